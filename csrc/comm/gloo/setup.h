// Setting up a Gloo communicator's connections: the lanes (full meshes of TCP
// connections, each with its own transport thread) and the shared-memory
// allreduce of a group that lives on one host.
//
// Every rank of the group calls these with the same store, prefix and size, in
// the same order; they exchange addresses (or host identities) through the
// store under `prefix`. Failures raise bagua errors named after the group
// (`who`, the communicator's describe()): TimeoutError for a timed-out
// rendezvous or connection, PeerError for a rank the store reports dead, Error
// otherwise (running out of file descriptors said plainly).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <gloo/context.h>
#include <gloo/transport/device.h>

#include "comm/gloo/communicator.h"
#include "comm/shm/shm_allreduce.h"
#include "store/store.h"

namespace bagua {

// One full mesh of connections with its own transport thread.
struct Lane {
  std::shared_ptr<gloo::transport::Device> device;
  std::shared_ptr<gloo::Context> context;
};

// max(1, options.lanes) lanes, each connected under "<prefix>/gloo/lane<i>".
std::vector<Lane> connect_lanes(const StorePtr& store, const std::string& prefix, int rank, int size,
                                const GlooCommunicatorOptions& options, const std::string& who);

// The group's shared-memory allreduce; null unless every rank is on this host
// and options.shm is set (comm/shm/shm_allreduce.h).
std::unique_ptr<ShmAllreduce> join_shared_memory(const StorePtr& store, const std::string& prefix, int rank, int size,
                                                 const GlooCommunicatorOptions& options, const std::string& who);

// Whether a Gloo error message says that something timed out.
bool mentions_timeout(const std::string& what);

}  // namespace bagua
