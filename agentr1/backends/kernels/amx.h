// AMX tiles for the native kernels (agentr1/backends/native.py): whether this build has
// them (AGENTR1_AMX), whether the process may use them, and their configuration.
#pragma once

#include <cstdint>

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__) && defined(__linux__)
#define AGENTR1_AMX 1
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace agentr1 {

// Whether this process may use the tile registers: Linux grants them on request
// (arch_prctl ARCH_REQ_XCOMP_PERM, asked once a process; torch's oneDNN asks the same).
inline bool amx_permitted() {
    static const bool ok = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */,
                                   18 /* XFEATURE_XTILEDATA */) == 0;
    return ok;
}

// Tiles 0 .. count - 1, 64 bytes a row: R rows each, 16 for those in `full` (a bit a
// tile: the B operands' 16 pairs). Per thread; a kernel configures before its first
// tile instruction and releases (_tile_release) when done.
inline void configure_tiles(int R, int count, unsigned full) {
    struct alignas(64) {
        uint8_t palette = 1;
        uint8_t start_row = 0;
        uint8_t reserved[14] = {};
        uint16_t colsb[16] = {};
        uint8_t rows[16] = {};
    } c;
    for (int t = 0; t < count; t++) {
        c.colsb[t] = 64;
        c.rows[t] = uint8_t((full >> t) & 1u ? 16 : R);
    }
    _tile_loadconfig(&c);
}

}  // namespace agentr1
#endif
