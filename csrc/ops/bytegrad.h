// ByteGrad's step (§2.2): MinMaxUInt8 scatter-reduce-gather on a float bucket.
//
// On a communicator of n ranks, rank r, the bucket (numel divisible by n) is
// split in n chunks:
//   1. compress all n chunks (per-chunk min/max + uint8 codes);
//   2. alltoall of the compressed records: rank r receives chunk r of every peer;
//   3. decode those n records and sum them in float32 (divide by n when
//      averaging) into chunk r of the bucket;
//   4. recompress chunk r;  5. allgather the records;  6. decode all chunks.
// Every element is thus quantised twice. Hierarchical: intra-node reduce (AVG
// or SUM) to the leader, the above among leaders (n = number of nodes),
// intra-node broadcast.
#pragma once

#include <memory>

#include "ops/comm_set.h"
#include "ops/op.h"

namespace bagua {

class ByteGradOp : public Op {
 public:
  ByteGradOp(CommSet comms, bool hierarchical, bool average);
  std::string describe() const override;
  // Checks dtype (floating) and numel % n == 0; allocates the compressed buffers.
  void bind(const BucketPtr& bucket) override;
  void execute(Bucket& bucket) override;

  // Chunk count of the compressed exchange: the group size, or the number of
  // nodes when hierarchical. Bucket sizes must be a multiple of it.
  int chunks() const { return chunks_; }

 private:
  void scatter_reduce_gather(Communicator& c, Bucket& bucket);

  CommSet comms_;
  bool hierarchical_;
  bool average_;
  int chunks_;
  bool bound_ = false;
  std::shared_ptr<void> send_;  // compressed records (all chunks, then own chunk)
  std::shared_ptr<void> recv_;  // records received by the alltoall
};

}  // namespace bagua
