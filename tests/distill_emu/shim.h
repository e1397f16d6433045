/* shim.h — just enough of CUDA for templates/distill.cu to run on the host (distill_emu.sh): one CTA
 * at a time as 256 POSIX threads, __syncthreads a barrier, __shfl_xor_sync through a buffer between
 * two warp barriers, __shared__ a static (the CTA's threads share it). fp32 inputs only: the 16-bit
 * conversions are inline PTX. A check of the kernels' arithmetic and indexing, not of the GPU. */
#include <pthread.h>
#include <cmath>
#include <cstring>
#include <cstdint>
struct float4 {
    float x, y, z, w;
};
struct emu_dim {
    unsigned x, y, z;
};
extern thread_local emu_dim threadIdx;
extern emu_dim emu_block, gridDim;
#define blockIdx emu_block
extern pthread_barrier_t emu_block_bar, emu_warp_bar[8];
extern float emu_shfl[256];
#define __syncthreads() pthread_barrier_wait(&emu_block_bar)
template <class T> static inline T __shfl_xor_sync(unsigned, T v, int o) // float and double
{
    static T buf[256];
    int t = (int)threadIdx.x;
    buf[t] = v;
    pthread_barrier_wait(&emu_warp_bar[t / 32]);
    T r = buf[t ^ o];
    pthread_barrier_wait(&emu_warp_bar[t / 32]);
    return r;
}
using std::isfinite;
static inline int __shfl_up_sync(unsigned, int v, int o)
{
    int t = (int)threadIdx.x;
    ((int *)emu_shfl)[t] = v;
    pthread_barrier_wait(&emu_warp_bar[t / 32]);
    int r = (t % 32) >= o ? ((int *)emu_shfl)[t - o] : v;
    pthread_barrier_wait(&emu_warp_bar[t / 32]);
    return r;
}
static inline unsigned atomicAdd(unsigned *a, unsigned v) { return __atomic_fetch_add(a, v, __ATOMIC_RELAXED); }
static inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
static inline float __uint_as_float(unsigned i) { float f; memcpy(&f, &i, 4); return f; }
#define __expf(x) expf(x)
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
