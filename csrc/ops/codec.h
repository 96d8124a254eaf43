// The wire formats of the compressed exchanges, by name: the one registry of them.
//
//   "minmax_uint8"  ByteGrad's 8-bit min-max (kernels/minmax_uint8.h)
//   "minmax_uint4", "minmax_uint2", "fp4_e2m1", "topk_uint4", "topk_uint2"
//                   the low-bit block formats (kernels/lowbit.h)
//
// A Codec runs its format's kernels on an ExecContext's device (ops/kernels.h), with the
// arguments of kernels/compress_cpu.h. Dense codecs code every element, so the ranks' records of a
// chunk line up and reduce in a scatter-reduce-gather (ops/compressed_exchange.h); top-k codecs
// keep different elements on each rank and are exchanged by an allgather of whole records
// (sparse()). The top-k codecs keep k = ceil(topk_density * 256) elements of every block of 256.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/lowbit.h"
#include "ops/algorithm_step.h"

namespace bagua {

class Codec {
 public:
  // The names above, in that order.
  static const std::vector<std::string>& names();
  // Throws InvalidArgument starting with `who` for an unknown name, or (top-k) a density outside (0, 1].
  static Codec make(const std::string& who, const std::string& name, double topk_density);

  const std::string& name() const { return name_; }
  bool sparse() const { return !dense_minmax8_ && lowbit::is_topk(spec_); }
  // Elements kept per block of 256 (top-k), else 0.
  uint32_t topk_k() const { return sparse() ? spec_.k : 0u; }
  // Bytes of one chunk record of chunk_len elements, and of n elements in n_chunks records.
  size_t record_bytes(size_t chunk_len) const;
  size_t compressed_size(size_t n, size_t n_chunks) const { return n_chunks * record_bytes(n / n_chunks); }

  void compress(const ExecContext& ctx, const void* src, size_t n, DType dtype, size_t n_chunks, void* dst,
                int64_t target_chunk = -1) const;
  void decompress(const ExecContext& ctx, const void* src, size_t n, DType dtype, size_t n_chunks, void* dst,
                  int64_t target_chunk = -1) const;
  void residual(const ExecContext& ctx, const void* src, const void* x, size_t n, DType dtype, size_t n_chunks, void* e,
                int64_t target_chunk = -1) const;
  void reduce_chunks(const ExecContext& ctx, const void* src, size_t chunk_len, size_t n_records, DType dtype,
                     bool average, void* dst) const;

 private:
  Codec() = default;
  std::string name_;
  bool dense_minmax8_ = false;
  lowbit::Spec spec_;
};

}  // namespace bagua
