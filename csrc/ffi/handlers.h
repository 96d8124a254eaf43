// XLA FFI handler symbols, one per (collective, platform). Each takes the
// operand and an ordering token, returns the result and a new token, and has
// the int64 attribute "comm" (a handle from bagua::register_communicator) plus
// "op" (allreduce) or "root" (broadcast).
//
// CPU handlers (cpu_handlers.cc) are in every build with the FFI headers; the
// CUDA ones (cuda_handlers.cc: the same bindings with XLA's stream first, via
// .Ctx<xffi::PlatformStream<cudaStream_t>>()) only where CUDA is built too
// (BAGUA_WITH_XLA_FFI_CUDA). targets.cc lists both under the same target
// names, so the Python lowering is the same on every platform.
#pragma once

#include "xla/ffi/api/api.h"

XLA_FFI_DECLARE_HANDLER_SYMBOL(bagua_ffi_allreduce_cpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(bagua_ffi_broadcast_cpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(bagua_ffi_allgather_cpu);
// Algorithm steps (ffi/xla_step_adapter.h): the token first, then the step number and a
// bucket's leaves (and state) as remaining operands and results.
XLA_FFI_DECLARE_HANDLER_SYMBOL(bagua_ffi_step_cpu);
// Asynchronous model average's training step (ffi/async_step.h).
XLA_FFI_DECLARE_HANDLER_SYMBOL(bagua_ffi_async_step_cpu);
// The leader device's arrays copied into the process's other devices
// (ffi/leader_broadcast.h); CPU only: on GPUs XLA's collective-broadcast does it.
XLA_FFI_DECLARE_HANDLER_SYMBOL(bagua_ffi_leader_broadcast_cpu);

#ifdef BAGUA_WITH_XLA_FFI_CUDA
XLA_FFI_DECLARE_HANDLER_SYMBOL(bagua_ffi_allreduce_cuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(bagua_ffi_broadcast_cuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(bagua_ffi_allgather_cuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(bagua_ffi_step_cuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(bagua_ffi_async_step_cuda);
#endif
