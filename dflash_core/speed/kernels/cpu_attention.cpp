// dflash_cpu::masked_attention(q, k, v, mask, scale): softmax(q k^T * scale, over the keys `mask`
// allows) v for the few query rows of a decoding or draft step, on an x86 CPU with AVX2 and FMA,
// in float32 or bfloat16 (read as float32, computed in float32, the output rounded to nearest even).
//
// A compiled step attends over its whole static cache, most of it unused early in a run. PyTorch's
// SDPA computes every masked key too, so its cost grows with the cache's capacity; this kernel
// reads the mask first and touches only the allowed keys, so a step's cost follows the run's length.
// Grouped-query heads read their key/value head directly (query head h uses head h / (H / Hkv)).
//
// Each output row is computed alone, in one fixed order: the allowed keys in ascending position,
// each score a dot product of 8 lane sums over the head dimension then one fixed horizontal sum
// (eight keys' at once, each in that order), exp by one polynomial (Cephes' expf coefficients,
// within 2 ulp of std::exp), the sum of those in ascending position, the values summed in the same
// order (in registers, 64 dimensions at a time) and divided by it once. A row's output
// is therefore bitwise the same whatever other rows share the call and however many masked keys
// the cache holds: a verify computes its attention exactly as one-token steps would.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/library.h>

#include "cpu_avx2.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace {

using dflash_kernels::has_avx2;
using dflash_kernels::horizontal_sum8;


// exp of 8 floats at most 0: x = n ln2 + r with |r| <= ln2 / 2, exp(r) by a degree-6 polynomial,
// times 2^n written into the exponent bits.
AVX2_TARGET inline __m256 exp8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));  // 2^n stays a normal float
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
  const __m256i two_n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(two_n));
}

AVX2_TARGET inline __m256 load8(const float* x) { return _mm256_loadu_ps(x); }

// bfloat16 is the top half of a float32: widen each to 32 bits and shift it up.
AVX2_TARGET inline __m256 load8(const at::BFloat16* x) {
  const __m128i halves = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(halves), 16));
}

template <typename T>
AVX2_TARGET inline float dot(const float* q, const T* k, int64_t D) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t d = 0; d < D; d += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), load8(k + d), acc);
  return horizontal_sum8(acc);
}

// horizontal_sum8 of each of a[0..7] at once, each in its order ((a0+a4)+(a2+a6))+((a1+a5)+(a3+a7)):
// eight keys' scores, bitwise as eight calls would give them.
AVX2_TARGET inline __m256 horizontal_sums8(const __m256* a) {
  __m256 halves[4];  // a[c]'s lanes i + (i + 4) in the low 128 bits, a[c + 4]'s in the high
  for (int c = 0; c < 4; ++c)
    halves[c] = _mm256_add_ps(_mm256_permute2f128_ps(a[c], a[c + 4], 0x20), _mm256_permute2f128_ps(a[c], a[c + 4], 0x31));
  const __m256 pairs01 = _mm256_add_ps(_mm256_shuffle_ps(halves[0], halves[1], 0x44),
                                       _mm256_shuffle_ps(halves[0], halves[1], 0xEE));
  const __m256 pairs23 = _mm256_add_ps(_mm256_shuffle_ps(halves[2], halves[3], 0x44),
                                       _mm256_shuffle_ps(halves[2], halves[3], 0xEE));
  return _mm256_add_ps(_mm256_shuffle_ps(pairs01, pairs23, 0x88), _mm256_shuffle_ps(pairs01, pairs23, 0xDD));
}

// out[d0 : d0 + 8R] = the sum over the keys, in ascending position, of p[i] v[keys[i]][d0 : d0 + 8R],
// kept in registers; with `total`, also the sum of the p[i] in that order.
template <int R, typename T>
AVX2_TARGET inline void weighted_values(const float* p, const T* v, const std::vector<int64_t>& keys, int64_t D,
                                        int64_t d0, float* out, float* total) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  float sum = 0.f;
  for (size_t i = 0; i < keys.size(); ++i) {
    const __m256 pi = _mm256_set1_ps(p[i]);
    const T* vj = v + keys[i] * D + d0;
    for (int r = 0; r < R; ++r) acc[r] = _mm256_fmadd_ps(pi, load8(vj + 8 * r), acc[r]);
    if (total != nullptr) sum += p[i];
  }
  for (int r = 0; r < R; ++r) _mm256_storeu_ps(out + d0 + 8 * r, acc[r]);
  if (total != nullptr) *total = sum;
}

template <typename T>
AVX2_TARGET void weighted_values(const float* p, const T* v, const std::vector<int64_t>& keys, int64_t D,
                                 float* out, float* total) {
  for (int64_t d0 = 0; d0 < D; d0 += 64) {  // 8 registers of sums at a time
    float* t = d0 == 0 ? total : nullptr;
    switch (std::min<int64_t>(8, (D - d0) / 8)) {
      case 8: weighted_values<8>(p, v, keys, D, d0, out, t); break;
      case 7: weighted_values<7>(p, v, keys, D, d0, out, t); break;
      case 6: weighted_values<6>(p, v, keys, D, d0, out, t); break;
      case 5: weighted_values<5>(p, v, keys, D, d0, out, t); break;
      case 4: weighted_values<4>(p, v, keys, D, d0, out, t); break;
      case 3: weighted_values<3>(p, v, keys, D, d0, out, t); break;
      case 2: weighted_values<2>(p, v, keys, D, d0, out, t); break;
      default: weighted_values<1>(p, v, keys, D, d0, out, t); break;
    }
  }
}

// One query row `q` [D] (as float32) against the keys `keys` (positions into k and v, rows of D) of
// one head, into `out` [D]. `scores` has room for keys.size() rounded up to 8.
template <typename T>
AVX2_TARGET void attend_row(const float* q, const T* k, const T* v, const std::vector<int64_t>& keys,
                            int64_t D, float scale, float* scores, float* out) {
  const int64_t n = static_cast<int64_t>(keys.size());
  const __m256 scales = _mm256_set1_ps(scale);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {  // eight keys at once: eight independent sums, each in the order of `dot`
    const T* kj[8];
    __m256 acc[8];
    for (int c = 0; c < 8; ++c) kj[c] = k + keys[i + c] * D, acc[c] = _mm256_setzero_ps();
    for (int64_t d = 0; d < D; d += 8) {
      const __m256 qd = _mm256_loadu_ps(q + d);
      for (int c = 0; c < 8; ++c) acc[c] = _mm256_fmadd_ps(qd, load8(kj[c] + d), acc[c]);
    }
    _mm256_storeu_ps(scores + i, _mm256_mul_ps(horizontal_sums8(acc), scales));
  }
  for (; i < n; ++i) scores[i] = dot(q, k + keys[i] * D, D) * scale;
  float top = -INFINITY;
  for (i = 0; i < n; ++i) top = std::max(top, scores[i]);
  for (i = n; i % 8; ++i) scores[i] = top;  // padding the last group of 8; never read back
  for (i = 0; i < n; i += 8)
    _mm256_storeu_ps(scores + i, exp8(_mm256_sub_ps(_mm256_loadu_ps(scores + i), _mm256_set1_ps(top))));
  float total = 0.f;
  weighted_values(scores, v, keys, D, out, &total);
  const __m256 inverse = _mm256_set1_ps(1.f / total);
  for (int64_t d = 0; d < D; d += 8) _mm256_storeu_ps(out + d, _mm256_mul_ps(_mm256_loadu_ps(out + d), inverse));
}

inline void widen(const float* x, int64_t D, float* to) { std::copy(x, x + D, to); }
inline void widen(const at::BFloat16* x, int64_t D, float* to) {
  for (int64_t d = 0; d < D; ++d) to[d] = static_cast<float>(x[d]);
}
inline void narrow(const float* x, int64_t D, float* to) { std::copy(x, x + D, to); }
inline void narrow(const float* x, int64_t D, at::BFloat16* to) {
  for (int64_t d = 0; d < D; ++d) to[d] = at::BFloat16(x[d]);  // round to nearest even
}

template <typename T>
void attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask, double scale,
            at::Tensor& out) {
  const int64_t H = q.size(1), L = q.size(2), D = q.size(3), Hkv = k.size(1), P = k.size(2);
  const bool shared = mask.numel() == P;  // one row of the mask for every query row
  const T *Q = q.data_ptr<T>(), *K = k.data_ptr<T>(), *V = v.data_ptr<T>();
  const bool* M = mask.data_ptr<bool>();
  T* O = out.data_ptr<T>();
  const int64_t group = H / Hkv;
  at::parallel_for(0, Hkv * L, 1, [&](int64_t first, int64_t last) {
    std::vector<int64_t> keys;
    std::vector<float> scores(P + 8), row_q(D), row_out(D);
    for (int64_t item = first; item < last; ++item) {
      const int64_t head = item / L, row = item % L;  // a key/value head and a query position
      const bool* allowed = M + (shared ? 0 : row * P);
      keys.clear();
      for (int64_t j = 0; j < P; ++j)
        if (allowed[j]) keys.push_back(j);
      for (int64_t h = head * group; h < (head + 1) * group; ++h) {
        widen(Q + (h * L + row) * D, D, row_q.data());
        attend_row(row_q.data(), K + head * P * D, V + head * P * D, keys, D, static_cast<float>(scale),
                   scores.data(), row_out.data());
        narrow(row_out.data(), D, O + (h * L + row) * D);
      }
    }
  });
}

// q [1, H, L, D], k and v [1, Hkv, P, D] (H a multiple of Hkv), all float32 or all bfloat16; mask
// bool, [L, P] or one row [1, P] for all query rows, with any leading ones -> [1, H, L, D].
at::Tensor masked_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                            double scale) {
  TORCH_CHECK(has_avx2(), "masked_attention needs AVX2 and FMA");
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.sizes() == k.sizes() && q.size(0) == 1 && k.size(0) == 1,
              "masked_attention takes q [1, H, L, D] and k, v [1, Hkv, P, D]");
  const int64_t H = q.size(1), L = q.size(2), D = q.size(3), Hkv = k.size(1), P = k.size(2);
  TORCH_CHECK(k.size(3) == D && D % 8 == 0 && Hkv > 0 && H % Hkv == 0,
              "masked_attention: the head size must match and be a multiple of 8, and H a multiple of Hkv");
  const auto dtype = q.scalar_type();
  TORCH_CHECK((dtype == at::kFloat || dtype == at::kBFloat16) && k.scalar_type() == dtype &&
                  v.scalar_type() == dtype && q.device().is_cpu() && k.device().is_cpu() && v.device().is_cpu(),
              "masked_attention takes float32 or bfloat16 CPU tensors, all of one dtype");
  TORCH_CHECK(mask.scalar_type() == at::kBool && mask.dim() >= 2 && mask.size(-1) == P &&
                  (mask.size(-2) == L || mask.size(-2) == 1) && mask.numel() == mask.size(-2) * P,
              "masked_attention takes a bool mask [L, P] (or [1, P]) shared by all heads");
  const at::Tensor qc = q.contiguous(), kc = k.contiguous(), vc = v.contiguous(), allowed = mask.contiguous();
  at::Tensor out = at::empty({1, H, L, D}, q.options());
  if (dtype == at::kFloat)
    attend<float>(qc, kc, vc, allowed, scale, out);
  else
    attend<at::BFloat16>(qc, kc, vc, allowed, scale, out);
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(dflash_cpu, m) {
  m.def("masked_attention(Tensor q, Tensor k, Tensor v, Tensor mask, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(dflash_cpu, CPU, m) { m.impl("masked_attention", &masked_attention); }
