// Residue mode product on INT8 tensor cores with the centered modular reduction fused in the epilogue.
//
// out[l, a, j, t] = [ sum_k A[l, j, k] X[l, a, k, t] ]_{p_l}
//
// for planes l (grid z; plane strides xplane, oplane), X (L, pre, n_in, post) and the operator A (L, n_out, n_in):
// the contraction of any tensor axis (pre/post are the axes before/after it),
// with no transposing copy in global memory. The GEMM is D (M x n_out) =
// X^T (M x n_in) A^T with M = pre * post tensor columns in the MMA's M
// dimension (so a small operator, n_out = 8, wastes no tensor-core rows) and
// the operator in N. Both operands go to shared memory K-contiguous (the only
// layout of 8-bit mma.sync, "row.col"): rows of 32 bytes, padded to 48 so the
// fragment loads of a warp hit 32 different banks.
//
// Exactness: residues are <= 128 in magnitude, products <= 2^14, and int32
// accumulation is exact for 131071 terms; past 4095 k-steps (131040 terms) the
// accumulators are folded to their centered residues (<= 128) and go on. The
// epilogue reduces each accumulator once (one float reduction when n_in <= 255,
// so |acc| <= 255 * 2^14 < 2^22 - 256; else the full int32 path) and writes int8:
// no int32 round trip through memory.
//
// Block: 128 threads (4 warps), a tile of 128 columns x BN operator rows; warp w
// owns columns 32w .. 32w + 31 as two m16 tiles and all BN/8 n8 tiles.
#include "rns_arith.cuh"
#include "rns_mma.cuh"

#define RNS_BM 128
#define RNS_BK 32
#define RNS_LDS 48
#ifndef RNS_FOLD_STEPS
#define RNS_FOLD_STEPS 4095  // k-steps of 32 terms between folds: 4095 * 32 * 2^14 + 128 < 2^31
#endif

struct __align__(8) rns_w2 { rns_u32 x, y; };
struct __align__(16) rns_w4 { rns_u32 x, y, z, w; };


// The tiles of one k-step pass through registers: a thread loads its share of
// the next X and operator tiles from global memory before the MMAs of the
// current step (so the loads are in flight while the tensor cores work) and
// stores them to shared memory after the step's closing barrier.
template <int BN>
struct RnsStage {
    rns_u32 x[8];           // X: 32 bytes (4 rows x 8 contiguous bytes, or one strided column)
    rns_u32 a[BN / 16 + 1]; // operator: BN / 4 bytes
};

template <int BN>
__device__ __forceinline__ void rns_load_tiles(RnsStage<BN>& st, const rns_i8* __restrict__ Xl,
                                               const rns_i8* __restrict__ Al, int M, int m0, int j0, int n_in,
                                               int post, int n_out, int k0, bool contiguous, bool vec8,
                                               bool avec, rns_i64 rowoff) {
    const int tid = threadIdx.x;
    if (contiguous) {
        // rows (tid >> 2) + 32 i, bytes 8 (tid & 3) .. + 7
        const int kk = 8 * (tid & 3);
        const int kr = n_in - (k0 + kk);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int m = m0 + (tid >> 2) + 32 * i;
            rns_u32 lo = 0u, hi = 0u;
            if (m < M && kr > 0) {
                const rns_i8* src = Xl + (rns_i64)m * n_in + k0 + kk;
                if (vec8) {
                    const rns_w2 w = *reinterpret_cast<const rns_w2*>(src);
                    lo = w.x;
                    hi = w.y;
                } else {
#pragma unroll
                    for (int b = 0; b < 8; ++b) {
                        const rns_u32 byte = b < kr ? (rns_u32)(rns_u8)src[b] : 0u;
                        if (b < 4) lo |= byte << (8 * b);
                        else hi |= byte << (8 * (b - 4));
                    }
                }
            }
            st.x[2 * i] = lo;
            st.x[2 * i + 1] = hi;
        }
    } else {
        // column m0 + tid, 32 k-values strided by post (consecutive threads: consecutive bytes)
#pragma unroll
        for (int i = 0; i < 8; ++i) st.x[i] = 0u;
        if (m0 + tid < M) {
            const rns_i8* src = Xl + rowoff + (rns_i64)k0 * post;
            const int kr = n_in - k0;
#pragma unroll
            for (int kk = 0; kk < RNS_BK; ++kk)
                if (kk < kr) st.x[kk >> 2] |= (rns_u32)(rns_u8)src[(rns_i64)kk * post] << (8 * (kk & 3));
        }
    }
    // operator: thread tid holds bytes [tid BB, tid BB + BB) of the BN x 32 tile (row j = . / 32)
    constexpr int BB = BN / 4;
    const int e0 = tid * BB;
    const int j = e0 >> 5, kk0 = e0 & 31;
    const int jj = j0 + j, k = k0 + kk0;
#pragma unroll
    for (int i = 0; i < BN / 16 + 1; ++i) st.a[i] = 0u;
    if (jj < n_out) {
        const rns_i8* src = Al + (rns_i64)jj * n_in + k;
        if (avec && BB >= 4 && k + BB <= n_in) {
#pragma unroll
            for (int i = 0; i < (BB >= 4 ? BB / 4 : 1); ++i) st.a[i] = reinterpret_cast<const rns_u32*>(src)[i];
        } else {
#pragma unroll
            for (int b = 0; b < BB; ++b)
                if (k + b < n_in) st.a[b >> 2] |= (rns_u32)(rns_u8)src[b] << (8 * (b & 3));
        }
    }
}

template <int BN>
__device__ __forceinline__ void rns_store_tiles(const RnsStage<BN>& st, rns_u8* As, rns_u8* Bs, bool contiguous) {
    const int tid = threadIdx.x;
    if (contiguous) {
        const int kk = 8 * (tid & 3);
#pragma unroll
        for (int i = 0; i < 4; ++i)
            *reinterpret_cast<rns_w2*>(As + ((tid >> 2) + 32 * i) * RNS_LDS + kk) = rns_w2{st.x[2 * i], st.x[2 * i + 1]};
    } else {
        rns_w4* dst = reinterpret_cast<rns_w4*>(As + tid * RNS_LDS);
        dst[0] = rns_w4{st.x[0], st.x[1], st.x[2], st.x[3]};
        dst[1] = rns_w4{st.x[4], st.x[5], st.x[6], st.x[7]};
    }
    constexpr int BB = BN / 4;
    const int e0 = tid * BB;
    rns_u8* dst = Bs + (e0 >> 5) * RNS_LDS + (e0 & 31);
    if (BB >= 4) {
#pragma unroll
        for (int i = 0; i < (BB >= 4 ? BB / 4 : 1); ++i) reinterpret_cast<rns_u32*>(dst)[i] = st.a[i];
    } else {
#pragma unroll
        for (int b = 0; b < BB; ++b) dst[b] = (rns_u8)(st.a[0] >> (8 * b));
    }
}

// The K loop of one output tile: acc[mt][nt][c] = sum_k X[m][k] A[j][k] over the whole
// contraction (folded to centered residues every RNS_FOLD_STEPS k-steps, see the header).
// Xl, Al: this plane's tensor and operator; ends with a __syncthreads, so the shared
// tiles may be reused at once.
template <int BN>
__device__ __forceinline__ void rns_mainloop(const rns_i8* __restrict__ Xl, const rns_i8* __restrict__ Al, int M,
                                             int m0, int j0, int n_in, int post, int n_out, rns_u8* As, rns_u8* Bs,
                                             int (&acc)[2][BN / 8][4], float p, float ip, float h, float c16) {
    constexpr int NT = BN / 8;
    const int tid = threadIdx.x;
    const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, tq = lane & 3;
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int c = 0; c < 4; ++c) acc[mt][nt][c] = 0;

    const bool contiguous = post == 1;
    const bool vec8 = contiguous && (n_in % 8) == 0 && (((unsigned long long)Xl) & 7) == 0;
    const bool avec = (n_in % 4) == 0 && (((unsigned long long)Al) & 3) == 0;
    // strided loader (post > 1): this thread's column and its offset in the plane
    rns_i64 rowoff = 0;
    if (!contiguous && m0 + tid < M) {
        const int a = (m0 + tid) / post;
        rowoff = (rns_i64)a * n_in * post + (m0 + tid - a * post);
    }

    RnsStage<BN> st;
    rns_load_tiles<BN>(st, Xl, Al, M, m0, j0, n_in, post, n_out, 0, contiguous, vec8, avec, rowoff);
    int steps = 0;
    for (int k0 = 0; k0 < n_in; k0 += RNS_BK) {
        rns_store_tiles<BN>(st, As, Bs, contiguous);
        __syncthreads();
        if (k0 + RNS_BK < n_in)
            rns_load_tiles<BN>(st, Xl, Al, M, m0, j0, n_in, post, n_out, k0 + RNS_BK, contiguous, vec8, avec, rowoff);
        // ---- tensor-core MMAs on the tiles in shared memory
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
            const rns_u8* a = As + (warp * 32 + mt * 16 + g) * RNS_LDS + 4 * tq;
            const rns_u32 a0 = *reinterpret_cast<const rns_u32*>(a);
            const rns_u32 a1 = *reinterpret_cast<const rns_u32*>(a + 8 * RNS_LDS);
            const rns_u32 a2 = *reinterpret_cast<const rns_u32*>(a + 16);
            const rns_u32 a3 = *reinterpret_cast<const rns_u32*>(a + 8 * RNS_LDS + 16);
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                const rns_u8* b = Bs + (nt * 8 + g) * RNS_LDS + 4 * tq;
                rns_mma_s8(acc[mt][nt], a0, a1, a2, a3, *reinterpret_cast<const rns_u32*>(b),
                           *reinterpret_cast<const rns_u32*>(b + 16));
            }
        }
        __syncthreads();
        if (++steps == RNS_FOLD_STEPS) {
            // keep int32 exact for any n_in: fold to centered residues (<= 128)
            steps = 0;
#pragma unroll
            for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                    for (int c = 0; c < 4; ++c) acc[mt][nt][c] = (int)rns_reduce_i32(acc[mt][nt][c], p, ip, h, c16);
        }
    }
}

// Where this thread's accumulator (mt, half) row goes: the output column's base
// pointer in tensor order, or nullptr past the last column.
__device__ __forceinline__ rns_i8* rns_out_row(rns_i8* Ol, int m0, int mt, int half, int M, int n_out, int post) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int m = m0 + warp * 32 + mt * 16 + (lane >> 2) + 8 * half;
    if (m >= M) return nullptr;
    const int a = m / post;
    return Ol + (rns_i64)a * n_out * post + (m - a * post);
}

template <int BN>
__device__ __forceinline__ void rns_product_body(const rns_i8* __restrict__ X, const rns_i8* __restrict__ A,
                                                 rns_i8* __restrict__ out, int pre, int n_in, int post,
                                                 int n_out, rns_i64 xplane, rns_i64 oplane, const float* __restrict__ P,
                                                 const float* __restrict__ IP, const float* __restrict__ H,
                                                 const float* __restrict__ C16) {
    constexpr int NT = BN / 8;
    __shared__ __align__(16) rns_u8 As[RNS_BM * RNS_LDS];
    __shared__ __align__(16) rns_u8 Bs[BN * RNS_LDS];
    const int l = blockIdx.z;
    const int M = pre * post;  // < 2^31 - 256: the host splits larger launches along pre
    const int m0 = blockIdx.x * RNS_BM;
    const int j0 = blockIdx.y * BN;
    const float p = P[l], ip = IP[l], h = H[l], c16 = C16[l];
    int acc[2][NT][4];
    rns_mainloop<BN>(X + (rns_i64)l * xplane, A + (rns_i64)l * n_out * n_in, M, m0, j0, n_in, post, n_out, As, Bs,
                     acc, p, ip, h, c16);
    // ---- epilogue: centered reduction in registers, int8 out in tensor order
    rns_i8* Ol = out + (rns_i64)l * oplane;
    const bool small = n_in <= 255;
    const int tq = threadIdx.x & 3;
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            rns_i8* dst = rns_out_row(Ol, m0, mt, half, M, n_out, post);
            if (dst == nullptr) continue;
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
                for (int c = 0; c < 2; ++c) {
                    const int j = j0 + nt * 8 + 2 * tq + c;
                    if (j < n_out) {
                        float r = rns_reduce_acc(acc[mt][nt][2 * half + c], small, p, ip, h, c16);
                        dst[(rns_i64)j * post] = rns_to_i8(r);
                    }
                }
            }
        }
    }
}

// The fused 3M complex product ([2606.25453] Sec. IV-B) for one plane:
//   T1 = [A_re X_re], T2 = [A_im X_im], T3 = [A_sum X_sum]  (A_sum = [A_re + A_im], X_sum likewise),
//   out_re = [T1 - T2],  out_im = [T3 - T1 - T2],
// three K loops through one int32 accumulator, T1 and T2 kept as residues in
// registers (|T| <= 128, so the combinations are exact float integers below 2^9):
// two int8 tiles written, no int32 and no T round trip through memory.
template <int BN>
__device__ __forceinline__ void rns_product3m_body(
    const rns_i8* __restrict__ Xre, const rns_i8* __restrict__ Xim, const rns_i8* __restrict__ Xsum,
    const rns_i8* __restrict__ Are, const rns_i8* __restrict__ Aim, const rns_i8* __restrict__ Asum,
    rns_i8* __restrict__ out_re, rns_i8* __restrict__ out_im, int pre, int n_in, int post, int n_out,
    rns_i64 xplane, rns_i64 oplane, const float* __restrict__ P, const float* __restrict__ IP,
    const float* __restrict__ H, const float* __restrict__ C16) {
    constexpr int NT = BN / 8;
    __shared__ __align__(16) rns_u8 As[RNS_BM * RNS_LDS];
    __shared__ __align__(16) rns_u8 Bs[BN * RNS_LDS];
    const int l = blockIdx.z;
    const int M = pre * post;
    const int m0 = blockIdx.x * RNS_BM;
    const int j0 = blockIdx.y * BN;
    const float p = P[l], ip = IP[l], h = H[l], c16 = C16[l];
    const bool small = n_in <= 255;
    const rns_i64 xo = (rns_i64)l * xplane, ao = (rns_i64)l * n_out * n_in;
    int acc[2][NT][4];
    float t1[2][NT][4], t2[2][NT][4];
    // one K loop in the code, run three times (three inlined copies compile three times slower)
#pragma unroll 1
    for (int pass = 0; pass < 3; ++pass) {
        const rns_i8* Xp = pass == 0 ? Xre : (pass == 1 ? Xim : Xsum);
        const rns_i8* Ap = pass == 0 ? Are : (pass == 1 ? Aim : Asum);
        rns_mainloop<BN>(Xp + xo, Ap + ao, M, m0, j0, n_in, post, n_out, As, Bs, acc, p, ip, h, c16);
        if (pass == 2) break;
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    const float r = rns_reduce_acc(acc[mt][nt][c], small, p, ip, h, c16);
                    if (pass == 0) t1[mt][nt][c] = r;
                    else t2[mt][nt][c] = r;
                }
    }
    rns_i8* Ore = out_re + (rns_i64)l * oplane;
    rns_i8* Oim = out_im + (rns_i64)l * oplane;
    const int tq = threadIdx.x & 3;
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            rns_i8* dre = rns_out_row(Ore, m0, mt, half, M, n_out, post);
            if (dre == nullptr) continue;
            rns_i8* dim = rns_out_row(Oim, m0, mt, half, M, n_out, post);
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
                for (int c = 0; c < 2; ++c) {
                    const int j = j0 + nt * 8 + 2 * tq + c;
                    if (j < n_out) {
                        const int q = 2 * half + c;
                        const float a = t1[mt][nt][q], b = t2[mt][nt][q];
                        const float t3 = rns_reduce_acc(acc[mt][nt][q], small, p, ip, h, c16);
                        dre[(rns_i64)j * post] = rns_to_i8(rns_reduce_f32(a - b, p, ip, h));
                        dim[(rns_i64)j * post] = rns_to_i8(rns_reduce_f32(t3 - a - b, p, ip, h));
                    }
                }
            }
        }
    }
}

#define RNS_PRODUCT_KERNEL(BN)                                                                                   \
    extern "C" __global__ void __launch_bounds__(RNS_BM, 2) rns_product_n##BN(                                  \
        const rns_i8* __restrict__ X, const rns_i8* __restrict__ A, rns_i8* __restrict__ out, int pre,          \
        int n_in, int post, int n_out, rns_i64 xplane, rns_i64 oplane, const float* __restrict__ P, const float* __restrict__ IP,          \
        const float* __restrict__ H, const float* __restrict__ C16) {                                          \
        rns_product_body<BN>(X, A, out, pre, n_in, post, n_out, xplane, oplane, P, IP, H, C16);                                 \
    }

RNS_PRODUCT_KERNEL(8)
RNS_PRODUCT_KERNEL(16)
RNS_PRODUCT_KERNEL(32)
RNS_PRODUCT_KERNEL(64)

#define RNS_PRODUCT3M_KERNEL(BN)                                                                                 \
    extern "C" __global__ void __launch_bounds__(RNS_BM, 2) rns_product3m_n##BN(                                \
        const rns_i8* __restrict__ Xre, const rns_i8* __restrict__ Xim, const rns_i8* __restrict__ Xsum,        \
        const rns_i8* __restrict__ Are, const rns_i8* __restrict__ Aim, const rns_i8* __restrict__ Asum,        \
        rns_i8* __restrict__ out_re, rns_i8* __restrict__ out_im, int pre, int n_in, int post, int n_out,       \
        rns_i64 xplane, rns_i64 oplane, const float* __restrict__ P, const float* __restrict__ IP,             \
        const float* __restrict__ H, const float* __restrict__ C16) {                                          \
        rns_product3m_body<BN>(Xre, Xim, Xsum, Are, Aim, Asum, out_re, out_im, pre, n_in, post, n_out, xplane,  \
                               oplane, P, IP, H, C16);                                                         \
    }

RNS_PRODUCT3M_KERNEL(8)
RNS_PRODUCT3M_KERNEL(32)

// The reduction after a cuBLAS INT8 GEMM (the baseline path): int32 accumulators
// (L, n) -> centered int8 residues, plane l reduced modulo p_l.
extern "C" __global__ void __launch_bounds__(256) rns_reduce_i32(const rns_i32* __restrict__ acc,
                                                                rns_i8* __restrict__ out, rns_i64 n, int L,
                                                                const float* __restrict__ P,
                                                                const float* __restrict__ IP,
                                                                const float* __restrict__ H,
                                                                const float* __restrict__ C16) {
    const rns_i64 total = n * L;
    for (rns_i64 i = (rns_i64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (rns_i64)gridDim.x * blockDim.x) {
        const int l = (int)(i / n);
        out[i] = rns_to_i8(rns_reduce_i32(acc[i], P[l], IP[l], H[l], C16[l]));
    }
}
