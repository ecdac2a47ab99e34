// The SiLU gate of a Llama-style MLP over float32 tensors, forward and backward, for the
// trainer's passes (agentr1/backends/native.py, `SiluGate`; agentr1/trainer/fused.py).
//
// Forward: y = silu(g) * u, silu(g) = g s with s = 1 / (1 + exp(-g)); one pass where
// torch runs silu and a product, each reading and writing the whole [N, I] tensor.
//
// Backward, with dy the gradient of y:
//   du = dy silu(g),   dg = dy u (s + silu(g) (1 - s))
// one pass where torch's autograd runs a product for du, another for silu's gradient
// input and silu_backward, and keeps silu(g) from the forward as well.
//
// bfloat16 tensors (the trainer's passes under bf16 autocast) take the `_bf16` entry points:
// float32 arithmetic on the widened values, each result rounded as torch's bf16 ops round
// theirs (silu(g) rounded before the product; dy u rounded before silu's gradient), so
// the two differ by exp's rounding only.
//
// exp is Cephes' (bf16.h's exp16 on 16 lanes where the compiler targets AVX-512, its
// one-lane twin exp1 in loops the compiler vectorizes elsewhere, e.g. AVX2: the same bits
// either way; both clamp the argument to [-87, 88]: s is then 0 or 1 to float precision,
// as it would be). A NaN in g stays NaN in y, dg and du (it multiplies them).
//
// Built by agentr1/backends/native.py with the machine's C++ compiler (-O3 -march=native
// -fopenmp where it compiles); blocks of the tensor in parallel on torch's OpenMP threads.
#include <cmath>

#include "bf16.h"

namespace {

constexpr long BLOCK = 4096;  // elements a task: a few pages of each tensor

#if defined(__AVX512F__)
inline __m512 sigmoid16(__m512 g) {
    const __m512 one = _mm512_set1_ps(1.f);
    const __m512 e = agentr1::exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
    return _mm512_div_ps(one, _mm512_add_ps(one, e));
}
#endif

inline float sigmoid(float g) { return 1.f / (1.f + agentr1::exp1(-g)); }

template <typename F> void blocks(long n, F f) {
    const long nb = (n + BLOCK - 1) / BLOCK;
#pragma omp parallel for schedule(static)
    for (long b = 0; b < nb; ++b) {
        const long lo = b * BLOCK;
        f(lo, lo + BLOCK < n ? lo + BLOCK : n);
    }
}

using agentr1::bf16;
using agentr1::load;
using agentr1::rounded;
using agentr1::to_bf16;

}  // namespace

extern "C" {

// The same over bfloat16 tensors (see the header); y may be g or u.
void agentr1_silu_gate_forward_bf16(const bf16* g, const bf16* u, long n, bf16* y) {
    blocks(n, [&](long lo, long hi) {
        long i = lo;
#if defined(__AVX512F__)
        for (; i + 16 <= hi; i += 16) {
            const __m512 vg = agentr1::load16(g + i);
            const __m512 silu =
                agentr1::widen16(agentr1::to_bf16x16(_mm512_mul_ps(vg, sigmoid16(vg))));
            const __m512 vy = _mm512_mul_ps(silu, agentr1::load16(u + i));
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i), agentr1::to_bf16x16(vy));
        }
#endif
#pragma omp simd
        for (long ii = i; ii < hi; ++ii) {
            const float gi = load(g[ii]);
            y[ii] = to_bf16(rounded<bf16>(gi * sigmoid(gi)) * load(u[ii]));
        }
    });
}

// dg may be g, du may be u: each element is read before it is written.
void agentr1_silu_gate_backward_bf16(const bf16* g, const bf16* u, const bf16* dy, long n,
                                     bf16* dg, bf16* du) {
    blocks(n, [&](long lo, long hi) {
        long i = lo;
#if defined(__AVX512F__)
        const __m512 one = _mm512_set1_ps(1.f);
        for (; i + 16 <= hi; i += 16) {
            const __m512 vg = agentr1::load16(g + i);
            const __m512 vdy = agentr1::load16(dy + i);
            const __m512 s = sigmoid16(vg);
            const __m512 silu = agentr1::widen16(agentr1::to_bf16x16(_mm512_mul_ps(vg, s)));
            const __m512 a =
                agentr1::widen16(agentr1::to_bf16x16(_mm512_mul_ps(vdy, agentr1::load16(u + i))));
            // silu's gradient as torch's silu_backward: a s (1 + g (1 - s))
            const __m512 d = _mm512_mul_ps(
                _mm512_mul_ps(a, s), _mm512_add_ps(one, _mm512_mul_ps(vg, _mm512_sub_ps(one, s))));
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(du + i),
                                agentr1::to_bf16x16(_mm512_mul_ps(vdy, silu)));
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(dg + i), agentr1::to_bf16x16(d));
        }
#endif
#pragma omp simd
        for (long ii = i; ii < hi; ++ii) {
            const float gi = load(g[ii]);
            const float s = sigmoid(gi);
            const float silu = rounded<bf16>(gi * s);
            const float a = rounded<bf16>(load(dy[ii]) * load(u[ii]));
            const bf16 dui = to_bf16(load(dy[ii]) * silu);
            dg[ii] = to_bf16(a * s * (1.f + gi * (1.f - s)));
            du[ii] = dui;
        }
    });
}

// g, u, y: n contiguous floats each (y may be g or u).
void agentr1_silu_gate_forward(const float* g, const float* u, long n, float* y) {
    blocks(n, [&](long lo, long hi) {
        long i = lo;
#if defined(__AVX512F__)
        for (; i + 16 <= hi; i += 16) {
            const __m512 vg = _mm512_loadu_ps(g + i);
            const __m512 silu = _mm512_mul_ps(vg, sigmoid16(vg));
            _mm512_storeu_ps(y + i, _mm512_mul_ps(silu, _mm512_loadu_ps(u + i)));
        }
#endif
#pragma omp simd
        for (long ii = i; ii < hi; ++ii) y[ii] = g[ii] * sigmoid(g[ii]) * u[ii];
    });
}

// g, u: the forward's inputs; dy: the gradient of y; dg, du: n floats each (dg may be g,
// du may be u: each element is read before it is written).
void agentr1_silu_gate_backward(const float* g, const float* u, const float* dy, long n, float* dg,
                                float* du) {
    blocks(n, [&](long lo, long hi) {
        long i = lo;
#if defined(__AVX512F__)
        const __m512 one = _mm512_set1_ps(1.f);
        for (; i + 16 <= hi; i += 16) {
            const __m512 vg = _mm512_loadu_ps(g + i);
            const __m512 vu = _mm512_loadu_ps(u + i);
            const __m512 vdy = _mm512_loadu_ps(dy + i);
            const __m512 s = sigmoid16(vg);
            const __m512 silu = _mm512_mul_ps(vg, s);
            const __m512 dsilu = _mm512_add_ps(s, _mm512_mul_ps(silu, _mm512_sub_ps(one, s)));
            _mm512_storeu_ps(du + i, _mm512_mul_ps(vdy, silu));
            _mm512_storeu_ps(dg + i, _mm512_mul_ps(_mm512_mul_ps(vdy, vu), dsilu));
        }
#endif
#pragma omp simd
        for (long ii = i; ii < hi; ++ii) {
            const float s = sigmoid(g[ii]);
            const float silu = g[ii] * s;
            const float gi = dy[ii] * u[ii] * (s + silu * (1.f - s));
            du[ii] = dy[ii] * silu;
            dg[ii] = gi;
        }
    });
}

}  // extern "C"
