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
  };
  return table;
}

}  // namespace ffi
}  // namespace bagua
