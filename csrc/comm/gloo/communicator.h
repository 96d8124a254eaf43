// CPU communicator over Gloo's TCP transport.
//
// Rendezvous: every rank of a group calls the factory with the same store,
// prefix and size; the ranks exchange their addresses through the store under
// `prefix` (several groups can share one store) and connect a full mesh.
//
// Only Gloo's options / unbound-buffer API is used (the legacy bound-buffer
// algorithms shrink the socket send buffers and slow everything after them).
// Every collective gets its own tag from a per-communicator sequence number,
// so all ranks must issue collectives in the same order; send/recv use a
// per-peer, per-direction sequence number, so a send must be matched by a
// recv on the peer in the same order.
//
// Failures: a timeout raises bagua::TimeoutError, a lost connection
// bagua::PeerError, anything else bagua::Error, each naming the operation,
// its sequence number, the group and the dead ranks the store knows of.
// After such a failure the communicator is broken: it closes its connections
// (so peers blocked on it fail fast) and every later call raises at once.
// Timeouts apply to each blocking step of an operation.
//
// Allreduce goes through shared memory when the whole group is on one host
// (see GlooCommunicatorOptions::shm); everything else stays on TCP.
//
// Inside: communicator.cc runs the primitives; comm/gloo/setup.h connects the
// lanes and the shared memory, comm/gloo/wire_packing.h decides when an
// allreduce travels packed, comm/gloo/failure_report.h words the failures.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "store/store.h"

namespace bagua {

// Returns the ranks known to have died (for error messages); may throw.
using DeadRanksFn = std::function<std::vector<int>()>;

// Whether float32 SUM/AVG allreduces may travel top-byte packed (BAGUA_WIRE_PACKING).
enum class WirePacking { kOff, kAuto, kOn };
// "off", "auto", "on": the setting's values.
inline const char* wire_packing_name(WirePacking w) {
  return w == WirePacking::kOff ? "off" : w == WirePacking::kAuto ? "auto" : "on";
}

struct GlooCommunicatorOptions {
  // Address peers reach this process on (an IP or a resolvable host name).
  std::string hostname = "127.0.0.1";
  std::chrono::milliseconds timeout{600000};
  // Defaults to store->dead_ranks().
  DeadRanksFn dead_ranks;
  // Large allreduces are split over this many connections, each driven by
  // its own thread, which keeps more than one socket busy at a time.
  int lanes = 2;
  // Buffers below this size (bytes) use a single connection.
  size_t lane_threshold_bytes = 8u << 20;
  // Bytes per segment in Gloo's pipelined allreduce/reduce ring.
  size_t segment_bytes = 4u << 20;
  // When every rank of the group is on this host (same kernel and network,
  // IPC and mount namespaces, same user), allreduces of at least
  // shm_threshold_bytes go through POSIX shared memory instead of TCP, in
  // chunks of shm_window_bytes (comm/shm/shm_allreduce.h). Every rank must
  // pass the same values, or the group stays on TCP. Threshold 0: shared
  // memory was faster than loopback TCP down to 16 KiB (benchmarks/gloo_tuning.py).
  bool shm = true;
  size_t shm_threshold_bytes = 0;
  size_t shm_window_bytes = 1u << 20;
  // Float32 SUM/AVG allreduces of at least wire_packing_min_bytes: kOff runs
  // Gloo's ring; kOn runs comm/gloo/packed_allreduce.h and packs every
  // message that shrinks; kAuto runs the ring until every rank has measured
  // the link below wire_packing_slow_bits_per_s (a vote every few such calls,
  // see comm/gloo/wire_packing.h), then the packed allreduce, whose senders pack
  // while their own measure stays below it: packing costs CPU time that only
  // a slow link pays back.
  WirePacking wire_packing = WirePacking::kAuto;
  size_t wire_packing_min_bytes = 1u << 20;
  double wire_packing_slow_bits_per_s = 2e9;
  size_t wire_packing_segment_bytes = 1u << 20;
  // The packed allreduce reduces each lane's part in windows of at most this
  // many bytes (comm/gloo/packed_allreduce.h): its scratch, about 2.25 times a
  // window per lane, then stays bounded however large a bucket is (VGG16's
  // first dense layer alone is 392 MiB). 0: no windows.
  size_t wire_packing_window_bytes = 32u << 20;
};

CommunicatorPtr create_gloo_communicator(StorePtr store, const std::string& prefix, int rank, int size,
                                         const GlooCommunicatorOptions& options);

CommunicatorPtr create_gloo_communicator(StorePtr store, const std::string& prefix, int rank, int size,
                                         std::chrono::milliseconds timeout, const std::string& hostname,
                                         DeadRanksFn dead_ranks = nullptr);

}  // namespace bagua
