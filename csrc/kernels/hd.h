// BAGUA_HD marks element math shared by CPU loops (g++) and CUDA kernels (nvcc).
#pragma once

#if defined(__CUDACC__)
#define BAGUA_HD __host__ __device__ __forceinline__
#else
#define BAGUA_HD inline __attribute__((always_inline))
#endif
