// bfloat16 <-> float32 for the native kernels (agentr1/backends/native.py): torch's
// rounding (nearest even, NaN kept NaN), scalar and, where the compiler targets AVX-512,
// 16 lanes at a time; and exp, on 16 lanes and (`exp1`) one lane at a time in a form
// compilers vectorize for whatever they target (AVX2, NEON).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace agentr1 {

using bf16 = uint16_t;

inline float load(float x) { return x; }
inline float load(bf16 h) {
    uint32_t u = uint32_t(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

// Round to nearest even, as torch's float -> bfloat16 conversion; NaN stays NaN.
inline bf16 to_bf16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return bf16((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return bf16(u >> 16);
}

template <typename T> inline T store(float f);
template <> inline float store<float>(float f) { return f; }
template <> inline bf16 store<bf16>(float f) { return to_bf16(f); }
template <typename T> inline float rounded(float f) { return load(store<T>(f)); }

// exp(x) as exp16 below computes it, one lane: the same clamp to [-87, 88], reduction and
// polynomial (Cephes', ~1 ulp), each step rounded as there, so a build with AVX-512 and
// one without give the same bits. Only arithmetic and bit moves: a loop of it under
// `#pragma omp simd` vectorizes for the ISA the compiler targets, where std::exp stays a
// library call per element (its loops 3.5-6.5x slower on an AVX2 EPYC). A NaN stays NaN.
inline float exp1(float x) {
    x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    const float shift = 12582912.0f;  // 1.5 * 2^23 (bits 0x4b400000): adding it rounds to an
    const float t = x * 1.44269504088896341f + shift;  // integer, ties to even, in t's low bits
    const float k = t - shift;
    const float r = (x - k * 0.693359375f) + k * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = std::fma(p, r, 1.3981999507e-3f);
    p = std::fma(p, r, 8.3334519073e-3f);
    p = std::fma(p, r, 4.1665795894e-2f);
    p = std::fma(p, r, 1.6666665459e-1f);
    p = std::fma(p, r, 5.0000001201e-1f);
    p = std::fma(p * r, r, r) + 1.0f;
    // 2^k in the exponent bits, k read from t's (no float -> int conversion, so a NaN is
    // defined behaviour): k in [-126, 127] after the clamp, a normal float
    uint32_t tb;
    std::memcpy(&tb, &t, 4);
    const uint32_t bits = (tb - 0x4b400000u + 127u) << 23;
    float two_k;
    std::memcpy(&two_k, &bits, 4);
    return p * two_k;
}

#if defined(__AVX512F__)
// 16 bfloat16 lanes widened to float32 (exact).
inline __m512 widen16(__m256i h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// 16 values widened to float32.
template <typename T> inline __m512 load16(const T* p) {
    if constexpr (sizeof(T) == 4) {
        return _mm512_loadu_ps(reinterpret_cast<const float*>(p));
    } else {
        return widen16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    }
}

// 16 float32 lanes rounded to bfloat16 as `to_bf16` rounds them (NaN included).
inline __m256i to_bf16x16(__m512 f) {
    __m512i u = _mm512_castps_si512(f);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb));
    __m512i nan = _mm512_or_si512(u, _mm512_set1_epi32(0x400000));
    __mmask16 is_nan = _mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q);
    r = _mm512_mask_mov_epi32(r, is_nan, nan);
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16));
}

#if defined(__AVX512BF16__)
// The same by the instruction (round to nearest even, NaN quieted, as torch; it also
// flushes float32 denormals, below 1.2e-38, to zero, where torch keeps them).
inline __m256i bf16x16(__m512 v) { return (__m256i)_mm512_cvtneps_pbh(v); }
#endif

// `to_bf16x16`'s bits, by the instruction where it has one and no lane is a float32
// denormal (the one case they differ): a class test and a conversion, not eight steps.
inline __m256i to_bf16x16_fast(__m512 f) {
#if defined(__AVX512BF16__) && defined(__AVX512DQ__)
    if (!_mm512_fpclass_ps_mask(f, 0x20 /* denormal */)) return bf16x16(f);
#endif
    return to_bf16x16(f);
}

// exp(x) on 16 lanes (Cephes' reduction and polynomial, ~1 ulp; x clamped to [-87, 88],
// where float32's exp neither underflows nor overflows).
inline __m512 exp16(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
    const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 r = _mm512_add_ps(_mm512_sub_ps(x, _mm512_mul_ps(k, _mm512_set1_ps(0.693359375f))),
                                   _mm512_mul_ps(k, _mm512_set1_ps(2.12194440e-4f)));
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, k);
}

// 2^t for t >= -126 on 16 lanes, to within 5e-5 relative (a degree-4 polynomial on the
// fraction): for values rounded to bf16 next (2^-9), whose rounding it is far below.
inline __m512 exp2_16(__m512 t) {
    const __m512 k = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(t, k);  // [-0.5, 0.5]
    __m512 p = _mm512_set1_ps(9.6181291e-3f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504109e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022651e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, k);
}
#endif

}  // namespace agentr1
