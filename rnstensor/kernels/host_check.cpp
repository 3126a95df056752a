// Host build of the kernels' per-entry arithmetic (rns_arith.cuh) for the CPU tests.
//
// Compiled with g++ -ffp-contract=off as a shared library and called through
// ctypes by tests/test_kernels_host.py: each function is the loop a kernel runs,
// over arrays, with the very same __host__ __device__ code.
#include "rns_arith.cuh"

#define RNS_MAXM 64

extern "C" {

void h_reduce_f32(const float* t, rns_i64 n, float p, float ip, float h, float* out) {
    for (rns_i64 i = 0; i < n; ++i) out[i] = rns_reduce_f32(t[i], p, ip, h);
}

void h_reduce_small_i8(const rns_i32* a, rns_i64 n, float p, float ip, float h, rns_i8* out) {
    for (rns_i64 i = 0; i < n; ++i) out[i] = rns_reduce_small_i8(a[i], p, ip, h);
}

void h_reduce_i32(const rns_i32* a, rns_i64 n, float p, float ip, float h, float c16, rns_i8* out) {
    for (rns_i64 i = 0; i < n; ++i) out[i] = (rns_i8)(int)rns_reduce_i32(a[i], p, ip, h, c16);
}

void h_reduce_acc(const rns_i32* a, rns_i64 n, int small, float p, float ip, float h, float c16, rns_i8* out) {
    for (rns_i64 i = 0; i < n; ++i) out[i] = (rns_i8)(int)rns_reduce_acc(a[i], small != 0, p, ip, h, c16);
}

void h_encode(const rns_u64* bits, rns_i64 N, const rns_i64* ev, rns_i64 inner, int L, const float* P,
              const float* IP, const float* H, const float* CP, const float* pw, int ldpw,
              const rns_i32* pa, const rns_i32* per, rns_i8* out) {
    for (rns_i64 i = 0; i < N; ++i)
        rns_encode_entry(bits[i], rns_entry_exponent(ev, inner, i), L, P, IP, H, CP, pw, ldpw, pa, per,
                         out + i, N);
}

int h_drop_extend(const rns_i8* X, rns_i64 N, const rns_i32* ib, const float* fb, rns_i8* out) {
    const RnsDropTables tb = rns_drop_tables(ib, fb);
    if (tb.g > RNS_MAXM || tb.m > RNS_MAXM || tb.nr > RNS_MAXM) return -1;
    rns_i32 D[RNS_MAXM], Y[RNS_MAXM];
    for (rns_i64 i = 0; i < N; ++i) rns_drop_extend_entry(X + i, N, tb, D, Y, 1, out + i, N);
    return 0;
}

int h_decode_fp64(const rns_i8* X, rns_i64 N, const rns_i32* ib, const float* fb, const double* qd, double f, double g,
                  const rns_i64* ev, rns_i64 inner, rns_i64 k, double* out) {
    const RnsDecodeTables tb = rns_decode_tables(ib, fb);
    if (tb.m > RNS_MAXM || tb.m < 1) return -1;
    rns_i32 d[RNS_MAXM];
    for (rns_i64 i = 0; i < N; ++i) {
        const rns_i64 e = rns_clip_exponent(rns_entry_exponent(ev, inner, i) + k);
        out[i] = rns_decode_fp64_entry(X + i, N, tb, qd, d, 1, f, g, e);
    }
    return 0;
}

int h_decode_exact(const rns_i8* X, rns_i64 N, const rns_i32* ib, const float* fb, const double* qd,
                   const rns_u32* F, int nf, int fneg, const rns_i64* ev, rns_i64 inner, rns_i64 k, double* out) {
    const RnsDecodeTables tb = rns_decode_tables(ib, fb);
    if (tb.m > RNS_MAXM || tb.m < 1) return -1;
    rns_i32 d[RNS_MAXM];
    for (rns_i64 i = 0; i < N; ++i)
        out[i] = rns_decode_exact_entry(X + i, N, tb, qd, F, nf, fneg != 0, rns_entry_exponent(ev, inner, i) + k, d, 1);
    return 0;
}

double h_ldexp(double y, rns_i64 e) { return rns_ldexp(y, e); }

}  // extern "C"
