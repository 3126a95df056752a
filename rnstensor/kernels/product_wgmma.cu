// Residue GEMM on Hopper warpgroup MMA (wgmma, sm_90a only) with the centered modular reduction fused in the epilogue.
//
// out[l, m, n] = [ sum_k X[l, m, k] A[l, n, k] ]_{p_l}        (C[l] = X[l] A[l]^T, reduced)
//
// for planes l (grid z) of X (L, M, K) and A (L, N, K), both K-contiguous, and
// out (L, M, N) row-major int8. This is the residue mode product along the
// LAST axis (X (L, pre, n_in), operator (L, n_out, n_in): M = pre, N = n_out,
// K = n_in) and any batched "TN" residue GEMM. Other axes (post > 1) stay on
// product.cu's mma.sync kernel: 8-bit wgmma reads only K-major operands from
// shared memory, and a middle axis is not K-contiguous in memory.
// Requirements (checked by the host, rnstensor/backends/cuda.py):
// K % 16 == 0 and 16-byte aligned X and A (every 16-byte chunk of a row is
// either wholly inside K or wholly past it, so cp.async never straddles the end).
//
// Exactness: residues are <= 128 in magnitude, products <= 2^14, and int32
// accumulation is exact for 131071 terms; a k-tile is 64 terms, so after
// RNS_WG_FOLD_TILES = 2047 tiles (131008 terms: 2047 * 64 * 2^14 + 128 < 2^31)
// the accumulators are folded to their centered residues (<= 128) and go on,
// the same rule as product.cu (4095 steps of 32). The epilogue reduces each
// accumulator once (one float reduction when K <= 255, so |acc| <= 255 * 2^14 <
// 2^22 - 256; else the full int32 path, rns_arith.cuh) and writes int8: no
// int32 round trip through memory.
//
// Block: 256 threads = two warpgroups; a tile of 128 rows (warpgroup w owns
// rows 64w .. 64w + 63, one m64nBNk32 wgmma per 32 k) x BN columns (64 or 128).
// Shared memory: RNS_WG_SMEM bytes of static shared memory (48 KiB, no opt-in
// attribute needed), STAGES = 48 KiB / (128 * 64 + BN * 64) stages of 64 k (3
// for BN = 128, 4 for BN = 64) filled by cp.async; the same bytes hold the
// int8 output tile in the epilogue.
//
// Shared tile layout: the canonical K-major layout without swizzle
// ("interleaved"): 8-row x 16-byte core matrices, each 128 contiguous bytes
// (row r at +16 r); core (i, j) (rows 8i.., bytes 16j..) at 512 i + 128 j for a
// 64-byte-wide k-tile. So the descriptor's leading byte offset (between core
// matrices adjacent in K) is 128 and its stride byte offset (between 8-row
// groups in M or N) is 512. The 16-byte chunk c of a tile (c = 32 i + 8 j + r)
// lives at byte 16 c: the cp.async stores of a warp are contiguous (no bank
// conflicts) and its loads cover 8 rows x 64 contiguous bytes (whole sectors).
#include "rns_arith.cuh"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "product_wgmma.cu uses wgmma.mma_async: build it for sm_90a only (rnstensor.kernels.build.MODULE_ARCHS)"
#endif

#define RNS_WG_BM 128
#define RNS_WG_BK 64
#define RNS_WG_THREADS 256
#define RNS_WG_SMEM 49152
#define RNS_WG_LBO 128  // bytes between core matrices adjacent in K
#define RNS_WG_SBO 512  // bytes between 8-row groups (RNS_WG_BK / 16 core matrices of 128 bytes)
#ifndef RNS_WG_FOLD_TILES
#define RNS_WG_FOLD_TILES 2047  // k-tiles of 64 terms between folds: 2047 * 64 * 2^14 + 128 < 2^31
#endif

struct __align__(16) rns_wg_v4 {
    rns_u32 x, y, z, w;
};

// One buffer for every kernel of the module (file scope, so the host harness knows its address).
__shared__ __align__(128) rns_u8 rns_wg_smem[RNS_WG_SMEM];

template <int BN>
struct RnsWgCfg {
    static constexpr int A_BYTES = RNS_WG_BM * RNS_WG_BK;
    static constexpr int B_BYTES = BN * RNS_WG_BK;
    static constexpr int STAGES = RNS_WG_SMEM / (A_BYTES + B_BYTES);
    static constexpr int LDO = BN + 16;  // output tile row stride: 16-byte rows, rows 4 banks apart
    static_assert(STAGES >= 2, "two stages at least");
    static_assert(RNS_WG_BM * LDO <= RNS_WG_SMEM, "the output tile reuses the stage buffers");
};

// ----- the asynchronous primitives (PTX on the device; the host harness wgmma_host.cpp emulates them) ---------

__device__ __forceinline__ rns_u32 rns_smem_u32(const void* p) {
#if defined(__CUDA_ARCH__)
    return (rns_u32)__cvta_generic_to_shared(p);
#else
    return rns_host_smem_u32(p);
#endif
}

// 16 bytes global -> shared; src_size < 16 zero-fills the rest (0: nothing is read)
__device__ __forceinline__ void rns_cp_async16(rns_u8* dst, const rns_i8* src, int src_size) {
#if defined(__CUDA_ARCH__)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(rns_smem_u32(dst)), "l"(src), "r"(src_size)
                 : "memory");
#else
    rns_host_cp_async16(dst, src, src_size);
#endif
}

__device__ __forceinline__ void rns_cp_async_commit() {
#if defined(__CUDA_ARCH__)
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#else
    rns_host_cp_async_commit();
#endif
}

template <int N>
__device__ __forceinline__ void rns_cp_async_wait() {
#if defined(__CUDA_ARCH__)
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#else
    rns_host_cp_async_wait(N);
#endif
}

// wgmma reads shared memory through the async proxy: make this thread's
// generic-proxy writes (cp.async, st.shared) visible to it first.
__device__ __forceinline__ void rns_fence_proxy_async() {
#if defined(__CUDA_ARCH__)
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void rns_wgmma_fence() {
#if defined(__CUDA_ARCH__)
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void rns_wgmma_commit() {
#if defined(__CUDA_ARCH__)
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#else
    rns_host_wgmma_commit();
#endif
}

template <int N>
__device__ __forceinline__ void rns_wgmma_wait() {
#if defined(__CUDA_ARCH__)
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#else
    rns_host_wgmma_wait(N);
#endif
}

// Pin the accumulators: the compiler may not move their reads or writes across
// this point (so nothing touches them while a wgmma is in flight).
template <int R>
__device__ __forceinline__ void rns_pin(int (&d)[R]) {
#if defined(__CUDA_ARCH__)
#pragma unroll
    for (int i = 0; i < R; ++i) asm volatile("" : "+r"(d[i])::"memory");
#endif
}

// Shared-memory matrix descriptor (PTX ISA, "Matrix Descriptor Format"): start
// address, leading and stride byte offsets, each >> 4 in 14 bits; base offset 0
// and swizzle mode 0 (none) in bits 49-51 and 62-63.
__device__ __forceinline__ rns_u64 rns_wg_desc(const rns_u8* tile) {
    const rns_u64 addr = (rns_u64)((rns_smem_u32(tile) & 0x3FFFFu) >> 4);
    return addr | ((rns_u64)(RNS_WG_LBO >> 4) << 16) | ((rns_u64)(RNS_WG_SBO >> 4) << 32);
}

// D (64 x BN, s32) += A (64 x 32) B (BN x 32)^T, both int8 K-major in shared memory.
template <int BN>
__device__ __forceinline__ void rns_wgmma(int (&d)[BN / 2], rns_u64 da, rns_u64 db);

template <>
__device__ __forceinline__ void rns_wgmma<64>(int (&d)[32], rns_u64 da, rns_u64 db) {
#if defined(__CUDA_ARCH__)
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k32.s32.s8.s8 {"
        "%0, %1, %2, %3, %4, %5, %6, %7,"
        "%8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23,"
        "%24, %25, %26, %27, %28, %29, %30, %31"
        "}, %32, %33, p;\n}\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]),
          "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]),
          "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]),
          "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31])
        : "l"(da), "l"(db), "n"(1));  // scale-d = 1: D = A B + D (the accumulators start at 0)
#else
    rns_host_wgmma(d, 64, da, db);
#endif
}

template <>
__device__ __forceinline__ void rns_wgmma<128>(int (&d)[64], rns_u64 da, rns_u64 db) {
#if defined(__CUDA_ARCH__)
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8 {"
        "%0, %1, %2, %3, %4, %5, %6, %7,"
        "%8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23,"
        "%24, %25, %26, %27, %28, %29, %30, %31,"
        "%32, %33, %34, %35, %36, %37, %38, %39,"
        "%40, %41, %42, %43, %44, %45, %46, %47,"
        "%48, %49, %50, %51, %52, %53, %54, %55,"
        "%56, %57, %58, %59, %60, %61, %62, %63"
        "}, %64, %65, p;\n}\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]),
          "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]),
          "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]),
          "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31]),
          "+r"(d[32]), "+r"(d[33]), "+r"(d[34]), "+r"(d[35]), "+r"(d[36]), "+r"(d[37]), "+r"(d[38]), "+r"(d[39]),
          "+r"(d[40]), "+r"(d[41]), "+r"(d[42]), "+r"(d[43]), "+r"(d[44]), "+r"(d[45]), "+r"(d[46]), "+r"(d[47]),
          "+r"(d[48]), "+r"(d[49]), "+r"(d[50]), "+r"(d[51]), "+r"(d[52]), "+r"(d[53]), "+r"(d[54]), "+r"(d[55]),
          "+r"(d[56]), "+r"(d[57]), "+r"(d[58]), "+r"(d[59]), "+r"(d[60]), "+r"(d[61]), "+r"(d[62]), "+r"(d[63])
        : "l"(da), "l"(db), "n"(1));
#else
    rns_host_wgmma(d, 128, da, db);
#endif
}

// ----- the kernel -------------------------------------------------------------------------------------------

// Issue the cp.async copies of k-tile kt into stage buffers As (128 x 64) and Bs (BN x 64).
// Chunk c (16 bytes) of a tile: row 8 (c >> 5) + (c & 7), bytes 16 ((c >> 3) & 3) .. + 15, at byte 16 c.
// Rows past M (or N) and chunks past K are zero-filled without a read.
template <int BN>
__device__ __forceinline__ void rns_wg_load(rns_u8* As, rns_u8* Bs, const rns_i8* __restrict__ Xl,
                                            const rns_i8* __restrict__ Al, int M, int N, int K, int m0, int n0,
                                            int kt) {
    const int tid = threadIdx.x;
    const int k0 = kt * RNS_WG_BK;
#pragma unroll
    for (int i = 0; i < RnsWgCfg<BN>::A_BYTES / 16 / RNS_WG_THREADS; ++i) {
        const int c = tid + i * RNS_WG_THREADS;
        const int r = ((c >> 5) << 3) + (c & 7), k = k0 + 16 * ((c >> 3) & 3);
        const bool in = m0 + r < M && k < K;
        rns_cp_async16(As + 16 * c, in ? Xl + (rns_i64)(m0 + r) * K + k : Xl, in ? 16 : 0);
    }
#pragma unroll
    for (int i = 0; i < RnsWgCfg<BN>::B_BYTES / 16 / RNS_WG_THREADS; ++i) {
        const int c = tid + i * RNS_WG_THREADS;
        const int r = ((c >> 5) << 3) + (c & 7), k = k0 + 16 * ((c >> 3) & 3);
        const bool in = n0 + r < N && k < K;
        rns_cp_async16(Bs + 16 * c, in ? Al + (rns_i64)(n0 + r) * K + k : Al, in ? 16 : 0);
    }
}

template <int BN>
__device__ __forceinline__ void rns_gemm_wgmma_body(const rns_i8* __restrict__ X, const rns_i8* __restrict__ A,
                                                    rns_i8* __restrict__ out, int M, int N, int K, rns_i64 xplane,
                                                    rns_i64 aplane, rns_i64 oplane, const float* __restrict__ P,
                                                    const float* __restrict__ IP, const float* __restrict__ H,
                                                    const float* __restrict__ C16) {
    using Cfg = RnsWgCfg<BN>;
    constexpr int S = Cfg::STAGES;
    constexpr int R = BN / 2;  // accumulators per thread: 64 x BN over 128 threads
    const int tid = threadIdx.x;
    const int wg = tid >> 7;  // warpgroup: rows 64 wg .. 64 wg + 63 of the tile
    const int l = blockIdx.z;
    const int m0 = blockIdx.x * RNS_WG_BM;
    const int n0 = blockIdx.y * BN;
    const rns_i8* Xl = X + (rns_i64)l * xplane;
    const rns_i8* Al = A + (rns_i64)l * aplane;
    const float p = P[l], ip = IP[l], h = H[l], c16 = C16[l];
    rns_u8* const smem = rns_wg_smem;

    int acc[R];
#pragma unroll
    for (int i = 0; i < R; ++i) acc[i] = 0;

    const int KT = (K + RNS_WG_BK - 1) / RNS_WG_BK;
    // prologue: tiles 0 .. S - 2 in flight, one commit group per tile (empty groups keep the count uniform)
#pragma unroll
    for (int s = 0; s < S - 1; ++s) {
        if (s < KT) rns_wg_load<BN>(smem + s * Cfg::A_BYTES, smem + S * Cfg::A_BYTES + s * Cfg::B_BYTES, Xl, Al, M,
                                    N, K, m0, n0, s);
        rns_cp_async_commit();
    }
    int tiles = 0;
    for (int kt = 0; kt < KT; ++kt) {
        const int st = kt % S;
        rns_cp_async_wait<S - 2>();  // this thread's copies of tile kt have landed
        rns_fence_proxy_async();     // ... and are visible to wgmma (the async proxy)
        __syncthreads();             // everyone's copies of tile kt are in, and every warpgroup is done with tile kt - 1
        // refill the stage tile kt - 1 used (its wgmmas completed before the barrier)
        const int nt = kt + S - 1;
        if (nt < KT) rns_wg_load<BN>(smem + (nt % S) * Cfg::A_BYTES, smem + S * Cfg::A_BYTES + (nt % S) * Cfg::B_BYTES,
                                     Xl, Al, M, N, K, m0, n0, nt);
        rns_cp_async_commit();

        const rns_u8* As = smem + st * Cfg::A_BYTES + wg * 64 * RNS_WG_BK;  // this warpgroup's 64 rows
        const rns_u8* Bs = smem + S * Cfg::A_BYTES + st * Cfg::B_BYTES;
        rns_pin<R>(acc);
        rns_wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < RNS_WG_BK / 32; ++ks)  // 32 k = two core matrices of 16 bytes along K
            rns_wgmma<BN>(acc, rns_wg_desc(As + ks * 2 * RNS_WG_LBO), rns_wg_desc(Bs + ks * 2 * RNS_WG_LBO));
        rns_wgmma_commit();
        rns_wgmma_wait<0>();
        rns_pin<R>(acc);
        if (++tiles == RNS_WG_FOLD_TILES) {
            // keep int32 exact for any K: fold to centered residues (<= 128)
            tiles = 0;
#pragma unroll
            for (int i = 0; i < R; ++i) acc[i] = (int)rns_reduce_i32(acc[i], p, ip, h, c16);
        }
    }
    rns_cp_async_wait<0>();  // only empty groups remain; nothing may land in the output tile
    __syncthreads();         // every warpgroup is done reading the stages

    // ---- epilogue: centered reduction in registers, int8 through shared memory, 16-byte coalesced stores
    // Accumulator layout (PTX ISA, wgmma D fragments): warp v of the warpgroup owns rows 16 v .. 16 v + 15;
    // lane = 4 g + t holds, for each 8-column block i, acc[4i], acc[4i+1] = D[16v + g][8i + 2t, +1] and
    // acc[4i+2], acc[4i+3] = D[16v + g + 8][8i + 2t, +1].
    const bool small = K <= 255;
    {
        const int v = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, t = lane & 3;
        rns_u8* Os = smem + (64 * wg + 16 * v + g) * Cfg::LDO + 2 * t;
#pragma unroll
        for (int i = 0; i < BN / 8; ++i)
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int r0 = (int)rns_reduce_acc(acc[4 * i + 2 * half], small, p, ip, h, c16);
                const int r1 = (int)rns_reduce_acc(acc[4 * i + 2 * half + 1], small, p, ip, h, c16);
                *reinterpret_cast<unsigned short*>(Os + half * 8 * Cfg::LDO + 8 * i) =
                    (unsigned short)((rns_u32)(rns_u8)r0 | ((rns_u32)(rns_u8)r1 << 8));
            }
    }
    __syncthreads();
    rns_i8* Ol = out + (rns_i64)l * oplane;
    const bool ovec = (N % 16) == 0 && (((unsigned long long)Ol) & 15) == 0;
    constexpr int CPR = BN / 16;  // 16-byte chunks per output row
#pragma unroll
    for (int i = 0; i < RNS_WG_BM * CPR / RNS_WG_THREADS; ++i) {
        const int c = tid + i * RNS_WG_THREADS;
        const int r = c / CPR, n = n0 + 16 * (c % CPR);
        const int m = m0 + r;
        if (m >= M || n >= N) continue;
        const rns_u8* src = smem + r * Cfg::LDO + 16 * (c % CPR);
        rns_i8* dst = Ol + (rns_i64)m * N + n;
        if (ovec && n + 16 <= N) {
            *reinterpret_cast<rns_wg_v4*>(dst) = *reinterpret_cast<const rns_wg_v4*>(src);
        } else {
            for (int b = 0; b < 16 && n + b < N; ++b) dst[b] = (rns_i8)src[b];
        }
    }
}

// BN = 128: 64 accumulators a thread and ~210 registers, one block (8 warps) per SM; at 128 registers
// (two blocks) ptxas spills. BN = 64 fits two blocks in 128 registers without spills.
#define RNS_GEMM_WGMMA_KERNEL(BN, MINB)                                                                          \
    extern "C" __global__ void __launch_bounds__(RNS_WG_THREADS, MINB) rns_gemm_wgmma_n##BN(                    \
        const rns_i8* __restrict__ X, const rns_i8* __restrict__ A, rns_i8* __restrict__ out, int M, int N,     \
        int K, rns_i64 xplane, rns_i64 aplane, rns_i64 oplane, const float* __restrict__ P,                    \
        const float* __restrict__ IP, const float* __restrict__ H, const float* __restrict__ C16) {            \
        rns_gemm_wgmma_body<BN>(X, A, out, M, N, K, xplane, aplane, oplane, P, IP, H, C16);                    \
    }

RNS_GEMM_WGMMA_KERNEL(64, 2)
RNS_GEMM_WGMMA_KERNEL(128, 1)
