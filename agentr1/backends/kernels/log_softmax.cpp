// The LM head's log-softmax over float32 logits, forward and backward, one row at a time
// (agentr1/trainer/logprobs.py, `HeadLogprobs`).
//
// Forward: per row of z (the logits at the sampling temperature), lse = log sum exp z,
// the target's log-prob z[t] - lse and, when asked, the entropy H = lse - sum p z. Two
// passes over the row (its max, then the sums), where torch's logsumexp, gather and
// softmax make and read several [N, V] temporaries.
//
// Backward: the row's gradient with respect to z, written over z itself:
//   dz_j = -p_j (g_lp + g_ent (z_j - lse + H)) + g_lp [j = t],   p_j = exp(z_j - lse)
// times `scale` (the inverse temperature, so the result is the gradient with respect to
// the unscaled logits). One pass, where autograd's backward of logsumexp and gather
// allocates, fills, subtracts, exponentiates and multiplies whole [N, V] tensors.
//
// Built by agentr1/backends/native.py with the machine's C++ compiler (-O3 -march=native
// -fopenmp where it compiles); AVX-512 where the compiler targets it, plain loops
// computing the same elsewhere (exp as bf16.h's exp1, so the compiler vectorizes them).
// Rows run in parallel on torch's OpenMP threads.
#include <cmath>
#include <cstdint>

#include "bf16.h"

namespace {

#if defined(__AVX512F__)
using agentr1::exp16;
#endif

// max, then sum exp(z - max) and (with entropy) sum exp(z - max) * z.
void row_forward(const float* z, long V, long t, float* lse, float* lp, float* ent) {
    float m = -INFINITY;
    bool nan = false;  // max and exp16's clamps would pass over a NaN: look for one
    long j = 0;
#if defined(__AVX512F__)
    __m512 vm = _mm512_set1_ps(-INFINITY);
    __mmask16 unordered = 0;
    for (; j + 16 <= V; j += 16) {
        const __m512 x = _mm512_loadu_ps(z + j);
        vm = _mm512_max_ps(vm, x);
        unordered |= _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    }
    m = _mm512_reduce_max_ps(vm);
    nan = unordered != 0;
#endif
    bool tail_nan = false;
#pragma omp simd reduction(max : m) reduction(| : tail_nan)
    for (long jj = j; jj < V; ++jj) {
        m = z[jj] > m ? z[jj] : m;
        tail_nan |= z[jj] != z[jj];
    }
    nan |= tail_nan;
    if (nan || !std::isfinite(m)) {  // NaN or +inf in the row, or nothing possible
        *lse = *lp = NAN;
        if (ent) *ent = NAN;
        return;
    }
    float s = 0.f, sz = 0.f;
    j = 0;
#if defined(__AVX512F__)
    __m512 vs = _mm512_setzero_ps(), vsz = _mm512_setzero_ps();
    const __m512 vmax = _mm512_set1_ps(m);
    for (; j + 16 <= V; j += 16) {
        const __m512 x = _mm512_loadu_ps(z + j);
        const __m512 e = exp16(_mm512_sub_ps(x, vmax));
        vs = _mm512_add_ps(vs, e);
        if (ent) vsz = _mm512_fmadd_ps(e, x, vsz);
    }
    s = _mm512_reduce_add_ps(vs);
    sz = _mm512_reduce_add_ps(vsz);
#endif
    double ts = 0.0, tsz = 0.0;  // the rest (all of it without AVX-512), in double lanes
#pragma omp simd reduction(+ : ts, tsz)
    for (long jj = j; jj < V; ++jj) {
        const float e = agentr1::exp1(z[jj] - m);
        ts += e;
        tsz += double(e) * z[jj];
    }
    s = float(s + ts);
    sz = float(sz + tsz);
    *lse = m + std::log(s);
    *lp = z[t] - *lse;
    if (ent) *ent = *lse - sz / s;
}

void row_backward(float* z, long V, long t, float lse, float h, float g_lp, float g_ent,
                  bool with_ent, float scale) {
    long j = 0;
    // dz_j = -p_j (a + b z_j) + g_lp [j = t], with a = g_lp + b (H - lse), b = g_ent
    const float b = with_ent ? g_ent : 0.f;
    const float a = g_lp + b * (h - lse);
#if defined(__AVX512F__)
    const __m512 vl = _mm512_set1_ps(lse), va = _mm512_set1_ps(a), vb = _mm512_set1_ps(b);
    const __m512 vscale = _mm512_set1_ps(-scale);
    for (; j + 16 <= V; j += 16) {
        const __m512 x = _mm512_loadu_ps(z + j);
        const __m512 p = exp16(_mm512_sub_ps(x, vl));
        const __m512 c = _mm512_fmadd_ps(vb, x, va);
        _mm512_storeu_ps(z + j, _mm512_mul_ps(_mm512_mul_ps(p, c), vscale));
    }
#endif
#pragma omp simd
    for (long jj = j; jj < V; ++jj) {
        const float p = agentr1::exp1(z[jj] - lse);
        z[jj] = (p * std::fma(b, z[jj], a)) * -scale;  // as the 16 lanes compute it
    }
    z[t] += g_lp * scale;
}

// f(i, t) for each row i whose target t is in the vocabulary, rows in parallel; 1 when a
// target is outside it (that row untouched), else 0.
template <typename F> int each_row(long N, long V, const int64_t* targets, F f) {
    int bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad)
    for (long i = 0; i < N; ++i) {
        const long t = long(targets[i]);
        if (t < 0 || t >= V) {
            bad |= 1;
            continue;
        }
        f(i, t);
    }
    return bad;
}

}  // namespace

extern "C" {

// z: [N, V] rows `ldz` floats apart; targets [N]; lse, lp [N]; ent [N] or null.
int agentr1_log_softmax_forward(const float* z, long N, long V, long ldz, const int64_t* targets,
                                float* lse, float* lp, float* ent) {
    return each_row(N, V, targets, [&](long i, long t) {
        row_forward(z + i * ldz, V, t, lse + i, lp + i, ent ? ent + i : nullptr);
    });
}

// Overwrites z with the gradient with respect to the unscaled logits (see above).
// ent and g_ent both null, or both given.
int agentr1_log_softmax_backward(float* z, long N, long V, long ldz, const int64_t* targets,
                                 const float* lse, const float* ent, const float* g_lp,
                                 const float* g_ent, float scale) {
    const bool with_ent = ent != nullptr && g_ent != nullptr;
    return each_row(N, V, targets, [&](long i, long t) {
        row_backward(z + i * ldz, V, t, lse[i], with_ent ? ent[i] : 0.f, g_lp[i],
                     with_ent ? g_ent[i] : 0.f, with_ent, scale);
    });
}

}  // extern "C"
