// dflash_cpu::rows_linear(x, w, b): y = x @ w.T + b for a few rows on an x86 CPU, in one of four
// variants chosen at run time by the CPU's features: `avx2` (AVX2 + FMA; float32), `avx512`
// (float32, and bfloat16 inputs and weights widened to float32 and summed there), `avx512_bf16`
// (as `avx512` for float32; bfloat16 pairs multiplied and summed into float32 by vdpbf16ps) and
// `amx` (bfloat16 only, through AMX tiles, on a copy of the weight in the tiles' layout made once
// by `amx_pack`; its op is dflash_cpu::rows_linear_amx(x, packed, b)).
//
// A decoding step multiplies a few rows (1 to 16 for a chain's verify, more for a tree's) by every
// weight of the model once, so it is bound by reading the weights. The vector variants read each
// weight row once per call, four rows at a time, and keep them in L1 while they multiply them with
// the input rows a few at a time. `amx` reads its packed weights in one sequential stream, and one
// tile product serves 1 to 16 rows at the same cost, three tiles up to 48 rows per read of the
// weights, so a block of 48 rows costs about what one row does.
//
// Every output element is summed in the same order whatever the number of rows: L lane sums over k
// in ascending steps of L (8 on AVX2, 16 on AVX-512, whose last step may cover 8; vdpbf16ps adds
// two products per lane and step), then one fixed horizontal sum, then the bias; `amx` adds the
// products in ascending k into one float32 sum per element, a tile of 32 inputs at a time. Row i
// of a block is therefore bitwise the output of row i alone, so a verify of B tokens computes its
// linears exactly as B one-token steps would. Each variant keeps its own order: variants give
// close, not bitwise equal, outputs.
//
// The variants are compiled with per-function target attributes rather than global -m flags, so
// one build runs on any x86-64 CPU and only the variant this CPU supports is ever called.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <immintrin.h>
#include <torch/library.h>

#include "cpu_avx2.h"

#include <cpuid.h>

#include <algorithm>
#include <cstdint>
#include <string>

#ifdef __linux__
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace {

using dflash_kernels::has_avx2;
using dflash_kernels::horizontal_sum8;

#define AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma")))
#define AVX512BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma")))
// The amx variant needs a compiler that knows AMX (GCC 11, Clang 12 on); older ones build the others.
#if (defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11)
#define DFLASH_AMX 1
#define AMX_TARGET __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma")))
#endif

// What a tile loop needs: the rows (float32), the weight (float32 or bfloat16), the output.
template <typename W, typename Y>
struct Problem {
  const float* x;
  const W* w;
  const float* bias;  // nullptr: none
  Y* y;
  int64_t M, N, K;
};

// ---------------------------------------------------------------- AVX2 + FMA, float32

// out[r * 4 + j] = dot(x row r, weight row j) for R input rows (1 to 3) and 4 weight rows; while
// it runs, the next tile's 4 weight rows (`next`, if any) are prefetched into L1.
template <int R>
AVX2_TARGET inline void dot_tile_avx2(const float* x, int64_t K, const float* const* w, float* out,
                                      const float* next) {
  __m256 acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < 4; ++j) acc[r][j] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; k += 8) {
    if (next != nullptr && (k & 15) == 0)
      for (int j = 0; j < 4; ++j) _mm_prefetch(reinterpret_cast<const char*>(next + j * K + k), _MM_HINT_T0);
    __m256 xr[R];
    for (int r = 0; r < R; ++r) xr[r] = _mm256_loadu_ps(x + r * K + k);
    for (int j = 0; j < 4; ++j) {
      const __m256 v = _mm256_loadu_ps(w[j] + k);
      for (int r = 0; r < R; ++r) acc[r][j] = _mm256_fmadd_ps(xr[r], v, acc[r][j]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < 4; ++j) out[r * 4 + j] = horizontal_sum8(acc[r][j]);
}

AVX2_TARGET void tiles_avx2(const Problem<float, float>& p, int64_t first, int64_t last) {
  const int64_t M = p.M, N = p.N, K = p.K;
  float out[12];
  for (int64_t tile = first; tile < last; ++tile) {
    const int64_t n0 = tile * 4;
    const int n = static_cast<int>(std::min<int64_t>(4, N - n0));
    const float* w[4];
    for (int j = 0; j < 4; ++j) w[j] = p.w + (n0 + std::min(j, n - 1)) * K;
    for (int64_t m = 0; m < M;) {
      // Pairs of rows, and the last 1 to 3 rows in one pass (the measured fastest on AVX2).
      const int r = M - m > 3 ? 2 : static_cast<int>(M - m);
      // Past one row the tile computes long enough to hide fetching the next tile's weights.
      const float* next = (M > 1 && m == 0 && n0 + 8 <= N) ? p.w + (n0 + 4) * K : nullptr;
      const float* xm = p.x + m * K;
      if (r == 3)
        dot_tile_avx2<3>(xm, K, w, out, next);
      else if (r == 2)
        dot_tile_avx2<2>(xm, K, w, out, next);
      else
        dot_tile_avx2<1>(xm, K, w, out, next);
      for (int i = 0; i < r; ++i)
        for (int j = 0; j < n; ++j) p.y[(m + i) * N + n0 + j] = out[i * 4 + j] + (p.bias ? p.bias[n0 + j] : 0.0f);
      m += r;
    }
  }
}

// ---------------------------------------------------------------- AVX-512, float32 or bfloat16 weights

AVX512_TARGET inline __m512 load16(const float* w, __mmask16 mask) { return _mm512_maskz_loadu_ps(mask, w); }

AVX512_TARGET inline __m512 load16(const c10::BFloat16* w, __mmask16 mask) {
  // A bfloat16 is the upper half of a float32: widen to 32 bits and shift (exact).
  const __m256i half = _mm256_maskz_loadu_epi16(mask, w);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
}

// As dot_tile_avx2, 16 lanes wide, for R input rows (1 to 4); the last step of k covers 8 lanes
// where K is not a multiple of 16 (the masked lanes add nothing). The next tile's weights are
// prefetched into L2, not L1, at every row count: on the AVX-512 EPYC that ran 1 to 4 rows at the
// memory's speed, where into L1 (a tile of 1536-wide rows is 24 KiB) or not at all was 27-58%
// slower (docs/benchmarks.md, "On the AVX-512 class").
template <int R, typename W>
AVX512_TARGET inline void dot_tile_avx512(const float* x, int64_t K, const W* const* w, float* out, const W* next) {
  constexpr int64_t line = 64 / sizeof(W);  // weights per cache line
  __m512 acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 16) {
    const __mmask16 mask = K - k >= 16 ? 0xFFFF : 0x00FF;
    if (next != nullptr && k % line == 0)
      for (int j = 0; j < 4; ++j) _mm_prefetch(reinterpret_cast<const char*>(next + j * K + k), _MM_HINT_T1);
    __m512 xr[R];
    for (int r = 0; r < R; ++r) xr[r] = _mm512_maskz_loadu_ps(mask, x + r * K + k);
    for (int j = 0; j < 4; ++j) {
      const __m512 v = load16(w[j] + k, mask);
      for (int r = 0; r < R; ++r) acc[r][j] = _mm512_fmadd_ps(xr[r], v, acc[r][j]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < 4; ++j) out[r * 4 + j] = _mm512_reduce_add_ps(acc[r][j]);
}

template <typename W, typename Y>
AVX512_TARGET void tiles_avx512(const Problem<W, Y>& p, int64_t first, int64_t last) {
  const int64_t M = p.M, N = p.N, K = p.K;
  float out[16];
  for (int64_t tile = first; tile < last; ++tile) {
    const int64_t n0 = tile * 4;
    const int n = static_cast<int>(std::min<int64_t>(4, N - n0));
    const W* w[4];
    for (int j = 0; j < 4; ++j) w[j] = p.w + (n0 + std::min(j, n - 1)) * K;
    for (int64_t m = 0; m < M;) {
      // Groups of four rows; the last 1 to 4 in one pass (32 registers hold 16 sums, 4 rows, a weight).
      const int r = static_cast<int>(std::min<int64_t>(4, M - m));
      const W* next = (m == 0 && n0 + 8 <= N) ? p.w + (n0 + 4) * K : nullptr;
      const float* xm = p.x + m * K;
      switch (r) {
        case 4: dot_tile_avx512<4>(xm, K, w, out, next); break;
        case 3: dot_tile_avx512<3>(xm, K, w, out, next); break;
        case 2: dot_tile_avx512<2>(xm, K, w, out, next); break;
        default: dot_tile_avx512<1>(xm, K, w, out, next); break;
      }
      for (int i = 0; i < r; ++i)
        for (int j = 0; j < n; ++j)
          p.y[(m + i) * N + n0 + j] = static_cast<Y>(out[i * 4 + j] + (p.bias ? p.bias[n0 + j] : 0.0f));
      m += r;
    }
  }
}

// ---------------------------------------------------------------- AVX512-BF16, bfloat16 rows and weights

// As dot_tile_avx512 on bfloat16 pairs: each step multiplies 32 weights by 32 inputs with
// vdpbf16ps, which adds both products of a pair to its float32 lane sum in one fixed order.
template <int R>
AVX512BF16_TARGET inline void dot_tile_dpbf16(const c10::BFloat16* x, int64_t K, const c10::BFloat16* const* w,
                                              float* out, const c10::BFloat16* next) {
  __m512 acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 32) {
    const __mmask32 mask = K - k >= 32 ? 0xFFFFFFFFu : ((1u << (K - k)) - 1u);
    if (next != nullptr)
      for (int j = 0; j < 4; ++j) _mm_prefetch(reinterpret_cast<const char*>(next + j * K + k), _MM_HINT_T1);
    __m512bh xr[R];
    for (int r = 0; r < R; ++r) xr[r] = (__m512bh)_mm512_maskz_loadu_epi16(mask, x + r * K + k);
    for (int j = 0; j < 4; ++j) {
      const __m512bh v = (__m512bh)_mm512_maskz_loadu_epi16(mask, w[j] + k);
      for (int r = 0; r < R; ++r) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], xr[r], v);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < 4; ++j) out[r * 4 + j] = _mm512_reduce_add_ps(acc[r][j]);
}

// tiles_avx512's loop over vdpbf16ps tiles; X: the rows in bfloat16 (p.x is unused).
AVX512BF16_TARGET void tiles_dpbf16(const c10::BFloat16* X, const Problem<c10::BFloat16, c10::BFloat16>& p,
                                    int64_t first, int64_t last) {
  const int64_t M = p.M, N = p.N, K = p.K;
  float out[16];
  for (int64_t tile = first; tile < last; ++tile) {
    const int64_t n0 = tile * 4;
    const int n = static_cast<int>(std::min<int64_t>(4, N - n0));
    const c10::BFloat16* w[4];
    for (int j = 0; j < 4; ++j) w[j] = p.w + (n0 + std::min(j, n - 1)) * K;
    for (int64_t m = 0; m < M;) {
      const int r = static_cast<int>(std::min<int64_t>(4, M - m));
      const c10::BFloat16* next = (m == 0 && n0 + 8 <= N) ? p.w + (n0 + 4) * K : nullptr;
      const c10::BFloat16* xm = X + m * K;
      switch (r) {
        case 4: dot_tile_dpbf16<4>(xm, K, w, out, next); break;
        case 3: dot_tile_dpbf16<3>(xm, K, w, out, next); break;
        case 2: dot_tile_dpbf16<2>(xm, K, w, out, next); break;
        default: dot_tile_dpbf16<1>(xm, K, w, out, next); break;
      }
      for (int i = 0; i < r; ++i)
        for (int j = 0; j < n; ++j)
          p.y[(m + i) * N + n0 + j] = static_cast<c10::BFloat16>(out[i * 4 + j] + (p.bias ? p.bias[n0 + j] : 0.0f));
      m += r;
    }
  }
}

// ---------------------------------------------------------------- AMX, bfloat16 rows and packed weights

// Outputs come in groups of 16, inputs in steps of 32. `amx_pack` lays a [N, K] weight out as
// [N / 16][K / 2][16][2]: for each group and step a 1 KiB block, the B operand of the tiles'
// vdpbf16ps (16 rows of input pairs, each holding the group's 16 outputs' two weights).
// A tile holds 16 rows; one pass over the weights serves three tiles of rows (48): a tree of up to
// 47 drafts verifies with one read of each weight.
constexpr int64_t AMX_OUTPUTS = 16, AMX_INPUTS = 32, AMX_TILE_ROWS = 16, AMX_ROW_TILES = 3;
constexpr int64_t AMX_ROWS = AMX_TILE_ROWS * AMX_ROW_TILES;

// ldtilecfg's 64-byte operand, palette 1.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
};

#ifdef DFLASH_AMX
// Groups [first, last) for M (1 to 48) rows. Tiles 0, 1, 2 sum the group's 16 outputs in float32
// for rows 0-15, 16-31 and 32-47; tiles 3, 4, 5 hold those rows' next 32 inputs; tile 6 the group's
// weights for them, loaded once for all the rows. Each row's sums are the same whichever tile holds it.
AMX_TARGET void groups_amx(const c10::BFloat16* X, const c10::BFloat16* packed, const float* bias, c10::BFloat16* Y,
                           int64_t M, int64_t N, int64_t K, int64_t first, int64_t last) {
  const int64_t tiles = (M + AMX_TILE_ROWS - 1) / AMX_TILE_ROWS;
  TileConfig config;
  for (int64_t t = 0; t < tiles; ++t) {
    config.rows[t] = config.rows[3 + t] = static_cast<uint8_t>(std::min(AMX_TILE_ROWS, M - t * AMX_TILE_ROWS));
    config.bytes_per_row[t] = config.bytes_per_row[3 + t] = 64;
  }
  config.rows[6] = AMX_INPUTS / 2;
  config.bytes_per_row[6] = 64;
  _tile_loadconfig(&config);  // per call and thread: the tile state belongs to the thread
  const int64_t stride = K * sizeof(c10::BFloat16), tile_rows = AMX_TILE_ROWS * K;
  alignas(64) float sums[AMX_ROWS * AMX_OUTPUTS];
  for (int64_t group = first; group < last; ++group) {
    const c10::BFloat16* w = packed + group * AMX_OUTPUTS * K;
    _tile_zero(0);
    if (tiles > 1) _tile_zero(1);
    if (tiles > 2) _tile_zero(2);
    for (int64_t k = 0; k < K; k += AMX_INPUTS) {
      _tile_loadd(6, w + k * AMX_OUTPUTS, 64);
      _tile_loadd(3, X + k, stride);
      _tile_dpbf16ps(0, 3, 6);
      if (tiles > 1) {
        _tile_loadd(4, X + tile_rows + k, stride);
        _tile_dpbf16ps(1, 4, 6);
      }
      if (tiles > 2) {
        _tile_loadd(5, X + 2 * tile_rows + k, stride);
        _tile_dpbf16ps(2, 5, 6);
      }
    }
    _tile_stored(0, sums, 64);
    if (tiles > 1) _tile_stored(1, sums + AMX_TILE_ROWS * AMX_OUTPUTS, 64);
    if (tiles > 2) _tile_stored(2, sums + 2 * AMX_TILE_ROWS * AMX_OUTPUTS, 64);
    const int64_t n0 = group * AMX_OUTPUTS;
    const __m512 b = bias ? _mm512_loadu_ps(bias + n0) : _mm512_setzero_ps();
    for (int64_t m = 0; m < M; ++m) {
      const __m256bh out = _mm512_cvtneps_pbh(_mm512_add_ps(_mm512_load_ps(sums + m * AMX_OUTPUTS), b));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(Y + m * N + n0), reinterpret_cast<const __m256i&>(out));
    }
  }
  _tile_release();  // a thread without tile state is cheaper to switch
}
#endif

// ---------------------------------------------------------------- dispatch

bool has_avx512() {
  __builtin_cpu_init();
  return has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl");
}

bool has_avx512_bf16() {
  __builtin_cpu_init();
  return has_avx512() && __builtin_cpu_supports("avx512bf16");
}

// AMX needs the CPU's tiles (CPUID leaf 7: EDX bit 24 AMX-TILE, bit 22 AMX-BF16), a build that
// knows them, and, on Linux, the kernel's leave to use their state in this process.
bool has_amx() {
  static const bool amx = [] {
#if defined(DFLASH_AMX) && defined(__linux__)
    unsigned a, b, c, d;
    if (!has_avx512_bf16() || !__get_cpuid_count(7, 0, &a, &b, &c, &d) || !((d >> 24) & 1) || !((d >> 22) & 1))
      return false;
    constexpr long ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
#else
    return false;
#endif
  }();
  return amx;
}

// The variants this CPU runs, comma-separated, the fastest last ("" where none).
std::string variants() {
  if (has_amx()) return "avx2,avx512,avx512_bf16,amx";
  if (has_avx512_bf16()) return "avx2,avx512,avx512_bf16";
  if (has_avx512()) return "avx2,avx512";
  return has_avx2() ? "avx2" : "";
}

constexpr int64_t GRAIN = 16;  // tiles of 4 outputs per thread at least

template <typename W, typename Y, typename Tiles>
void run(const Problem<W, Y>& p, Tiles tiles) {
  at::parallel_for(0, (p.N + 3) / 4, GRAIN, [&](int64_t first, int64_t last) { tiles(p, first, last); });
}

// The bias as float32 for the epilogues (undefined where there is none), checked against N outputs.
at::Tensor float_bias(const c10::optional<at::Tensor>& bias, int64_t N, const char* op) {
  if (!bias.has_value() || !bias->defined()) return at::Tensor();
  at::Tensor b = bias->to(at::kFloat).contiguous();
  TORCH_CHECK(b.numel() == N, op, ": bias must have ", N, " elements");
  return b;
}

// y [M, N] with x's leading dimensions, as F.linear returns it.
at::Tensor with_leading_dims(const at::Tensor& y, const at::Tensor& x) {
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = y.size(1);
  return y.view(shape);
}

at::Tensor rows_linear_with(const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
                            c10::string_view variant) {
  const std::string name(variant);
  TORCH_CHECK(name != "amx", "rows_linear: the amx variant reads a packed weight (amx_pack, rows_linear_amx)");
  TORCH_CHECK(name == "avx2" || name == "avx512" || name == "avx512_bf16",
              "rows_linear: the variant must be avx2, avx512 or avx512_bf16, not '", name, "'");
  TORCH_CHECK(name == "avx2" ? has_avx2() : name == "avx512" ? has_avx512() : has_avx512_bf16(),
              "rows_linear: this CPU cannot run the ", name, " variant");
  const bool bf16 = weight.scalar_type() == at::kBFloat16, wide = name != "avx2";
  TORCH_CHECK(x.device().is_cpu() && weight.device().is_cpu() && x.scalar_type() == weight.scalar_type() &&
                  (weight.scalar_type() == at::kFloat || (bf16 && wide)),
              "rows_linear takes float32 CPU tensors", wide ? " or bfloat16 ones" : "", ", not ",
              x.scalar_type(), " rows and ", weight.scalar_type(), " weights");
  const int64_t K = x.size(-1), N = weight.size(0);
  TORCH_CHECK(weight.dim() == 2 && weight.size(1) == K, "rows_linear: weight must be [N, ", K, "]");
  TORCH_CHECK(K % 8 == 0, "rows_linear: the inner size must be a multiple of 8, not ", K);
  // Rows widen exactly to float32 once per call (the weights, not the rows, are the traffic), but
  // for vdpbf16ps, which takes bfloat16 pairs.
  const bool pairs = bf16 && name == "avx512_bf16";
  const at::Tensor rows = x.reshape({-1, K}).to(pairs ? at::kBFloat16 : at::kFloat).contiguous();
  const at::Tensor w = weight.contiguous();
  const at::Tensor b = float_bias(bias, N, "rows_linear");
  const int64_t M = rows.size(0);
  at::Tensor y = at::empty({M, N}, x.options());
  const float* X = pairs ? nullptr : rows.data_ptr<float>();
  const float* B = b.defined() ? b.data_ptr<float>() : nullptr;
  if (pairs) {
    const c10::BFloat16* XB = rows.data_ptr<c10::BFloat16>();
    run(Problem<c10::BFloat16, c10::BFloat16>{X, w.data_ptr<c10::BFloat16>(), B, y.data_ptr<c10::BFloat16>(), M, N, K},
        [XB](const auto& p, int64_t a, int64_t z) { tiles_dpbf16(XB, p, a, z); });
  } else if (bf16) {
    run(Problem<c10::BFloat16, c10::BFloat16>{X, w.data_ptr<c10::BFloat16>(), B, y.data_ptr<c10::BFloat16>(), M, N, K},
        [](const auto& p, int64_t a, int64_t z) { tiles_avx512(p, a, z); });
  } else if (wide) {
    run(Problem<float, float>{X, w.data_ptr<float>(), B, y.data_ptr<float>(), M, N, K},
        [](const auto& p, int64_t a, int64_t z) { tiles_avx512(p, a, z); });
  } else {
    run(Problem<float, float>{X, w.data_ptr<float>(), B, y.data_ptr<float>(), M, N, K},
        [](const auto& p, int64_t a, int64_t z) { tiles_avx2(p, a, z); });
  }
  return with_leading_dims(y, x);
}

at::Tensor rows_linear(const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias) {
  static const std::string best = has_avx512_bf16() ? "avx512_bf16" : has_avx512() ? "avx512" : "avx2";
  return rows_linear_with(x, weight, bias, best);
}

at::Tensor amx_pack(const at::Tensor& weight) {
  TORCH_CHECK(has_amx(), "amx_pack: this CPU cannot run the amx variant");
  TORCH_CHECK(weight.device().is_cpu() && weight.scalar_type() == at::kBFloat16 && weight.dim() == 2,
              "amx_pack takes a 2-d bfloat16 CPU weight, not ", weight.scalar_type(), " of ", weight.sizes());
  const int64_t N = weight.size(0), K = weight.size(1);
  TORCH_CHECK(N % AMX_OUTPUTS == 0 && K % AMX_INPUTS == 0,
              "amx_pack: the weight's sizes must be multiples of 16 (outputs) and 32 (inputs), not ", weight.sizes());
  return weight.reshape({N / AMX_OUTPUTS, AMX_OUTPUTS, K / 2, 2}).permute({0, 2, 1, 3}).contiguous();
}

at::Tensor rows_linear_amx(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(has_amx(), "rows_linear_amx: this CPU cannot run the amx variant");
  TORCH_CHECK(packed.dim() == 4 && packed.size(2) == AMX_OUTPUTS && packed.size(3) == 2 && packed.is_contiguous(),
              "rows_linear_amx: the weight must be packed by amx_pack");
  const int64_t K = packed.size(1) * 2, N = packed.size(0) * AMX_OUTPUTS;
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kBFloat16 && packed.scalar_type() == at::kBFloat16,
              "rows_linear_amx takes bfloat16 CPU tensors, not ", x.scalar_type(), " rows and ",
              packed.scalar_type(), " weights");
  TORCH_CHECK(x.size(-1) == K, "rows_linear_amx: rows of ", K, " inputs, not ", x.size(-1));
  const at::Tensor rows = x.reshape({-1, K}).contiguous();
  const at::Tensor b = float_bias(bias, N, "rows_linear_amx");
  const int64_t M = rows.size(0);
  at::Tensor y = at::empty({M, N}, x.options());
  const c10::BFloat16* X = rows.data_ptr<c10::BFloat16>();
  const c10::BFloat16* W = packed.data_ptr<c10::BFloat16>();
  const float* B = b.defined() ? b.data_ptr<float>() : nullptr;
  c10::BFloat16* Y = y.data_ptr<c10::BFloat16>();
#ifdef DFLASH_AMX
  // Past 48 rows (a pass's), blocks of 48 rows one after another, each as it would be alone.
  for (int64_t m0 = 0; m0 < M; m0 += AMX_ROWS) {
    const int64_t rows_here = std::min(AMX_ROWS, M - m0);
    at::parallel_for(0, N / AMX_OUTPUTS, GRAIN / 4, [&](int64_t first, int64_t last) {
      groups_amx(X + m0 * K, W, B, Y + m0 * N, rows_here, N, K, first, last);
    });
  }
#endif
  return with_leading_dims(y, x);
}

}  // namespace

TORCH_LIBRARY(dflash_cpu, m) {
  m.def("rows_linear(Tensor x, Tensor weight, Tensor? bias) -> Tensor");
  m.def("rows_linear_with(Tensor x, Tensor weight, Tensor? bias, str variant) -> Tensor");
  m.def("rows_linear_amx(Tensor x, Tensor packed, Tensor? bias) -> Tensor");
  m.def("amx_pack(Tensor weight) -> Tensor");
  m.def("variants() -> str", &variants);
}

TORCH_LIBRARY_IMPL(dflash_cpu, CPU, m) {
  m.impl("rows_linear", &rows_linear);
  m.impl("rows_linear_with", &rows_linear_with);
  m.impl("rows_linear_amx", &rows_linear_amx);
  m.impl("amx_pack", &amx_pack);
}
