// The table of FFI targets the module exports, for jax.ffi.register_ffi_target.
// One name per collective; each platform registers its own handler under that
// name, so the Python lowering is the same on every platform: "cpu" always,
// "CUDA" in builds with CUDA (BAGUA_WITH_XLA_FFI_CUDA). The exception,
// "bagua_leader_broadcast", is CPU only: on GPUs XLA's collective-broadcast does it.
#pragma once

#include <vector>

namespace bagua {
namespace ffi {

struct Target {
  const char* name;      // e.g. "bagua_allreduce"
  const char* platform;  // "cpu" or "CUDA", as jax.ffi.register_ffi_target spells it
  void* handler;         // an XLA_FFI_DEFINE_HANDLER_SYMBOL function
};

const std::vector<Target>& targets();

}  // namespace ffi
}  // namespace bagua
