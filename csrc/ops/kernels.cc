#include "ops/kernels.h"

#include <chrono>
#include <cstring>
#include <memory>

#include "buffer/buffer.h"
#include "common/error.h"
#include "kernels/compress_cpu.h"
#include "kernels/half_wire.h"
#include "kernels/lowbit_cpu.h"
#include "ops/dispatch.h"
#include "ops/elementwise.h"
#ifdef BAGUA_WITH_CUDA
#include "kernels/compress_cuda.h"
#include "kernels/cuda_kernels.h"
#include "kernels/lowbit_cuda.h"
#endif

namespace bagua {
namespace step_kernels {
namespace {

// A readback waits for the work queued before it, which includes the exchange's communication.
constexpr std::chrono::milliseconds kReadbackTimeout{std::chrono::minutes(30)};

}  // namespace

void compress(const ExecContext& ctx, const void* src, size_t n, DType dtype, size_t n_chunks, void* dst,
              int64_t target_chunk) {
  on_device(
      ctx, "MinMaxUInt8 compression", [=] { minmax_uint8::compress_cpu(src, n, dtype, n_chunks, dst, target_chunk); },
      BAGUA_CUDA_LAUNCH(minmax_uint8::compress_cuda(src, n, dtype, n_chunks, dst, target_chunk, stream)));
}

void decompress(const ExecContext& ctx, const void* src, size_t n, DType dtype, size_t n_chunks, void* dst,
                int64_t target_chunk) {
  on_device(
      ctx, "MinMaxUInt8 decompression",
      [=] { minmax_uint8::decompress_cpu(src, n, dtype, n_chunks, dst, target_chunk); },
      BAGUA_CUDA_LAUNCH(minmax_uint8::decompress_cuda(src, n, dtype, n_chunks, dst, target_chunk, stream)));
}

void residual(const ExecContext& ctx, const void* src, const void* x, size_t n, DType dtype, size_t n_chunks, void* e,
              int64_t target_chunk) {
  on_device(
      ctx, "the MinMaxUInt8 residual", [=] { minmax_uint8::residual_cpu(src, x, n, dtype, n_chunks, e, target_chunk); },
      BAGUA_CUDA_LAUNCH(minmax_uint8::residual_cuda(src, x, n, dtype, n_chunks, e, target_chunk, stream)));
}

void reduce_chunks(const ExecContext& ctx, const void* src, size_t chunk_len, size_t n_records, DType dtype,
                   bool average, void* dst) {
  on_device(
      ctx, "MinMaxUInt8 reduction",
      [=] { minmax_uint8::reduce_chunks_cpu(src, chunk_len, n_records, dtype, average, dst); },
      BAGUA_CUDA_LAUNCH(minmax_uint8::reduce_chunks_cuda(src, chunk_len, n_records, dtype, average, dst, stream)));
}

void lowbit_compress(const ExecContext& ctx, lowbit::Spec spec, const void* src, size_t n, DType dtype, size_t n_chunks,
                     void* dst, int64_t target_chunk) {
  on_device(
      ctx, "low-bit compression", [=] { lowbit::compress_cpu(spec, src, n, dtype, n_chunks, dst, target_chunk); },
      BAGUA_CUDA_LAUNCH(lowbit::compress_cuda(spec, src, n, dtype, n_chunks, dst, target_chunk, stream)));
}

void lowbit_decompress(const ExecContext& ctx, lowbit::Spec spec, const void* src, size_t n, DType dtype,
                       size_t n_chunks, void* dst, int64_t target_chunk) {
  on_device(
      ctx, "low-bit decompression", [=] { lowbit::decompress_cpu(spec, src, n, dtype, n_chunks, dst, target_chunk); },
      BAGUA_CUDA_LAUNCH(lowbit::decompress_cuda(spec, src, n, dtype, n_chunks, dst, target_chunk, stream)));
}

void lowbit_residual(const ExecContext& ctx, lowbit::Spec spec, const void* src, const void* x, size_t n, DType dtype,
                     size_t n_chunks, void* e, int64_t target_chunk) {
  on_device(
      ctx, "the low-bit residual", [=] { lowbit::residual_cpu(spec, src, x, n, dtype, n_chunks, e, target_chunk); },
      BAGUA_CUDA_LAUNCH(lowbit::residual_cuda(spec, src, x, n, dtype, n_chunks, e, target_chunk, stream)));
}

void lowbit_reduce_chunks(const ExecContext& ctx, lowbit::Spec spec, const void* src, size_t chunk_len,
                          size_t n_records, DType dtype, bool average, void* dst) {
  on_device(
      ctx, "low-bit reduction",
      [=] { lowbit::reduce_chunks_cpu(spec, src, chunk_len, n_records, dtype, average, dst); },
      BAGUA_CUDA_LAUNCH(lowbit::reduce_chunks_cuda(spec, src, chunk_len, n_records, dtype, average, dst, stream)));
}

size_t count_nonfinite(const ExecContext& ctx, const void* x, size_t n, DType dtype, int slot) {
  if (ctx.device == DeviceType::kCPU) {
    if (ctx.dev == nullptr) return lowbit::count_nonfinite_cpu(x, n, dtype);
    auto count = std::make_shared<size_t>(0);
    ctx.dev->enqueue_host(ctx.stream, [=] { *count = lowbit::count_nonfinite_cpu(x, n, dtype); });
    ctx.dev->synchronize(ctx.stream, kReadbackTimeout);
    return *count;
  }
#ifdef BAGUA_WITH_CUDA
  return lowbit::count_nonfinite_cuda(x, n, dtype, ctx.scratch->get(slot, sizeof(uint64_t)), ctx.stream);
#else
  (void)slot;
  throw InvalidArgument("counting non-finite values: this build has no CUDA support");
#endif
}

void wire_encode(const ExecContext& ctx, const void* src, size_t count, DType dtype, DType wire, void* dst) {
  on_device(
      ctx, "16-bit encoding", [=] { half_wire::encode_cpu(src, count, dtype, wire, dst); },
      BAGUA_CUDA_LAUNCH(cuda::launch_wire_encode(src, count, dtype, wire, dst, stream)));
}

void wire_decode(const ExecContext& ctx, const void* src, size_t count, DType wire, DType dtype, void* dst) {
  on_device(
      ctx, "16-bit decoding", [=] { half_wire::decode_cpu(src, count, wire, dtype, dst); },
      BAGUA_CUDA_LAUNCH(cuda::launch_wire_decode(src, count, wire, dtype, dst, stream)));
}

void wire_reduce(const ExecContext& ctx, const void* src, size_t chunk_len, size_t n_records, DType wire, DType dtype,
                 bool average, void* dst) {
  on_device(
      ctx, "16-bit reduction", [=] { half_wire::reduce_cpu(src, chunk_len, n_records, wire, dtype, average, dst); },
      BAGUA_CUDA_LAUNCH(cuda::launch_wire_reduce(src, chunk_len, n_records, wire, dtype, average, dst, stream)));
}

void average_into(const ExecContext& ctx, void* acc, const void* other, size_t count, DType dtype) {
  on_device(
      ctx, "weight averaging", [=] { average_into_cpu(acc, other, count, dtype); },
      BAGUA_CUDA_LAUNCH(cuda::launch_average_into(acc, other, count, dtype, stream)));
}

void replica_diff(const ExecContext& ctx, void* t, const void* w, const void* l, const void* r, size_t count,
                  DType dtype) {
  on_device(
      ctx, "the replica difference", [=] { replica_diff_cpu(t, w, l, r, count, dtype); },
      BAGUA_CUDA_LAUNCH(cuda::launch_replica_diff(t, w, l, r, count, dtype, stream)));
}

void add_into(const ExecContext& ctx, void* acc, const void* other, size_t count, DType dtype) {
  on_device(
      ctx, "adding", [=] { add_into_cpu(acc, other, count, dtype); },
      BAGUA_CUDA_LAUNCH(cuda::launch_add_into(acc, other, count, dtype, stream)));
}

void momentum_update(const ExecContext& ctx, void* m, const void* g, size_t count, DType dtype, double beta) {
  on_device(
      ctx, "QAdam's momentum update", [=] { momentum_update_cpu(m, g, count, dtype, beta); },
      BAGUA_CUDA_LAUNCH(cuda::launch_momentum_update(m, g, count, dtype, beta, stream)));
}

void apply_average(const ExecContext& ctx, void* w, const void* snapshot, const void* avg, size_t count, DType dtype) {
  on_device(
      ctx, "applying a model average", [=] { apply_average_cpu(w, snapshot, avg, count, dtype); },
      BAGUA_CUDA_LAUNCH(cuda::launch_apply_average(w, snapshot, avg, count, dtype, stream)));
}

void pseudo_gradient(const ExecContext& ctx, void* d, const void* a, size_t count, DType dtype) {
  on_device(
      ctx, "the pseudo-gradient", [=] { pseudo_gradient_cpu(d, a, count, dtype); },
      BAGUA_CUDA_LAUNCH(cuda::launch_pseudo_gradient(d, a, count, dtype, stream)));
}

void outer_mix(const ExecContext& ctx, void* w, const void* a, size_t count, DType dtype, double alpha) {
  on_device(
      ctx, "the fragment merge", [=] { outer_mix_cpu(w, a, count, dtype, alpha); },
      BAGUA_CUDA_LAUNCH(cuda::launch_outer_mix(w, a, count, dtype, alpha, stream)));
}

void outer_sgd(const ExecContext& ctx, void* w, void* a, void* m, const void* d, size_t count, DType dtype, double lr,
               double mu, bool nesterov, bool fresh) {
  on_device(
      ctx, "the outer optimizer step", [=] { outer_sgd_cpu(w, a, m, d, count, dtype, lr, mu, nesterov, fresh); },
      BAGUA_CUDA_LAUNCH(cuda::launch_outer_sgd(w, a, m, d, count, dtype, lr, mu, nesterov, fresh, stream)));
}

void copy(const ExecContext& ctx, void* dst, const void* src, size_t nbytes) {
  if (ctx.dev == nullptr) return copy_bytes(dst, src, nbytes, ctx.device);
  ctx.dev->copy_async(dst, src, nbytes, ctx.stream);
}

void fill_zero(const ExecContext& ctx, void* dst, size_t nbytes) {
  if (nbytes == 0) return;
  if (ctx.dev == nullptr) {
    if (ctx.device != DeviceType::kCPU) throw InvalidArgument("zeroing device memory needs the context's Device");
    std::memset(dst, 0, nbytes);
    return;
  }
  ctx.dev->memset_async(dst, 0, nbytes, ctx.stream);
}

}  // namespace step_kernels
}  // namespace bagua
