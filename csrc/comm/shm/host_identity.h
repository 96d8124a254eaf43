// Which "host" a process is on, as far as POSIX shared memory is concerned.
//
// Two processes can share a /dev/shm segment when they run on the same kernel
// (boot id), in the same network, IPC and mount namespaces, as the same user.
// The network namespace is part of the key on purpose: the bandwidth benchmark
// emulates hosts as network namespaces of one kernel, and those must keep
// talking over their shaped link. Returns "" when the identity cannot be read
// (no /proc): then shared memory is never used.
#pragma once

#include <string>

namespace bagua {

std::string shm_host_identity();

}  // namespace bagua
