#include "comm/registry.h"

#include <mutex>
#include <string>
#include <unordered_map>

#include "common/error.h"

namespace bagua {
namespace {

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}

std::unordered_map<int64_t, CommunicatorPtr>& registry() {
  static auto* table = new std::unordered_map<int64_t, CommunicatorPtr>();
  return *table;
}

int64_t next_handle = 1;

}  // namespace

int64_t register_communicator(CommunicatorPtr comm) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  int64_t handle = next_handle++;
  registry()[handle] = std::move(comm);
  return handle;
}

CommunicatorPtr lookup_communicator(int64_t handle) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto it = registry().find(handle);
  if (it == registry().end()) {
    throw InvalidArgument("no communicator with handle " + std::to_string(handle) +
                          " (was the process group destroyed?)");
  }
  return it->second;
}

void unregister_communicator(int64_t handle) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  registry().erase(handle);
}

}  // namespace bagua
