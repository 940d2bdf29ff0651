// What the CPU kernels (cpu_rows.cpp, cpu_attention.cpp) share: the AVX2 + FMA target attribute,
// the one horizontal sum of 8 lanes they all end a dot product with, and the run-time check.
#pragma once

#include <immintrin.h>

#define AVX2_TARGET __attribute__((target("avx2,fma")))

namespace dflash_kernels {

AVX2_TARGET inline float horizontal_sum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline bool has_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

}  // namespace dflash_kernels
