#include "ffi/targets.h"

#include "ffi/handlers.h"

namespace bagua {
namespace ffi {

const std::vector<Target>& targets() {
  static const std::vector<Target> table = {
      {"bagua_allreduce", "cpu", reinterpret_cast<void*>(&bagua_ffi_allreduce_cpu)},
      {"bagua_broadcast", "cpu", reinterpret_cast<void*>(&bagua_ffi_broadcast_cpu)},
      {"bagua_allgather", "cpu", reinterpret_cast<void*>(&bagua_ffi_allgather_cpu)},
      {"bagua_step", "cpu", reinterpret_cast<void*>(&bagua_ffi_step_cpu)},
      {"bagua_async_step", "cpu", reinterpret_cast<void*>(&bagua_ffi_async_step_cpu)},
      {"bagua_leader_broadcast", "cpu", reinterpret_cast<void*>(&bagua_ffi_leader_broadcast_cpu)},
#ifdef BAGUA_WITH_XLA_FFI_CUDA
      {"bagua_allreduce", "CUDA", reinterpret_cast<void*>(&bagua_ffi_allreduce_cuda)},
      {"bagua_broadcast", "CUDA", reinterpret_cast<void*>(&bagua_ffi_broadcast_cuda)},
      {"bagua_allgather", "CUDA", reinterpret_cast<void*>(&bagua_ffi_allgather_cuda)},
      {"bagua_step", "CUDA", reinterpret_cast<void*>(&bagua_ffi_step_cuda)},
      {"bagua_async_step", "CUDA", reinterpret_cast<void*>(&bagua_ffi_async_step_cuda)},
#endif
  };
  return table;
}

}  // namespace ffi
}  // namespace bagua
