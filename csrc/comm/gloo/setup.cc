#include "comm/gloo/setup.h"

#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <chrono>

#include "common/descriptors.h"
#include "common/error.h"
#include "store/gloo_store_adapter.h"

namespace bagua {
namespace {

using std::chrono::milliseconds;

// gloo/transport/tcp/pair.h: waitUntilConnected() waits timeout_ * 5.
constexpr int kGlooConnectFactor = 5;

// Inside a catch of bagua::Error during set-up: the same error, named after this group.
[[noreturn]] void rethrow_rendezvous_failure(const std::string& who) {
  try {
    throw;
  } catch (const TimeoutError& e) {
    throw TimeoutError(who + ": rendezvous timed out: " + e.what());
  } catch (const PeerError& e) {
    throw PeerError(who + ": " + e.what(), e.peer());
  } catch (const Error& e) {
    throw Error(who + ": rendezvous failed: " + e.what());
  }
}

}  // namespace

bool mentions_timeout(const std::string& what) {
  return what.find("Timed out") != std::string::npos || what.find("timed out") != std::string::npos;
}

std::vector<Lane> connect_lanes(const StorePtr& store, const std::string& prefix, int rank, int size,
                                const GlooCommunicatorOptions& options, const std::string& who) {
  std::vector<Lane> lanes;
  const int n = std::max(1, options.lanes);
  for (int i = 0; i < n; ++i) {
    Lane lane;
    try {
      gloo::transport::tcp::attr attr;
      attr.hostname = options.hostname;
      lane.device = gloo::transport::tcp::CreateDevice(attr);
      auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
      // Gloo waits 5 x the context timeout for a peer to connect: a fifth of
      // ours bounds set-up by our timeout. (The store waits of the
      // rendezvous keep the full timeout: see GlooStoreAdapter.)
      ctx->setTimeout(std::max(milliseconds(1), options.timeout / kGlooConnectFactor));
      GlooStoreAdapter adapter(store, prefix + "/gloo/lane" + std::to_string(i));
      ctx->connectFullMesh(adapter, lane.device);
      ctx->setTimeout(options.timeout);
      lane.context = ctx;
    } catch (const Error&) {
      rethrow_rendezvous_failure(who);
    } catch (const std::exception& e) {
      std::string what = e.what();
      // Gloo says "Unable to find address for: <host>" when socket() fails.
      if (out_of_descriptors())
        throw Error(who + ": " +
                    out_of_descriptors_message("connecting to peers (listening on '" + options.hostname + "')") +
                    " [gloo: " + what + "]");
      if (mentions_timeout(what)) throw TimeoutError(who + ": connecting timed out: " + what);
      throw Error(who + ": connecting to peers (listening on '" + options.hostname + "') failed: " + what);
    }
    lanes.push_back(std::move(lane));
  }
  return lanes;
}

std::unique_ptr<ShmAllreduce> join_shared_memory(const StorePtr& store, const std::string& prefix, int rank, int size,
                                                 const GlooCommunicatorOptions& options, const std::string& who) {
  ShmAllreduceOptions o{options.shm_window_bytes, options.shm_threshold_bytes, options.timeout, options.dead_ranks};
  try {
    return ShmAllreduce::join(store, prefix, rank, size, options.shm, std::move(o));
  } catch (const Error&) {
    rethrow_rendezvous_failure(who);
  }
}

}  // namespace bagua
