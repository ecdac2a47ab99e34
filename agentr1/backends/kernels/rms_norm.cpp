// RMSNorm over float32 rows, forward and backward, for the trainer's passes
// (agentr1/backends/native.py, `RMSNorm`; agentr1/trainer/fused.py).
//
// Forward: per row x of H values, r = 1 / sqrt(sum(x^2) / H + eps) and y = w * (x * r),
// the products of transformers' Llama / Qwen2 RMSNorm in float32. One pass to sum, one to
// write, where torch's ops (pow, mean, add, rsqrt, two products) each read and write the
// whole [N, H] tensor, and their backward about twice as many.
//
// Backward, with g the gradient of y:
//   dx_j = r (w_j g_j) - r^3 x_j (sum_k w_k g_k x_k) / H
//   dw_j = sum over rows of g_j x_j r
// one pass over a row for its dot product, one to write dx; dw is summed on each thread
// then added up (rows in parallel on torch's OpenMP threads).
//
// Built by agentr1/backends/native.py with the machine's C++ compiler (-O3 -march=native
// -fopenmp where it compiles); plain loops the compiler vectorizes.
#include <cmath>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace {

float row_scale(const float* x, long H, float eps) {
    float s = 0.f;
#pragma omp simd reduction(+ : s)
    for (long j = 0; j < H; ++j) s += x[j] * x[j];
    return 1.f / std::sqrt(s / float(H) + eps);
}

}  // namespace

extern "C" {

// x, y: [N, H] rows `ld` floats apart (y may be x); w: [H]; r: [N] (the scales, for the
// backward).
void agentr1_rms_norm_forward(const float* x, long N, long H, long ldx, const float* w, float eps,
                              float* y, long ldy, float* r) {
#pragma omp parallel for schedule(static)
    for (long i = 0; i < N; ++i) {
        const float* xi = x + i * ldx;
        float* yi = y + i * ldy;
        const float ri = row_scale(xi, H, eps);
        r[i] = ri;
#pragma omp simd
        for (long j = 0; j < H; ++j) yi[j] = w[j] * (xi[j] * ri);
    }
}

// g: [N, H] the gradient of y; r: the forward's scales; dx: [N, H] (may be g); dw: [H],
// written (not accumulated), or null when the weight needs no gradient.
void agentr1_rms_norm_backward(const float* x, const float* g, long N, long H, long ldx,
                               long ldg, const float* w, const float* r, float* dx, long lddx,
                               float* dw) {
    if (dw)
        for (long j = 0; j < H; ++j) dw[j] = 0.f;
#pragma omp parallel
    {
        std::vector<float> part(dw ? H : 0, 0.f);
#pragma omp for schedule(static)
        for (long i = 0; i < N; ++i) {
            const float* xi = x + i * ldx;
            const float* gi = g + i * ldg;
            const float ri = r[i];
            if (dw) {
                float* p = part.data();
#pragma omp simd
                for (long j = 0; j < H; ++j) p[j] += gi[j] * (xi[j] * ri);
            }
            float dot = 0.f;
#pragma omp simd reduction(+ : dot)
            for (long j = 0; j < H; ++j) dot += w[j] * gi[j] * xi[j];
            const float c = ri * ri * ri * dot / float(H);
            float* di = dx + i * lddx;
#pragma omp simd
            for (long j = 0; j < H; ++j) di[j] = ri * (w[j] * gi[j]) - c * xi[j];
        }
        if (dw) {
#pragma omp critical
            for (long j = 0; j < H; ++j) dw[j] += part[j];
        }
    }
}

}  // extern "C"
