#include "ops/kernels.h"

#include <cstring>
#include <utility>

#include "buffer/buffer.h"
#include "common/error.h"
#include "kernels/compress_cpu.h"
#include "ops/elementwise.h"
#ifdef BAGUA_WITH_CUDA
#include "kernels/compress_cuda.h"
#include "kernels/cuda_kernels.h"
#endif

namespace bagua {
namespace step_kernels {
namespace {

#ifdef BAGUA_WITH_CUDA
cudaStream_t cuda_stream(const ExecContext& ctx) { return static_cast<cudaStream_t>(ctx.stream); }
#else
[[noreturn]] void no_cuda(const char* what) {
  throw InvalidArgument(std::string(what) + ": this build has no CUDA support");
}
#endif

// Plain host: `work` runs now. On a Device whose memory the host touches (the
// host implementation): it is enqueued on the context's stream, so it runs in
// stream order like a CUDA launch.
template <typename Work>
void on_host(const ExecContext& ctx, Work&& work) {
  if (ctx.dev == nullptr) return work();
  ctx.dev->enqueue_host(ctx.stream, std::forward<Work>(work));
}

}  // namespace

void compress(const ExecContext& ctx, const void* src, size_t n, DType dtype, size_t n_chunks, void* dst,
              int64_t target_chunk) {
  if (ctx.device == DeviceType::kCPU) return on_host(ctx, [=] { minmax_uint8::compress_cpu(src, n, dtype, n_chunks, dst, target_chunk); });
#ifdef BAGUA_WITH_CUDA
  return minmax_uint8::compress_cuda(src, n, dtype, n_chunks, dst, target_chunk, ctx.stream);
#else
  no_cuda("MinMaxUInt8 compression");
#endif
}

void decompress(const ExecContext& ctx, const void* src, size_t n, DType dtype, size_t n_chunks, void* dst,
                int64_t target_chunk) {
  if (ctx.device == DeviceType::kCPU) return on_host(ctx, [=] { minmax_uint8::decompress_cpu(src, n, dtype, n_chunks, dst, target_chunk); });
#ifdef BAGUA_WITH_CUDA
  return minmax_uint8::decompress_cuda(src, n, dtype, n_chunks, dst, target_chunk, ctx.stream);
#else
  no_cuda("MinMaxUInt8 decompression");
#endif
}

void residual(const ExecContext& ctx, const void* src, const void* x, size_t n, DType dtype, size_t n_chunks, void* e,
              int64_t target_chunk) {
  if (ctx.device == DeviceType::kCPU) return on_host(ctx, [=] { minmax_uint8::residual_cpu(src, x, n, dtype, n_chunks, e, target_chunk); });
#ifdef BAGUA_WITH_CUDA
  return minmax_uint8::residual_cuda(src, x, n, dtype, n_chunks, e, target_chunk, ctx.stream);
#else
  no_cuda("the MinMaxUInt8 residual");
#endif
}

void reduce_chunks(const ExecContext& ctx, const void* src, size_t chunk_len, size_t n_records, DType dtype,
                   bool average, void* dst) {
  if (ctx.device == DeviceType::kCPU) return on_host(ctx, [=] { minmax_uint8::reduce_chunks_cpu(src, chunk_len, n_records, dtype, average, dst); });
#ifdef BAGUA_WITH_CUDA
  return minmax_uint8::reduce_chunks_cuda(src, chunk_len, n_records, dtype, average, dst, ctx.stream);
#else
  no_cuda("MinMaxUInt8 reduction");
#endif
}

void average_into(const ExecContext& ctx, void* acc, const void* other, size_t count, DType dtype) {
  if (ctx.device == DeviceType::kCPU) return on_host(ctx, [=] { average_into_cpu(acc, other, count, dtype); });
#ifdef BAGUA_WITH_CUDA
  cuda::launch_average_into(acc, other, count, dtype, cuda_stream(ctx));
#else
  no_cuda("weight averaging");
#endif
}

void replica_diff(const ExecContext& ctx, void* t, const void* w, const void* l, const void* r, size_t count,
                  DType dtype) {
  if (ctx.device == DeviceType::kCPU) return on_host(ctx, [=] { replica_diff_cpu(t, w, l, r, count, dtype); });
#ifdef BAGUA_WITH_CUDA
  cuda::launch_replica_diff(t, w, l, r, count, dtype, cuda_stream(ctx));
#else
  no_cuda("the replica difference");
#endif
}

void add_into(const ExecContext& ctx, void* acc, const void* other, size_t count, DType dtype) {
  if (ctx.device == DeviceType::kCPU) return on_host(ctx, [=] { add_into_cpu(acc, other, count, dtype); });
#ifdef BAGUA_WITH_CUDA
  cuda::launch_add_into(acc, other, count, dtype, cuda_stream(ctx));
#else
  no_cuda("adding");
#endif
}

void momentum_update(const ExecContext& ctx, void* m, const void* g, size_t count, DType dtype, double beta) {
  if (ctx.device == DeviceType::kCPU) return on_host(ctx, [=] { momentum_update_cpu(m, g, count, dtype, beta); });
#ifdef BAGUA_WITH_CUDA
  cuda::launch_momentum_update(m, g, count, dtype, beta, cuda_stream(ctx));
#else
  no_cuda("QAdam's momentum update");
#endif
}

void apply_average(const ExecContext& ctx, void* w, const void* snapshot, const void* avg, size_t count,
                   DType dtype) {
  if (ctx.device == DeviceType::kCPU) return on_host(ctx, [=] { apply_average_cpu(w, snapshot, avg, count, dtype); });
#ifdef BAGUA_WITH_CUDA
  cuda::launch_apply_average(w, snapshot, avg, count, dtype, cuda_stream(ctx));
#else
  no_cuda("applying a model average");
#endif
}

void pseudo_gradient(const ExecContext& ctx, void* d, const void* a, size_t count, DType dtype) {
  if (ctx.device == DeviceType::kCPU) return on_host(ctx, [=] { pseudo_gradient_cpu(d, a, count, dtype); });
#ifdef BAGUA_WITH_CUDA
  cuda::launch_pseudo_gradient(d, a, count, dtype, cuda_stream(ctx));
#else
  no_cuda("the pseudo-gradient");
#endif
}

void outer_sgd(const ExecContext& ctx, void* w, void* a, void* m, const void* d, size_t count, DType dtype, double lr,
               double mu, bool nesterov, bool fresh) {
  if (ctx.device == DeviceType::kCPU)
    return on_host(ctx, [=] { outer_sgd_cpu(w, a, m, d, count, dtype, lr, mu, nesterov, fresh); });
#ifdef BAGUA_WITH_CUDA
  cuda::launch_outer_sgd(w, a, m, d, count, dtype, lr, mu, nesterov, fresh, cuda_stream(ctx));
#else
  no_cuda("the outer optimizer step");
#endif
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
