// Per-entry kernels: encode, elementwise product/sum, drop x g + base extension, fp64 decode.
//
// One thread per tensor entry (grid-stride loops), every plane of the entry
// handled by that thread: the layout is plane-major (L, N), so for a fixed plane
// consecutive threads touch consecutive bytes (coalesced). The arithmetic is the
// __host__ __device__ code of rns_arith.cuh, checked on the CPU against
// rnstensor.arith. Scratch digits live in shared memory, one column per thread
// (stride blockDim.x: conflict-free), so no local memory is used.
#include "rns_arith.cuh"

#if defined(__CUDA_ARCH__)
// Dynamic shared memory (the launch's shared_mem bytes): the digit scratch of drop/extend and the decodes.
extern __shared__ rns_i32 rns_words[];
#endif
// (the host SIMT harness, entry_host.cpp, defines rns_words as one buffer per launch)

// x (N) float64 as bits, exponents ev (runs of `inner`), L moduli -> out (L, N).
// CP: (3, L) weights of the significand's 14-bit pieces; pw: (L, ldpw) table of [2^i]_p; pa, per: its 2-adic offset and period.
extern "C" __global__ void __launch_bounds__(256) rns_encode(
    const rns_u64* __restrict__ xbits, rns_i64 N, const rns_i64* __restrict__ ev, rns_i64 inner, int L,
    const float* __restrict__ P, const float* __restrict__ IP, const float* __restrict__ H,
    const float* __restrict__ CP, const float* __restrict__ pw, int ldpw,
    const rns_i32* __restrict__ pa, const rns_i32* __restrict__ per, rns_i8* __restrict__ out) {
    for (rns_i64 i = (rns_i64)blockIdx.x * blockDim.x + threadIdx.x; i < N; i += (rns_i64)gridDim.x * blockDim.x) {
        rns_encode_entry(xbits[i], rns_entry_exponent(ev, inner, i), L, P, IP, H, CP, pw, ldpw, pa, per,
                         out + i, N);
    }
}

// a, b, out (L, n): mode 0 product, 1 sum, 2 difference; |t| <= 2^14.
extern "C" __global__ void __launch_bounds__(256) rns_elementwise(
    const rns_i8* __restrict__ a, const rns_i8* __restrict__ b, rns_i8* __restrict__ out, rns_i64 n, int L,
    int mode, const float* __restrict__ P, const float* __restrict__ IP, const float* __restrict__ H) {
    const rns_i64 total = n * L;
    for (rns_i64 i = (rns_i64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (rns_i64)gridDim.x * blockDim.x) {
        const int l = (int)(i / n);
        const float x = (float)a[i], y = (float)b[i];
        const float t = mode == 0 ? x * y : (mode == 1 ? x + y : x - y);
        out[i] = rns_to_i8(rns_reduce_f32(t, P[l], IP[l], H[l]));
    }
}

// The drop/extension tables of the current call (rnstensor.kernels.tables.drop_tables),
// copied in before each launch: every thread reads the same entry at the same
// time, which the constant cache broadcasts, and no table pointer takes a register.
#define RNS_DROP_IB 4096
#define RNS_DROP_FB 4096
__constant__ rns_i32 rns_drop_ib[RNS_DROP_IB];
__constant__ float rns_drop_fb[RNS_DROP_FB];

// X (L_in, N) -> out (T, N) through Alg. 1 for each dropped modulus, then Alg. 4.
// Dynamic shared memory: (max(wg, wm) + max(nr, 1)) * blockDim.x words (packed digits, remaining planes).
extern "C" __global__ void __launch_bounds__(128) rns_drop_extend(const rns_i8* __restrict__ X, rns_i64 N,
                                                                 rns_i8* __restrict__ out) {
    const RnsDropTables tb = rns_drop_tables(rns_drop_ib, rns_drop_fb);
    rns_i32* D = rns_words + threadIdx.x;
    rns_i32* Y = rns_words + max(tb.wg, tb.wm) * blockDim.x + threadIdx.x;
    for (rns_i64 i = (rns_i64)blockIdx.x * blockDim.x + threadIdx.x; i < N; i += (rns_i64)gridDim.x * blockDim.x)
        rns_drop_extend_entry(X + i, N, tb, D, Y, blockDim.x, out + i, N);
}

// X (m, N) -> out (N) float64: MRC digits, Horner, times (f + g) 2^(ev[i / inner] + k), faithfully rounded.
// Dynamic shared memory: m * blockDim.x words (ceil(m / 4) used).
extern "C" __global__ void __launch_bounds__(128) rns_decode_fp64(
    const rns_i8* __restrict__ X, rns_i64 N, const rns_i32* __restrict__ ib, const float* __restrict__ fb,
    const double* __restrict__ qd, double f, double g, const rns_i64* __restrict__ ev, rns_i64 inner, rns_i64 k,
    double* __restrict__ out) {
    const RnsDecodeTables tb = rns_decode_tables(ib, fb);
    rns_i32* d = rns_words + threadIdx.x;
    for (rns_i64 i = (rns_i64)blockIdx.x * blockDim.x + threadIdx.x; i < N; i += (rns_i64)gridDim.x * blockDim.x) {
        const rns_i64 e = rns_clip_exponent(rns_entry_exponent(ev, inner, i) + k);
        out[i] = rns_decode_fp64_entry(X + i, N, tb, qd, d, blockDim.x, f, g, e);
    }
}

// X (m, N) -> out (N) float64, correctly rounded v F 2^(ev[i / inner] + k) (F: odd factor limbs).
// Dynamic shared memory: m * blockDim.x words. Limbs live in local memory (not a hot kernel); at least
// 8 blocks per SM leaves ptxas 64 registers (it aims at 32 otherwise, and spills).
extern "C" __global__ void __launch_bounds__(128, 8) rns_decode_exact(
    const rns_i8* __restrict__ X, rns_i64 N, const rns_i32* __restrict__ ib, const float* __restrict__ fb,
    const double* __restrict__ qd, const rns_u32* __restrict__ F, int nf, int fneg, const rns_i64* __restrict__ ev,
    rns_i64 inner, rns_i64 k, double* __restrict__ out) {
    const RnsDecodeTables tb = rns_decode_tables(ib, fb);
    rns_i32* d = rns_words + threadIdx.x;
    for (rns_i64 i = (rns_i64)blockIdx.x * blockDim.x + threadIdx.x; i < N; i += (rns_i64)gridDim.x * blockDim.x)
        out[i] = rns_decode_exact_entry(X + i, N, tb, qd, F, nf, fneg != 0, rns_entry_exponent(ev, inner, i) + k, d,
                                        blockDim.x);
}
