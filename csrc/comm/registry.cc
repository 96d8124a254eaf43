#include "comm/registry.h"

#include "common/handle_table.h"

namespace bagua {
namespace {

HandleTable<Communicator>& table() {
  static auto* t = new HandleTable<Communicator>("communicator");  // never destroyed: XLA may call at exit
  return *t;
}

}  // namespace

int64_t register_communicator(CommunicatorPtr comm) { return table().add(std::move(comm)); }

CommunicatorPtr lookup_communicator(int64_t handle) {
  return table().get(handle, " (was the process group destroyed?)");
}

void unregister_communicator(int64_t handle) { table().remove(handle); }

}  // namespace bagua
