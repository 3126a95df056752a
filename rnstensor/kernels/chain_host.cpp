// Host SIMT run of chain.cu for the CPU tests: the fused chain kernel's own source on CPU threads.
//
// Dynamic shared memory is one buffer per launch, filled with a byte pattern
// first and reused by every block (as stale data would be on a GPU), so a
// kernel that read shared memory it never wrote would give different results
// from the reference. The two atomics are the GCC builtins.
#include <cstring>

#include "simt_runtime.h"

static unsigned char* rns_host_smem = nullptr;
#define RNS_CHAIN_SMEM rns_host_smem

static inline void rns_atomic_max_u64(unsigned long long* a, unsigned long long v) {
    unsigned long long cur = __atomic_load_n(a, __ATOMIC_RELAXED);
    while (cur < v && !__atomic_compare_exchange_n(a, &cur, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
}
static inline void rns_atomic_or(int* a, int v) { __atomic_fetch_or(a, v, __ATOMIC_RELAXED); }

#include "chain.cu"

extern "C" {

// rns_chain_fused over ceil(B / nb) blocks of RNS_CHAIN_THREADS threads.
int emu_chain(const rns_u64* X, rns_i64 B, double* Y, const rns_i32* pi, const float* pf, const double* qd,
              const rns_i8* ops, const rns_i32* dexp, int mode, double f, double g, const rns_u32* F, int nf, int fneg,
              const rns_i8* field, rns_i64 fstride, const rns_i32* fexp, int* flags, rns_i64 shared_bytes, int fill) {
    const rns_i64 nb = pi[RC_NB];
    const unsigned blocks = (unsigned)((B + nb - 1) / nb);
    if (blocks == 0) return 0;
    std::vector<unsigned char> smem((size_t)shared_bytes + 16);
    std::memset(smem.data(), fill, smem.size());
    rns_host_smem = smem.data();
    rns_simt_launch(rns_dim3{blocks, 1, 1}, RNS_CHAIN_THREADS,
                    [=] {
                        if (mode == 0)
                            rns_chain_fused(X, B, Y, pi, pf, qd, ops, dexp, f, g, field, fstride, fexp, flags);
                        else
                            rns_chain_fused_exact(X, B, Y, pi, pf, qd, ops, dexp, F, nf, fneg, field, fstride, fexp,
                                                  flags);
                    });
    rns_host_smem = nullptr;
    return 0;
}

}  // extern "C"
