// A whole residue program in one kernel: encode, the mode products, Hadamard products with per-element
// fields, sums, the drops and base extensions, decode.
//
// A block takes nb consecutive tensors of the batch (a chain's tensors, a FEM operator's elements) and
// keeps them in shared memory from the float64 load to the float64 store, so each entry crosses device
// memory twice (8 bytes in, 8 bytes out) and every step in between is exact integer arithmetic on
// residue planes. The live tensors sit in slots (each slot: lmax planes of cap bytes); the program is a
// list of ops, each writing one slot, with a block barrier where the next op reads what this one wrote:
//
//   1. the largest magnitude of each tensor (a shared atomic max on the IEEE bits) gives its exponent
//      e = bits - E, as encode(..., shared_axes=tensor); every entry is encoded on the L0 moduli
//      (rns_encode_entry) into slot 0, at its place in the first physical layout;
//   2. a product op writes out[l][j][r] = [sum_t sum_k A_t[l][j][k] X_t[l][r][k]]_p: one term (n_in <= 64)
//      or a sum of two (n_in <= 16), all contracting the innermost physical axis, with dp4a on four
//      residues at a time (|sum| <= 64 * 2^14 < 2^22 - 1: one reduction from the accumulator's bits); the new axis is
//      written outermost within each tensor (the batch stays outermost of all), so the axis the
//      previous layout held second from the inside becomes innermost (the host chose the first layout
//      so this order is the program's). The innermost axis is padded to a multiple of 4 bytes; the
//      operators' padded columns are zero, so the padding's contents never matter;
//   3. a Hadamard op writes out = [sum_t F_t X_t]_p entrywise, F_t a component of the per-element
//      field read from device memory in logical order;
//   4. a drop op divides one slot by the dropped moduli and extends it back (rns_drop_extend_entry,
//      the tables of the CPU backend's drop), on the real entries only (not the padding);
//   5. decode per entry (fp64 Horner or exact, rns_arith.cuh) with the exponent of the entry minus e
//      (plus the field's exponent of the tensor), stored in logical order.
//
// The program (layouts, slots, table offsets) is an int32 array built on the host by
// rnstensor.kernels.fused; floats, float64s and the operators' int8 residues sit in three more
// arrays. The operators are copied to shared memory once per block; the tables are read through the
// cache (every thread reads the same entry).
// A plan's specialized build includes its program as constexpr arrays (rns_spec::PI / PF / QD; the
// operators as int32 words OPW and a copy PIW of PI, for the drops' and the decode's coefficient
// words, in constant memory; rnstensor.kernels.fused.spec_header, option -DRNS_SPEC_INCLUDE).
// The body then reads them instead of its pointer arguments, so every size, offset and table entry
// is a compile-time constant: the loops over planes, digits and operator rows unroll completely,
// tables become instruction immediates and the digits stay in registers.
#if defined(RNS_SPEC_INCLUDE)
#if defined(__CUDACC__)
#define RNS_SPEC_WORDS __constant__  // not const: the values stay in the constant bank (ULDC), not immediates
#else
#define RNS_SPEC_WORDS static
#endif
#include "rns_chain_spec.h"
#define RNS_SPEC 1
#define RNS_SPEC_MAXM 49  // planes of at most the whole pool: register arrays, only the used ones survive
#define RNS_SPEC_MAXW 13  // packed digit words of at most the whole pool
#endif
#include "rns_arith.cuh"
#include "rns_mma.cuh"

#include "rns_chain_layout.cuh"

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

// Entry indices within a block's tensors: 32-bit in a specialized build (its extents are constants, so
// each division is a multiply), 64-bit in the generic one (whose runtime 32-bit division sequences
// take registers that sm_80's 128-register build does not have: it would spill).
#if defined(RNS_SPEC)
typedef unsigned rns_place_t;
#else
typedef rns_i64 rns_place_t;
#endif

// Physical offset of logical entry q (row-major over the map's extents) of tensor b.
__device__ __forceinline__ rns_place_t rns_chain_place(const rns_i32* map, int ndim, rns_place_t q, int b) {
    rns_place_t off = (rns_place_t)b * map[2 * ndim];
    for (int a = ndim - 1; a >= 0; --a) {
        const rns_place_t n = (rns_place_t)map[2 * a];
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

// The shared-memory tensor slots of a block: slot k at base + k * stride.
struct RnsSlots {
    rns_i8* base;
    rns_i64 stride;
    __device__ __forceinline__ rns_i8* operator[](int k) const { return base + k * stride; }
};

// Where a table's coefficient words are read: a specialized build's constant-memory copy PIW at the
// offset p has in PI (dp4a takes a constant-bank word, not an immediate); p itself otherwise.
__device__ __forceinline__ const rns_i32* rns_chain_words(const rns_i32* p) {
#if defined(RNS_SPEC)
    return rns_spec::PIW + (p - rns_spec::PI);
#else
    return p;
#endif
}

// The output place of input row r of a product op (tensor b, row r - b MT of it), operator row 0.
__device__ __forceinline__ int rns_product_place(int r, int MT, int osb, int nlast, int nlastpad) {
    const int b = r / MT, rt = r - b * MT;
    return b * osb + (rt / nlast) * nlastpad + rt % nlast;
}

// A product op's record, decoded: sizes, the output's layout (jstride: between operator rows), the
// terms, the planes' reduction constants, the output slot.
struct RnsProductOp {
    int L, M, MT, n_out, nt, W, nlast, nlastpad, osb, jstride;
    const rns_i32* terms;
    const float *P, *IP, *H;
    rns_i8* dst;
};

__device__ __forceinline__ RnsProductOp rns_product_op(const rns_i32* pi, const rns_i32* st, const float* pf,
                                                       const RnsSlots& slot) {
    const int L = st[RS_L], MT = st[RS_MT], nlast = st[RS_NLAST], nlastpad = st[RS_NLASTPAD];
    const float* P = pf + st[RS_RED];
    return RnsProductOp{L, st[RS_M], MT, st[RS_NOUT], st[RS_NT], st[RS_W], nlast, nlastpad, st[RS_OSB],
                        (MT / nlast) * nlastpad, pi + st[RS_TERMS], P, P + L, P + 2 * L, slot[st[RS_OUT]]};
}

// A product op: every row r of the inputs (all planes, all operator rows) per thread; rows are
// (tensor b, row r' of that tensor). The TM x W words of the terms' rows stay in registers: sums of two
// products for rows of at most 4 words (n_in <= 16), one product beyond (the host builds no other sum);
// so the generic build needs 128 registers, two blocks of 256 threads per SM.
// WMAX: the row's words at most. Rows of up to 4 words have exactly WMAX (W == WMAX); wider ones (n_in > 16,
// rare: d <= 2) share WMAX = 16 and skip the missing words, a constant test in a specialized build and a
// uniform one in the generic build. With one instantiation per width 1..16, NVRTC 13.0 (the H200 image's)
// gives the generic kernel 255 registers (one block per SM; 13.5: 127); with 1..4, 8, 12 and 16, 128
// registers and 140 bytes of spills; with these five, 128 registers and no spills under both.
template <int WMAX>
__device__ __forceinline__ void rns_chain_product(const rns_i32* pi, const rns_i32* st, const float* __restrict__ pf,
                                                  const RnsSlots& slot, const rns_i8* ops, int cap) {
    [[maybe_unused]] const auto [L, M, MT, n_out, nt, W, nlast, nlastpad, osb, jstride, terms, P, IP, H, dst] =
        rns_product_op(pi, st, pf, slot);
    for (int r = threadIdx.x; r < M; r += blockDim.x) {
        const int o = rns_product_place(r, MT, osb, nlast, nlastpad);
        RNS_SPEC_UNROLL
        for (int l = 0; l < L; ++l) {
            constexpr int TM = WMAX <= 4 ? RNS_PRODUCT_TMAX : 1;
            rns_i32 x[TM][WMAX];
#pragma unroll
            for (int t = 0; t < TM; ++t) {
                if (t < nt) {
                    const rns_i32* xr = reinterpret_cast<const rns_i32*>(slot[terms[2 * t]] + (rns_i64)l * cap) + (rns_i64)r * W;
#pragma unroll
                    for (int w = 0; w < WMAX; ++w) x[t][w] = WMAX <= 4 || w < W ? xr[w] : 0;
                }
            }
            const float p = P[l], ip = IP[l], h = H[l];
            rns_i8* out = dst + (rns_i64)l * cap + o;
            RNS_SPEC_UNROLL
            for (int j = 0; j < n_out; ++j) {
                rns_i32 acc = RNS_MAGIC_BITS;  // the sum's bits are those of the float 1.5 2^23 + sum
#pragma unroll
                for (int t = 0; t < TM; ++t) {
                    if (t < nt) {
#if defined(RNS_SPEC)
                        const rns_i32* A = rns_spec::OPW + terms[2 * t + 1] / 4;  // constants once unrolled
#else
                        const rns_i32* A = reinterpret_cast<const rns_i32*>(ops + terms[2 * t + 1]);
#endif
                        const rns_i32* Aj = A + ((rns_i64)l * n_out + j) * W;
#pragma unroll
                        for (int w = 0; w < WMAX; ++w)
                            if (WMAX <= 4 || w < W) acc = rns_dp4a(Aj[w], x[t][w], acc);
                    }
                }
                out[j * jstride] = rns_reduce_magic_i8(rns_bits_float(acc), p, ip, h);
            }
        }
    }
}

// Lane (g, t)'s a0, a1 of the tile's mma for planes l0 (and l0 + 1 when W == 2), from the operator
// words A (plane, operator row, word): see rns_chain_product_mma.
template <int W>
__device__ __forceinline__ void rns_mma_operator_words(const rns_i32* A, int L, int l0, int g, int t, rns_u32& a0,
                                                       rns_u32& a1) {
    if (W == 2) {
        const int half = t >> 1, l = l0 + half;
        const rns_u32 av = l < L ? (rns_u32)A[(l * 8 + g) * 2 + (t & 1)] : 0u;
        a0 = half ? 0u : av;
        a1 = half ? av : 0u;
    } else {
        a0 = (rns_u32)A[(l0 * 16 + g) * 4 + t];
        a1 = (rns_u32)A[(l0 * 16 + g + 8) * 4 + t];
    }
}

// A product op on the tensor cores, for a full tile: one term and either rows of 2 words (5 <= n_in <= 8)
// with 8 operator rows (W = 2) or rows of 4 words (13 <= n_in <= 16) with 16 operator rows (W = 4). On
// partial tiles the 4-instruction epilogue per output would also run for the tile's empty rows, and dp4a
// is cheaper (6.5 instructions per stored residue against 7.2 at n = 8, but 1621 against 1280 per DoF
// for an n = 4 chain). A warp takes 8 rows of the input (the B columns) at a time; every sum starts at
// the magic's bits, so each d is the float 1.5 2^23 + sum for rns_reduce_magic_i8 (|sum| <= 16 * 2^14).
// W = 2: mma.sync m16n8k16 with two planes block-diagonal, the 16 x 16 A = [A_p0 0; 0 A_p1] (k: 8
// inputs of p0, then 8 of p1). Lane (g, t) works on plane p0 + t / 2, word t % 2: it holds row g of
// that plane's operator in a0 (t < 2) or a1 (t >= 2), zero in the other, and loads that word of input
// row g as b0. Its d0, d1 are (p0, operator row g, input rows 2t, 2t + 1), d2, d3 the same of p1.
// W = 4: one plane per mma, A = the plane's 16 x 16 operator: lane (g, t) holds word t of operator rows
// g (a0) and g + 8 (a1) and loads word t of input row g as b0; d0, d1 are (operator row g, input rows
// 2t, 2t + 1), d2, d3 the same of operator row g + 8. Here dp4a would take 4 words a residue (and a
// move each in a specialized build, whose long operator rows are immediates): 12.2 instructions per
// stored residue at n = 16, against 4.5 here.
// A specialized build loads each lane's operator words of all planes once per op, into registers.
template <int W>
__device__ __forceinline__ void rns_chain_product_mma(const rns_i32* pi, const rns_i32* st, const float* __restrict__ pf,
                                                      const RnsSlots& slot, const rns_i8* ops, int cap) {
    [[maybe_unused]] const auto [L, M, MT, n_out, nt, words, nlast, nlastpad, osb, jstride, terms, P, IP, H, dst] =
        rns_product_op(pi, st, pf, slot);
    static_assert(W == 2 || W == 4, "tiles of 2-word rows and 8 operator rows, or 4-word rows and 16");
    constexpr int PP = W == 2 ? 2 : 1;  // planes per mma
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, half = t >> 1;
    const int word = W == 2 ? t & 1 : t;
    const rns_i32* X = reinterpret_cast<const rns_i32*>(slot[terms[0]]);
#if defined(RNS_SPEC)
    const rns_i32* A = rns_spec::OPW + terms[1] / 4;  // constants (memory)
    rns_u32 as0[(RNS_SPEC_MAXM + 1) / PP], as1[(RNS_SPEC_MAXM + 1) / PP];  // this lane's a0, a1 of every mma
    RNS_SPEC_UNROLL
    for (int l0 = 0; l0 < L; l0 += PP) rns_mma_operator_words<W>(A, L, l0, g, t, as0[l0 / PP], as1[l0 / PP]);
#else
    const rns_i32* A = reinterpret_cast<const rns_i32*>(ops + terms[1]);  // shared memory
#endif
    const bool full = M % 8 == 0;  // a constant in a specialized build
    const int groups = (M + 7) / 8;
    for (int grp = threadIdx.x >> 5; grp < groups; grp += blockDim.x >> 5) {  // warp-uniform
        // this lane's B column, clamped to the last row: in bounds, and a clamped column feeds only
        // outputs that are not stored
        const int rb = min(grp * 8 + g, M - 1) * W + word;
        int o[2];
        bool oin[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {  // this lane's output rows 2t, 2t + 1
            const int rr = grp * 8 + 2 * t + i;
            oin[i] = full || rr < M;
            o[i] = rns_product_place(rr, MT, osb, nlast, nlastpad) + g * jstride;
        }
        RNS_SPEC_UNROLL
        for (int l0 = 0; l0 < L; l0 += PP) {
            const bool two = W == 2 && l0 + 1 < L;
            const int lb = two ? l0 + half : l0;  // W = 2, an odd last plane: the other half reads p0 (A is zero)
            rns_u32 a0, a1;
#if defined(RNS_SPEC)
            a0 = as0[l0 / PP];
            a1 = as1[l0 / PP];
#else
            rns_mma_operator_words<W>(A, L, l0, g, t, a0, a1);
#endif
            const rns_u32 b0 = (rns_u32)X[(rns_i64)lb * (cap / 4) + rb];
            int d[4];
            rns_mma_s8_k16(d, a0, a1, b0, RNS_MAGIC_BITS);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int l = W == 2 ? l0 + (i >> 1) : l0;
                const int row8 = W == 2 ? 0 : (i >> 1) * 8;  // W = 4: d2, d3 are operator row g + 8
                if (W == 4 || i < 2 || two) {
                    const rns_i8 r = rns_reduce_magic_i8(rns_bits_float(d[i]), P[l], IP[l], H[l]);
                    if (oin[i & 1]) dst[(rns_i64)l * cap + o[i & 1] + row8 * jstride] = r;
                }
            }
        }
    }
}

// The per-element field of the Hadamard ops: (planes, batch, components, entries) int8, plane stride
// fstride; this block's first tensor t0 and its tensor count nt (the rest of the block is past the end).
struct RnsChainField {
    const rns_i8* field;
    rns_i64 fstride, t0;
    int nt;
};

// A Hadamard op: out[l][x] = [sum_t f_t[l][x] x_t[l][x]]_p for the logical entries x of every tensor of the
// block (|sum| <= 3 * 2^14: one reduction, from the sum's magic-form bits). The field is read in logical
// order (coalesced); past the batch end it reads nothing.
__device__ __forceinline__ void rns_chain_hadamard(const rns_i32* pi, const rns_i32* st, const float* __restrict__ pf,
                                                   const RnsSlots& slot, int cap, const RnsChainField& fd) {
    const int L = st[RS_L], ndim = pi[RC_NDIM], nb = pi[RC_NB], nq = pi[RC_NQ], nf = pi[RC_NFIELD];
    const int nt = st[RS_NT];
    const rns_i32* terms = pi + st[RS_TERMS];
    const rns_i32* fplane = pi + st[RS_FPLANE];
    const rns_i32* map = pi + st[RS_MAP];
    const float* P = pf + st[RS_RED];
    const float* IP = P + L;
    const float* H = IP + L;
    rns_i8* dst = slot[st[RS_OUT]];
    for (int i = threadIdx.x; i < nb * nq; i += blockDim.x) {
        const int b = i / nq, q = i - b * nq;
        const rns_place_t off = rns_chain_place(map, ndim, q, b);
        const bool live = b < fd.nt;
        const rns_i8* f = fd.field + (fd.t0 + (live ? b : 0)) * nf * (rns_i64)nq + q;
        RNS_SPEC_UNROLL
        for (int l = 0; l < L; ++l) {
            rns_i32 acc = RNS_MAGIC_BITS;  // integer multiply-adds: no int8-to-float conversions
#pragma unroll
            for (int t = 0; t < RNS_TMAX; ++t) {
                if (t < nt) {
                    const rns_i32 fv = live ? (rns_i32)f[fplane[l] * fd.fstride + terms[2 * t + 1] * (rns_i64)nq] : 0;
                    acc += (rns_i32)slot[terms[2 * t]][(rns_i64)l * cap + off] * fv;
                }
            }
            dst[(rns_i64)l * cap + off] = rns_reduce_magic_i8(rns_bits_float(acc), P[l], IP[l], H[l]);
        }
    }
}

// A drop op: one slot divided by the dropped moduli and extended back, entry by entry. Padding entries
// are left as they are: a product multiplies them by zero columns, nothing else reads them.
__device__ __forceinline__ void rns_chain_drop(const rns_i32* pi, const rns_i32* st, const float* __restrict__ pf,
                                               const RnsSlots& slot, int cap, float* scratch) {
    const rns_i32* ib = pi + st[RS_DROP_I];
    const RnsDropTables tb = rns_drop_tables(ib, pf + st[RS_DROP_F], rns_chain_words(ib));
    const rns_i8* src = slot[st[RS_IN]];
    rns_i8* dst = slot[st[RS_OUT]];
    // the real entries e of all tensors, at their places past the innermost axis' padding
    const int entries = st[RS_SLOTS], inner = st[RS_NLAST], innerpad = st[RS_NLASTPAD];
#if defined(RNS_SPEC)
    rns_i32 D[RNS_SPEC_MAXW], Yd[RNS_SPEC_MAXM];  // registers once unrolled
    for (int e = threadIdx.x; e < entries; e += blockDim.x) {
        const int q = (e / inner) * innerpad + e % inner;
        rns_drop_extend_entry(src + q, cap, tb, D, Yd, 1, dst + q, cap);
    }
#else
    rns_i32* D = reinterpret_cast<rns_i32*>(scratch) + threadIdx.x;
    rns_i32* Yd = D + max(tb.wg, tb.wm) * blockDim.x;
    for (int e = threadIdx.x; e < entries; e += blockDim.x) {
        const int q = (e / inner) * innerpad + e % inner;
        rns_drop_extend_entry(src + q, cap, tb, D, Yd, blockDim.x, dst + q, cap);
    }
#endif
}

// One op; st: its record.
__device__ __forceinline__ void rns_chain_op(const rns_i32* pi, const rns_i32* st, const float* __restrict__ pf,
                                             const RnsSlots& slot, const rns_i8* ops, int cap, float* scratch,
                                             const RnsChainField& fd) {
    if (st[RS_KIND] == 2) {
        rns_chain_drop(pi, st, pf, slot, cap, scratch);
    } else if (st[RS_KIND] == 1) {
        rns_chain_hadamard(pi, st, pf, slot, cap, fd);
    } else if (st[RS_W] == 2 && st[RS_NOUT] == 8 && st[RS_NT] == 1) {  // full tiles: see rns_chain_product_mma
        rns_chain_product_mma<2>(pi, st, pf, slot, ops, cap);
    } else if (st[RS_W] == 4 && st[RS_NOUT] == 16 && st[RS_NT] == 1) {
        rns_chain_product_mma<4>(pi, st, pf, slot, ops, cap);
    } else {
        switch (st[RS_W]) {
            case 1: rns_chain_product<1>(pi, st, pf, slot, ops, cap); break;
            case 2: rns_chain_product<2>(pi, st, pf, slot, ops, cap); break;
            case 3: rns_chain_product<3>(pi, st, pf, slot, ops, cap); break;
            case 4: rns_chain_product<4>(pi, st, pf, slot, ops, cap); break;
            default: rns_chain_product<16>(pi, st, pf, slot, ops, cap); break;  // the host builds W <= 16
        }
    }
    if (st[RS_SYNC]) __syncthreads();
}

#if defined(RNS_SPEC)
// The ops of a specialized program one by one at compile time: every record is a constant.
template <int S>
__device__ __forceinline__ void rns_spec_ops(const float* __restrict__ pf, const RnsSlots& slot, const rns_i8* ops,
                                             int cap, float* scratch, const RnsChainField& fd) {
    if constexpr (S < rns_spec::PI[RC_STEPS]) {
        rns_chain_op(rns_spec::PI, rns_spec::PI + rns_spec::PI[RC_OPS] + S * RS_SIZE, pf, slot, ops, cap, scratch, fd);
        rns_spec_ops<S + 1>(pf, slot, ops, cap, scratch, fd);
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
                                               const rns_i32* __restrict__ dexp, double f, double g,
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
    RnsScale* escale = reinterpret_cast<RnsScale*>(sm + 8 * ((nb + 1) & ~1));  // nb: 2^e as the encode applies it
    rns_i8* ops = reinterpret_cast<rns_i8*>(sm + 8 * ((nb + 1) & ~1) + sizeof(RnsScale) * nb);
    const RnsSlots slot{ops + opbytes, (rns_i64)lmax * cap};
    float* scratch = reinterpret_cast<float*>(slot[pi[RC_NSLOTS]]);
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
    // the exponent's clamps and powers of two once per tensor, not per entry (~25 instructions each)
    for (int b = threadIdx.x; b < nb; b += blockDim.x) {
        const rns_i64 e = rns_chain_exponent(amax[b], bits);
        amax[b] = (rns_u64)e;
        escale[b] = rns_encode_scale(e);
    }
    __syncthreads();

    // 2. encode into slot 0 (tensors past the batch end are encoded as zeros and never stored)
    {
        const float* ef = pf + pi[RC_ENC_F];
        const rns_i32* ei = pi + pi[RC_ENC_I];
        const rns_i32* map = pi + pi[RC_ENC_MAP];
        const int ldpw = pi[RC_ENC_LDPW];
        const int n_in = (int)nin;
        for (int i = threadIdx.x; i < nb * n_in; i += blockDim.x) {
            const int b = i / n_in;
            const rns_u64 xb = b < nt ? X[t0 * nin + i] : 0ULL;
            const rns_place_t off = rns_chain_place(map, ndim, i - b * n_in, b);
            rns_encode_entry(xb, (rns_i64)amax[b], escale[b], L0, ef, ef + L0, ef + 2 * L0, ef + 3 * L0, ef + 6 * L0,
                             ldpw, ei, ei + L0, slot[0] + off, cap);
        }
    }
    __syncthreads();

    // 3, 4. the ops
#if defined(RNS_SPEC)
    rns_spec_ops<0>(pf, slot, ops, cap, scratch, fd);
#else
    for (int k = 0; k < K; ++k) rns_chain_op(pi, pi + pi[RC_OPS] + k * RS_SIZE, pf, slot, ops, cap, scratch, fd);
#endif

    // 5. decode in logical order
    {
        const rns_i32* ib = pi + pi[RC_DEC_I];
        const RnsDecodeTables tb = rns_decode_tables(ib, pf + pi[RC_DEC_F], rns_chain_words(ib));
        const rns_i32* map = pi + pi[RC_DEC_MAP];
        const rns_i8* fin = slot[pi[RC_DEC_BUF]];
#if defined(RNS_SPEC)
        rns_i32 d[RNS_SPEC_MAXW];  // registers: every index is a constant once the digit loops unroll
        const int ds = 1;
#else
        rns_i32* d = reinterpret_cast<rns_i32*>(scratch) + threadIdx.x;
        const int ds = blockDim.x;
#endif
        const int n_out = (int)nout;
        for (int i = threadIdx.x; i < nt * n_out; i += blockDim.x) {
            const int b = i / n_out;
            const int q = i - b * n_out;
            const rns_i8* x = fin + rns_chain_place(map, ndim, q, b);
            const rns_i64 e = (rns_i64)dexp[q] - (rns_i64)amax[b] + (pi[RC_NFIELD] ? fexp[t0 + b] : 0);
            if (EXACT)
                Y[t0 * nout + i] = rns_decode_exact_entry(x, cap, tb, qd, F, nf, fneg != 0, e, d, ds);
            else
                Y[t0 * nout + i] = rns_decode_fp64_entry(x, cap, tb, qd, d, ds, f, g, rns_clip_exponent(e));
        }
    }
}

// The fp64 decode (the hot kernel: no local memory) and the exact one (its limbs live in local memory).
// field/fstride/fexp: the Hadamard steps' per-element field and its per-element exponent (read only
// when the program has field components).
extern "C" __global__ void __launch_bounds__(RNS_CHAIN_THREADS) rns_chain_fused(
    const rns_u64* __restrict__ X, rns_i64 B, double* __restrict__ Y, const rns_i32* __restrict__ pi,
    const float* __restrict__ pf, const double* __restrict__ qd, const rns_i8* __restrict__ gops,
    const rns_i32* __restrict__ dexp, double f, double g, const rns_i8* __restrict__ field, rns_i64 fstride,
    const rns_i32* __restrict__ fexp, int* __restrict__ flags) {
    rns_chain_body<false>(X, B, Y, pi, pf, qd, gops, dexp, f, g, nullptr, 0, 0, field, fstride, fexp, flags);
}

extern "C" __global__ void __launch_bounds__(RNS_CHAIN_THREADS) rns_chain_fused_exact(
    const rns_u64* __restrict__ X, rns_i64 B, double* __restrict__ Y, const rns_i32* __restrict__ pi,
    const float* __restrict__ pf, const double* __restrict__ qd, const rns_i8* __restrict__ gops,
    const rns_i32* __restrict__ dexp, const rns_u32* __restrict__ F, int nf, int fneg,
    const rns_i8* __restrict__ field, rns_i64 fstride, const rns_i32* __restrict__ fexp,
    int* __restrict__ flags) {
    rns_chain_body<true>(X, B, Y, pi, pf, qd, gops, dexp, 1.0, 0.0, F, nf, fneg, field, fstride, fexp, flags);
}
