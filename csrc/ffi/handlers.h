// XLA FFI handler symbols, one per (collective, platform). Each takes the
// operand and an ordering token, returns the result and a new token, and has
// the int64 attribute "comm" (a handle from bagua::register_communicator) plus
// "op" (allreduce) or "root" (broadcast).
#pragma once

#include "xla/ffi/api/api.h"

XLA_FFI_DECLARE_HANDLER_SYMBOL(bagua_ffi_allreduce_cpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(bagua_ffi_broadcast_cpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(bagua_ffi_allgather_cpu);
