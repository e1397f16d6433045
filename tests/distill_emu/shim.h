/* shim.h — just enough of CUDA for templates/distill.cu to run on the host (distill_emu.sh): one CTA
 * at a time as 256 coroutines of one host thread (emu.cpp run: ucontext), __syncthreads a barrier
 * that yields to the next coroutine until all have arrived, __shfl_xor_sync through a buffer between
 * two warp barriers, __shared__ a static (the CTA's threads share it). fp32 inputs only: the 16-bit
 * conversions are inline PTX. A check of the kernels' arithmetic and indexing, not of the GPU.
 * (256 POSIX threads per CTA spent most of the test's time in futex barriers: 105 s wall, 101 s of
 * it in the kernel, on 2 cores; coroutines switch without waking threads.) */
#include <cmath>
#include <cstring>
#include <cstdint>
struct float4 {
    float x, y, z, w;
};
struct emu_dim {
    unsigned x, y, z;
};
extern emu_dim threadIdx; // the running coroutine's (emu.cpp sets it on every switch)
extern emu_dim emu_block, gridDim;
#define blockIdx emu_block
extern float emu_shfl[256];
// A barrier of `expected` coroutines: the last to arrive opens it; the others yield until it opens.
struct emu_bar {
    int count;
    unsigned gen;
};
extern emu_bar emu_block_bar, emu_warp_bar[8];
void emu_yield();
static inline void emu_wait(emu_bar &b, int expected)
{
    const unsigned gen = b.gen;
    if (++b.count == expected) {
        b.count = 0, b.gen++;
        return;
    }
    while (b.gen == gen) emu_yield();
}
#define __syncthreads() emu_wait(emu_block_bar, 256)
template <class T> static inline T __shfl_xor_sync(unsigned, T v, int o) // float and double
{
    static T buf[256];
    int t = (int)threadIdx.x;
    buf[t] = v;
    emu_wait(emu_warp_bar[t / 32], 32);
    T r = buf[t ^ o];
    emu_wait(emu_warp_bar[t / 32], 32);
    return r;
}
using std::isfinite;
static inline int __shfl_up_sync(unsigned, int v, int o)
{
    int t = (int)threadIdx.x;
    ((int *)emu_shfl)[t] = v;
    emu_wait(emu_warp_bar[t / 32], 32);
    int r = (t % 32) >= o ? ((int *)emu_shfl)[t - o] : v;
    emu_wait(emu_warp_bar[t / 32], 32);
    return r;
}
static inline unsigned atomicAdd(unsigned *a, unsigned v) { return __atomic_fetch_add(a, v, __ATOMIC_RELAXED); }
static inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
static inline float __uint_as_float(unsigned i) { float f; memcpy(&f, &i, 4); return f; }
#define __expf(x) expf(x)
#define __logf(x) logf(x)
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
