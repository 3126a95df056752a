// Per-entry exact residue arithmetic, shared by the CUDA kernels and the host test harness.
//
// Every function here is __host__ __device__ under a CUDA compiler (NVRTC, nvcc)
// and plain inline C++ otherwise, so the CPU tests compile this very file with
// g++ and check it exhaustively against rnstensor.arith (the numpy reference).
// NVRTC has no system headers: only the builtin math functions are used, and
// the integer types are defined here.
//
// Exactness (moduli 2 <= p <= 256, centered residues in [h - p, h - 1] with
// h = ceil(p/2)):
//
// rns_reduce_f32(t) for an integer-valued float t with |t| < 2^22 - 1 returns
// [t]_p as  c = t - q p,  q = rint((t + d) ip),  d = 1/2 for an even p and 0 for
// an odd one,  ip = fl(1/p) (float32, computed on the host). For an odd p,
// t - p rint(t/p) lies in [-(p-1)/2, (p-1)/2] = [h - p, h - 1]; for an even p,
// (t + 1/2) - q p lies in (-p/2, p/2), so t - q p is in [-p/2, p/2 - 1]: the
// centered residue either way. x = (t + d)/p is never a half-integer and is at
// least 1/(2p) away from every one (its numerator and the half-integer's
// multiple of p differ by a nonzero multiple of 1/2), while the exact product
// (t + d) ip differs from x by |t + d| |ip - 1/p| <= 2^22 2^-24 / p = 1/(4p):
// both round to the same integer. The rounding is one FMA against the magic
// number 1.5 2^23 (ulp 1 on [2^23, 2^24)), so it takes no conversion unit
// instruction (floorf and F2I do); t + d, the magic subtraction and t - q p are
// all exact. Every digit is the same as the CPU backend's _cr32 (a floor-based
// formula): the centered residue is unique.
//
// rns_reduce_i32(a) covers every int32: a = hi 2^16 + lo with hi = a >> 16
// (|hi| <= 2^15) and 0 <= lo < 2^16, then [a]_p = [[hi]_p c16 + lo]_p with
// c16 = [2^16]_p centered: |[hi]_p c16| <= 2^14, so the sum is below 2^17.
#pragma once

#if defined(__CUDACC__)
#define RNS_HD __host__ __device__ __forceinline__
// Rare paths (wide encodings, subnormal inputs): out of line in a plan's specialized build, whose
// unrolled body has registers to spare around a call and gains instruction-cache room; inline
// elsewhere (a call under a 128-register cap would spill).
#if defined(RNS_SPEC)
#define RNS_RARE __host__ __device__ __noinline__
#else
#define RNS_RARE RNS_HD
#endif
// Loops over planes and digits: completely unrolled where their trip counts are compile-time
// constants (a plan's specialized chain kernel), left alone where they are not.
#define RNS_UNROLL _Pragma("unroll")
#else
#define RNS_UNROLL
#include <math.h>
#include <string.h>
#define RNS_HD static inline
#define RNS_RARE static
#endif

// for (k = 0; k < i; ++k) inside a loop over i < n: a specialized kernel (RNS_SPEC) runs k to the
// compile-time n with the test inside, so the inner loop unrolls before the outer one does.
#if defined(RNS_SPEC)
#define RNS_FOR_BELOW(k, i, n) RNS_UNROLL for (int k = 0; k < (n); ++k) if (k < (i))
#else
#define RNS_FOR_BELOW(k, i, n) for (int k = 0; k < (i); ++k)
#endif

typedef signed char rns_i8;
typedef unsigned char rns_u8;
typedef int rns_i32;
typedef unsigned int rns_u32;
typedef long long rns_i64;
typedef unsigned long long rns_u64;

// ----- float rounding steps that must not be fused --------------------------------------------

RNS_HD float rns_fadd(float a, float b) {
#if defined(__CUDA_ARCH__)
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}

RNS_HD float rns_fmul(float a, float b) {
#if defined(__CUDA_ARCH__)
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}

RNS_HD double rns_dadd(double a, double b) {
#if defined(__CUDA_ARCH__)
    return __dadd_rn(a, b);
#else
    return a + b;  // the host harness is built with -ffp-contract=off
#endif
}

RNS_HD double rns_dmul(double a, double b) {
#if defined(__CUDA_ARCH__)
    return __dmul_rn(a, b);
#else
    return a * b;
#endif
}

// a b + c rounded once: the exact error of a product, e = rns_dfma(a, b, -fl(a b)), the value of
// Dekker's product (arith.two_product_error) on the host reference
RNS_HD double rns_dfma(double a, double b, double c) {
#if defined(__CUDA_ARCH__)
    return __fma_rn(a, b, c);
#else
    return fma(a, b, c);
#endif
}

RNS_HD double rns_bits_to_double(rns_u64 b) {
#if defined(__CUDA_ARCH__)
    return __longlong_as_double((long long)b);
#else
    double d;
    memcpy(&d, &b, sizeof d);
    return d;
#endif
}

RNS_HD rns_u64 rns_double_to_bits(double d) {
#if defined(__CUDA_ARCH__)
    return (rns_u64)__double_as_longlong(d);
#else
    rns_u64 b;
    memcpy(&b, &d, sizeof b);
    return b;
#endif
}

// ----- four int8 products in one instruction ------------------------------------------------

// c + sum_i a_i b_i over the four signed bytes of a and b (dp4a); exact while the int32 sum is.
RNS_HD rns_i32 rns_dp4a(rns_i32 a, rns_i32 b, rns_i32 c) {
#if defined(__CUDA_ARCH__)
    return __dp4a(a, b, c);
#else
    for (int i = 0; i < 4; ++i) c += (rns_i32)(rns_i8)(a >> (8 * i)) * (rns_i32)(rns_i8)(b >> (8 * i));
    return c;
#endif
}

// ----- centered modular reduction -------------------------------------------------------------

#define RNS_MAGIC 12582912.0f  // 1.5 2^23: x + RNS_MAGIC rounds x to an integer, |x| < 2^22

RNS_HD float rns_fma(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
    return __fmaf_rn(a, b, c);
#else
    return fmaf(a, b, c);  // correctly rounded in glibc, as on the device
#endif
}

RNS_HD rns_i32 rns_float_bits(float x) {
#if defined(__CUDA_ARCH__)
    return __float_as_int(x);
#else
    rns_i32 b;
    memcpy(&b, &x, sizeof b);
    return b;
#endif
}

RNS_HD float rns_bits_float(rns_i32 b) {
#if defined(__CUDA_ARCH__)
    return __int_as_float(b);
#else
    float x;
    memcpy(&x, &b, sizeof x);
    return x;
#endif
}

// [t]_p for an integer-valued float32 with |t| < 2^22 - 1 (see the header).
// The quotient q = rint((t + d) ip) of the reduction in magic form, q + 1.5 2^23 (exact: |q| < 2^22),
// whose bits are 0x4B400000 + q (d == 0 for an odd p: no add, which a specialized kernel's constant
// p turns into no instruction at all).
RNS_HD float rns_reduce_quotient_magic(float t, float p, float ip, float h) {
    // (p - h) + 1/2 - p/2: 1/2 if p is even, else 0. Plain operators (every step is exact, fused
    // or not), so a compile-time p folds it and the test below to nothing.
    const float d = (p - h) + 0.5f - 0.5f * p;
    return rns_fma(d == 0.0f ? t : rns_fadd(t, d), ip, RNS_MAGIC);
}

RNS_HD float rns_reduce_quotient(float t, float p, float ip, float h) {
    return rns_fadd(rns_reduce_quotient_magic(t, p, ip, h), -RNS_MAGIC);
}

RNS_HD float rns_reduce_f32(float t, float p, float ip, float h) { return rns_fma(-rns_reduce_quotient(t, p, ip, h), p, t); }

// The int8 of an integer-valued float with |r| <= 128: the low byte of r + 1.5 2^23 (no F2I).
RNS_HD rns_i8 rns_to_i8(float r) { return (rns_i8)rns_float_bits(rns_fadd(r, RNS_MAGIC)); }

// [a]_p as an int8 from tM = 1.5 2^23 + a (a float, |a| < 2^22 - 1: its bits are 0x4B400000 + a),
// in three instructions (four for an even p): t = tM - 1.5 2^23 and the quotient's magic form qM
// (bits 0x4B400000 + q) are floats, and the residue is the low byte of the integer
// bits(tM) - bits(qM) p = 0x4B400000 (1 - p) + (a - q p): 0x4B400000 is a multiple of 2^20, so modulo
// 2^8 this is a - q p = [a]_p (unsigned arithmetic: the product wraps, its low bits do not change).
// rns_reduce_magic_word returns that word (its upper bytes are not a sign extension).
RNS_HD rns_u32 rns_reduce_magic_word(float tM, float p, float ip, float h) {
    const float qM = rns_reduce_quotient_magic(rns_fadd(tM, -RNS_MAGIC), p, ip, h);
    // bits(p + 1.5 2^23) = 0x4B400000 + p multiplies like p modulo 2^20 (no F2I for a runtime p; a
    // constant p folds)
    return (rns_u32)rns_float_bits(tM) - (rns_u32)rns_float_bits(qM) * (rns_u32)rns_float_bits(rns_fadd(p, RNS_MAGIC));
}

RNS_HD rns_i8 rns_reduce_magic_i8(float tM, float p, float ip, float h) { return (rns_i8)rns_reduce_magic_word(tM, p, ip, h); }

// The int8 residue [a]_p of an int32 with |a| < 2^22 - 1, from the bits: 1.5 2^23 + a is the float
// with bits 0x4B400000 + a (no I2F). A dp4a sum started at RNS_MAGIC_BITS is that float already.
#define RNS_MAGIC_BITS 0x4B400000
RNS_HD rns_i8 rns_reduce_small_i8(rns_i32 a, float p, float ip, float h) {
    return rns_reduce_magic_i8(rns_bits_float(RNS_MAGIC_BITS + a), p, ip, h);
}

// [a]_p for every int32 a; c16 = [2^16]_p centered (0 for p = 256).
RNS_HD float rns_reduce_i32(rns_i32 a, float p, float ip, float h, float c16) {
    rns_i32 hi = a >> 16;  // arithmetic shift: floor(a / 2^16)
    rns_i32 lo = a & 0xffff;
    float rh = rns_reduce_f32((float)hi, p, ip, h);
    return rns_reduce_f32(rh * c16 + (float)lo, p, ip, h);
}

// [a]_p for an int32 accumulator; `small` promises |a| < 2^22 - 256 (one reduction).
RNS_HD float rns_reduce_acc(rns_i32 a, bool small, float p, float ip, float h, float c16) {
    return small ? rns_reduce_f32((float)a, p, ip, h) : rns_reduce_i32(a, p, ip, h, c16);
}

// ----- mixed-radix digits as packed int8 words ---------------------------------------------------
//
// Digits and the drop's coefficients are int8 (centered, magnitude <= 128), so four multiply-adds
// are one dp4a: digit i sits in byte i % 4 of word D[(i / 4) * ds]. A sum started at RNS_MAGIC_BITS
// is the float 1.5 2^23 + sum, reduced by rns_reduce_magic_word; every sum here has at most 50 terms
// of magnitude <= 2^14 (< 2^20). A residue whose upper bytes are not its sign extension (a loaded
// byte, a rns_reduce_magic_word result) enters through a coefficient word with zero upper bytes
// (the "diagonal" words Cd below), which reads its low byte alone.

// w with byte k (0..3) replaced by the low byte of b (one PRMT on the device).
RNS_HD rns_i32 rns_put_byte(rns_i32 w, rns_u32 b, int k) {
#if defined(__CUDA_ARCH__)
    return (rns_i32)__byte_perm((unsigned)w, b, 0x3210u + ((4u - (unsigned)k) << (4 * k)));
#else
    const int sh = 8 * k;
    return (rns_i32)(((rns_u32)w & ~(0xffu << sh)) | ((b & 0xffu) << sh));
#endif
}

// For a conversion order q_0, q_1, ... (W_i = q_0 ... q_{i-1}) the centered digits of v are
// d_i = [C[i][i] x_i + sum_{k<i} C[i][k] d_k]_{q_i} with C[i][i] = [W_i^{-1}]_{q_i} and
// C[i][k] = [-W_k W_i^{-1}]_{q_i} (host tables: row i of C holds C[i][k], k < i, in byte k of its wc
// words; Cd[i] is C[i][i] in the low byte). x[perm[i] * xs] is the residue on q_i, centered (its low
// byte: an int32 x may carry other upper bytes); the digits go into the ceil(m / 4) words of D.
// d_0 = [x_0]_{q_0} is x_0 itself (C[0][0] = 1, and the residue is centered already): no reduction.
template <typename T>
RNS_HD void rns_mrc_digit_words(const T* x, rns_i64 xs, const rns_i32* perm, int m, const rns_i32* C, int wc,
                                const rns_i32* Cd, const float* P, const float* IP, const float* H, rns_i32* D,
                                int ds) {
    const int nw = (m + 3) / 4;
    RNS_UNROLL
    for (int w = 1; w < nw; ++w) D[w * ds] = 0;
    if (m > 0) D[0] = (rns_i32)((rns_u32)x[(rns_i64)perm[0] * xs] & 0xffu);
    RNS_UNROLL
    for (int i = 1; i < m; ++i) {
        rns_i32 acc = rns_dp4a(Cd[i], (rns_i32)x[(rns_i64)perm[i] * xs], RNS_MAGIC_BITS);
        const rns_i32* Ci = C + (rns_i64)i * wc;
        RNS_FOR_BELOW(w, (i + 3) / 4, nw) acc = rns_dp4a(Ci[w], D[w * ds], acc);
        const int iw = (i / 4) * ds;
        D[iw] = rns_put_byte(D[iw], rns_reduce_magic_word(rns_bits_float(acc), P[i], IP[i], H[i]), i % 4);
    }
}

// Digit i of the packed words D (sign-extended).
RNS_HD rns_i32 rns_digit(const rns_i32* D, int ds, int i) { return (rns_i32)(rns_i8)(D[(i / 4) * ds] >> (8 * (i % 4))); }

// ----- drop x g and base extension, one entry --------------------------------------------------
//
// The tables are those of the CPU backend's _drop_plan (rnstensor/backends/cpu.py), packed by
// rnstensor.kernels.tables.drop_tables (coefficient rows as int8 words):
//  1. digits r_i of v over the dropped moduli in drop order (dperm, A/Ad, dP/dIP/dH);
//  2. the remaining planes [v_g]_p = [Bc[j] x_p + sum_i E[j][i] r_i]_p (rsrc, Bc, E, r*);
//  3. if m > 0, digits of v_g over the remaining moduli, even one first (mperm, Cm/Cmd, m*);
//  4. every output plane: a kept plane (tsrc[t] >= 0) or [sum_i Tw[t][i] d_i]_t.
// Scratch: D (ceil(max(g, m) / 4) words, stride ds) and Y (nr words, stride ds).
//
// The tables are 32-bit offsets into the packed buffers (the int buffer ib, its coefficient words at the
// same offsets in iw, the float buffer fb), not pointers: the generic fused kernel runs under a
// 128-register cap, where two dozen 64-bit pointers live across the entry loop would spill.
// P, IP, H of a group of moduli are consecutive in fb (n floats each).
struct RnsDropTables {
    const rns_i32* ib; const rns_i32* iw; const float* fb;
    int g, nr, m, T;
    int wg, wm;  // words of a digit vector: ceil(g / 4), ceil(m / 4)
    int dperm, A, Ad, dP;   // 1. (ints: dperm; words: A, Ad; floats: dP)
    int rsrc, Bc, E, rP;    // 2.
    int mperm, Cm, Cmd, mP; // 3.
    int tsrc, Tw, tP;       // 4.
};

RNS_HD void rns_drop_extend_entry(const rns_i8* x, rns_i64 xs, const RnsDropTables& tb, rns_i32* D, rns_i32* Y,
                                  int ds, rns_i8* out, rns_i64 os) {
    const int g = tb.g, nr = tb.nr, m = tb.m;
    rns_mrc_digit_words(x, xs, tb.ib + tb.dperm, g, tb.iw + tb.A, tb.wg, tb.iw + tb.Ad, tb.fb + tb.dP,
                        tb.fb + tb.dP + g, tb.fb + tb.dP + 2 * g, D, ds);
    RNS_UNROLL
    for (int j = 0; j < nr; ++j) {
        const rns_i32 xv = (rns_i32)x[(rns_i64)tb.ib[tb.rsrc + j] * xs];
        if (g == 0) {
            Y[j * ds] = xv;
            continue;
        }
        rns_i32 acc = rns_dp4a(tb.iw[tb.Bc + j], xv, RNS_MAGIC_BITS);
        const rns_i32* Ej = tb.iw + tb.E + j * tb.wg;
        RNS_UNROLL
        for (int w = 0; w < tb.wg; ++w) acc = rns_dp4a(Ej[w], D[w * ds], acc);
        const float* rP = tb.fb + tb.rP + j;
        Y[j * ds] = (rns_i32)rns_reduce_magic_word(rns_bits_float(acc), rP[0], rP[nr], rP[2 * nr]);
    }
    if (m > 0)
        rns_mrc_digit_words(Y, (rns_i64)ds, tb.ib + tb.mperm, m, tb.iw + tb.Cm, tb.wm, tb.iw + tb.Cmd, tb.fb + tb.mP,
                            tb.fb + tb.mP + m, tb.fb + tb.mP + 2 * m, D, ds);
    RNS_UNROLL
    for (int t = 0; t < tb.T; ++t) {
        const int s = tb.ib[tb.tsrc + t];
        rns_u32 r;
        if (s >= 0) {
            r = (rns_u32)Y[s * ds];
        } else {
            const rns_i32* Wt = tb.iw + tb.Tw + t * tb.wm;
            rns_i32 acc = RNS_MAGIC_BITS;
            RNS_UNROLL
            for (int w = 0; w < tb.wm; ++w) acc = rns_dp4a(Wt[w], D[w * ds], acc);
            const float* tP = tb.fb + tb.tP + t;
            r = rns_reduce_magic_word(rns_bits_float(acc), tP[0], tP[tb.T], tP[2 * tb.T]);
        }
        out[(rns_i64)t * os] = (rns_i8)r;
    }
}

// ----- encode from the IEEE bits ---------------------------------------------------------------
//
// x 2^e = m 2^k with the 53-bit significand m. Where |x 2^e| <= 2^53 (every entry of an encoding
// of at most 53 bits), v = round_half_even(x 2^e) is one float64-to-int64 conversion: the scaling
// by two powers of two is exact whenever |x 2^e| >= 2^-1022, and below that v = 0 however it
// rounds. Above 2^53 (wider encodings), v = m 2^k with k > 0 is an integer already and
// [v]_p = [[m]_p [2^k]_p]_p: the split takes m and leaves 2^k for later (also the path of inf and
// nan, by the bits, as the CPU backend). The signed v splits into balanced 14-bit pieces
// v = a3 2^42 + a2 2^28 + a1 2^14 + a0 (-2^13 <= a0, a1, a2 < 2^13, |a3| <= 2^11 + 1), so with the
// centered weights c_i = [2^(14 i)]_p (|c_i| <= 128) the sum t = a0 + a1 c1 + a2 c2 + a3 c3 has
// |t| <= 2^13 + 128 (2^14 + 2^11 + 1) < 2^22 - 1: one reduction per plane. Accumulated from
// a0 + 1.5 2^23 (its bits: 0x4B400000 + a0), every partial sum is an exact float in [2^23, 2^24),
// the form rns_reduce_magic_i8 takes.
struct RnsSplit {
    float a0M, a1, a2, a3;  // 1.5 2^23 + a0, and the other pieces
    rns_i64 kbig;           // k > 0: the power of two still to apply; else 0
};

// 2^e for a normal exponent -1022 <= e <= 1023, from its bits.
RNS_HD double rns_pow2(int e) { return rns_bits_to_double((rns_u64)(e + 1023) << 52); }

RNS_HD rns_i64 rns_clamp_normal_exponent(rns_i64 e) { return e < -1022 ? -1022 : (e > 1023 ? 1023 : e); }

// round_half_even(y) for |y| <= 2^53 (the current rounding mode on the host: nearest-even by default).
RNS_HD rns_i64 rns_rint_i64(double y) {
#if defined(__CUDA_ARCH__)
    return __double2ll_rn(y);
#else
    return (rns_i64)llrint(y);
#endif
}

// v = m 2^-sh rounded half to even, times the sign, and the power of two 2^kbig still to apply, for
// an x 2^e above 2^53 or not finite: the rare path (RNS_RARE).
struct RnsWide {
    rns_i64 v, kbig;
};

RNS_RARE RnsWide rns_encode_wide(rns_u64 bits, rns_i64 e) {
    const rns_i64 ef = (rns_i64)((bits >> 52) & 2047);
    const rns_i64 m = (rns_i64)(bits & ((1ULL << 52) - 1)) | (ef != 0 ? (1LL << 52) : 0);
    const rns_i64 k = (ef > 1 ? ef : 1) - 1075 + e;
    const rns_i64 sh = k > 0 ? 0 : (-k > 62 ? 62 : -k);
    rns_i64 v = m >> sh;
    const rns_i64 rem = m - (v << sh), half = (1LL << sh) >> 1;
    if (sh > 0 && (rem > half || (rem == half && (v & 1) == 1))) v += 1;
    RnsWide w;
    w.v = (bits >> 63) ? -v : v;
    w.kbig = k > 0 ? k : 0;
    return w;
}

// 2^e as two normal powers of two 2^e1 2^e2 (e1, e2 clamped to [-1022, 1023]): x 2^e1 2^e2 is exact
// wherever it matters (see above). A function of the exponent alone: where one exponent serves many
// entries (a tensor's, in the fused chain kernel) it is computed once for all of them.
struct RnsScale {
    double s1, s2;
};

RNS_HD RnsScale rns_encode_scale(rns_i64 e) {
    const rns_i64 e1 = rns_clamp_normal_exponent(e), e2 = rns_clamp_normal_exponent(e - e1);
    RnsScale sc;
    sc.s1 = rns_pow2((int)e1);
    sc.s2 = rns_pow2((int)e2);
    return sc;
}

// sc: rns_encode_scale(e).
RNS_HD RnsSplit rns_encode_split(rns_u64 bits, rns_i64 e, const RnsScale& sc) {
    const double y = rns_dmul(rns_dmul(rns_bits_to_double(bits), sc.s1), sc.s2);
    RnsWide w;
    if (y >= -9007199254740992.0 && y <= 9007199254740992.0) {  // |y| <= 2^53; false for inf and nan
        w.v = rns_rint_i64(y);
        w.kbig = 0;
    } else {
        w = rns_encode_wide(bits, e);
    }
    // the pieces from one biased add: u = v + 2^13 (1 + 2^14 + 2^28 + 2^42) is >= 0 (|v| <= 2^53) and below
    // 2^56, and its base-2^14 digits are a_k + 2^13, each in [0, 2^14): the balanced digits of v
    // (a0 = the low 14 bits of v, balanced; a1 those of (v - a0) / 2^14; ...) shifted by 2^13
    const rns_u64 u = (rns_u64)w.v + 0x0080020008002000ULL;
    RnsSplit s;
    s.a0M = rns_bits_float(RNS_MAGIC_BITS - 0x2000 + (rns_i32)(u & 0x3fff));
    s.a1 = (float)((rns_i32)((u >> 14) & 0x3fff) - 0x2000);
    s.a2 = (float)((rns_i32)((u >> 28) & 0x3fff) - 0x2000);
    s.a3 = (float)((rns_i32)(u >> 42) - 0x2000);
    s.kbig = w.kbig;
    return s;
}

// [2^k]_p from a host table pw (length >= pa + per) of [2^i]_p, i < pa + per:
// 2^k mod p is periodic with period per once k >= pa (the 2-adic part of p).
RNS_HD float rns_pow2_mod(rns_i64 k, const float* pw, rns_i32 pa, rns_i32 per) {
    rns_i64 idx = k < (rns_i64)(pa + per) ? k : pa + (k - pa) % per;
    return pw[idx];
}

// t + a c for a piece a of the split (an integer) and its weight c. In a specialized build c is a
// constant, and a zero one (every weight of p = 256) costs nothing: t + a 0 = t exactly for finite a,
// which the compiler cannot assume of an FFMA.
RNS_HD float rns_encode_term(float t, float a, float c) {
#if defined(RNS_SPEC)
    if (c == 0.0f) return t;
#endif
    return rns_fma(a, c, t);
}

// [v]_p of the split v (the power of two 2^kbig not yet applied); c1, c2, c3 = [2^14]_p, [2^28]_p,
// [2^42]_p centered.
RNS_HD rns_i8 rns_encode_residue(const RnsSplit& s, float p, float ip, float h, float c1, float c2, float c3) {
    return rns_reduce_magic_i8(rns_encode_term(rns_encode_term(rns_encode_term(s.a0M, s.a1, c1), s.a2, c2), s.a3, c3),
                               p, ip, h);
}

// ----- decode (fp64) ---------------------------------------------------------------------------

// y 2^e rounded once to nearest-even (as C's ldexp): scaling up is exact until
// it overflows; scaling down rounds only in the last step.
RNS_HD double rns_ldexp(double y, rns_i64 e) {
    if (y == 0.0 || !(y - y == 0.0)) return y;  // zeros, inf, nan unchanged
    if (e >= -1022 && e <= 1023) return rns_dmul(y, rns_pow2((int)e));
    if (e > 1023) {
        if (e > 3000) e = 3000;
        while (e > 1023) {
            y = rns_dmul(y, rns_pow2(1023));
            e -= 1023;
        }
        return rns_dmul(y, rns_pow2((int)e));
    }
    int ey;
    double mant = frexp(y, &ey);  // y = mant 2^ey, 0.5 <= |mant| < 1, exact
    rns_i64 t = (rns_i64)ey + e;
    if (t < -1100) return rns_dmul(mant, 0.0);  // below half the least subnormal: a signed zero
    if (t >= -1021) return rns_dmul(mant, rns_pow2((int)t));  // normal: exact
    return rns_dmul(rns_dmul(mant, rns_pow2((int)t + 100)), rns_pow2(-100));  // exact, then one rounding
}

// ----- packed host tables (built by rnstensor.kernels.tables) ------------------------------------
//
// One int32 buffer and one float32 buffer per call; the int buffer starts with a
// header of sizes, leading dimensions and offsets (into ib for int tables, into
// fb for float tables), so a kernel takes two pointers whatever the basis.
// iw: where the coefficient words are read (the same offsets as in ib): ib itself, or a copy in
// constant memory where ib is compile-time (a dp4a takes a constant-bank operand, not an immediate).
RNS_HD RnsDropTables rns_drop_tables(const rns_i32* ib, const float* fb, const rns_i32* iw) {
    RnsDropTables t;
    t.ib = ib; t.iw = iw; t.fb = fb;
    t.g = ib[0]; t.nr = ib[1]; t.m = ib[2]; t.T = ib[3];
    t.wg = ib[4]; t.wm = ib[5];
    t.dperm = ib[8]; t.rsrc = ib[9]; t.mperm = ib[10]; t.tsrc = ib[11];
    t.A = ib[12]; t.Ad = ib[13]; t.Bc = ib[14]; t.E = ib[15]; t.Cm = ib[16]; t.Cmd = ib[17]; t.Tw = ib[18];
    t.dP = ib[19]; t.rP = ib[22]; t.mP = ib[25]; t.tP = ib[28];  // IP and H follow each P (ib[20, 21], ...)
    return t;
}

RNS_HD RnsDropTables rns_drop_tables(const rns_i32* ib, const float* fb) { return rns_drop_tables(ib, fb, ib); }

// The decode tables: conversion order (perm), the MRC coefficients as rns_mrc_digit_words takes them
// (C rows of wc words, Cd), the moduli constants (P, then IP and H); offsets into the buffers as in
// RnsDropTables, iw as in rns_drop_tables.
struct RnsDecodeTables {
    const rns_i32* ib; const rns_i32* iw; const float* fb;
    int m, wc;
    int perm, C, Cd, P;
};

RNS_HD RnsDecodeTables rns_decode_tables(const rns_i32* ib, const float* fb, const rns_i32* iw) {
    RnsDecodeTables t;
    t.ib = ib; t.iw = iw; t.fb = fb;
    t.m = ib[0]; t.wc = ib[1];
    t.perm = ib[2]; t.C = ib[3]; t.Cd = ib[4]; t.P = ib[5];  // IP, H follow P (ib[6], ib[7])
    return t;
}

RNS_HD RnsDecodeTables rns_decode_tables(const rns_i32* ib, const float* fb) { return rns_decode_tables(ib, fb, ib); }

// The mixed-radix digits of one entry into the words D (ceil(m / 4), stride ds).
RNS_HD void rns_decode_digits(const rns_i8* x, rns_i64 xs, const RnsDecodeTables& tb, rns_i32* D, int ds) {
    const int m = tb.m;
    rns_mrc_digit_words(x, xs, tb.ib + tb.perm, m, tb.iw + tb.C, tb.wc, tb.iw + tb.Cd, tb.fb + tb.P,
                        tb.fb + tb.P + m, tb.fb + tb.P + 2 * m, D, ds);
}

// Mixed-radix digits per exact chunk of the fp64 decode (arith.HORNER_CHUNK): six moduli of at most
// 256 weigh below 2^48, so a chunk's plain float64 Horner is exact.
#define RNS_HORNER_CHUNK 6

// The digits j0 .. j1-1 of D by plain float64 Horner (exact).
RNS_HD double rns_horner_chunk(const rns_i32* D, int ds, const double* qd, int j0, int j1) {
    double c = (double)rns_digit(D, ds, j1 - 1);
    RNS_UNROLL
    for (int j = j1 - 2; j >= j0; --j) c = rns_dadd(rns_dmul(qd[j], c), (double)rns_digit(D, ds, j));
    return c;
}

// Alg. 5 ReconstructFP64 for one entry, faithfully rounded: MRC digits (conversion order, into the
// words D), exact chunks of RNS_HORNER_CHUNK digits joined from the top in double-double as
// arith.horner_fp64_ref (v = h + l: the product's error by an FMA, the sum's by Fast2Sum, every
// other operation rounded on its own), times the factor f + g rounded once
// (arith.scaled_double_double), times 2^e.
RNS_HD double rns_decode_fp64_entry(const rns_i8* x, rns_i64 xs, const RnsDecodeTables& tb, const double* qd,
                                    rns_i32* D, int ds, double f, double g, rns_i64 e) {
    const int m = tb.m;
    rns_decode_digits(x, xs, tb, D, ds);
    const int top = RNS_HORNER_CHUNK * ((m - 1) / RNS_HORNER_CHUNK);
    double h = rns_horner_chunk(D, ds, qd, top, m), l = 0.0;
    RNS_UNROLL
    for (int j0 = top - RNS_HORNER_CHUNK; j0 >= 0; j0 -= RNS_HORNER_CHUNK) {
        double w = 1.0;
        RNS_UNROLL
        for (int j = j0; j < j0 + RNS_HORNER_CHUNK; ++j) w = rns_dmul(w, qd[j]);
        const double c = rns_horner_chunk(D, ds, qd, j0, j0 + RNS_HORNER_CHUNK);
        const double p = rns_dmul(w, h);
        const double e1 = rns_dfma(h, w, -p);
        const double s = rns_dadd(p, c);
        l = rns_dadd(rns_dmul(w, l), rns_dadd(e1, rns_dadd(c, -rns_dadd(s, -p))));
        h = s;
    }
    const double p = rns_dmul(h, f);
    const double t = rns_dadd(rns_dfma(h, f, -p), rns_dadd(rns_dmul(l, f), rns_dmul(h, g)));
    return rns_ldexp(rns_dadd(p, t), e);
}

// The exponent of flattened entry i: ev[i / inner] (trailing axes it broadcasts over not materialized).
RNS_HD rns_i64 rns_entry_exponent(const rns_i64* ev, rns_i64 inner, rns_i64 i) {
    return inner == 1 ? ev[i] : ev[i / inner];
}

// out[l * os] = [out[l * os] 2^k]_p for l < L (RNS_RARE: only wide encodings and subnormal inputs).
RNS_RARE void rns_encode_pow2_pass(rns_i64 k, int L, const float* P, const float* IP, const float* H,
                                       const float* pw, int ldpw, const rns_i32* pa, const rns_i32* per,
                                       rns_i8* out, rns_i64 os) {
    for (int l = 0; l < L; ++l) {
        const float f = rns_pow2_mod(k, pw + (rns_i64)l * ldpw, pa[l], per[l]);
        out[(rns_i64)l * os] = rns_to_i8(rns_reduce_f32((float)out[(rns_i64)l * os] * f, P[l], IP[l], H[l]));
    }
}

// Every residue of one encoded entry: out[l * os] for l < L; CP: the (3, L) piece weights. The factor
// 2^kbig (an entry whose significand lies above the encoding's 2^-e grid: wide encodings, subnormal
// inputs) is a second, rare pass kept out of the per-plane code; pw/pa/per as rns_pow2_mod.
// sc: rns_encode_scale(e).
RNS_HD void rns_encode_entry(rns_u64 bits, rns_i64 e, const RnsScale& sc, int L, const float* P, const float* IP,
                             const float* H, const float* CP, const float* pw, int ldpw, const rns_i32* pa,
                             const rns_i32* per, rns_i8* out, rns_i64 os) {
    const RnsSplit s = rns_encode_split(bits, e, sc);
    RNS_UNROLL
    for (int l = 0; l < L; ++l)
        out[(rns_i64)l * os] = rns_encode_residue(s, P[l], IP[l], H[l], CP[l], CP[L + l], CP[2 * L + l]);
    if (s.kbig > 0) rns_encode_pow2_pass(s.kbig, L, P, IP, H, pw, ldpw, pa, per, out, os);
}

// The same with the entry's own exponent (the per-entry kernels: no exponent shared across entries).
RNS_HD void rns_encode_entry(rns_u64 bits, rns_i64 e, int L, const float* P, const float* IP, const float* H,
                             const float* CP, const float* pw, int ldpw, const rns_i32* pa, const rns_i32* per,
                             rns_i8* out, rns_i64 os) {
    rns_encode_entry(bits, e, rns_encode_scale(e), L, P, IP, H, CP, pw, ldpw, pa, per, out, os);
}

// The decode exponent e + k, clipped to +-2^20 (far outside float range either way).
RNS_HD rns_i64 rns_clip_exponent(rns_i64 e) {
    return e < -(1LL << 20) ? -(1LL << 20) : (e > (1LL << 20) ? (1LL << 20) : e);
}

// ----- decode (exact, correctly rounded) --------------------------------------------------------
//
// |v| from the centered digits in base-2^32 limbs: the top nonzero digit carries
// the sign s of v and outweighs all lower ones, so every Horner prefix of s v is
// >= 0 and each step V <- V q + s d stays exact with a signed carry (|limb q +
// carry| < 2^41 in int64; floor division by 2^32 by the arithmetic shift).
// Then |v| times the odd part F of the factor (its power of two is in e), and
// one rounding to nearest-even on the float64 grid of the result: 53 bits, or
// fewer where the result is subnormal, so the final scaling is exact or
// overflows. A zero v gives +0.0, as the reference's exact integer does.
#define RNS_MAXLIMB 40

// bit i of the limb array M[0..n) (0 beyond)
RNS_HD rns_u32 rns_limb_bit(const rns_u32* M, int n, rns_i64 i) {
    if (i < 0 || i >= 32LL * n) return 0u;
    return (M[i >> 5] >> (i & 31)) & 1u;
}

// bits [lo, lo + 53) of M as an integer (lo >= 0)
RNS_HD rns_u64 rns_limb_bits53(const rns_u32* M, int n, rns_i64 lo) {
    rns_u64 r = 0;
    for (int b = 52; b >= 0; --b) r = (r << 1) | rns_limb_bit(M, n, lo + b);
    return r;
}

// whether any of bits [0, hi) of M is set
RNS_HD bool rns_limb_any_below(const rns_u32* M, int n, rns_i64 hi) {
    for (int i = 0; i < n && 32LL * i < hi; ++i) {
        rns_u32 w = M[i];
        rns_i64 top = hi - 32LL * i;
        if (top < 32) w &= (1u << top) - 1u;
        if (w) return true;
    }
    return false;
}

// v F 2^e rounded once; F = odd factor limbs F[0..nf), fneg: the factor is negative.
// Needs nl(v) + nf <= RNS_MAXLIMB (the host checks). d: digit scratch (stride ds).
RNS_HD double rns_decode_exact_entry(const rns_i8* x, rns_i64 xs, const RnsDecodeTables& tb, const double* qd,
                                     const rns_u32* F, int nf, bool fneg, rns_i64 e, rns_i32* D, int ds) {
    const int m = tb.m;
    rns_decode_digits(x, xs, tb, D, ds);
    int s = 0;
    for (int i = m - 1; i >= 0 && s == 0; --i) {
        const rns_i32 di = rns_digit(D, ds, i);
        s = di > 0 ? 1 : (di < 0 ? -1 : 0);
    }
    if (s == 0) return 0.0;
    rns_u32 V[RNS_MAXLIMB];
    int n = 1;
    V[0] = (rns_u32)(s * rns_digit(D, ds, m - 1));
    for (int j = m - 2; j >= 0; --j) {
        const rns_i64 q = (rns_i64)qd[j];
        rns_i64 carry = (rns_i64)(s * rns_digit(D, ds, j));
        for (int i = 0; i < n; ++i) {
            rns_i64 t = (rns_i64)V[i] * q + carry;
            V[i] = (rns_u32)(t & 0xffffffffLL);
            carry = t >> 32;  // floor division (arithmetic shift)
        }
        if (carry > 0 && n < RNS_MAXLIMB) V[n++] = (rns_u32)carry;
    }
    rns_u32 M[RNS_MAXLIMB];
    int nm = n + nf;
    if (nm > RNS_MAXLIMB) nm = RNS_MAXLIMB;
    for (int i = 0; i < nm; ++i) M[i] = 0u;
    for (int i = 0; i < n; ++i) {
        rns_u64 c = 0;
        for (int j = 0; j < nf && i + j < nm; ++j) {
            rns_u64 t = (rns_u64)V[i] * F[j] + M[i + j] + c;
            M[i + j] = (rns_u32)t;
            c = t >> 32;
        }
        if (i + nf < nm) M[i + nf] = (rns_u32)c;
    }
    while (nm > 0 && M[nm - 1] == 0u) --nm;
    if (nm == 0) return 0.0;
    rns_u32 top = M[nm - 1];
    int tb_len = 0;
    while (top) {
        ++tb_len;
        top >>= 1;
    }
    const rns_i64 nb = 32LL * (nm - 1) + tb_len;
    if (e < -(1LL << 40)) e = -(1LL << 40);
    if (e > (1LL << 40)) e = 1LL << 40;
    const rns_i64 shift = nb - 53 > -1074 - e ? nb - 53 : -1074 - e;
    double y;
    if (shift <= 0) {
        y = rns_ldexp((double)rns_limb_bits53(M, nm, 0), e);
    } else {
        rns_u64 mant = rns_limb_bits53(M, nm, shift);
        if (rns_limb_bit(M, nm, shift - 1) && ((mant & 1u) || rns_limb_any_below(M, nm, shift - 1))) mant += 1;
        y = rns_ldexp((double)mant, shift + e);
    }
    return (s < 0) != fneg ? -y : y;
}
