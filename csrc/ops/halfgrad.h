// HalfGrad's step: a scatter-reduce-gather of float data over a 16-bit wire
// (kernels/half_wire.h), in place. On a communicator of n ranks, rank r, the
// data (count divisible by n) split in n chunks:
//   1. encode the data to the wire dtype (float16 or bfloat16);
//   2. alltoall: rank r receives chunk r of every peer;
//   3. sum those n records in float32 (record 0 first; divide by n when
//      averaging) into chunk r of the data;
//   4. encode chunk r;  5. allgather the encoded chunks;  6. decode them all.
// Every rank ends with the same bits; each element is rounded to 16 bits twice
// (before the sum and after it), never summed in 16 bits (unlike torch's
// fp16_compress_hook, whose allreduce adds float16 values). Bytes on the wire:
// half those of GradientAllReduce's float32 ring. Hierarchical: intra-node
// reduce to the leader in full precision, the exchange among leaders,
// intra-node broadcast. Scratch slots 0 and 1 hold the wire records.
//
// Registered as "halfgrad"; parameters: hierarchical (bool, false), average
// (bool, true), wire ("float16" or "bfloat16", "float16").
#pragma once

#include "ops/algorithm_step.h"

namespace bagua {

class HalfGradStep : public Step {
 public:
  HalfGradStep(CommSet comms, const StepParams& params);
  std::string describe() const override;
  // The group size whatever `hierarchical`, as ByteGrad's.
  size_t alignment() const override { return static_cast<size_t>(comms_.global->size()); }
  void check(DType dtype, size_t count) const override;
  bool run(const ExecContext& ctx, Span data, Span result, int64_t step) const override;

 private:
  CommSet comms_;
  bool hierarchical_;
  bool average_;
  DType wire_;
};

}  // namespace bagua
