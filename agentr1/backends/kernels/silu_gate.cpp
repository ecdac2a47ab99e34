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
// exp is Cephes' on 16 lanes where the compiler targets AVX-512 (bf16.h's exp16, which
// clamps its argument to [-87, 88]: s is then 0 or 1 to float precision, as it would be),
// std::exp elsewhere. A NaN in g stays NaN in y, dg and du (it multiplies them).
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

inline float sigmoid(float g) { return 1.f / (1.f + std::exp(-g)); }

template <typename F> void blocks(long n, F f) {
    const long nb = (n + BLOCK - 1) / BLOCK;
#pragma omp parallel for schedule(static)
    for (long b = 0; b < nb; ++b) {
        const long lo = b * BLOCK;
        f(lo, lo + BLOCK < n ? lo + BLOCK : n);
    }
}

}  // namespace

extern "C" {

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
        for (; i < hi; ++i) y[i] = g[i] * sigmoid(g[i]) * u[i];
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
        for (; i < hi; ++i) {
            const float s = sigmoid(g[i]);
            const float silu = g[i] * s;
            const float gi = dy[i] * u[i] * (s + silu * (1.f - s));
            du[i] = dy[i] * silu;
            dg[i] = gi;
        }
    });
}

}  // extern "C"
