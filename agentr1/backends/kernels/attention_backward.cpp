// The backward of bf16 grouped-query attention on AMX tiles, for the trainer
// (agentr1/backends/attention.py, `TrainAttention`): torch's CPU flash kernel computes the
// forward and its log-sum-exp; this computes dq, dk, dv from them. torch's own CPU
// backward runs its block products as separate small GEMM calls with the softmax between
// them and takes 5-8x the forward's time; this keeps every product on tiles.
//
// Per (row b, key/value head h), the heads of its group g = 0 .. G - 1 (query head
// j = h * G + g), per strip of 32 queries of one head against every key they see, all in
// key-major layout (keys down, the strip's 32 queries across), so that no matrix is
// transposed on the way:
//   1. S^T = K Q^T and dP^T = V dO^T, 16 keys at a time, float32 (TDPBF16PS over D);
//   2. P^T = exp(scale S^T - lse[q]) where query q sees the key (0 elsewhere), and
//      dS^T = P^T (dP^T - delta[q]) with delta[q] = dO[q] . O[q]; both rounded to bf16;
//   3. dV += P^T dO and dK += dS^T Q into float32 accumulators of the (b, h) pair;
//   4. dQ^T = K^T dS^T for the strip (it sees all its keys at once), scaled and rounded.
// dK is scaled and rounded, dV rounded, once every strip of the pair has added to them.
//
// Which keys a query sees: with `mask` (uint8 [S, T] per row, row stride m_sb, 0 for one
// shared by every row; nonzero = attend), exactly those; without, causally, query s at
// column T - S + s seeing every column up to its own. A query that sees nothing (its
// log-sum-exp not finite) gets zero gradients and gives none.
//
// Layouts: q, o, dout [B, Q, S, D]; k, v [B, K, T, D]; each with its own (batch, head,
// position) strides in `st` (15 element strides: q, k, v, o, dout), the last dimension
// contiguous; lse float32 [B, Q, S] contiguous; dq [B, Q, S, D], dk and dv [B, K, T, D]
// contiguous. Returns 0; 1 when scratch memory could not be allocated; 3 where this build
// or process has no AMX, or D is not a multiple of 32 (the caller keeps torch's backward).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "bf16.h"

#include "amx.h"

namespace {

using agentr1::bf16;

#if defined(AGENTR1_AMX)
constexpr int QS = 32;  // queries a strip
constexpr int KB = 16;  // keys a block

// Every tile 16 rows of 64 bytes: 0-3 sums, 4 and 6 A operands, 5 and 7 B operands.
inline void configure() { agentr1::configure_tiles(16, 8, 0xffu); }

using agentr1::bf16x16;

// Rows [n, D] (row stride `ld`) as B tiles of x^T: [NP/16 blocks][D/2 pairs][16][2]; rows
// past n zeros.
void pack_pairs_of_d(const bf16* x, long ld, long n, long NP, long D, bf16* out) {
    const long P = D / 2;
    uint32_t* o32 = reinterpret_cast<uint32_t*>(out);
    for (long blk = 0; blk < NP / 16; blk++)
        for (int i = 0; i < 16; i++) {
            const long r = blk * 16 + i;
            uint32_t* o = o32 + blk * P * 16 + i;
            const uint32_t* x32 = reinterpret_cast<const uint32_t*>(x + r * ld);
            if (r < n) {
                for (long p = 0; p < P; p++) o[p * 16] = x32[p];
            } else {
                for (long p = 0; p < P; p++) o[p * 16] = 0;
            }
        }
}

// Rows [n, D] as B tiles of products reducing over the rows: [NP/2 pairs][D][2] (rows 2m
// and 2m + 1 interleaved); rows past n zeros.
void pack_pairs_of_rows(const bf16* x, long ld, long n, long NP, long D, bf16* out) {
    for (long m = 0; m < NP / 2; m++) {
        const bool a = 2 * m < n, b = 2 * m + 1 < n;
        for (long d = 0; d < D; d += 16) {
            const __m512i lo = a ? _mm512_cvtepu16_epi32(_mm256_loadu_si256(
                                       reinterpret_cast<const __m256i*>(x + 2 * m * ld + d)))
                                 : _mm512_setzero_si512();
            const __m512i hi = b ? _mm512_cvtepu16_epi32(_mm256_loadu_si256(
                                       reinterpret_cast<const __m256i*>(x + (2 * m + 1) * ld + d)))
                                 : _mm512_setzero_si512();
            _mm512_storeu_si512(out + (m * D + d) * 2, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
        }
    }
}

// Rows [n, D] copied into [NP, D] (zeros past n).
void copy_rows(const bf16* x, long ld, long n, long NP, long D, bf16* out) {
    for (long r = 0; r < NP; r++) {
        if (r < n)
            std::memcpy(out + r * D, x + r * ld, size_t(D) * 2);
        else
            std::memset(out + r * D, 0, size_t(D) * 2);
    }
}

struct Scratch {
    std::vector<bf16> kr, vr, kt, qd, dod, qr, dor;
    std::vector<float> delta, lse, dk, dv, st, dpt, dqt;
    std::vector<bf16> pt, dst, dstv;
};

template <typename V> void grow(V& v, size_t n) {
    if (v.size() < n) v.resize(n);
}

struct Call {
    const bf16 *q, *k, *v, *o, *dout;
    const long* st;
    const float* lse;
    const uint8_t* mask;
    long m_sb;
    bf16 *dq, *dk, *dv;
    long B, S, T, Q, K, D;
    float scale;
    const uint8_t* maskt;  // per mask row: [TP, SP], nonzero = query s sees key t
    const long* last;      // per mask row: [S], the last key each query sees (-1: none)
};

// Mask row `m` ([S, T], or none: causal) as `last` and, with a mask, `maskt`.
void sights(const uint8_t* m, long S, long T, long SP, long TP, uint8_t* maskt, long* last) {
    for (long s = 0; s < S; s++) {
        long l = T - S + s;
        if (m) {
            l = -1;
            for (long t = T - 1; t >= 0; t--)
                if (m[s * T + t]) {
                    l = t;
                    break;
                }
        }
        last[s] = l;
    }
    if (!m) return;
    // 16 queries' bytes of one key gathered at a time (4 bytes read at each: the last 3
    // keys of a row one at a time, not to read past the mask)
    const __m512i rows = _mm512_mullo_epi32(
        _mm512_set1_epi32(int(T)),
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    std::memset(maskt, 0, size_t(TP) * SP);
    for (long s0 = 0; s0 < S; s0 += 16) {
        const long n = std::min<long>(16, S - s0);
        const __mmask16 in = n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1);
        for (long t = 0; t < T; t++) {
            if (t + 3 < T) {
                const __m512i g = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), in, rows,
                                                              m + s0 * T + t, 1);
                _mm_storeu_si128(reinterpret_cast<__m128i*>(maskt + t * SP + s0),
                                 _mm512_cvtepi32_epi8(_mm512_and_si512(g, _mm512_set1_epi32(0xff))));
            } else {
                for (long i = 0; i < n; i++) maskt[t * SP + s0 + i] = m[(s0 + i) * T + t];
            }
        }
    }
}

// One (row b, key head h) pair: every query head of its group, every strip.
void pair(const Call& c, long b, long h, Scratch& w) {
    const long S = c.S, T = c.T, D = c.D, G = c.Q / c.K;
    const long SP = (S + QS - 1) / QS * QS, TP = (T + 31) / 32 * 32;
    const long* st = c.st;
    // the pair's keys and values: rows (A of S^T, dP^T), K^T rows (A of dQ^T), K as pairs
    // of rows is not needed (dQ^T reduces over keys from dS^T's side)
    const bf16* kb = c.k + b * st[3] + h * st[4];
    const bf16* vb = c.v + b * st[6] + h * st[7];
    copy_rows(kb, st[5], T, TP, D, w.kr.data());
    copy_rows(vb, st[8], T, TP, D, w.vr.data());
    for (long d = 0; d < D; d++)
        for (long t = 0; t < TP; t++) w.kt[d * TP + t] = t < T ? kb[t * st[5] + d] : bf16(0);
    std::fill(w.dk.begin(), w.dk.begin() + TP * D, 0.0f);
    std::fill(w.dv.begin(), w.dv.begin() + TP * D, 0.0f);
    // which keys each query sees: the last one (-1: none), and with a mask its transpose
    const long row = c.m_sb ? b : 0;
    const uint8_t* m = c.mask ? c.maskt + row * TP * SP : nullptr;
    const long* last = c.last + row * S;
    for (long g = 0; g < G; g++) {
        const long j = h * G + g;
        const bf16* qb = c.q + b * st[0] + j * st[1];
        const bf16* ob = c.o + b * st[9] + j * st[10];
        const bf16* gb = c.dout + b * st[12] + j * st[13];
        const float* lb = c.lse + (b * c.Q + j) * S;
        pack_pairs_of_d(qb, st[2], S, SP, D, w.qd.data());
        pack_pairs_of_d(gb, st[14], S, SP, D, w.dod.data());
        pack_pairs_of_rows(qb, st[2], S, SP, D, w.qr.data());
        pack_pairs_of_rows(gb, st[14], S, SP, D, w.dor.data());
        for (long s = 0; s < SP; s++) {
            float dl = 0.0f, l = INFINITY;  // l = +inf: p = 0 for the query
            if (s < S && last[s] >= 0 && std::isfinite(lb[s])) {
                __m512 acc = _mm512_setzero_ps();
                for (long d = 0; d < D; d += 16)
                    acc = _mm512_fmadd_ps(agentr1::load16(gb + s * st[14] + d),
                                          agentr1::load16(ob + s * st[11] + d), acc);
                dl = _mm512_reduce_add_ps(acc);
                l = lb[s];
            }
            w.delta[s] = dl;
            w.lse[s] = l * float(M_LOG2E);  // in base 2
        }
        for (long q0 = 0; q0 < S; q0 += QS) {
            long seen = -1;
            for (long s = q0; s < std::min(S, q0 + QS); s++) seen = std::max(seen, last[s]);
            if (seen < 0) {  // no query of the strip sees a key: zero dq
                for (long s = q0; s < std::min(S, q0 + QS); s++)
                    std::memset(c.dq + ((b * c.Q + j) * S + s) * D, 0, size_t(D) * 2);
                continue;
            }
            const long nblk = seen / KB + 1, nk32 = (nblk * KB + 31) / 32 * 32;
            // 1. S^T and dP^T, key block by key block
            for (long kbk = 0; kbk < nblk; kbk++) {
                _tile_zero(0);
                _tile_zero(1);
                _tile_zero(2);
                _tile_zero(3);
                for (long ds = 0; ds < D / 32; ds++) {
                    const bf16* b0 = w.qd.data() + ((q0 / 16) * (D / 2) + ds * 16) * 32;
                    const bf16* b1 = b0 + (D / 2) * 32;
                    const bf16* g0 = w.dod.data() + ((q0 / 16) * (D / 2) + ds * 16) * 32;
                    const bf16* g1 = g0 + (D / 2) * 32;
                    _tile_loadd(4, w.kr.data() + kbk * KB * D + ds * 32, D * 2);
                    _tile_loadd(5, b0, 64);
                    _tile_loadd(7, b1, 64);
                    _tile_dpbf16ps(0, 4, 5);
                    _tile_dpbf16ps(1, 4, 7);
                    _tile_loadd(6, w.vr.data() + kbk * KB * D + ds * 32, D * 2);
                    _tile_loadd(5, g0, 64);
                    _tile_loadd(7, g1, 64);
                    _tile_dpbf16ps(2, 6, 5);
                    _tile_dpbf16ps(3, 6, 7);
                }
                _tile_stored(0, w.st.data() + kbk * KB * QS, QS * 4);
                _tile_stored(1, w.st.data() + kbk * KB * QS + 16, QS * 4);
                _tile_stored(2, w.dpt.data() + kbk * KB * QS, QS * 4);
                _tile_stored(3, w.dpt.data() + kbk * KB * QS + 16, QS * 4);
            }
            // 2. P^T and dS^T (rows past the last block, up to a pair of blocks: zeros)
            const __m512 sv2 = _mm512_set1_ps(c.scale * float(M_LOG2E));
            for (long t = 0; t < nk32; t++) {
                for (int half = 0; half < 2; half++) {
                    const long s0 = q0 + half * 16;
                    __mmask16 see = 0;
                    if (t < nblk * KB && t < T) {
                        if (m) {
                            const __m128i a = _mm_loadu_si128(
                                reinterpret_cast<const __m128i*>(m + t * SP + s0));
                            see = _mm_cmpneq_epi8_mask(a, _mm_setzero_si128());
                        } else {
                            // query s sees t when t <= T - S + s, i.e. s >= t - (T - S)
                            const long from = std::max<long>(t - (T - S) - s0, 0);
                            see = from >= 16 ? 0 : __mmask16(0xffffu << from);
                            const long valid = std::min<long>(16, S - s0);
                            see &= valid >= 16 ? __mmask16(0xffff)
                                               : __mmask16(valid > 0 ? (1u << valid) - 1 : 0);
                        }
                    }
                    const long at = t * QS + half * 16;
                    __m512 p = _mm512_setzero_ps(), ds = _mm512_setzero_ps();
                    if (see) {
                        // exp(scale s - lse) = 2^(s scale log2(e) - lse log2(e)); a query
                        // that sees nothing has lse = +inf, so t = -inf
                        const __m512 t2 = _mm512_fmsub_ps(_mm512_loadu_ps(w.st.data() + at), sv2,
                                                          _mm512_loadu_ps(w.lse.data() + s0));
                        const __mmask16 under =
                            _mm512_cmp_ps_mask(t2, _mm512_set1_ps(-126.0f), _CMP_LT_OQ);
                        p = _mm512_maskz_mov_ps(see & ~under, agentr1::exp2_16(t2));
                        ds = _mm512_mul_ps(p, _mm512_sub_ps(_mm512_loadu_ps(w.dpt.data() + at),
                                                            _mm512_loadu_ps(w.delta.data() + s0)));
                    }
                    _mm256_storeu_si256(reinterpret_cast<__m256i*>(w.pt.data() + at), bf16x16(p));
                    _mm256_storeu_si256(reinterpret_cast<__m256i*>(w.dst.data() + at), bf16x16(ds));
                }
            }
            pack_pairs_of_rows(w.dst.data(), QS, nk32, nk32, QS, w.dstv.data());
            // 3. dV += P^T dO, dK += dS^T Q, 16 keys x 64 columns at a time
            const bf16* dor = w.dor.data() + (q0 / 2) * D * 2;
            const bf16* qr = w.qr.data() + (q0 / 2) * D * 2;
            for (long kbk = 0; kbk < nblk; kbk++)
                for (long c0 = 0; c0 < D; c0 += 64) {
                    const long nc = std::min<long>(4, (D - c0) / 16);
                    for (int which = 0; which < 2; which++) {
                        float* acc = (which ? w.dk.data() : w.dv.data()) + kbk * KB * D + c0;
                        const bf16* a = (which ? w.dst.data() : w.pt.data()) + kbk * KB * QS;
                        const bf16* bm = (which ? qr : dor) + c0 * 2;
                        _tile_loadd(4, a, QS * 2);
                        _tile_loadd(0, acc, D * 4);
                        _tile_loadd(5, bm, D * 2 * 2);
                        _tile_dpbf16ps(0, 4, 5);
                        _tile_stored(0, acc, D * 4);
                        if (nc > 1) {
                            _tile_loadd(1, acc + 16, D * 4);
                            _tile_loadd(7, bm + 32, D * 2 * 2);
                            _tile_dpbf16ps(1, 4, 7);
                            _tile_stored(1, acc + 16, D * 4);
                        }
                        if (nc > 2) {
                            _tile_loadd(2, acc + 32, D * 4);
                            _tile_loadd(5, bm + 64, D * 2 * 2);
                            _tile_dpbf16ps(2, 4, 5);
                            _tile_stored(2, acc + 32, D * 4);
                        }
                        if (nc > 3) {
                            _tile_loadd(3, acc + 48, D * 4);
                            _tile_loadd(7, bm + 96, D * 2 * 2);
                            _tile_dpbf16ps(3, 4, 7);
                            _tile_stored(3, acc + 48, D * 4);
                        }
                    }
                }
            // 4. dQ^T = K^T dS^T: two tiles of 16 head columns x the strip's 32 queries
            for (long d0 = 0; d0 < D; d0 += 32) {
                _tile_zero(0);
                _tile_zero(1);
                _tile_zero(2);
                _tile_zero(3);
                for (long t0 = 0; t0 < nk32; t0 += 32) {
                    _tile_loadd(4, w.kt.data() + d0 * TP + t0, TP * 2);
                    _tile_loadd(6, w.kt.data() + (d0 + 16) * TP + t0, TP * 2);
                    _tile_loadd(5, w.dstv.data() + (t0 / 2) * QS * 2, QS * 2 * 2);
                    _tile_loadd(7, w.dstv.data() + (t0 / 2) * QS * 2 + 32, QS * 2 * 2);
                    _tile_dpbf16ps(0, 4, 5);
                    _tile_dpbf16ps(1, 4, 7);
                    _tile_dpbf16ps(2, 6, 5);
                    _tile_dpbf16ps(3, 6, 7);
                }
                _tile_stored(0, w.dqt.data() + d0 * QS, QS * 4);
                _tile_stored(1, w.dqt.data() + d0 * QS + 16, QS * 4);
                _tile_stored(2, w.dqt.data() + (d0 + 16) * QS, QS * 4);
                _tile_stored(3, w.dqt.data() + (d0 + 16) * QS + 16, QS * 4);
            }
            // dQ^T's columns gathered into dq's rows, 16 head columns at a time, scaled
            const __m512 sv = _mm512_set1_ps(c.scale);
            const __m512i down = _mm512_mullo_epi32(_mm512_set1_epi32(QS),
                                                    _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8,
                                                                      9, 10, 11, 12, 13, 14, 15));
            for (long s = q0; s < std::min(S, q0 + QS); s++) {
                bf16* out = c.dq + ((b * c.Q + j) * S + s) * D;
                for (long d = 0; d < D; d += 16) {
                    const __m512 x = _mm512_i32gather_ps(down, w.dqt.data() + d * QS + (s - q0), 4);
                    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + d),
                                        bf16x16(_mm512_mul_ps(x, sv)));
                }
            }
        }
    }
    bf16* dkb = c.dk + (b * c.K + h) * T * D;
    bf16* dvb = c.dv + (b * c.K + h) * T * D;
    const __m512 sv = _mm512_set1_ps(c.scale);
    for (long t = 0; t < T; t++)
        for (long d = 0; d < D; d += 16) {
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(dkb + t * D + d),
                                bf16x16(_mm512_mul_ps(_mm512_loadu_ps(w.dk.data() + t * D + d), sv)));
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(dvb + t * D + d),
                                bf16x16(_mm512_loadu_ps(w.dv.data() + t * D + d)));
        }
}
#endif

}  // namespace

// Whether calls run here (AMX in this build and granted to this process).
extern "C" int agentr1_attention_backward_ready() {
#if defined(AGENTR1_AMX)
    return agentr1::amx_permitted() ? 1 : 0;
#else
    return 0;
#endif
}

extern "C" int agentr1_attention_backward_bf16(const bf16* q, const bf16* k, const bf16* v,
                                               const bf16* o, const bf16* dout, const long* st,
                                               const float* lse, const uint8_t* mask, long m_sb,
                                               bf16* dq, bf16* dk, bf16* dv, int B, int S, int T,
                                               int Q, int K, int D, float scale) {
#if defined(AGENTR1_AMX)
    if (!agentr1::amx_permitted() || D % 32 != 0 || Q % K != 0 || S > T)
        return 3;
    const long SP = (S + QS - 1) / QS * QS, TP = (long(T) + 31) / 32 * 32;
    const long rows = mask && m_sb ? B : 1;
    // the calling thread's, kept between calls like each thread's scratch below
    thread_local std::vector<uint8_t> maskt;
    thread_local std::vector<long> last;
    try {
        grow(last, size_t(rows) * S);
        if (mask) grow(maskt, size_t(rows) * TP * SP);
    } catch (...) {
        return 1;
    }
    const Call c{q, k, v, o, dout, st, lse, mask, m_sb, dq, dk, dv, B, S, T, Q, K, D, scale,
                 maskt.data(), last.data()};
    uint8_t* const mt = maskt.data();
    long* const lt = last.data();
    int failed = 0;
#pragma omp parallel
    {
#pragma omp for schedule(static)
        for (long r = 0; r < rows; r++)
            sights(mask ? mask + r * m_sb : nullptr, S, T, SP, TP, mask ? mt + r * TP * SP : nullptr,
                   lt + r * S);
        // kept between calls (one a layer): no fresh pages each time
        thread_local Scratch w;
        try {
            grow(w.kr, TP * D);
            grow(w.vr, TP * D);
            grow(w.kt, TP * D);
            grow(w.qd, SP * D);
            grow(w.dod, SP * D);
            grow(w.qr, SP * D);
            grow(w.dor, SP * D);
            grow(w.delta, SP);
            grow(w.lse, SP);
            grow(w.dk, TP * D);
            grow(w.dv, TP * D);
            grow(w.st, TP * QS);
            grow(w.dpt, TP * QS);
            grow(w.dqt, size_t(D) * QS);
            grow(w.pt, TP * QS);
            grow(w.dst, TP * QS);
            grow(w.dstv, TP * QS);
        } catch (...) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp barrier
        if (!failed) {
            configure();
#pragma omp for collapse(2) schedule(dynamic, 1)
            for (long b = 0; b < B; b++)
                for (long h = 0; h < K; h++) pair(c, b, h, w);
            _tile_release();
        }
    }
    return failed;
#else
    (void)q, (void)k, (void)v, (void)o, (void)dout, (void)st, (void)lse, (void)mask, (void)m_sb;
    (void)dq, (void)dk, (void)dv, (void)B, (void)S, (void)T, (void)Q, (void)K, (void)D;
    (void)scale;
    return 3;
#endif
}
