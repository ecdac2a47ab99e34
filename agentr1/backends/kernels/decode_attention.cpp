// One decode step of grouped-query attention for the hf sampler (agentr1/backends/native.py).
//
// For each row b and key/value head h, in one call a layer:
//   1. rotary on the row's G query heads of group h and on key head h:
//      x * cos + roll(x, D/2) * sin', with sin' = sin whose first half is negated (the
//      products of transformers' rotate_half form), each operation rounded to the tensor's
//      dtype exactly as the same three torch ops round it;
//   2. the rotated key and the value written into the preallocated cache at column n;
//   3. softmax attention of the G queries over the cache's columns 0..n that the row
//      attends, in float32 (scores, softmax, the weighted sum of the values), the result
//      rounded once to the dtype.
// Columns a row does not attend never reach the result (their scores are replaced before
// the softmax, their values skipped), so padding may hold any value, NaN included.
//
// Layouts (element strides; the last dimension is contiguous everywhere):
//   qkv    [B, Q + 2K, D], row stride qkv_sb: the q heads, then the k heads, then the v heads
//   cos    [B, D], sin [B, D] (sign-flipped as above), row stride rot_sb
//   kbuf, vbuf [B, K, C, D] with strides (kv_sb, kv_sh, D, 1), C > n
//   attend [B, >= n + 1] uint8, row stride att_sb (nonzero = attend)
//   out    [B, Q, D] contiguous; query head j = h * G + g reads key head h
// Returns 0, or 1 when a thread's scratch memory could not be allocated.
//
// Built by agentr1/backends/native.py with the machine's C++ compiler (-O3 -march=native
// -fopenmp; the OpenMP runtime is the one torch has loaded). The AVX-512 paths are used
// where the compiler targets AVX-512 (and AVX512-BF16 for bf16 dot products); the plain
// loops elsewhere compute the same function.

#include <cfloat>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "bf16.h"

namespace {

using agentr1::bf16;
using agentr1::load;
using agentr1::rounded;
using agentr1::store;

// exp(x) for x <= 0 (a score minus its row's maximum): Cephes' range reduction and
// polynomial (~1 ulp), 0 below -87 where float32's exp underflows. Branch-free.
inline float exp_nonpositive(float x) {
    float xc = x < -87.0f ? -87.0f : x;
    float k = float(int(xc * 1.44269504088896341f - 0.5f));
    float r = xc - k * 0.693359375f + k * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t bits = (int32_t(k) + 127) << 23;
    float two_k;
    std::memcpy(&two_k, &bits, 4);
    return x < -87.0f ? 0.0f : p * two_k;
}

// q . k over D for one cached key row; q in float (already rounded to T's precision).
template <typename T, int D> inline float dot(const float* q, const T* k) {
#if defined(__AVX512F__)
    if constexpr (D % 16 == 0) {
        __m512 acc[D / 16];
        for (int i = 0; i < D / 16; i++)
            acc[i] = _mm512_mul_ps(_mm512_loadu_ps(q + 16 * i), agentr1::load16(k + 16 * i));
        for (int w = D / 32; w > 0; w /= 2)
            for (int i = 0; i < w; i++) acc[i] = _mm512_add_ps(acc[i], acc[i + w]);
        return _mm512_reduce_add_ps(acc[0]);
    }
#endif
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int d = 0; d < D; d++) s += q[d] * load(k[d]);
    return s;
}

#if defined(__AVX512F__)
// exp_nonpositive on 16 lanes, the same operations.
inline __m512 exp16(__m512 x) {
    const __m512 lo = _mm512_set1_ps(-87.0f);
    __m512 xc = _mm512_max_ps(x, lo);
    __m512 k = _mm512_cvtepi32_ps(_mm512_cvttps_epi32(
        _mm512_sub_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f)), _mm512_set1_ps(0.5f))));
    __m512 r = _mm512_add_ps(_mm512_sub_ps(xc, _mm512_mul_ps(k, _mm512_set1_ps(0.693359375f))),
                             _mm512_mul_ps(k, _mm512_set1_ps(2.12194440e-4f)));
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(_mm512_mul_ps(p, r), r), r), _mm512_set1_ps(1.0f));
    __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(k), _mm512_set1_epi32(127)), 23);
    __m512 e = _mm512_mul_ps(p, _mm512_castsi512_ps(bits));
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, lo, _CMP_GE_OQ), e);
}
#endif

// The row's maximum of s[0..n).
inline float max_of(const float* s, long n) {
    float m = -FLT_MAX;
    long t = 0;
#if defined(__AVX512F__)
    __m512 mv = _mm512_set1_ps(-FLT_MAX);
    for (; t + 16 <= n; t += 16) mv = _mm512_max_ps(mv, _mm512_loadu_ps(s + t));
    m = _mm512_reduce_max_ps(mv);
#endif
#pragma omp simd reduction(max : m)
    for (long u = t; u < n; u++) m = s[u] > m ? s[u] : m;
    return m;
}

// s[t] = exp(s[t] - m) in place; their sum.
inline float exp_sum(float* s, long n, float m) {
    float z = 0.0f;
    long t = 0;
#if defined(__AVX512F__)
    const __m512 mv = _mm512_set1_ps(m);
    __m512 zv = _mm512_setzero_ps();
    for (; t + 16 <= n; t += 16) {
        __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(s + t), mv));
        _mm512_storeu_ps(s + t, e);
        zv = _mm512_add_ps(zv, e);
    }
    z = _mm512_reduce_add_ps(zv);
#endif
    float zt = 0.0f;
#pragma omp simd reduction(+ : zt)
    for (long u = t; u < n; u++) {
        s[u] = exp_nonpositive(s[u] - m);
        zt += s[u];
    }
    return z + zt;
}

#if defined(__AVX512F__)
// The sums of four vectors' lanes: [sum a, sum b, sum c, sum d].
inline __m128 reduce4(__m512 a, __m512 b, __m512 c, __m512 d) {
    __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
    __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
    __m512 lo = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(ab), _mm512_castps_pd(cd)));
    __m512 hi = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(ab), _mm512_castps_pd(cd)));
    __m512 w = _mm512_add_ps(lo, hi);  // each 128-bit lane: its part of the four sums
    w = _mm512_add_ps(w, _mm512_shuffle_f32x4(w, w, _MM_SHUFFLE(2, 3, 0, 1)));
    w = _mm512_add_ps(w, _mm512_shuffle_f32x4(w, w, _MM_SHUFFLE(1, 0, 3, 2)));
    return _mm512_castps512_ps128(w);
}

// Dot products of one query with four consecutive key rows (D apart).
template <typename T, int D> inline __m128 dot4(const float* q, const T* k) {
    __m512 a[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                   _mm512_setzero_ps()};
#if defined(__AVX512BF16__)
    if constexpr (sizeof(T) == 2 && D % 32 == 0) {
        // bf16 pairs straight into float32 sums: the query is bf16-exact already
        for (int i = 0; i < D / 32; i++) {
            __m512bh qb = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(q + 32 * i + 16),
                                              _mm512_loadu_ps(q + 32 * i));
            for (int r = 0; r < 4; r++) {
                __m512i kr = _mm512_loadu_si512(reinterpret_cast<const void*>(k + r * D + 32 * i));
                a[r] = _mm512_dpbf16_ps(a[r], qb, reinterpret_cast<__m512bh&>(kr));
            }
        }
        return reduce4(a[0], a[1], a[2], a[3]);
    }
#endif
    for (int i = 0; i < D / 16; i++) {
        const __m512 qv = _mm512_loadu_ps(q + 16 * i);
        for (int r = 0; r < 4; r++) a[r] = _mm512_fmadd_ps(qv, agentr1::load16(k + r * D + 16 * i), a[r]);
    }
    return reduce4(a[0], a[1], a[2], a[3]);
}

// out[g][0..D) = sum over attended t of p[g][t] * v[t, 0..D) for GC queries at once (each
// value row loaded and widened once); p rows ``stride`` apart.
template <typename T, int D, int GC>
inline void weighted_sums(float* out, const float* p, long stride, const T* v, const uint8_t* att,
                          long n) {
    __m512 acc[GC][D / 16];
    for (int g = 0; g < GC; g++)
        for (int i = 0; i < D / 16; i++) acc[g][i] = _mm512_setzero_ps();
    for (long t = 0; t < n; t++) {
        if (!att[t]) continue;
        __m512 row[D / 16];
        for (int i = 0; i < D / 16; i++) row[i] = agentr1::load16(v + t * D + 16 * i);
        for (int g = 0; g < GC; g++) {
            const __m512 pv = _mm512_set1_ps(p[g * stride + t]);
            for (int i = 0; i < D / 16; i++) acc[g][i] = _mm512_fmadd_ps(pv, row[i], acc[g][i]);
        }
    }
    for (int g = 0; g < GC; g++)
        for (int i = 0; i < D / 16; i++) _mm512_storeu_ps(out + g * D + 16 * i, acc[g][i]);
}
#endif

// Element d of a head after rotary (step 1), each of its three operations rounded to T.
template <typename T> inline float rotated(const T* x, const T* c, const T* sn, int d, int half) {
    const int other = d < half ? d + half : d - half;
    float a = rounded<T>(load(x[d]) * load(c[d]));
    float r = rounded<T>(load(x[other]) * load(sn[d]));
    return rounded<T>(a + r);
}

struct Scratch {
    std::vector<float> q, acc, s;
};

// Steps 1-3 for one (row, key head) pair; D is a template argument for the common head
// sizes (0 = the runtime ``d``).
template <typename T, int DC>
void pair(const T* x, const T* c, const T* sn, T* kb, T* vb, long n, const uint8_t* att, T* o,
          int Q, int K, int G, long h, int d_runtime, float scale, Scratch& w) {
    const int D = DC ? DC : d_runtime;
    const int half = D / 2;
    const long cols = n + 1;
    float* qf = w.q.data();
    for (int g = 0; g < G; g++) {
        const T* xq = x + (h * G + g) * D;
        for (int d = 0; d < D; d++) qf[g * D + d] = rotated(xq, c, sn, d, half);
    }
    const T* xk = x + long(Q + h) * D;
    const T* xv = x + long(Q + K + h) * D;
    for (int d = 0; d < D; d++) {
        kb[n * D + d] = store<T>(rotated(xk, c, sn, d, half));
        vb[n * D + d] = xv[d];
    }
    float* s_all = w.s.data();
    for (int g = 0; g < G; g++) {
        const float* qg = qf + g * D;
        float* sg = s_all + g * cols;
        long t = 0;
#if defined(__AVX512F__)
        if constexpr (DC != 0 && DC % 16 == 0) {
            // four columns at a time, masked ones included (their scores are replaced, so
            // whatever a padding column holds never reaches the result)
            for (; t + 4 <= cols; t += 4) {
                __m128 v = _mm_mul_ps(dot4<T, DC>(qg, kb + t * DC), _mm_set1_ps(scale));
                _mm_storeu_ps(sg + t, v);
            }
        }
#endif
        for (; t < cols; t++) {
            float v = 0.0f;
            if constexpr (DC != 0) v = dot<T, DC>(qg, kb + t * DC);
            else
                for (int d = 0; d < D; d++) v += qg[d] * load(kb[t * D + d]);
            sg[t] = v * scale;
        }
        for (t = 0; t < cols; t++)
            if (!att[t]) sg[t] = -FLT_MAX;  // exp underflows to 0
        const float z = exp_sum(sg, cols, max_of(sg, cols));
        const float inv = z > 0.0f ? 1.0f / z : 0.0f;
        for (t = 0; t < cols; t++) sg[t] *= inv;  // probabilities
    }
    // the weighted sums of the values: each value row read once for several queries
    float* ag = w.acc.data();
    int g = 0;
#if defined(__AVX512F__)
    if constexpr (DC != 0 && DC % 16 == 0 && DC <= 128) {
        constexpr int GC = DC <= 32 ? 4 : DC <= 64 ? 3 : 2;  // accumulators in registers
        for (; g + GC <= G; g += GC)
            weighted_sums<T, DC, GC>(ag + g * DC, s_all + g * cols, cols, vb, att, cols);
        for (; g < G; g++)
            weighted_sums<T, DC, 1>(ag + g * DC, s_all + g * cols, cols, vb, att, cols);
    }
#endif
    for (; g < G; g++) {
        float* a = ag + g * D;
        const float* sg = s_all + g * cols;
        for (int d = 0; d < D; d++) a[d] = 0.0f;
        for (long t = 0; t < cols; t++) {
            if (!att[t]) continue;
            for (int d = 0; d < D; d++) a[d] += sg[t] * load(vb[t * D + d]);
        }
    }
    for (int i = 0; i < G * D; i++) o[i] = store<T>(ag[i]);
}

template <typename T>
int attention(const T* qkv, long qkv_sb, const T* cos, const T* sin, long rot_sb, T* kbuf,
              T* vbuf, long kv_sb, long kv_sh, long n, const uint8_t* attend, long att_sb,
              T* out, int B, int Q, int K, int D, float scale) {
    const int G = Q / K;
    int failed = 0;
#pragma omp parallel reduction(| : failed)
    {
        Scratch w;
        try {
            w.q.resize(size_t(G) * D);
            w.acc.resize(size_t(G) * D);
            w.s.resize(size_t(G) * size_t(n + 1));
        } catch (...) {
            failed = 1;
        }
#pragma omp for schedule(static)
        for (long bh = 0; bh < long(B) * K; bh++) {
            if (failed) continue;
            const long b = bh / K, h = bh % K;
            const T* x = qkv + b * qkv_sb;
            const T* c = cos + b * rot_sb;
            const T* sn = sin + b * rot_sb;
            T* kb = kbuf + b * kv_sb + h * kv_sh;
            T* vb = vbuf + b * kv_sb + h * kv_sh;
            const uint8_t* att = attend + b * att_sb;
            T* o = out + (b * Q + h * G) * long(D);
            switch (D) {
                case 32: pair<T, 32>(x, c, sn, kb, vb, n, att, o, Q, K, G, h, D, scale, w); break;
                case 64: pair<T, 64>(x, c, sn, kb, vb, n, att, o, Q, K, G, h, D, scale, w); break;
                case 128: pair<T, 128>(x, c, sn, kb, vb, n, att, o, Q, K, G, h, D, scale, w); break;
                default: pair<T, 0>(x, c, sn, kb, vb, n, att, o, Q, K, G, h, D, scale, w);
            }
        }
    }
    return failed;
}

}  // namespace

#define AGENTR1_EXPORT(NAME, T)                                                             \
    extern "C" int NAME(const T* qkv, long qkv_sb, const T* cos, const T* sin, long rot_sb, \
                        T* kbuf, T* vbuf, long kv_sb, long kv_sh, long n,                   \
                        const uint8_t* attend, long att_sb, T* out, int B, int Q, int K,    \
                        int D, float scale) {                                               \
        return attention<T>(qkv, qkv_sb, cos, sin, rot_sb, kbuf, vbuf, kv_sb, kv_sh, n,     \
                            attend, att_sb, out, B, Q, K, D, scale);                        \
    }

AGENTR1_EXPORT(agentr1_decode_attention_bf16, bf16)
AGENTR1_EXPORT(agentr1_decode_attention_f32, float)
