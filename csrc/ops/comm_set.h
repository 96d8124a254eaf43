// The communicators an engine's ops run on.
//
// Flat ops use `global`. Hierarchical ops reduce within the node over `intra`
// to its rank 0 (the node leader), run the algorithm among leaders over
// `inter`, then broadcast within the node. Every
// node must hold the same number of processes; `inter` is null on non-leaders.
#pragma once

#include <string>

#include "comm/communicator.h"
#include "common/error.h"

namespace bagua {

struct CommSet {
  CommunicatorPtr global;
  CommunicatorPtr intra;  // null unless hierarchical ops are used
  CommunicatorPtr inter;  // node leaders only; null elsewhere

  bool is_leader() const { return intra && intra->rank() == 0; }

  // Number of nodes (size of `inter`) derived from sizes known on every rank.
  int num_nodes() const { return global->size() / intra->size(); }

  // Throws InvalidArgument unless the communicators can run hierarchical ops.
  void check_hierarchical(const std::string& what) const {
    if (!global) throw InvalidArgument(what + ": no global communicator");
    if (!intra)
      throw InvalidArgument(what +
                            ": hierarchical mode needs an intra-node communicator "
                            "(create the engine with intra and inter communicators)");
    if (global->size() % intra->size() != 0)
      throw InvalidArgument(what + ": hierarchical mode needs the same number of processes on every node (" +
                            std::to_string(global->size()) + " processes, " + std::to_string(intra->size()) +
                            " on this node)");
    if (is_leader()) {
      if (!inter)
        throw InvalidArgument(what + ": this process leads its node (intra rank 0) but has no inter-node communicator");
      if (inter->size() != num_nodes())
        throw InvalidArgument(what + ": the inter-node communicator has " + std::to_string(inter->size()) +
                              " ranks but there are " + std::to_string(num_nodes()) + " nodes");
    }
  }
};

}  // namespace bagua
