// The CUDA execution model on CPU threads, for the host builds that run kernel sources as written.
//
// One std::thread per CUDA thread of a block (kept between launches); the blocks of a grid run one
// after another (so a kernel's __shared__ arrays can be static), separated by
// a barrier; __syncthreads is a block barrier. Enough of the CUDA spelling is
// defined for a kernel file to compile unchanged with a host C++20 compiler.
#pragma once
#include <algorithm>
#include <barrier>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

struct rns_dim3 {
    unsigned x, y, z;
};
static thread_local rns_dim3 threadIdx;
static thread_local rns_dim3 blockIdx;
static rns_dim3 blockDim, gridDim;
static std::barrier<>* rns_block_barrier = nullptr;
static std::barrier<>* rns_warp_barrier[32];  // one per warp of the block, for warp-collective emulations

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __constant__ static
#define __align__(n) __attribute__((aligned(n)))
static inline void __syncthreads() { rns_block_barrier->arrive_and_wait(); }
using std::max;
using std::min;

// The CPU threads that play a block's CUDA threads: started once, on the first launch that needs them, and
// reused by every later launch of this library (starting 256 threads takes ~14 ms, more than most launches'
// work). run() is one launch at a time, as the callers are.
class RnsThreadPool {
   public:
    ~RnsThreadPool() {
        {
            std::lock_guard<std::mutex> g(m_);
            stop_ = true;
        }
        wake_.notify_all();
        for (auto& t : threads_) t.join();
    }

    // job(t) on threads t = 0 .. n - 1, all at once; returns when every one has returned
    void run(unsigned n, const std::function<void(unsigned)>& job) {
        std::unique_lock<std::mutex> lk(m_);
        while (threads_.size() < n) {
            const unsigned id = (unsigned)threads_.size();
            threads_.emplace_back([this, id] { loop(id); });
        }
        job_ = &job;
        n_ = n;
        pending_ = n;
        ++generation_;
        wake_.notify_all();
        done_.wait(lk, [this] { return pending_ == 0; });
        job_ = nullptr;
    }

   private:
    void loop(unsigned id) {
        unsigned long long seen = 0;
        std::unique_lock<std::mutex> lk(m_);
        for (;;) {
            wake_.wait(lk, [&] { return stop_ || generation_ != seen; });
            if (stop_) return;
            seen = generation_;
            if (id >= n_) continue;  // not part of this launch
            const std::function<void(unsigned)>* job = job_;
            lk.unlock();
            (*job)(id);
            lk.lock();
            if (--pending_ == 0) done_.notify_one();
        }
    }

    std::vector<std::thread> threads_;
    std::mutex m_;
    std::condition_variable wake_, done_;
    const std::function<void(unsigned)>* job_ = nullptr;
    unsigned n_ = 0, pending_ = 0;
    unsigned long long generation_ = 0;
    bool stop_ = false;
};
static RnsThreadPool rns_thread_pool;

// Run body() as every thread of every block of the grid (blocks in order); after_block() runs in
// every thread after body(), before the barrier that ends the block (checks of leftover state).
template <class F, class G>
static void rns_simt_launch(rns_dim3 grid, unsigned block, F body, G after_block) {
    gridDim = grid;
    blockDim = rns_dim3{block, 1, 1};
    std::barrier<> bb((std::ptrdiff_t)block);
    rns_block_barrier = &bb;
    for (unsigned w = 0; w < block / 32; ++w) rns_warp_barrier[w] = new std::barrier<>(32);
    rns_thread_pool.run(block, [&](unsigned t) {
        threadIdx = rns_dim3{t, 0, 0};
        for (unsigned z = 0; z < grid.z; ++z)
            for (unsigned y = 0; y < grid.y; ++y)
                for (unsigned x = 0; x < grid.x; ++x) {
                    blockIdx = rns_dim3{x, y, z};
                    body();
                    after_block();
                    rns_block_barrier->arrive_and_wait();
                }
    });
    for (unsigned w = 0; w < block / 32; ++w) delete rns_warp_barrier[w];
}

template <class F>
static void rns_simt_launch(rns_dim3 grid, unsigned block, F body) {
    rns_simt_launch(grid, block, body, [] {});
}

// mma.sync m16n8k32 .s8 in software, warp-collective, with the PTX fragment layout (rns_mma.cuh).
struct RnsFrag {
    unsigned a[4], b[2];
};
static RnsFrag rns_frag[32][32];  // [warp][lane]

static inline void rns_host_mma_s8(int (&d)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0,
                                   unsigned b1) {
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    rns_frag[w][lane] = RnsFrag{{a0, a1, a2, a3}, {b0, b1}};
    rns_warp_barrier[w]->arrive_and_wait();
    auto A = [&](int r, int k) {
        const unsigned reg = rns_frag[w][(r & 7) * 4 + ((k & 15) >> 2)].a[(r >> 3) + 2 * (k >> 4)];
        return (int)(signed char)(reg >> (8 * (k & 3)));
    };
    auto B = [&](int k, int n) {
        const unsigned reg = rns_frag[w][n * 4 + ((k & 15) >> 2)].b[k >> 4];
        return (int)(signed char)(reg >> (8 * (k & 3)));
    };
    int out[4];
    for (int i = 0; i < 4; ++i) {
        const int r = g + 8 * (i >> 1), n = 2 * t + (i & 1);
        long long s = d[i];
        for (int k = 0; k < 32; ++k) s += A(r, k) * B(k, n);
        out[i] = (int)(unsigned)(unsigned long long)s;  // wraps as int32 like the hardware would
    }
    rns_warp_barrier[w]->arrive_and_wait();  // every lane has read the fragments
    for (int i = 0; i < 4; ++i) d[i] = out[i];
}
