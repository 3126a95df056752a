// The whole chain in one kernel: encode, every mode product, the drops and base extensions, decode.
//
// A block takes nb consecutive tensors of the batch and keeps them in shared
// memory from the float64 load to the float64 store, so each entry crosses
// device memory twice (8 bytes in, 8 bytes out) and every step in between is
// exact integer arithmetic on residue planes:
//
//   1. the largest magnitude of each tensor (a shared atomic max on the IEEE
//      bits) gives its exponent e = bits - E, as encode(..., shared_axes=tensor);
//   2. every entry is encoded on the L0 moduli (rns_encode_entry) into plane
//      buffer 0, at its place in the first physical layout;
//   3. product s contracts the innermost physical axis: out[l][j][r] =
//      [sum_k A[l][j][k] X[l][r][k]]_p with dp4a on four residues at a time
//      (|sum| <= 64 * 2^14 < 2^22 - 256: one float reduction), writing the new
//      axis outermost within each tensor (the batch stays outermost of all); the
//      next contracted axis, which the previous layout held second from the
//      inside, becomes innermost (the host chose the first layout so this order
//      is the plan's). The innermost axis is padded to a
//      multiple of 4 bytes; the operator's padded columns are zero, so the
//      padding's contents never matter;
//   4. drop x g and base extension per entry (rns_drop_extend_entry, the
//      tables of the CPU backend's drop);
//   5. decode per entry (fp64 Horner or exact, rns_arith.cuh) with the
//      exponent of the entry minus e and the plan's scale, stored in logical order.
//
// The program (layouts, table offsets) is an int32 array built on the host by
// rnstensor.kernels.fused; floats, float64s and the operators' int8 residues
// sit in three more arrays. The operators are copied to shared memory once per
// block; the tables are read through the cache (every thread reads the same entry).
// A plan's specialized build includes its program as constexpr arrays (rns_spec::PI / PF / QD and
// the operators as int32 words OPW; rnstensor.kernels.fused.spec_header, option -DRNS_SPEC_INCLUDE).
// The body then reads them instead of its pointer arguments, so every size, offset and table entry
// is a compile-time constant: the loops over planes, digits and operator rows unroll completely,
// tables become instruction immediates and the digits stay in registers.
#if defined(RNS_SPEC_INCLUDE)
#include "rns_chain_spec.h"
#define RNS_SPEC 1
#define RNS_SPEC_MAXM 49  // digits of at most the whole pool: register arrays, only the used ones survive
#endif
#include "rns_arith.cuh"

// program header (int32 slots)
#define RC_NDIM 0      // logical tensor axes d
#define RC_STEPS 1     // mode products K
#define RC_NIN 2       // entries per input tensor
#define RC_NOUT 3      // entries per output tensor
#define RC_NB 4        // tensors per block
#define RC_L0 5        // input planes
#define RC_BITS 6      // input encoding width
#define RC_CAP 7       // bytes per plane in each buffer (multiple of 16)
#define RC_LMAX 8      // most planes at any step
#define RC_OPBYTES 9   // operator bytes (multiple of 16)
#define RC_ENC_F 10    // float offset of the encode tables: P, IP, H, C18, C36 (L0 each), pw (L0 x ldpw)
#define RC_ENC_LDPW 11
#define RC_ENC_I 12    // int offset of pa, per (L0 each)
#define RC_ENC_MAP 13  // int offset: (extent, physical stride) per logical input axis, then the batch stride
#define RC_DEC_MAP 14  // the same for the output
#define RC_DEC_BUF 15  // buffer holding the final planes
#define RC_DEC_I 16    // int offset of the decode tables (rns_decode_tables)
#define RC_DEC_F 17    // float offset
#define RC_NFIELD 18   // Hadamard field components per element
#define RC_NQ 19       // entries per field component
#define RC_STEP0 20    // first step record
// step record (int32 slots)
#define RS_SRC 0       // buffer read by the product
#define RS_DST 1       // buffer written by the product
#define RS_L 2         // planes
#define RS_M 3         // rows: entries of the input / n_in, all tensors of the block
#define RS_W 4         // words per row: padded n_in / 4
#define RS_NOUT 5      // operator rows
#define RS_NLAST 6     // extent of the output's innermost axis
#define RS_NLASTPAD 7  // ... padded to a multiple of 4
#define RS_OP 8        // byte offset of the operator (L, n_out, 4 W) in the operator array
#define RS_RED 9       // float offset of P, IP, H (L each) of the planes
#define RS_DROP 10     // 1: a drop (and extension) follows
#define RS_DROP_DST 11 // its output buffer
#define RS_DROP_I 12   // int offset of its packed tables (rns_drop_tables)
#define RS_DROP_F 13   // float offset
#define RS_SLOTS 14    // physical slots of the output per plane (padding included)
#define RS_MT 15       // rows per tensor
#define RS_OSB 16      // output bytes per tensor and plane (the batch stride)
#define RS_KIND 17     // 0: mode product; 1: Hadamard product with a per-element field
#define RS_FIELD 18    // Hadamard: the field component
#define RS_FPLANE 19   // Hadamard: int offset of the field plane of every step plane
#define RS_MAP 20      // Hadamard: int offset of the layout's place map
#define RS_SIZE 21

#define RNS_CHAIN_THREADS 256

// The per-element field of the Hadamard steps: (planes, batch, components, entries) int8, plane stride
// fstride; this block's first tensor t0 and its tensor count nt (the rest of the block is past the end).
struct RnsChainField {
    const rns_i8* field;
    rns_i64 fstride, t0;
    int nt;
};

#if defined(RNS_SPEC) && defined(__CUDACC__)
#define RNS_SPEC_UNROLL _Pragma("unroll")
#else
#define RNS_SPEC_UNROLL
#endif

#if defined(__CUDA_ARCH__)
extern __shared__ __align__(16) unsigned char rns_chain_smem[];
#define RNS_CHAIN_SMEM rns_chain_smem

__device__ __forceinline__ void rns_atomic_max_u64(rns_u64* a, rns_u64 v) { atomicMax(a, v); }
__device__ __forceinline__ void rns_atomic_or(int* a, int v) { atomicOr(a, v); }
#endif
// (the host SIMT harness, chain_host.cpp, defines RNS_CHAIN_SMEM and the two atomics)

// Physical offset of logical entry q (row-major over the map's extents) of tensor b.
__device__ __forceinline__ rns_i64 rns_chain_place(const rns_i32* map, int ndim, rns_i64 q, int b) {
    rns_i64 off = (rns_i64)b * map[2 * ndim];
    for (int a = ndim - 1; a >= 0; --a) {
        const rns_i64 n = map[2 * a];
        off += (q % n) * map[2 * a + 1];
        q /= n;
    }
    return off;
}

// The exponent e = bits - E of a tensor whose largest |x| has the IEEE bits amax (0 if all zero).
__device__ __forceinline__ rns_i64 rns_chain_exponent(rns_u64 amax, int bits) {
    if (amax == 0) return 0;
    const rns_i64 ef = (rns_i64)(amax >> 52);
    rns_i64 E;
    if (ef > 0) {
        E = ef - 1022;  // 2^(ef - 1023) <= |x| < 2^(ef - 1022)
    } else {
        int len = 0;    // subnormal: |x| = amax 2^-1074
        for (rns_u64 m = amax; m; m >>= 1) ++len;
        E = len - 1074;
    }
    return bits - E;
}

// One mode product: every row r of the input (all planes, all operator rows) per thread.
// Rows are (tensor b, row r' of that tensor); the batch stays outermost in every layout.
template <int W>
__device__ __forceinline__ void rns_chain_product(const rns_i32* st, const rns_i8* __restrict__ src,
                                                  rns_i8* __restrict__ dst, const rns_i8* ops, int cap,
                                                  const float* __restrict__ pf) {
    const int L = st[RS_L], M = st[RS_M], MT = st[RS_MT], n_out = st[RS_NOUT];
    const int nlast = st[RS_NLAST], nlastpad = st[RS_NLASTPAD], osb = st[RS_OSB];
    const int jstride = (MT / nlast) * nlastpad;
#if defined(RNS_SPEC)
    const rns_i32* A = rns_spec::OPW + st[RS_OP] / 4;  // immediates once unrolled
#else
    const rns_i32* A = reinterpret_cast<const rns_i32*>(ops + st[RS_OP]);
#endif
    const float* P = pf + st[RS_RED];
    const float* IP = P + L;
    const float* H = IP + L;
    for (int r = threadIdx.x; r < M; r += blockDim.x) {
        const int b = r / MT, rt = r - b * MT;
        const int o = b * osb + (rt / nlast) * nlastpad + rt % nlast;
        RNS_SPEC_UNROLL
        for (int l = 0; l < L; ++l) {
            const rns_i32* xr = reinterpret_cast<const rns_i32*>(src + (rns_i64)l * cap) + (rns_i64)r * W;
            rns_i32 x[W];
#pragma unroll
            for (int w = 0; w < W; ++w) x[w] = xr[w];
            const float p = P[l], ip = IP[l], h = H[l];
            const rns_i32* Al = A + (rns_i64)l * n_out * W;
            rns_i8* out = dst + (rns_i64)l * cap + o;
            RNS_SPEC_UNROLL
            for (int j = 0; j < n_out; ++j) {
                rns_i32 acc = 0;
#pragma unroll
                for (int w = 0; w < W; ++w) acc = rns_dp4a(Al[j * W + w], x[w], acc);
                out[j * jstride] = rns_reduce_small_i8(acc, p, ip, h);
            }
        }
    }
}

// Hadamard product with a per-element field: out[l][x] = [f[l][x] x[l][x]]_p for the logical entries x of
// every tensor of the block (|product| <= 2^14: one reduction). The field is (planes, batch, components,
// entries) int8 in device memory, read in logical order (coalesced); past the batch end it reads nothing.
__device__ __forceinline__ void rns_chain_hadamard(const rns_i32* pi, const rns_i32* st, const float* __restrict__ pf,
                                                   const rns_i8* __restrict__ src, rns_i8* __restrict__ dst, int cap,
                                                   const RnsChainField& fd) {
    const int L = st[RS_L], ndim = pi[RC_NDIM], nb = pi[RC_NB], nq = pi[RC_NQ], nf = pi[RC_NFIELD];
    const rns_i32* fplane = pi + st[RS_FPLANE];
    const rns_i32* map = pi + st[RS_MAP];
    const float* P = pf + st[RS_RED];
    const float* IP = P + L;
    const float* H = IP + L;
    for (int i = threadIdx.x; i < nb * nq; i += blockDim.x) {
        const int b = i / nq, q = i - b * nq;
        const rns_i64 off = rns_chain_place(map, ndim, q, b);
        const bool live = b < fd.nt;
        const rns_i8* f = fd.field + ((fd.t0 + (live ? b : 0)) * nf + st[RS_FIELD]) * (rns_i64)nq + q;
        RNS_SPEC_UNROLL
        for (int l = 0; l < L; ++l) {
            const float fv = live ? (float)f[fplane[l] * fd.fstride] : 0.0f;
            dst[(rns_i64)l * cap + off] = rns_to_i8(rns_reduce_f32((float)src[(rns_i64)l * cap + off] * fv, P[l], IP[l], H[l]));
        }
    }
}

// One product (or Hadamard product) and the drops (and extension) after it; st: the step's record.
__device__ __forceinline__ void rns_chain_step(const rns_i32* pi, const rns_i32* st, const float* __restrict__ pf, rns_i8* buf0,
                                               rns_i8* buf1, const rns_i8* ops, int cap, float* scratch,
                                               const RnsChainField& fd) {
    const rns_i8* src = st[RS_SRC] ? buf1 : buf0;
    rns_i8* dst = st[RS_DST] ? buf1 : buf0;
    if (st[RS_KIND] == 1) rns_chain_hadamard(pi, st, pf, src, dst, cap, fd);
    else switch (st[RS_W]) {
        case 1: rns_chain_product<1>(st, src, dst, ops, cap, pf); break;
        case 2: rns_chain_product<2>(st, src, dst, ops, cap, pf); break;
        case 3: rns_chain_product<3>(st, src, dst, ops, cap, pf); break;
        case 4: rns_chain_product<4>(st, src, dst, ops, cap, pf); break;
        case 5: rns_chain_product<5>(st, src, dst, ops, cap, pf); break;
        case 6: rns_chain_product<6>(st, src, dst, ops, cap, pf); break;
        case 7: rns_chain_product<7>(st, src, dst, ops, cap, pf); break;
        case 8: rns_chain_product<8>(st, src, dst, ops, cap, pf); break;
        case 9: rns_chain_product<9>(st, src, dst, ops, cap, pf); break;
        case 10: rns_chain_product<10>(st, src, dst, ops, cap, pf); break;
        case 11: rns_chain_product<11>(st, src, dst, ops, cap, pf); break;
        case 12: rns_chain_product<12>(st, src, dst, ops, cap, pf); break;
        case 13: rns_chain_product<13>(st, src, dst, ops, cap, pf); break;
        case 14: rns_chain_product<14>(st, src, dst, ops, cap, pf); break;
        case 15: rns_chain_product<15>(st, src, dst, ops, cap, pf); break;
        case 16: rns_chain_product<16>(st, src, dst, ops, cap, pf); break;
        default: break;  // the host only builds programs with these widths
    }
    __syncthreads();
    if (st[RS_DROP]) {
        const RnsDropTables tb = rns_drop_tables(pi + st[RS_DROP_I], pf + st[RS_DROP_F]);
        rns_i8* ddst = st[RS_DROP_DST] ? buf1 : buf0;
        const int slots = st[RS_SLOTS];
#if defined(RNS_SPEC)
        float D[RNS_SPEC_MAXM], Yd[RNS_SPEC_MAXM];  // registers once unrolled
        for (int q = threadIdx.x; q < slots; q += blockDim.x)
            rns_drop_extend_entry(dst + q, cap, tb, D, Yd, 1, ddst + q, cap);
#else
        const int nd = max(max(tb.g, tb.m), 1);
        float* D = scratch + threadIdx.x;
        float* Yd = scratch + nd * blockDim.x + threadIdx.x;
        for (int q = threadIdx.x; q < slots; q += blockDim.x)
            rns_drop_extend_entry(dst + q, cap, tb, D, Yd, blockDim.x, ddst + q, cap);
#endif
        __syncthreads();
    }
}

#if defined(RNS_SPEC)
// The steps of a specialized program one by one at compile time: every record is a constant.
template <int S>
__device__ __forceinline__ void rns_spec_steps(const float* __restrict__ pf, rns_i8* buf0, rns_i8* buf1,
                                               const rns_i8* ops, int cap, float* scratch, const RnsChainField& fd) {
    if constexpr (S < rns_spec::PI[RC_STEPS]) {
        rns_chain_step(rns_spec::PI, rns_spec::PI + RC_STEP0 + S * RS_SIZE, pf, buf0, buf1, ops, cap, scratch, fd);
        rns_spec_steps<S + 1>(pf, buf0, buf1, ops, cap, scratch, fd);
    }
}
#endif

// X (B, N_in) float64 -> Y (B, N_out) float64 through the program; EXACT: the correctly rounded decode.
// dexp (N_out): the exponent of every output entry for a tensor with e = 0 (the plan's scale
// and its factor's power of two included). flags[0] |= 1 when an input is not finite.
// Dynamic shared memory: see rnstensor.kernels.fused.ChainProgram.shared_bytes.
template <bool EXACT>
__device__ __forceinline__ void rns_chain_body(const rns_u64* __restrict__ X, rns_i64 B, double* __restrict__ Y,
                                               const rns_i32* __restrict__ pi, const float* __restrict__ pf,
                                               const double* __restrict__ qd, const rns_i8* __restrict__ gops,
                                               const rns_i32* __restrict__ dexp, double f,
                                               const rns_u32* __restrict__ F, int nf, int fneg,
                                               const rns_i8* __restrict__ field, rns_i64 fstride,
                                               const rns_i32* __restrict__ fexp, int* __restrict__ flags) {
#if defined(RNS_SPEC)
    pi = rns_spec::PI;
    pf = rns_spec::PF;
    qd = rns_spec::QD;
#endif
    unsigned char* sm = RNS_CHAIN_SMEM;
    const int ndim = pi[RC_NDIM], K = pi[RC_STEPS], nb = pi[RC_NB], L0 = pi[RC_L0], bits = pi[RC_BITS];
    const rns_i64 nin = pi[RC_NIN], nout = pi[RC_NOUT];
    const int cap = pi[RC_CAP], lmax = pi[RC_LMAX], opbytes = pi[RC_OPBYTES];
    rns_u64* amax = reinterpret_cast<rns_u64*>(sm);      // nb: largest |x| bits, then the exponent
    rns_i8* ops = reinterpret_cast<rns_i8*>(sm + 8 * ((nb + 1) & ~1));
    rns_i8* const buf0 = ops + opbytes;  // the two plane buffers (selected, not indexed: no local array)
    rns_i8* const buf1 = buf0 + (rns_i64)lmax * cap;
    float* scratch = reinterpret_cast<float*>(buf1 + (rns_i64)lmax * cap);
    const rns_i64 t0 = (rns_i64)blockIdx.x * nb;
    const int nt = (int)(B - t0 < nb ? B - t0 : nb);  // tensors of this block
    const RnsChainField fd{field, fstride, t0, nt};

    // 1. the operators into shared memory; the largest magnitude of each tensor
#if !defined(RNS_SPEC)
    for (int i = threadIdx.x; i < opbytes / 4; i += blockDim.x)
        reinterpret_cast<rns_i32*>(ops)[i] = reinterpret_cast<const rns_i32*>(gops)[i];
#endif
    for (int b = threadIdx.x; b < nb; b += blockDim.x) amax[b] = 0;
    __syncthreads();
    int bad = 0;
    for (rns_i64 i = threadIdx.x; i < nt * nin; i += blockDim.x) {
        const rns_u64 a = X[t0 * nin + i] & 0x7fffffffffffffffULL;
        if (a >= 0x7ff0000000000000ULL) bad = 1;
        rns_atomic_max_u64(&amax[i / nin], a);
    }
    if (bad) rns_atomic_or(flags, 1);
    __syncthreads();
    for (int b = threadIdx.x; b < nb; b += blockDim.x) amax[b] = (rns_u64)rns_chain_exponent(amax[b], bits);
    __syncthreads();

    // 2. encode into buffer 0 (tensors past the batch end are encoded as zeros and never stored)
    {
        const float* ef = pf + pi[RC_ENC_F];
        const rns_i32* ei = pi + pi[RC_ENC_I];
        const rns_i32* map = pi + pi[RC_ENC_MAP];
        const int ldpw = pi[RC_ENC_LDPW];
        for (rns_i64 i = threadIdx.x; i < nb * nin; i += blockDim.x) {
            const int b = (int)(i / nin);
            const rns_u64 xb = b < nt ? X[t0 * nin + i] : 0ULL;
            const rns_i64 off = rns_chain_place(map, ndim, i - b * nin, b);
            rns_encode_entry(xb, (rns_i64)amax[b], L0, ef, ef + L0, ef + 2 * L0, ef + 3 * L0, ef + 4 * L0,
                             ef + 5 * L0, ldpw, ei, ei + L0, buf0 + off, cap);
        }
    }
    __syncthreads();

    // 3, 4. the products, each followed by its drops and extension
#if defined(RNS_SPEC)
    rns_spec_steps<0>(pf, buf0, buf1, ops, cap, scratch, fd);
#else
    for (int s = 0; s < K; ++s) rns_chain_step(pi, pi + RC_STEP0 + s * RS_SIZE, pf, buf0, buf1, ops, cap, scratch, fd);
#endif

    // 5. decode in logical order
    {
        const RnsDecodeTables tb = rns_decode_tables(pi + pi[RC_DEC_I], pf + pi[RC_DEC_F]);
        const rns_i32* map = pi + pi[RC_DEC_MAP];
        const rns_i8* fin = pi[RC_DEC_BUF] ? buf1 : buf0;
#if defined(RNS_SPEC)
        float d[RNS_SPEC_MAXM];  // registers: every index is a constant once the digit loops unroll
        const int ds = 1;
#else
        float* d = scratch + threadIdx.x;
        const int ds = blockDim.x;
#endif
        for (rns_i64 i = threadIdx.x; i < nt * nout; i += blockDim.x) {
            const int b = (int)(i / nout);
            const rns_i64 q = i - b * nout;
            const rns_i8* x = fin + rns_chain_place(map, ndim, q, b);
            const rns_i64 e = (rns_i64)dexp[q] - (rns_i64)amax[b] + (pi[RC_NFIELD] ? fexp[t0 + b] : 0);
            if (EXACT)
                Y[t0 * nout + i] = rns_decode_exact_entry(x, cap, tb, qd, F, nf, fneg != 0, e, d, ds);
            else
                Y[t0 * nout + i] = rns_decode_fp64_entry(x, cap, tb.perm, tb.m, tb.C, tb.ldc, tb.P, tb.IP, tb.H, qd, d,
                                                         ds, f, rns_clip_exponent(e));
        }
    }
}

// The fp64 decode (the hot kernel: no local memory) and the exact one (its limbs live in local memory).
// field/fstride/fexp: the Hadamard steps' per-element field and its per-element exponent (read only
// when the program has field components).
extern "C" __global__ void __launch_bounds__(RNS_CHAIN_THREADS) rns_chain_fused(
    const rns_u64* __restrict__ X, rns_i64 B, double* __restrict__ Y, const rns_i32* __restrict__ pi,
    const float* __restrict__ pf, const double* __restrict__ qd, const rns_i8* __restrict__ gops,
    const rns_i32* __restrict__ dexp, double f, const rns_i8* __restrict__ field, rns_i64 fstride,
    const rns_i32* __restrict__ fexp, int* __restrict__ flags) {
    rns_chain_body<false>(X, B, Y, pi, pf, qd, gops, dexp, f, nullptr, 0, 0, field, fstride, fexp, flags);
}

extern "C" __global__ void __launch_bounds__(RNS_CHAIN_THREADS) rns_chain_fused_exact(
    const rns_u64* __restrict__ X, rns_i64 B, double* __restrict__ Y, const rns_i32* __restrict__ pi,
    const float* __restrict__ pf, const double* __restrict__ qd, const rns_i8* __restrict__ gops,
    const rns_i32* __restrict__ dexp, const rns_u32* __restrict__ F, int nf, int fneg,
    const rns_i8* __restrict__ field, rns_i64 fstride, const rns_i32* __restrict__ fexp,
    int* __restrict__ flags) {
    rns_chain_body<true>(X, B, Y, pi, pf, qd, gops, dexp, 1.0, F, nf, fneg, field, fstride, fexp, flags);
}
