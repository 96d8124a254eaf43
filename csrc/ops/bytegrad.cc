#include "ops/bytegrad.h"

#include "bucket/host_memory.h"
#include "kernels/compress_cpu.h"
#include "kernels/minmax_uint8.h"
#include "ops/hierarchical.h"

namespace bagua {

namespace mm = minmax_uint8;

ByteGradOp::ByteGradOp(CommSet comms, bool hierarchical, bool average)
    : comms_(std::move(comms)), hierarchical_(hierarchical), average_(average) {
  if (!comms_.global) throw InvalidArgument("bytegrad: no communicator");
  if (hierarchical_) comms_.check_hierarchical("bytegrad");
  chunks_ = hierarchical_ ? comms_.num_nodes() : comms_.global->size();
}

std::string ByteGradOp::describe() const {
  return std::string("bytegrad(hierarchical=") + (hierarchical_ ? "true" : "false") +
         ", average=" + (average_ ? "true" : "false") + ")";
}

void ByteGradOp::bind(const BucketPtr& bucket_ptr) {
  const Bucket& bucket = *bucket_ptr;
  if (bound_) throw InvalidArgument(describe() + " is already part of another bucket's chain");
  const DType dt = bucket.dtype();
  if (dt != DType::kFloat32 && dt != DType::kFloat64 && dt != DType::kFloat16 && dt != DType::kBFloat16)
    throw InvalidArgument(describe() + ": " + bucket.describe() + " holds " + dtype_name(dt) +
                          "; MinMaxUInt8 compression needs float32, float64, float16 or bfloat16");
  if (bucket.numel() % static_cast<size_t>(chunks_) != 0)
    throw InvalidArgument(describe() + ": " + bucket.describe() + " has " + std::to_string(bucket.numel()) +
                          " elements, not a multiple of " + std::to_string(chunks_) +
                          " (create the bucket with alignment = the group size)");
  const size_t bytes = mm::compressed_size(bucket.numel(), static_cast<size_t>(chunks_));
  send_ = allocate_host_memory(bytes);
  recv_ = allocate_host_memory(bytes);
  bound_ = true;
}

void ByteGradOp::execute(Bucket& bucket) {
  run_centralized(comms_, hierarchical_, bucket.data(), bucket.numel(), bucket.dtype(),
                  average_ ? ReduceOp::kAvg : ReduceOp::kSum,
                  [&](Communicator& c) { scatter_reduce_gather(c, bucket); });
}

void ByteGradOp::scatter_reduce_gather(Communicator& c, Bucket& bucket) {
  const size_t n = static_cast<size_t>(c.size());
  const size_t r = static_cast<size_t>(c.rank());
  const size_t numel = bucket.numel();
  const DType dt = bucket.dtype();
  const size_t chunk = numel / n;
  const size_t record = mm::record_bytes(chunk);
  uint8_t* send = static_cast<uint8_t*>(send_.get());
  uint8_t* recv = static_cast<uint8_t*>(recv_.get());
  uint8_t* mine = static_cast<uint8_t*>(bucket.data()) + r * chunk * dtype_size(dt);

  mm::compress_cpu(bucket.data(), numel, dt, n, send, -1);
  c.alltoall(send, recv, record, DType::kUInt8);
  mm::reduce_chunks_cpu(recv, chunk, n, dt, average_, mine);
  mm::compress_cpu(bucket.data(), numel, dt, n, send, static_cast<int64_t>(r));
  c.allgather(send + r * record, send, record, DType::kUInt8);
  mm::decompress_cpu(send, numel, dt, n, bucket.data(), -1);
}

}  // namespace bagua
