// An element of a bucket's op chain, run by the engine's comm thread.
//
// An op is bound to one bucket when appended (bind() validates and allocates
// what it needs; errors surface there, in the caller). A device bucket's op
// is bound with its lane's comm stream: everything it does runs in that
// stream's order. execute() runs on the
// comm thread without the GIL and throws bagua::Error subclasses on failure.
// The algorithms' ops are StepOps (sched/bucket_step_op.h): adapters from a bucket
// to a registered step (ops/registry.h).
#pragma once

#include <memory>
#include <string>

#include "bucket/bucket.h"
#include "comm/communicator.h"

namespace bagua {

class Op {
 public:
  virtual ~Op() = default;
  // e.g. "centralized_allreduce(hierarchical=false, average=true)"
  virtual std::string describe() const = 0;
  // Called once, when the op is appended to `bucket`'s chain; `stream` is the
  // comm stream of the bucket's lane (null for plain host buckets).
  virtual void bind(const BucketPtr& bucket, Stream stream) = 0;
  virtual void execute(Bucket& bucket) = 0;
  // The collectives the next execute() will make, appended to `calls`, when
  // they are known beforehand and all go to `comm`; false otherwise. The
  // engine promises them to its communicator (Communicator::expect_calls).
  virtual bool predict_calls(const Communicator& comm, std::vector<OpDesc>* calls) const {
    (void)comm;
    (void)calls;
    return false;
  }
};

using OpPtr = std::shared_ptr<Op>;

}  // namespace bagua
