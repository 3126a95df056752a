// Warp-wide INT8 tensor-core products, mma.sync m16n8k32 / m16n8k16 .s8 .s8 .s32 (row.col), d += A B,
// shared by product.cu and chain.cu. Fragment layout (PTX ISA; lane = 4 g + t): a0 = A[g][4t..4t+3],
// a1 = A[g+8][4t..], a2 = A[g][16+4t..], a3 = A[g+8][16+4t..]; b0 = B[4t..4t+3][g], b1 = B[16+4t..][g];
// d0, d1 = D[g][2t, 2t+1], d2, d3 = D[g+8][2t, 2t+1]; the lowest k in the lowest byte. The host SIMT
// builds (simt_runtime.h) run a software MMA with this very layout.
#pragma once

__device__ __forceinline__ void rns_mma_s8(int (&d)[4], rns_u32 a0, rns_u32 a1, rns_u32 a2, rns_u32 a3, rns_u32 b0,
                                           rns_u32 b1) {
#if defined(__CUDA_ARCH__)
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
    rns_host_mma_s8(d, a0, a1, a2, a3, b0, b1);  // the host SIMT emulation (simt_runtime.h)
#endif
}

// m16n8k16: the first half of m16n8k32's k (a0, a1, b0 as there; a2 = a3 = b1 = 0), d = A B + c with
// c in its own registers (a constant c stays put across calls).
__device__ __forceinline__ void rns_mma_s8_k16(int (&d)[4], rns_u32 a0, rns_u32 a1, rns_u32 b0, int c) {
#if defined(__CUDA_ARCH__)
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%7,%7,%7};\n"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a0), "r"(a1), "r"(b0), "r"(c));
#else
    d[0] = d[1] = d[2] = d[3] = c;
    rns_host_mma_s8(d, a0, a1, 0u, 0u, b0, 0u);
#endif
}
