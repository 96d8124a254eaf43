// Launchers of Bagua's CUDA kernels (kernels/cuda_kernels.cu). Plain C++: any
// translation unit of a CUDA build may call them. Each launch is asynchronous
// on `stream`; launch failures throw bagua::Error, bad arguments
// bagua::InvalidArgument. Empty buffers launch nothing.
#pragma once

#include <cstddef>

#include <cuda_runtime_api.h>

#include "common/dtype.h"

namespace bagua {
namespace cuda {

// data[i] *= factor (see kernels/scale.h for the rounding of each dtype).
void launch_scale(void* data, size_t count, DType dtype, double factor, cudaStream_t stream);
// data[i] /= divisor; integer dtypes need a non-zero whole divisor.
void launch_divide(void* data, size_t count, DType dtype, double divisor, cudaStream_t stream);

}  // namespace cuda
}  // namespace bagua
