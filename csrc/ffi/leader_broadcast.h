// The leader device's arrays copied into the other devices of the process
// (target "bagua_leader_broadcast", CPU only): how the result of an engine
// step that ran once per process under shard_map (bagua_jax's
// local_devices.run_once) reaches the process's other devices. XLA:CPU devices
// share the process's memory, so each follower copies the leader's buffers (a
// memcpy each) where an XLA psum of (result on the leader, zero elsewhere)
// would all-reduce them; on GPUs the lowering is XLA's collective-broadcast.
//
// Operands: the device's position among the participants (an int32 scalar;
// the leader is 0), then the arrays. Results: the arrays (aliased to the
// operands). Attributes: "site" (the call site, unique per lowering),
// "participants" (how many devices take part) and "timeout_ms".
//
// The participants meet in a slot keyed by (XLA's run id, site): the k-th
// call of one position in a slot matches the k-th call of every other (a site
// inside a loop runs several times per run). The leader publishes its
// buffers and returns once every follower has copied them; a side that waits
// longer than the timeout gets TimeoutError, and so does every later call of
// that slot. When an engine step of the same run fails (the leader's, which
// then never arrives), the handlers report it (leader_broadcast_run_failed)
// and the run's waiting and later calls fail at once with its message.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace bagua {
namespace ffi {

struct ByteSpan {
  void* data;
  size_t bytes;
};

// One device's call. The leader's `arrays` are what the followers' `arrays`
// receive. Throws TimeoutError, InvalidArgument (a position or participant
// count that does not fit the slot) or MismatchError (sizes differ).
// An engine step of XLA run `run_id` failed with `why`: that run's leader
// broadcasts fail from now on (the last few failed runs are remembered).
void leader_broadcast_run_failed(int64_t run_id, const std::string& why);

void leader_broadcast(int64_t run_id, int64_t site, int64_t position, int64_t participants,
                      std::chrono::milliseconds timeout, const std::vector<ByteSpan>& arrays);

}  // namespace ffi
}  // namespace bagua
