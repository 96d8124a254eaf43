// Process-wide table of live communicators, addressed by an integer handle.
// The XLA FFI handlers receive the handle as a static attribute, since a jitted
// program cannot carry a C++ object.
#pragma once

#include <cstdint>

#include "comm/communicator.h"

namespace bagua {

int64_t register_communicator(CommunicatorPtr comm);
// Throws bagua::InvalidArgument for an unknown handle.
CommunicatorPtr lookup_communicator(int64_t handle);
void unregister_communicator(int64_t handle);

}  // namespace bagua
