// XLA FFI handler symbols, one per (collective, platform). Each takes the
// operand and an ordering token, returns the result and a new token, and has
// the int64 attribute "comm" (a handle from bagua::register_communicator) plus
// "op" (allreduce) or "root" (broadcast).
//
// Adding CUDA (NCCL on XLA's stream): a cuda_handlers.cu/.cc beside
// cpu_handlers.cc whose handlers add .Ctx<xffi::PlatformStream<cudaStream_t>>()
// to the same binding and call the bodies in collectives.h with
// Platform{DeviceType::kCUDA, stream, <cudaMemcpyAsync on stream>}; declare the
// symbols here under BAGUA_WITH_CUDA and list them in targets.cc with platform
// "CUDA" and the same target names. The Python lowering needs no change.
#pragma once

#include "xla/ffi/api/api.h"

XLA_FFI_DECLARE_HANDLER_SYMBOL(bagua_ffi_allreduce_cpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(bagua_ffi_broadcast_cpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(bagua_ffi_allgather_cpu);
// Algorithm steps (ffi/steps.h): the token first, then the step number and a
// bucket's leaves (and state) as remaining operands and results.
XLA_FFI_DECLARE_HANDLER_SYMBOL(bagua_ffi_step_cpu);
