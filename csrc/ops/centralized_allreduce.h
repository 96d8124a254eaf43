// GradientAllReduce's step (§2.1): every rank's bucket becomes the sum or the
// mean over the group. Hierarchical: intra-node reduce to the node leader,
// allreduce among leaders, intra-node broadcast.
#pragma once

#include "ops/comm_set.h"
#include "ops/op.h"

namespace bagua {

class CentralizedAllreduceOp : public Op {
 public:
  CentralizedAllreduceOp(CommSet comms, bool hierarchical, bool average);
  std::string describe() const override;
  void bind(const BucketPtr& bucket) override;
  void execute(Bucket& bucket) override;

 private:
  CommSet comms_;
  bool hierarchical_;
  bool average_;
  bool bound_ = false;
};

}  // namespace bagua
