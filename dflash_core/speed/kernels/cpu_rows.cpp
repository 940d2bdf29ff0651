// dflash_cpu::rows_linear(x, w, b): y = x @ w.T + b for a few float32 rows on an x86 CPU (AVX2, FMA).
//
// A decoding step multiplies 1 to 16 rows by every weight of the model once, so it is bound by
// reading the weights. The kernel reads each weight row once per call, four rows at a time, and
// keeps them in L1 while it multiplies them with the input rows two or three at a time.
//
// Every output element is summed in the same order whatever the number of rows: eight lane sums
// over k in ascending steps of eight, then one fixed horizontal sum, then the bias. Row i of a block
// is therefore bitwise the output of row i alone, so a verify of B tokens computes its linears
// exactly as B one-token steps would.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>

namespace {

inline float horizontal_sum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// out[r * 4 + j] = dot(x row r, weight row j) for R input rows (1 to 3) and 4 weight rows; while
// it runs, the next tile's 4 weight rows (`next`, if any) are prefetched into L1.
template <int R>
inline void dot_tile(const float* x, int64_t K, const float* w0, const float* w1, const float* w2,
                     const float* w3, float* out, const float* next) {
  const float* w[4] = {w0, w1, w2, w3};
  __m256 acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < 4; ++j) acc[r][j] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; k += 8) {
    if (next != nullptr && (k & 15) == 0) {
      _mm_prefetch(reinterpret_cast<const char*>(next + k), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(next + K + k), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(next + 2 * K + k), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(next + 3 * K + k), _MM_HINT_T0);
    }
    __m256 xr[R];
    for (int r = 0; r < R; ++r) xr[r] = _mm256_loadu_ps(x + r * K + k);
    for (int j = 0; j < 4; ++j) {
      const __m256 v = _mm256_loadu_ps(w[j] + k);
      for (int r = 0; r < R; ++r) acc[r][j] = _mm256_fmadd_ps(xr[r], v, acc[r][j]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < 4; ++j) out[r * 4 + j] = horizontal_sum(acc[r][j]);
}

at::Tensor rows_linear(const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat,
              "rows_linear takes float32 CPU tensors");
  const int64_t K = x.size(-1), N = weight.size(0);
  TORCH_CHECK(weight.dim() == 2 && weight.size(1) == K, "rows_linear: weight must be [N, ", K, "]");
  TORCH_CHECK(K % 8 == 0, "rows_linear: the inner size must be a multiple of 8, not ", K);
  const at::Tensor rows = x.reshape({-1, K}).contiguous();
  const at::Tensor w = weight.contiguous();
  at::Tensor b;
  if (bias.has_value() && bias->defined()) {
    b = bias->to(at::kFloat).contiguous();
    TORCH_CHECK(b.numel() == N, "rows_linear: bias must have ", N, " elements");
  }
  const int64_t M = rows.size(0);
  at::Tensor y = at::empty({M, N}, x.options());
  const float* X = rows.data_ptr<float>();
  const float* W = w.data_ptr<float>();
  const float* B = b.defined() ? b.data_ptr<float>() : nullptr;
  float* Y = y.data_ptr<float>();

  at::parallel_for(0, (N + 3) / 4, 16, [&](int64_t first, int64_t last) {
    float out[12];
    for (int64_t tile = first; tile < last; ++tile) {
      const int64_t n0 = tile * 4;
      const int n = static_cast<int>(std::min<int64_t>(4, N - n0));
      // Past N, the tile repeats its last weight row and drops those results.
      const float* w0 = W + n0 * K;
      const float* w1 = W + (n0 + std::min(1, n - 1)) * K;
      const float* w2 = W + (n0 + std::min(2, n - 1)) * K;
      const float* w3 = W + (n0 + std::min(3, n - 1)) * K;
      for (int64_t m = 0; m < M;) {
        // Pairs of rows, and the last 1 to 3 rows in one pass (the measured fastest on AVX2).
        const int r = M - m > 3 ? 2 : static_cast<int>(M - m);
        // Past one row the tile computes long enough to hide fetching the next tile's weights.
        const float* next = (M > 1 && m == 0 && n0 + 8 <= N) ? W + (n0 + 4) * K : nullptr;
        if (r == 3)
          dot_tile<3>(X + m * K, K, w0, w1, w2, w3, out, next);
        else if (r == 2)
          dot_tile<2>(X + m * K, K, w0, w1, w2, w3, out, next);
        else
          dot_tile<1>(X + m * K, K, w0, w1, w2, w3, out, next);
        for (int i = 0; i < r; ++i)
          for (int j = 0; j < n; ++j) Y[(m + i) * N + n0 + j] = out[i * 4 + j] + (B ? B[n0 + j] : 0.0f);
        m += r;
      }
    }
  });
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = N;
  return y.view(shape);
}

}  // namespace

TORCH_LIBRARY(dflash_cpu, m) {
  m.def("rows_linear(Tensor x, Tensor weight, Tensor? bias) -> Tensor");
}

TORCH_LIBRARY_IMPL(dflash_cpu, CPU, m) {
  m.impl("rows_linear", &rows_linear);
}
