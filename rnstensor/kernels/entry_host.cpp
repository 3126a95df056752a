// Host SIMT run of entry.cu for the CPU tests: the per-entry kernels' own source on CPU threads.
//
// Each launch runs its grid as written (simt_runtime.h: one std::thread per CUDA
// thread, blocks in order), so the grid-stride loops, the thread-to-entry
// mapping and the shared-memory columns of the digit scratch (stride
// blockDim.x) are exercised, not only the per-entry arithmetic that
// host_check.cpp calls in a plain loop. Dynamic shared memory is one buffer
// per launch, filled with a byte pattern first and reused by every block (as
// stale data would be on a GPU); the __constant__ drop tables are the file's
// own static arrays, filled by emu_set_drop_tables before a drop/extend
// launch as the backend copies them into the module's constant bank.
#include <cstring>
#include <vector>

#include "simt_runtime.h"
#include "rns_arith.cuh"

static rns_i32* rns_words = nullptr;

#include "entry.cu"

namespace {

// run kernel() over `blocks` x `threads` with `shared_bytes` of dynamic shared memory filled with `fill`
template <class F>
int rns_entry_launch(unsigned blocks, unsigned threads, rns_i64 shared_bytes, int fill, F kernel) {
    if (blocks == 0 || threads == 0 || threads > 1024 || threads % 32 != 0 || shared_bytes < 0) return -1;
    std::vector<rns_i32> smem((size_t)(shared_bytes + 3) / 4 + 4);
    std::memset(smem.data(), fill, smem.size() * sizeof(rns_i32));
    rns_words = smem.data();
    rns_simt_launch(rns_dim3{blocks, 1, 1}, threads, kernel);
    rns_words = nullptr;
    return 0;
}

}  // namespace

extern "C" {

int emu_encode(unsigned blocks, unsigned threads, const rns_u64* xbits, rns_i64 N, const rns_i64* ev, rns_i64 inner,
               int L, const float* P, const float* IP, const float* H, const float* CP, const float* pw, int ldpw,
               const rns_i32* pa, const rns_i32* per, rns_i8* out) {
    return rns_entry_launch(blocks, threads, 0, 0, [=] {
        rns_encode(xbits, N, ev, inner, L, P, IP, H, CP, pw, ldpw, pa, per, out);
    });
}

int emu_elementwise(unsigned blocks, unsigned threads, const rns_i8* a, const rns_i8* b, rns_i8* out, rns_i64 n, int L,
                    int mode, const float* P, const float* IP, const float* H) {
    return rns_entry_launch(blocks, threads, 0, 0, [=] { rns_elementwise(a, b, out, n, L, mode, P, IP, H); });
}

// the module's __constant__ banks, as the backend fills them before a drop/extend launch
int emu_set_drop_tables(const rns_i32* ib, rns_i64 nib, const float* fb, rns_i64 nfb) {
    if (nib < 0 || nib > RNS_DROP_IB || nfb < 0 || nfb > RNS_DROP_FB) return -1;
    std::memcpy(rns_drop_ib, ib, (size_t)nib * sizeof(rns_i32));
    std::memcpy(rns_drop_fb, fb, (size_t)nfb * sizeof(float));
    return 0;
}

int emu_drop_extend(unsigned blocks, unsigned threads, rns_i64 shared_bytes, int fill, const rns_i8* X, rns_i64 N,
                    rns_i8* out) {
    return rns_entry_launch(blocks, threads, shared_bytes, fill, [=] { rns_drop_extend(X, N, out); });
}

int emu_decode_fp64(unsigned blocks, unsigned threads, rns_i64 shared_bytes, int fill, const rns_i8* X, rns_i64 N,
                    const rns_i32* ib, const float* fb, const double* qd, double f, double g, const rns_i64* ev,
                    rns_i64 inner, rns_i64 k, double* out) {
    return rns_entry_launch(blocks, threads, shared_bytes, fill, [=] {
        rns_decode_fp64(X, N, ib, fb, qd, f, g, ev, inner, k, out);
    });
}

int emu_decode_exact(unsigned blocks, unsigned threads, rns_i64 shared_bytes, int fill, const rns_i8* X, rns_i64 N,
                     const rns_i32* ib, const float* fb, const double* qd, const rns_u32* F, int nf, int fneg,
                     const rns_i64* ev, rns_i64 inner, rns_i64 k, double* out) {
    return rns_entry_launch(blocks, threads, shared_bytes, fill, [=] {
        rns_decode_exact(X, N, ib, fb, qd, F, nf, fneg, ev, inner, k, out);
    });
}

}  // extern "C"
