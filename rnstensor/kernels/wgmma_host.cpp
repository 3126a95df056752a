// Host SIMT emulation of product_wgmma.cu for the CPU tests: the kernel's own source, run on CPU threads.
//
// Each block runs as 256 std::threads (one per CUDA thread) sharing the
// module's __shared__ buffer; __syncthreads is a block barrier. The Hopper
// asynchronous machinery is software:
//
// * cp.async.cg 16 bytes with zero fill, commit_group, wait_group N;
// * wgmma.mma_async m64nNk32 .s32.s8.s8 from two shared-memory descriptors,
//   commit_group, wait_group N. The descriptor is decoded as the PTX ISA
//   defines it (start address, leading byte offset, stride byte offset, each
//   >> 4 in 14 bits; base offset and swizzle mode must be 0: the kernel uses the
//   canonical K-major layout without swizzle, core matrices of 8 rows x 16
//   bytes with row r at +16 r, core matrices adjacent in K at +LBO, 8-row groups
//   at +SBO), and every thread computes its own accumulator fragment after the
//   PTX ISA's wgmma D layout (warp v of the warpgroup: rows 16 v + g and
//   16 v + g + 8, lane = 4 g + t, columns 8 i + 2 t and 8 i + 2 t + 1 in
//   d[4 i .. 4 i + 3]).
//
// Two timing modes bracket what the hardware may do. EAGER: every copy and
// every MMA completes when it is issued. LAZY: a copy lands, and an MMA reads
// shared memory and writes its accumulators, only when the kernel waits for its
// group (the latest the PTX rules allow). A kernel that reads a stage before
// waiting for it, overwrites a stage an MMA in flight still reads, or reads the
// accumulators before wgmma.wait_group, computes wrong numbers in one of the
// two modes. The shared window is placed at a nonzero offset (RNS_HOST_SMEM0),
// so a descriptor that ignores the real start address is caught too.
// Blocks run one after another (the __shared__ buffer is static).
#include <atomic>
#include <cstdint>
#include <cstring>

#include "simt_runtime.h"

#include "rns_arith.cuh"

static unsigned rns_host_smem_u32(const void* p);
static void rns_host_cp_async16(unsigned char* dst, const signed char* src, int src_size);
static void rns_host_cp_async_commit();
static void rns_host_cp_async_wait(int n);
static void rns_host_wgmma(int* d, int n, unsigned long long da, unsigned long long db);
static void rns_host_wgmma_commit();
static void rns_host_wgmma_wait(int n);

#include "product_wgmma.cu"

static const unsigned RNS_HOST_SMEM0 = 1024;  // where the emulated shared window puts rns_wg_smem
static bool rns_lazy = false;
static int rns_wait_skew = 0;  // > 0: every cp.async wait_group leaves that many more groups pending (a broken pipeline)
static std::atomic<int> rns_error{0};  // 1: bad descriptor; 2: async work left at the end; 3: bad wait

static unsigned rns_host_smem_u32(const void* p) {
    const auto off = (const unsigned char*)p - rns_wg_smem;
    if (off < 0 || off > RNS_WG_SMEM) rns_error = 1;
    return RNS_HOST_SMEM0 + (unsigned)off;
}

// ----- cp.async --------------------------------------------------------------------------------

struct RnsCopy {
    unsigned char* dst;
    const signed char* src;
    int size;
};
static thread_local std::vector<std::vector<RnsCopy>> rns_copy_groups;  // committed groups, oldest first
static thread_local std::vector<RnsCopy> rns_copy_open;                 // not yet committed

static void rns_do_copy(const RnsCopy& c) {
    for (int b = 0; b < 16; ++b) c.dst[b] = b < c.size ? (unsigned char)c.src[b] : 0;
}

static void rns_host_cp_async16(unsigned char* dst, const signed char* src, int src_size) {
    if (((uintptr_t)dst & 15) || ((uintptr_t)src & 15) || src_size < 0 || src_size > 16) rns_error = 3;
    if (rns_lazy) rns_copy_open.push_back({dst, src, src_size});
    else rns_do_copy({dst, src, src_size});
}

static void rns_host_cp_async_commit() {
    rns_copy_groups.push_back(std::move(rns_copy_open));
    rns_copy_open.clear();
}

static void rns_host_cp_async_wait(int n) {
    // cp.async.wait_group n: all but the newest n committed groups are complete
    n += rns_wait_skew;
    while ((int)rns_copy_groups.size() > n) {
        for (const auto& c : rns_copy_groups.front()) rns_do_copy(c);
        rns_copy_groups.erase(rns_copy_groups.begin());
    }
}

// ----- wgmma -----------------------------------------------------------------------------------

struct RnsMma {
    int* d;
    int n;
    unsigned long long da, db;
};
static thread_local std::vector<std::vector<RnsMma>> rns_mma_groups;
static thread_local std::vector<RnsMma> rns_mma_open;

// byte (row, k) of a K-major operand without swizzle, from its descriptor; nullptr if the descriptor is bad
static const unsigned char* rns_desc_base(unsigned long long desc, unsigned& lbo, unsigned& sbo) {
    const unsigned start = (unsigned)(desc & 0x3FFF) << 4;
    lbo = (unsigned)((desc >> 16) & 0x3FFF) << 4;
    sbo = (unsigned)((desc >> 32) & 0x3FFF) << 4;
    const unsigned base_offset = (unsigned)((desc >> 49) & 7), swizzle = (unsigned)(desc >> 62);
    const unsigned long long reserved = desc & ~((0x3FFFull) | (0x3FFFull << 16) | (0x3FFFull << 32) | (7ull << 49) |
                                                 (3ull << 62));
    if (swizzle != 0 || base_offset != 0 || reserved != 0 || start < RNS_HOST_SMEM0) return nullptr;
    return rns_wg_smem + (start - RNS_HOST_SMEM0);
}

static void rns_do_mma(const RnsMma& op) {
    unsigned la, sa, lb, sb;
    const unsigned char* A = rns_desc_base(op.da, la, sa);
    const unsigned char* B = rns_desc_base(op.db, lb, sb);
    if (!A || !B) {
        rns_error = 1;
        return;
    }
    const unsigned char* end = rns_wg_smem + RNS_WG_SMEM;
    auto at = [&](const unsigned char* base, unsigned lbo, unsigned sbo, int row, int k) -> int {
        const unsigned char* q = base + (row >> 3) * sbo + (k >> 4) * lbo + (row & 7) * 16 + (k & 15);
        if (q >= end) {
            rns_error = 1;
            return 0;
        }
        return (int)(signed char)*q;
    };
    const int tw = threadIdx.x & 127, v = tw >> 5, g = (tw & 31) >> 2, t = tw & 3;
    for (int i = 0; i < op.n / 8; ++i)
        for (int j = 0; j < 4; ++j) {
            const int row = 16 * v + g + 8 * (j >> 1), col = 8 * i + 2 * t + (j & 1);
            long long s = op.d[4 * i + j];
            for (int k = 0; k < 32; ++k) s += at(A, la, sa, row, k) * at(B, lb, sb, col, k);
            op.d[4 * i + j] = (int)(unsigned)(unsigned long long)s;  // wraps as int32 like the hardware would
        }
}

static void rns_host_wgmma(int* d, int n, unsigned long long da, unsigned long long db) {
    if (rns_lazy) rns_mma_open.push_back({d, n, da, db});
    else rns_do_mma({d, n, da, db});
}

static void rns_host_wgmma_commit() {
    rns_mma_groups.push_back(std::move(rns_mma_open));
    rns_mma_open.clear();
}

static void rns_host_wgmma_wait(int n) {
    while ((int)rns_mma_groups.size() > n) {
        for (const auto& op : rns_mma_groups.front()) rns_do_mma(op);
        rns_mma_groups.erase(rns_mma_groups.begin());
    }
}

// ----- launch ----------------------------------------------------------------------------------

// the kernel must leave no copy or MMA behind (uncommitted work counts too): checked by every
// thread at the end of each block, before the block barrier
static void rns_host_block_done() {
    if (!rns_copy_open.empty() || !rns_mma_open.empty() || !rns_mma_groups.empty()) rns_error = 2;
    for (const auto& g : rns_copy_groups)
        if (!g.empty()) rns_error = 2;
    rns_copy_groups.clear();
    rns_copy_open.clear();
    rns_mma_groups.clear();
    rns_mma_open.clear();
}

extern "C" {

// rns_gemm_wgmma_n<bn> over grid (gx, gy, gz) with 256 threads; lazy = 1 defers async work to its wait;
// skew > 0 breaks the pipeline on purpose (cp.async waits too short: the tests see LAZY catch it).
// Returns 0, -1 for a tile width without a kernel, or the error code (see rns_error).
int emu_gemm_wgmma(int bn, int lazy, int skew, unsigned gx, unsigned gy, unsigned gz, const rns_i8* X, const rns_i8* A,
                   rns_i8* out, int M, int N, int K, rns_i64 xplane, rns_i64 aplane, rns_i64 oplane, const float* P,
                   const float* IP, const float* H, const float* C16) {
    rns_dim3 grid{gx, gy, gz};
    rns_lazy = lazy != 0;
    rns_wait_skew = skew;
    rns_error = 0;
    auto run = [&](auto kernel) {
        rns_simt_launch(
            grid, RNS_WG_THREADS, [=] { kernel(X, A, out, M, N, K, xplane, aplane, oplane, P, IP, H, C16); },
            rns_host_block_done);
    };
    switch (bn) {
        case 64: run(rns_gemm_wgmma_n64); break;
        case 128: run(rns_gemm_wgmma_n128); break;
        default: return -1;
    }
    return rns_error.load();
}

// the fold period the build uses (RNS_WG_FOLD_TILES), so the tests know how often it folded
int emu_wgmma_fold_tiles() { return RNS_WG_FOLD_TILES; }

}  // extern "C"
