// Host SIMT emulation of product.cu for the CPU tests: the kernels' own source, run on CPU threads.
//
// Each block runs as blockDim.x std::threads (one per CUDA thread) sharing the
// kernel's __shared__ arrays; __syncthreads is a block barrier; mma.sync is a
// warp-collective software MMA that follows the PTX ISA fragment layout of
// m16n8k32 .s8 (lane = 4 g + t: a0 = A[g][4t..4t+3], a1 = A[g+8][4t..],
// a2 = A[g][16+4t..], a3 = A[g+8][16+4t..]; b0 = B[4t..4t+3][g], b1 = B[16+4t..][g];
// c0, c1 = C[g][2t, 2t+1], c2, c3 = C[g+8][2t, 2t+1]; the lowest k in the lowest byte).
// So the tile loaders, the fragment packing, the fold and the epilogue of the
// device code are executed as written; only the tensor core is software.
// The execution model (threads, barriers, blocks in order) is simt_runtime.h.
#include "simt_runtime.h"

#include "product.cu"

extern "C" {

// rns_product_n<bn> over the grid the backend launches (grid = (gx, gy, gz), 128 threads)
int emu_product(int bn, unsigned gx, unsigned gy, unsigned gz, const rns_i8* X, const rns_i8* A, rns_i8* out, int pre,
                int n_in, int post, int n_out, rns_i64 xplane, rns_i64 oplane, const float* P, const float* IP,
                const float* H, const float* C16) {
    rns_dim3 grid{gx, gy, gz};
    auto run = [&](auto kernel) {
        rns_simt_launch(grid, RNS_BM, [=] { kernel(X, A, out, pre, n_in, post, n_out, xplane, oplane, P, IP, H, C16); });
    };
    switch (bn) {
        case 8: run(rns_product_n8); return 0;
        case 16: run(rns_product_n16); return 0;
        case 32: run(rns_product_n32); return 0;
        case 64: run(rns_product_n64); return 0;
    }
    return -1;
}

int emu_product3m(int bn, unsigned gx, unsigned gy, unsigned gz, const rns_i8* Xre, const rns_i8* Xim,
                  const rns_i8* Xsum, const rns_i8* Are, const rns_i8* Aim, const rns_i8* Asum, rns_i8* Ore,
                  rns_i8* Oim, int pre, int n_in, int post, int n_out, rns_i64 xplane, rns_i64 oplane,
                  const float* P, const float* IP, const float* H, const float* C16) {
    rns_dim3 grid{gx, gy, gz};
    auto run = [&](auto kernel) {
        rns_simt_launch(grid, RNS_BM, [=] {
            kernel(Xre, Xim, Xsum, Are, Aim, Asum, Ore, Oim, pre, n_in, post, n_out, xplane, oplane, P, IP, H, C16);
        });
    };
    switch (bn) {
        case 8: run(rns_product3m_n8); return 0;
        case 32: run(rns_product3m_n32); return 0;
    }
    return -1;
}

int emu_reduce_i32(unsigned blocks, const rns_i32* acc, rns_i8* out, rns_i64 n, int L, const float* P,
                   const float* IP, const float* H, const float* C16) {
    rns_simt_launch(rns_dim3{blocks, 1, 1}, 256, [=] { rns_reduce_i32(acc, out, n, L, P, IP, H, C16); });
    return 0;
}

}  // extern "C"
