// The matrix products of the hf sampler's bf16 decode pass (agentr1/backends/native.py),
// each with what surrounds it in a decoder layer fused in:
//
//   out = epilogue(prologue(x) @ W^T + bias)
//
//   prologue: none, or RMSNorm: h = to_bf16(norm * to_bf16(x * rsqrt(mean(x^2) + eps))),
//             float32 inside (transformers' LlamaRMSNorm, rounded where it rounds);
//   epilogue: the product rounded to bf16, then
//             - none;
//             - a residual: to_bf16(residual + product);
//             - GLU (W is gate | up, N = 2I outputs): to_bf16(to_bf16(silu(gate)) * up)
//               over the I pairs (out has I columns);
//             - rotary (the first rope_cols outputs are q and k heads of D columns): each
//               head's halves x1, x2 become x1 cos1 - x2 sin1 and x2 cos2 + x1 sin2, every
//               product and sum rounded as transformers' `q * cos + rotate_half(q) * sin`
//               rounds them, with each row's cos and sin [D].
//
// The products accumulate in float32 and are rounded once, as oneDNN's bf16 GEMM rounds
// them; only the order of the float32 sums differs. Three paths compute them, the best
// this build and CPU have (agentr1_linear_isa):
//   2  AMX (TDPBF16PS): a tile of up to 16 rows x 32 inputs against 32 inputs x 16
//      outputs a call, two tiles of outputs a block;
//   1  AVX512-BF16 (VDPBF16PS: pairs of bf16 products added into float32 lanes), rows
//      8 at a time in registers against a block;
//   0  plain loops (correct, slow).
// W is read once a call at decode's few rows (each thread a share of the blocks, each
// block taken against every row while its weights are in cache: the call streams W from
// memory); at a prefill's many rows, once a thread (each thread its own rows against every
// block: a blocked GEMM).
//
// Packed layout (agentr1_pack_bf16): blocks of 32 outputs; for each pair of inputs
// (2kp, 2kp + 1) a block holds [32 outputs][2 inputs] bf16, so one 64-byte load gives 16
// outputs' weights for two inputs and one vdpbf16ps multiplies them by a row's two
// inputs broadcast; 16 such half-rows, 128 bytes apart, are an AMX B tile (16 input
// pairs x 16 outputs, the pairs interleaved as TDPBF16PS reads them). Plain products:
// block b holds outputs 32b..32b+31. GLU: block b holds gate outputs 16b..16b+15, then
// the up outputs with the same indices, so a block's epilogue has both halves of its 16
// results. Rotary (the first rope_cols / 32 blocks): a block holds 16 columns of a head's
// first half and the 16 of its second half they pair with (D % 32 == 0), so the
// epilogue has both sides of each rotation; the columns are written back in their own
// order, rotated or not. K is zero-padded to a multiple of 32 (whole tiles), tails of N
// with zeros.
//
// x [M, K] rows x_sb apart; residual [M, N] rows r_sb apart; out [M, N or I] rows o_sb
// apart; norm and bias are [K] and [N] (or null); cos and sin [M, D] rows cs_sb apart (or
// null: a rotary pack's columns come out unrotated). Returns 0; 1 when scratch memory
// could not be allocated; 2 for an invalid combination (GLU with a bias, a residual or
// rotary, or an odd N; rotary with a residual, or heads that do not fit).
//
// Built like decode_attention.cpp. AMX needs the kernel's permission to use the tile
// registers (arch_prctl ARCH_REQ_XCOMP_PERM, asked once a process; torch's oneDNN asks
// the same): where it is refused the AVX512-BF16 path runs. agentr1_linear_use_amx(0)
// turns AMX off (tests and benchmarks compare the paths on one machine).

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "bf16.h"

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "amx.h"

namespace {

using agentr1::bf16;
using agentr1::load;
using agentr1::to_bf16;

constexpr int OUT = 32;  // outputs a block
constexpr int ROWS = 8;  // rows a register block
constexpr long CHUNK = 256;  // AMX: rows a core takes against a group of blocks
constexpr long GROUP = 16;   // AMX: blocks (of 32 outputs) whose weights a core keeps in L2

long blocks_of(long N, int glu) { return glu ? (N / 2 + 15) / 16 : (N + OUT - 1) / OUT; }
constexpr int TILE_PAIRS = 16;  // input pairs an AMX tile holds (32 inputs)
long pairs_of(long K) { return ((K + 1) / 2 + TILE_PAIRS - 1) / TILE_PAIRS * TILE_PAIRS; }

// What a call does after its products, and where it writes them (see the top).
struct Epi {
    long N = 0;  // outputs of the weight (GLU: 2I)
    int glu = 0;
    long rope_blocks = 0;  // the first blocks hold rotary pairs
    long head_dim = 0;
    const bf16* bias = nullptr;
    const bf16* residual = nullptr;
    long r_sb = 0;
    const bf16* cos = nullptr;  // null: rotary packs' columns unrotated
    const bf16* sin = nullptr;
    long cs_sb = 0;
    bf16* out = nullptr;
    long o_sb = 0;
};

// The first output of block b's half h (16 columns; not for GLU blocks).
inline long column(long b, int h, long rope_blocks, long D) {
    if (b < rope_blocks) {
        const long per_head = D / 32;
        return (b / per_head) * D + 16 * (b % per_head) + h * (D / 2);
    }
    return b * OUT + 16 * h;
}

// The source row (output index into W) of a block's output j, or -1 for padding.
long source_row(long b, int j, long N, int glu, long rope_blocks, long D) {
    if (!glu) {
        const long n = column(b, j / 16, rope_blocks, D) + j % 16;
        return n < N ? n : -1;
    }
    const long I = N / 2, i = b * 16 + (j & 15);
    if (i >= I) return -1;
    return j < 16 ? i : I + i;
}

// The staged input: rows of 2 * KP bf16 (zero-padded), normalized when norm is given.
void stage(const bf16* x, long x_sb, long m, long K, long KP, const bf16* norm, float eps,
           bf16* xs) {
    const bf16* xr = x + m * x_sb;
    bf16* dst = xs + m * 2 * KP;
    if (norm == nullptr) {
        std::memcpy(dst, xr, size_t(K) * sizeof(bf16));
    } else {
        float ss = 0.0f;
        long k = 0;
#if defined(__AVX512F__)
        __m512 acc = _mm512_setzero_ps();
        for (; k + 16 <= K; k += 16) {
            const __m512 v = agentr1::load16(xr + k);
            acc = _mm512_fmadd_ps(v, v, acc);
        }
        ss = _mm512_reduce_add_ps(acc);
#endif
        for (; k < K; k++) ss += load(xr[k]) * load(xr[k]);
        const float rstd = 1.0f / std::sqrt(ss / float(K) + eps);
        k = 0;
#if defined(__AVX512F__)
        const __m512 r = _mm512_set1_ps(rstd);
        for (; k + 16 <= K; k += 16) {
            const __m256i h = agentr1::to_bf16x16_fast(_mm512_mul_ps(agentr1::load16(xr + k), r));
            const __m512 y = _mm512_mul_ps(agentr1::load16(norm + k), agentr1::widen16(h));
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + k), agentr1::to_bf16x16_fast(y));
        }
#endif
        for (; k < K; k++) dst[k] = to_bf16(load(norm[k]) * load(to_bf16(load(xr[k]) * rstd)));
    }
    for (long k = K; k < 2 * KP; k++) dst[k] = 0;
}

#if defined(__AVX512BF16__)
using agentr1::bf16x16;
using agentr1::widen16;


inline __m512 rounded16(__m512 v) { return widen16(bf16x16(v)); }

inline __mmask16 tail(long left) {
    return left >= 16 ? __mmask16(0xffff) : left <= 0 ? __mmask16(0) : __mmask16((1u << left) - 1);
}

// The epilogue of one row's 32 float32 sums (a block's outputs: lo, hi halves).
inline void finish16(__m512 lo, __m512 hi, long b, long m, const Epi& e) {
    bf16* out = e.out + m * e.o_sb;
    if (e.glu) {
        const long I = e.N / 2, i0 = b * 16;
        const __m512 g = rounded16(lo), u = rounded16(hi);
        const __m512 s = rounded16(_mm512_div_ps(
            g, _mm512_add_ps(_mm512_set1_ps(1.0f), agentr1::exp16(_mm512_sub_ps(_mm512_setzero_ps(), g)))));
        _mm256_mask_storeu_epi16(out + i0, tail(I - i0), bf16x16(_mm512_mul_ps(s, u)));
        return;
    }
    if (b < e.rope_blocks) {  // whole blocks: a head's two halves, 16 columns each
        const long n1 = column(b, 0, e.rope_blocks, e.head_dim), half = e.head_dim / 2;
        if (e.bias) {
            lo = _mm512_add_ps(lo, agentr1::load16(e.bias + n1));
            hi = _mm512_add_ps(hi, agentr1::load16(e.bias + n1 + half));
        }
        __m512 x1 = rounded16(lo), x2 = rounded16(hi);
        if (e.cos) {
            const long d = n1 % e.head_dim;
            const bf16* c = e.cos + m * e.cs_sb + d;
            const bf16* s = e.sin + m * e.cs_sb + d;
            const __m512 c1 = agentr1::load16(c), c2 = agentr1::load16(c + half);
            const __m512 s1 = agentr1::load16(s), s2 = agentr1::load16(s + half);
            const __m512 r1 = _mm512_sub_ps(rounded16(_mm512_mul_ps(x1, c1)),
                                            rounded16(_mm512_mul_ps(x2, s1)));
            const __m512 r2 = _mm512_add_ps(rounded16(_mm512_mul_ps(x2, c2)),
                                            rounded16(_mm512_mul_ps(x1, s2)));
            x1 = r1, x2 = r2;
        }
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + n1), bf16x16(x1));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + n1 + half), bf16x16(x2));
        return;
    }
    for (int h = 0; h < 2; h++) {
        const long n0 = b * OUT + 16 * h;
        const __mmask16 k = tail(e.N - n0);
        __m512 v = h ? hi : lo;
        if (e.bias) v = _mm512_add_ps(v, widen16(_mm256_maskz_loadu_epi16(k, e.bias + n0)));
        v = rounded16(v);
        if (e.residual)
            v = _mm512_add_ps(widen16(_mm256_maskz_loadu_epi16(k, e.residual + m * e.r_sb + n0)), v);
        _mm256_mask_storeu_epi16(out + n0, k, bf16x16(v));
    }
}

// R rows (R <= ROWS) against one block: the sums in registers, then the epilogue.
template <int R>
void block(const bf16* xs, long KP, const bf16* wp, long b, long m0, const Epi& e) {
    __m512 a0[R], a1[R];
    for (int r = 0; r < R; r++) a0[r] = a1[r] = _mm512_setzero_ps();
    const int32_t* x32 = reinterpret_cast<const int32_t*>(xs + m0 * 2 * KP);
    for (long kp = 0; kp < KP; kp++) {
        const __m512i w0 = _mm512_loadu_si512(wp + kp * 64);
        const __m512i w1 = _mm512_loadu_si512(wp + kp * 64 + 32);
        for (int r = 0; r < R; r++) {
            const __m512i xb = _mm512_set1_epi32(x32[r * KP + kp]);
            a0[r] = _mm512_dpbf16_ps(a0[r], (__m512bh)w0, (__m512bh)xb);
            a1[r] = _mm512_dpbf16_ps(a1[r], (__m512bh)w1, (__m512bh)xb);
        }
    }
    for (int r = 0; r < R; r++) finish16(a0[r], a1[r], b, m0 + r, e);
}

using BlockFn = void (*)(const bf16*, long, const bf16*, long, long, const Epi&);
const BlockFn BLOCKS[ROWS + 1] = {nullptr,  block<1>, block<2>, block<3>, block<4>,
                                  block<5>, block<6>, block<7>, block<8>};

#if defined(AGENTR1_AMX)
using agentr1::amx_permitted;

// The tile registers' layout: tiles 0, 1, 5, 6 sums (R rows x 16 float32), 2, 7 inputs
// (R rows x 32 bf16), 3, 4 weights (16 input pairs x 16 outputs x 2).
inline void configure_tiles(int R) { agentr1::configure_tiles(R, 8, (1u << 3) | (1u << 4)); }

// A block's sums as stored from the tiles, and where they go.
struct Stored {
    alignas(64) float acc[32][OUT];
    long b = 0, m0 = 0;
    int rows = 0;  // 0: nothing pending
};

// The epilogue of a block's stored rows [from, to).
inline void finish_rows(const Stored& s, int from, int to, const Epi& e) {
    for (int r = from; r < to; r++)
        finish16(_mm512_load_ps(s.acc[r]), _mm512_load_ps(s.acc[r] + 16), s.b, s.m0 + r, e);
}

// The sums of R rows (R <= 16, tiles 0 and 1) or 32 rows (two row tiles sharing each
// weight tile: tiles 0, 1, 5, 6) against one block, left in the tiles; meanwhile the
// epilogue of the previous block's stored sums (`pending`), a few rows an input step:
// spread among the tile products, the vector work and its stores run while they do (run
// after them, it filled the reorder buffer and the products waited).
inline void multiply_amx(const bf16* x, long KP, const bf16* wb, bool two, Stored& pending,
                         const Epi& e) {
    _tile_zero(0);
    _tile_zero(1);
    if (two) {
        _tile_zero(5);
        _tile_zero(6);
    }
    const long steps = KP / TILE_PAIRS;
    const int rows = pending.rows;
    int done = 0;
    for (long kp = 0, step = 1; kp < KP; kp += TILE_PAIRS, step++) {
        _tile_loadd(3, wb + kp * 64, 128);       // outputs 0..15, 16 input pairs
        _tile_loadd(4, wb + kp * 64 + 32, 128);  // outputs 16..31
        _tile_loadd(2, x + 2 * kp, 4 * KP);      // rows of 32 inputs, 2 * KP bf16 apart
        _tile_dpbf16ps(0, 2, 3);
        _tile_dpbf16ps(1, 2, 4);
        if (two) {
            _tile_loadd(7, x + 32 * KP + 2 * kp, 4 * KP);  // rows 16..31
            _tile_dpbf16ps(5, 7, 3);
            _tile_dpbf16ps(6, 7, 4);
        }
        const int upto = int(rows * step / steps);
        finish_rows(pending, done, upto, e);
        done = upto;
    }
    pending.rows = 0;
}

inline void store_amx(Stored& s, long b, long m0, int rows) {
    _tile_stored(0, &s.acc[0][0], OUT * 4);
    _tile_stored(1, &s.acc[0][16], OUT * 4);
    if (rows > 16) {
        _tile_stored(5, &s.acc[16][0], OUT * 4);
        _tile_stored(6, &s.acc[16][16], OUT * 4);
    }
    s.b = b, s.m0 = m0, s.rows = rows;
}

#endif
#else
inline float silu(float g) { return g / (1.0f + std::exp(-g)); }

// The epilogue of one row's 32 float32 sums (a block's outputs), scalar.
void finish(const float* acc, long b, long m, const Epi& e) {
    bf16* out = e.out + m * e.o_sb;
    if (e.glu) {
        const long I = e.N / 2;
        for (int j = 0; j < 16; j++) {
            const long i = b * 16 + j;
            if (i >= I) break;
            const float g = load(to_bf16(acc[j])), u = load(to_bf16(acc[16 + j]));
            out[i] = to_bf16(load(to_bf16(silu(g))) * u);
        }
        return;
    }
    float v[OUT] = {};
    for (int j = 0; j < OUT; j++) {
        const long n = column(b, j / 16, e.rope_blocks, e.head_dim) + j % 16;
        if (n >= e.N) continue;
        v[j] = load(to_bf16(acc[j] + (e.bias ? load(e.bias[n]) : 0.0f)));
        if (e.residual) v[j] = load(to_bf16(load(e.residual[m * e.r_sb + n]) + v[j]));
    }
    if (b < e.rope_blocks && e.cos) {  // whole blocks: x1 in v[0..15], x2 in v[16..31]
        const long d = column(b, 0, e.rope_blocks, e.head_dim) % e.head_dim;
        const long half = e.head_dim / 2;
        const bf16* c = e.cos + m * e.cs_sb + d;
        const bf16* s = e.sin + m * e.cs_sb + d;
        for (int j = 0; j < 16; j++) {
            const float x1 = v[j], x2 = v[16 + j];
            const float p1 = load(to_bf16(x1 * load(c[j]))), q1 = load(to_bf16(x2 * load(s[j])));
            const float p2 = load(to_bf16(x2 * load(c[half + j])));
            const float q2 = load(to_bf16(x1 * load(s[half + j])));
            v[j] = p1 - q1;
            v[16 + j] = p2 + q2;
        }
    }
    for (int j = 0; j < OUT; j++) {
        const long n = column(b, j / 16, e.rope_blocks, e.head_dim) + j % 16;
        if (n < e.N) out[n] = to_bf16(v[j]);
    }
}

// The plain loops: the same sums for one block and up to ROWS rows, then `finish`.
void block_plain(const bf16* xs, long KP, const bf16* wp, long b, long m0, int R, const Epi& e) {
    float acc[ROWS][OUT] = {};
    for (long kp = 0; kp < KP; kp++) {
        const bf16* w = wp + kp * 64;
        for (int r = 0; r < R; r++) {
            const bf16* xr = xs + (m0 + r) * 2 * KP + 2 * kp;
            const float x0 = load(xr[0]), x1 = load(xr[1]);
            for (int j = 0; j < OUT; j++) acc[r][j] += load(w[2 * j]) * x0 + load(w[2 * j + 1]) * x1;
        }
    }
    for (int r = 0; r < R; r++) finish(acc[r], b, m0 + r, e);
}
#endif

bool amx_on = true;  // agentr1_linear_use_amx

// The path a call takes: 2 AMX, 1 AVX512-BF16, 0 plain loops.
int isa() {
#if defined(AGENTR1_AMX)
    if (amx_on && amx_permitted()) return 2;
#endif
#if defined(__AVX512BF16__)
    return 1;
#else
    return 0;
#endif
}

}  // namespace

extern "C" int agentr1_linear_isa() { return isa(); }

// AMX on (1, the default, where the CPU has it and the process may use it) or off (0);
// returns the path calls take now.
extern "C" int agentr1_linear_use_amx(int on) {
    amx_on = on != 0;
    return isa();
}

// Elements of the packed weight for N outputs of K inputs.
extern "C" long agentr1_packed_size(long N, long K, int glu) {
    return blocks_of(N, glu) * pairs_of(K) * 64;
}

// Whether the kernel lays out a pack of these outputs (see the top).
bool valid_layout(long N, int glu, long rope_cols, long D) {
    if (glu) return N % 2 == 0 && rope_cols == 0;
    if (rope_cols == 0) return true;
    return D > 0 && D % 32 == 0 && rope_cols % D == 0 && rope_cols <= N;
}

// W [N, K] (row-major; GLU: the gate's I rows, then the up's; rotary: the first
// rope_cols rows are heads of D) into the packed layout; 2 for a layout it has not.
extern "C" int agentr1_pack_bf16(const bf16* w, long N, long K, int glu, long rope_cols, long D,
                                 bf16* out) {
    if (!valid_layout(N, glu, rope_cols, D)) return 2;
    const long nb = blocks_of(N, glu), KP = pairs_of(K), rope_blocks = rope_cols / 32;
#pragma omp parallel for schedule(static)
    for (long b = 0; b < nb; b++) {
        bf16* o = out + b * KP * 64;
        for (int j = 0; j < OUT; j++) {
            const long n = source_row(b, j, N, glu, rope_blocks, D);
            for (long k = 0; k < 2 * KP; k++)
                o[(k / 2) * 64 + 2 * j + (k % 2)] = (n >= 0 && k < K) ? w[n * K + k] : bf16(0);
        }
    }
    return 0;
}

extern "C" int agentr1_linear_bf16(const bf16* x, long x_sb, long M, long K, const bf16* norm,
                                   float eps, const bf16* wp, long N, int glu, long rope_cols,
                                   long D, const bf16* bias, const bf16* residual, long r_sb,
                                   const bf16* cos, const bf16* sin, long cs_sb, bf16* out,
                                   long o_sb) {
    if (!valid_layout(N, glu, rope_cols, D)) return 2;
    if (glu && (bias != nullptr || residual != nullptr)) return 2;
    if (rope_cols && residual != nullptr) return 2;
    if ((cos != nullptr) != (sin != nullptr) || (cos != nullptr && rope_cols == 0)) return 2;
    Epi e;
    e.N = N, e.glu = glu, e.rope_blocks = rope_cols / 32, e.head_dim = D;
    e.bias = bias, e.residual = residual, e.r_sb = r_sb;
    e.cos = cos, e.sin = sin, e.cs_sb = cs_sb, e.out = out, e.o_sb = o_sb;
    const long KP = pairs_of(K), nb = blocks_of(N, glu);
    // The inputs as the products read them: rows of 2 * KP, normalised where asked; a
    // contiguous input of whole tiles without a norm is read where it is.
    const bool in_place = norm == nullptr && K == 2 * KP && x_sb == K;
    thread_local std::vector<bf16> staged;
    if (!in_place) {
        try {
            // Every element a call reads it writes first: the buffer is grown (never
            // zero-filled again when products of other shapes alternate) and given back
            // when a call needs far less than a large one held (a prefill's, say).
            // 32 more for the start's alignment: a tile row (64 bytes) read across two
            // cache lines costs both (a misaligned buffer ran the products 1.3x slower).
            const size_t need = size_t(M) * size_t(2 * KP) + 32, keep = size_t(16) << 20;
            if (staged.size() > std::max(4 * need, keep)) std::vector<bf16>().swap(staged);
            if (staged.size() < need) staged.resize(need);
        } catch (...) {
            return 1;
        }
    }
    // (the calling thread's buffer: inside the parallel region `staged` names each
    // thread's own)
    bf16* buf = nullptr;
    if (!in_place) {
        const uintptr_t at = reinterpret_cast<uintptr_t>(staged.data());
        buf = staged.data() + ((64 - at % 64) % 64) / sizeof(bf16);
    }
    const bf16* xs = in_place ? x : buf;
    const int path = isa();
#pragma omp parallel
    {
#if defined(_OPENMP)
        const long threads = omp_get_num_threads(), tid = omp_get_thread_num();
#else
        const long threads = 1, tid = 0;
#endif
        // A prefill's many rows: each thread its own rows, against every block, staging
        // them itself (no barrier between the staging and the products, and no rows
        // staged in the other core's cache). Decode's few rows: each thread a share of
        // the blocks.
        const bool by_rows = path == 2 && M >= 64 * threads;
        if (!in_place && !by_rows) {
#pragma omp for schedule(static)
            for (long m = 0; m < M; m++) stage(x, x_sb, m, K, KP, norm, eps, buf);
        }
#if defined(AGENTR1_AMX)
        if (path == 2) {
            // Tile shapes are per thread: one configuration per row count (M <= 16: one).
            int configured = 0;
            // A block's epilogue (vector instructions) runs among the next block's tile
            // products (`multiply_amx`): each block's sums are stored after them, and
            // the next block's products finish them.
            Stored stored[2];
            int cur = 0;
            // GEMM blocking: a group of GROUP blocks' weights stays in this core's L2
            // while chunks of CHUNK rows pass, 32 rows at a time against each block of the
            // group (those rows' inputs in L1).
            auto run = [&](long b0, long b1, long m_begin, long m_end) {
                for (long m0 = m_begin; m0 < m_end;) {
                    const long left = m_end - m0;
                    const int rows = int(left >= 32 ? 32 : left < 16 ? left : 16);
                    const int R = rows > 16 ? 16 : rows;
                    for (long b = b0; b < b1; b++) {
                        if (R != configured) configure_tiles(configured = R);
                        multiply_amx(xs + m0 * 2 * KP, KP, wp + b * KP * 64, rows > 16,
                                     stored[cur ^ 1], e);
                        store_amx(stored[cur], b, m0, rows);
                        cur ^= 1;
                    }
                    m0 += rows;
                }
            };
            const long chunks = (M + CHUNK - 1) / CHUNK;
            // Groups of equal size (the work splits evenly), at most GROUP blocks; with
            // fewer chunks than threads (decode), at least one group a thread.
            long groups = (nb + GROUP - 1) / GROUP;
            if (!by_rows && chunks < threads) groups = std::max(groups, std::min(nb, threads));
            const long per = (nb + groups - 1) / groups;
            groups = (nb + per - 1) / per;
            if (by_rows) {
                const long share = ((M + threads - 1) / threads + 31) / 32 * 32;
                const long r0 = std::min(M, tid * share), r1 = std::min(M, r0 + share);
                if (!in_place)
                    for (long m = r0; m < r1; m++) stage(x, x_sb, m, K, KP, norm, eps, buf);
                for (long g = 0; g < groups; g++)
                    for (long c0 = r0; c0 < r1; c0 += CHUNK)
                        run(g * per, std::min(nb, (g + 1) * per), c0, std::min(r1, c0 + CHUNK));
            } else {
                // a thread takes a run of (group, chunk) pairs: at decode's few rows, a
                // share of the groups
#pragma omp for collapse(2) schedule(static)
                for (long g = 0; g < groups; g++)
                    for (long c = 0; c < chunks; c++)
                        run(g * per, std::min(nb, (g + 1) * per), c * CHUNK,
                            std::min(M, (c + 1) * CHUNK));
            }
            finish_rows(stored[cur ^ 1], 0, stored[cur ^ 1].rows, e);
            if (configured) _tile_release();
        }
#endif
        if (path < 2) {
#pragma omp for schedule(static)
            for (long b = 0; b < nb; b++) {
                const bf16* wb = wp + b * KP * 64;
                for (long m0 = 0; m0 < M; m0 += ROWS) {
                    const int R = int(M - m0 < ROWS ? M - m0 : ROWS);
#if defined(__AVX512BF16__)
                    BLOCKS[R](xs, KP, wb, b, m0, e);
#else
                    block_plain(xs, KP, wb, b, m0, R, e);
#endif
                }
            }
        }
    }
    return 0;
}
