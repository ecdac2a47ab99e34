// Causal grouped-query attention of a bf16 prefill on AMX tiles (agentr1/backends/native.py):
// S new queries a row against the T columns of the row's KV cache (the columns before them,
// then their own), what the hf sampler's written-out prefill runs once a layer.
//
// For each row b, key/value head h and query head j = h * G + g of its group, query s
// (the row's column p = T - S + s) sees column c when c <= p and the row attends c, and
// always its own column (a padding query then attends to itself: finite, never read).
// Per tile of 16 queries of one head:
//   1. scores = q k^T, 16 keys at a time (TDPBF16PS over D in steps of 32), float32;
//   2. softmax in float32: scaled, masked, the row's maximum subtracted, exp (2^t by a
//      polynomial within 5e-5, 16 columns at a time to the last); the unnormalised
//      weights rounded to bf16 (the normalisation is applied to the output in float32);
//   3. out = weights v, 32 keys at a time into D / 16 tiles of 16 columns, divided by the
//      row's sum, rounded once to bf16.
// Only the key blocks up to the tile's last query's column are visited.
//
// Layouts (element strides; the last dimension is contiguous everywhere):
//   q      [B, S, Q, D] with strides (q_sb, q_ss, D, 1): the rotated query heads
//   kbuf, vbuf [B, K, C, D] with strides (kv_sb, kv_sh, D, 1), C >= T: the cache
//   attend [B, T] uint8, row stride att_sb (nonzero = attend)
//   out    [B, S, Q * D] contiguous
// Returns 0; 1 when scratch memory could not be allocated; 3 where this build or process
// has no AMX, or D is not a multiple of 32 (the caller keeps torch's attention).
//
// Built by agentr1/backends/native.py like the other kernels (-O3 -march=native -fopenmp).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "bf16.h"

#include "amx.h"

namespace {

using agentr1::bf16;

#if defined(AGENTR1_AMX)
constexpr int TQ = 16;  // queries a tile
constexpr int TK = 16;  // keys a score tile

using agentr1::amx_permitted;

// Tiles 0-3: sums (R rows x 16 float32); 4: the A operand (R rows x 32 bf16); 5: the B
// operand (16 pairs x 16 columns x 2).
inline void configure(int R) { agentr1::configure_tiles(R, 6, 1u << 5); }

using agentr1::bf16x16;


// The keys of one (row, head) as B tiles of q k^T: [T/16 blocks][D/2 pairs][16 keys][2],
// and the values as B tiles of w v: [T'/2 key pairs][D][2] (T' = T rounded up to 32);
// keys and values past T are zeros.
void pack_kv(const bf16* k, const bf16* v, long T, long TP, long D, bf16* kt, bf16* vv) {
    // keys: a key's (2p, 2p + 1) pair is one 32-bit element; kt[kb][p][n] = k32[t][p]
    const long P = D / 2, blocks = TP / TK;
    const uint32_t* k32 = reinterpret_cast<const uint32_t*>(k);
    uint32_t* kt32 = reinterpret_cast<uint32_t*>(kt);
    for (long kb = 0; kb < blocks; kb++)
        for (int n = 0; n < TK; n++) {
            const long t = kb * TK + n;
            uint32_t* o = kt32 + kb * P * TK + n;
            if (t < T) {
                for (long p = 0; p < P; p++) o[p * TK] = k32[t * P + p];
            } else {
                for (long p = 0; p < P; p++) o[p * TK] = 0;
            }
        }
    // values: rows 2kp and 2kp + 1 interleaved, 16 columns at a time
    for (long kp = 0; kp < TP / 2; kp++) {
        const bool a = 2 * kp < T, b = 2 * kp + 1 < T;
        for (long d = 0; d < D; d += 16) {
            const __m512i lo = a ? _mm512_cvtepu16_epi32(_mm256_loadu_si256(
                                       reinterpret_cast<const __m256i*>(v + 2 * kp * D + d)))
                                 : _mm512_setzero_si512();
            const __m512i hi = b ? _mm512_cvtepu16_epi32(_mm256_loadu_si256(
                                       reinterpret_cast<const __m256i*>(v + (2 * kp + 1) * D + d)))
                                 : _mm512_setzero_si512();
            _mm512_storeu_si512(vv + (kp * D + d) * 2, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
        }
    }
}

// One tile of R queries (s0 ..) of query head j of row b against its packed keys/values.
void tile(const bf16* q, long q_ss, long s0, int R, long S, long T, long TP, long D,
          const bf16* kt, const bf16* vv, const uint8_t* attend, float scale, float* sc,
          bf16* w, float* acc, bf16* out, long o_ss) {
    const long last = T - S + s0 + R - 1;  // the tile's last query's column
    const long blocks = last / TK + 1;
    const long steps = D / 32;
    // 1. scores, four key blocks at a time (four independent sums, the queries' tile
    // loaded once for them)
    for (long kb0 = 0; kb0 < blocks; kb0 += 4) {
        const long nb = std::min<long>(4, blocks - kb0);
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (long st = 0; st < steps; st++) {
            _tile_loadd(4, q + s0 * q_ss + 32 * st, q_ss * 2);
            const bf16* k0 = kt + (kb0 * (D / 2) + 16 * st) * TK * 2;
            const long next = (D / 2) * TK * 2;  // one key block further
            _tile_loadd(5, k0, TK * 2 * 2);
            _tile_dpbf16ps(0, 4, 5);
            if (nb > 1) {
                _tile_loadd(5, k0 + next, TK * 2 * 2);
                _tile_dpbf16ps(1, 4, 5);
            }
            if (nb > 2) {
                _tile_loadd(5, k0 + 2 * next, TK * 2 * 2);
                _tile_dpbf16ps(2, 4, 5);
            }
            if (nb > 3) {
                _tile_loadd(5, k0 + 3 * next, TK * 2 * 2);
                _tile_dpbf16ps(3, 4, 5);
            }
        }
        _tile_stored(0, sc + kb0 * TK, TP * 4);
        if (nb > 1) _tile_stored(1, sc + (kb0 + 1) * TK, TP * 4);
        if (nb > 2) _tile_stored(2, sc + (kb0 + 2) * TK, TP * 4);
        if (nb > 3) _tile_stored(3, sc + (kb0 + 3) * TK, TP * 4);
    }
    const long used = (blocks * TK + 31) / 32 * 32;  // keys the weights cover (pairs of 16)
    float sums[TQ];
    const __m512 sv_scale = _mm512_set1_ps(scale), ninf = _mm512_set1_ps(-INFINITY);
    const __m512 log2e = _mm512_set1_ps(1.44269504088896341f);
    for (int r = 0; r < R; r++) {  // 2. softmax, unnormalised
        const long p = T - S + s0 + r;
        float* row = sc + r * TP;
        // scaled; -inf where not seen (not attended, or past p: only the last 16 can be)
        __m512 mx = ninf;
        for (long c = 0; c <= p; c += 16) {
            const __mmask16 in = c + 16 <= p + 1 ? __mmask16(0xffff)
                                                 : __mmask16((1u << (p + 1 - c)) - 1);
            const __m128i a = _mm_maskz_loadu_epi8(in, attend + c);
            __mmask16 seen = _mm_mask_cmpneq_epi8_mask(in, a, _mm_setzero_si128());
            if (p - c < 16) seen |= __mmask16(1u << (p - c));  // its own column
            const __m512 v = _mm512_mask_mul_ps(ninf, seen, _mm512_loadu_ps(row + c), sv_scale);
            _mm512_storeu_ps(row + c, v);  // (the block is whole: TP columns a row)
            mx = _mm512_max_ps(mx, v);
        }
        // exp(x - m) = 2^(x log2(e) - m log2(e)), 0 below 2^-126 (-inf included), the
        // last block's columns past p too; within 5e-5 of exp, below the bf16 rounding
        const __m512 ml = _mm512_mul_ps(_mm512_set1_ps(_mm512_reduce_max_ps(mx)), log2e);
        __m512 sv = _mm512_setzero_ps();
        bf16* wr = w + r * TP;
        long c = 0;
        for (; c <= p; c += 16) {
            const __m512 t = _mm512_fmsub_ps(_mm512_loadu_ps(row + c), log2e, ml);
            const __mmask16 under = _mm512_cmp_ps_mask(t, _mm512_set1_ps(-126.0f), _CMP_LT_OQ);
            const __m256i h = bf16x16(_mm512_maskz_mov_ps(~under, agentr1::exp2_16(t)));
            sv = _mm512_add_ps(sv, agentr1::widen16(h));
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(wr + c), h);
        }
        for (; c < used; c += 16)
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(wr + c), _mm256_setzero_si256());
        sums[r] = _mm512_reduce_add_ps(sv);
    }
    for (int r = R; r < TQ; r++) sums[r] = 1.0f;
    for (long cb0 = 0; cb0 < D / 16; cb0 += 4) {  // 3. weights x values, 4 column tiles
        const long nc = std::min<long>(4, D / 16 - cb0);
        _tile_zero(0);  // (tile numbers are immediates: all four, used or not)
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (long kp0 = 0; kp0 < used / 2; kp0 += 16) {
            _tile_loadd(4, w + 2 * kp0, TP * 2);
            for (long t = 0; t < nc; t++) {
                _tile_loadd(5, vv + (kp0 * D + (cb0 + t) * 16) * 2, D * 2 * 2);
                switch (t) {  // tile numbers are immediates
                    case 0: _tile_dpbf16ps(0, 4, 5); break;
                    case 1: _tile_dpbf16ps(1, 4, 5); break;
                    case 2: _tile_dpbf16ps(2, 4, 5); break;
                    default: _tile_dpbf16ps(3, 4, 5); break;
                }
            }
        }
        for (long t = 0; t < nc; t++) {
            float* a = acc + (cb0 + t) * 16;
            switch (t) {
                case 0: _tile_stored(0, a, D * 4); break;
                case 1: _tile_stored(1, a, D * 4); break;
                case 2: _tile_stored(2, a, D * 4); break;
                default: _tile_stored(3, a, D * 4); break;
            }
        }
    }
    for (int r = 0; r < R; r++) {
        const __m512 inv = _mm512_set1_ps(1.0f / sums[r]);
        for (long d = 0; d < D; d += 16)
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + (s0 + r) * o_ss + d),
                                bf16x16(_mm512_mul_ps(_mm512_loadu_ps(acc + r * D + d), inv)));
    }
}
#endif

}  // namespace

// Whether calls run here (AMX in this build and granted to this process).
extern "C" int agentr1_prefill_attention_ready() {
#if defined(AGENTR1_AMX)
    return amx_permitted() ? 1 : 0;
#else
    return 0;
#endif
}

extern "C" int agentr1_prefill_attention_bf16(const bf16* q, long q_sb, long q_ss, const bf16* kbuf,
                                              const bf16* vbuf, long kv_sb, long kv_sh, long T,
                                              const uint8_t* attend, long att_sb, bf16* out,
                                              int B, int S, int Q, int K, int D, float scale) {
#if defined(AGENTR1_AMX)
    if (!amx_permitted() || D % 32 != 0 || Q % K != 0 || S > T) return 3;
    const long G = Q / K, TP = (T + 31) / 32 * 32;
    const long per_kt = (TP / TK) * (D / 2) * TK * 2, per_vv = (TP / 2) * D * 2;
    // Every element the tiles read is packed first (pack_kv writes zeros past T), so the
    // buffer is kept between calls (a prefill calls once a layer: no fresh pages each
    // time) and given back when a call needs far less than one before held.
    thread_local std::vector<bf16> packed;
    try {
        const size_t need = size_t(B) * K * (per_kt + per_vv), keep = size_t(16) << 20;
        if (packed.size() > std::max(4 * need, keep)) std::vector<bf16>().swap(packed);
        if (packed.size() < need) packed.resize(need);
    } catch (...) {
        return 1;
    }
    // (the calling thread's buffer: inside the parallel region `packed` names each
    // thread's own)
    bf16* const pk = packed.data();
    const long tiles = (S + TQ - 1) / TQ;
    int failed = 0;
#pragma omp parallel
    {
#pragma omp for collapse(2) schedule(static)
        for (int b = 0; b < B; b++)
            for (int h = 0; h < K; h++) {
                bf16* kt = pk + (long(b) * K + h) * (per_kt + per_vv);
                pack_kv(kbuf + b * kv_sb + h * kv_sh, vbuf + b * kv_sb + h * kv_sh, T, TP, D, kt,
                        kt + per_kt);
            }
        std::vector<float> sc, acc;
        std::vector<bf16> w;
        try {
            sc.resize(size_t(TQ) * TP);
            acc.resize(size_t(TQ) * D);
            w.resize(size_t(TQ) * TP);
        } catch (...) {
#pragma omp atomic write
            failed = 1;
        }
        int configured = 0;
        // the work of a tile grows with its queries' columns (causal): dynamic
#pragma omp for collapse(3) schedule(dynamic, 1)
        for (int b = 0; b < B; b++)
            for (int j = 0; j < Q; j++)
                for (long t = 0; t < tiles; t++) {
                    if (sc.empty() || acc.empty() || w.empty()) continue;
                    const int h = int(j / G);
                    const bf16* kt = pk + (long(b) * K + h) * (per_kt + per_vv);
                    const long s0 = t * TQ;
                    const int R = int(std::min<long>(TQ, S - s0));
                    if (R != configured) configure(configured = R);
                    tile(q + b * q_sb + long(j) * D, q_ss, s0, R, S, T, TP, D, kt, kt + per_kt,
                         attend + b * att_sb, scale, sc.data(), w.data(), acc.data(),
                         out + (long(b) * S) * Q * D + long(j) * D, long(Q) * D);
                }
        if (configured) _tile_release();
    }
    return failed;
#else
    (void)q, (void)q_sb, (void)q_ss, (void)kbuf, (void)vbuf, (void)kv_sb, (void)kv_sh, (void)T;
    (void)attend, (void)att_sb, (void)out, (void)B, (void)S, (void)Q, (void)K, (void)D;
    (void)scale;
    return 3;
#endif
}
