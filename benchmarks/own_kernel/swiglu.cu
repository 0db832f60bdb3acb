// SwiGLU as a user writes it: out[m, j] = silu(x[m, j]) * x[m, H + j], x of M x 2H and out of M x H, bf16 in and
// out, fp32 math. One file for both tuners: its knobs arrive as #defines, from Kernel Tuner (which defines every
// tunable parameter, block_size_x among them) or from swiglu.cu.j2's header (tuner).
//   block_size_x  threads per block
//   vec           bf16 elements per access (1, 2, 4, 8: 2 to 16-byte loads and stores)
//   items         accesses in flight per thread
//   min_blocks    __launch_bounds__'s minimum resident blocks per SM (0: no minimum)
// Launch: grid (ceil(H / (block_size_x * items * vec)), M), block (block_size_x); needs H % vec == 0.
#include <cuda_bf16.h>

#ifndef KERNEL_NAME
#define KERNEL_NAME swiglu  // tuner names the entry point after the config; Kernel Tuner looks for "swiglu"
#endif

#if min_blocks > 0
#define SWIGLU_BOUNDS __launch_bounds__(block_size_x, min_blocks)
#else
#define SWIGLU_BOUNDS __launch_bounds__(block_size_x)
#endif

// One access of vec bf16 elements, as one load or store instruction of its size: a bf16 type for 2 and 4 bytes, a
// CUDA vector type for 8 and 16 bytes (the vectorized-access idiom; a struct of __nv_bfloat162 is copied member
// by member, 4 bytes at a time), whose bytes the math reads as __nv_bfloat162 pairs.
#if vec == 1
typedef __nv_bfloat16 access_t;
#elif vec == 2
typedef __nv_bfloat162 access_t;
#elif vec == 4
typedef uint2 access_t;
#elif vec == 8
typedef uint4 access_t;
#else
#error "vec must be 1, 2, 4 or 8"
#endif

__device__ __forceinline__ float silu_mul(float gate, float up) { return gate / (1.0f + __expf(-gate)) * up; }

__device__ __forceinline__ access_t swiglu_access(const access_t& gate, const access_t& up)
{
#if vec == 1
    return __float2bfloat16_rn(silu_mul(__bfloat162float(gate), __bfloat162float(up)));
#else
    access_t out;
    const __nv_bfloat162* g2 = reinterpret_cast<const __nv_bfloat162*>(&gate);
    const __nv_bfloat162* u2 = reinterpret_cast<const __nv_bfloat162*>(&up);
    __nv_bfloat162* o2 = reinterpret_cast<__nv_bfloat162*>(&out);
#pragma unroll
    for (int i = 0; i < vec / 2; ++i) {
        const float2 g = __bfloat1622float2(g2[i]);
        const float2 u = __bfloat1622float2(u2[i]);
        o2[i] = __float22bfloat162_rn(make_float2(silu_mul(g.x, u.x), silu_mul(g.y, u.y)));
    }
    return out;
#endif
}

extern "C" __global__ void SWIGLU_BOUNDS KERNEL_NAME(const __nv_bfloat16* __restrict__ x,
                                                     __nv_bfloat16* __restrict__ out, int H)
{
    const long long row = blockIdx.y;
    const access_t* gate = reinterpret_cast<const access_t*>(x + row * 2 * H);
    const access_t* up = reinterpret_cast<const access_t*>(x + row * 2 * H + H);
    access_t* dst = reinterpret_cast<access_t*>(out + row * H);
    const int accesses = H / vec;  // per row of out
    const int first = blockIdx.x * (block_size_x * items) + threadIdx.x;

    // every load of the thread first, then the math and the stores: items loads in flight
    access_t g[items], u[items];
#pragma unroll
    for (int k = 0; k < items; ++k) {
        const int c = first + k * block_size_x;
        if (c < accesses) {
            g[k] = gate[c];
            u[k] = up[c];
        }
    }
#pragma unroll
    for (int k = 0; k < items; ++k) {
        const int c = first + k * block_size_x;
        if (c < accesses) dst[c] = swiglu_access(g[k], u[k]);
    }
}
