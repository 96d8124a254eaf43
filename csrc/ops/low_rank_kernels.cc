#include "ops/low_rank_kernels.h"

#include <string>

#include "common/error.h"
#include "kernels/low_rank_cpu.h"
#include "ops/dispatch.h"
#include "ops/elementwise.h"
#ifdef BAGUA_WITH_CUDA
#include "kernels/low_rank_cuda.h"
#endif

namespace bagua {
namespace step_kernels {

DType low_rank_compute_dtype(DType dtype) {
  if (!is_floating(dtype))
    throw InvalidArgument(std::string("low-rank compression needs a floating dtype, got ") + dtype_name(dtype));
  return dtype == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32;
}

void low_rank_fold_error(const ExecContext& ctx, void* data, void* error, size_t count, DType dtype) {
  if (count == 0) return;
  on_device(
      ctx, "low-rank error feedback", [=] { low_rank::fold_error_cpu(data, error, count, dtype); },
      BAGUA_CUDA_LAUNCH(cuda::launch_low_rank_fold_error(data, error, count, dtype, stream)));
}

void low_rank_finish_error(const ExecContext& ctx, const void* data, void* error, size_t count, DType dtype) {
  if (count == 0) return;
  on_device(
      ctx, "low-rank error feedback", [=] { low_rank::finish_error_cpu(data, error, count, dtype); },
      BAGUA_CUDA_LAUNCH(cuda::launch_low_rank_finish_error(data, error, count, dtype, stream)));
}

void low_rank_initial_q(const ExecContext& ctx, void* q, size_t count, DType compute, uint64_t key) {
  if (count == 0) return;
  on_device(
      ctx, "the initial Q", [=] { low_rank::initial_q_cpu(q, count, compute, key); },
      BAGUA_CUDA_LAUNCH(cuda::launch_low_rank_initial_q(q, count, compute, key, stream)));
}

void low_rank_orthogonalize(const ExecContext& ctx, void* mat, size_t rows, size_t cols, DType compute,
                            double epsilon) {
  if (rows == 0 || cols == 0) return;
  on_device(
      ctx, "orthogonalisation", [=] { low_rank::orthogonalize_cpu(mat, rows, cols, compute, epsilon); },
      BAGUA_CUDA_LAUNCH(cuda::launch_low_rank_orthogonalize(mat, rows, cols, compute, epsilon, stream)));
}

void low_rank_mq(const ExecContext& ctx, void* M, size_t n, size_t m, const void* Q, size_t r, void* P, DType dtype,
                 void* error) {
  if (n == 0) return;
  on_device(
      ctx, "low-rank compression", [=] { low_rank::mq_cpu(M, n, m, Q, r, P, dtype, error); },
      BAGUA_CUDA_LAUNCH(cuda::launch_low_rank_mq(M, n, m, Q, r, P, dtype, error, stream)));
}

void low_rank_mtp(const ExecContext& ctx, const void* M, size_t n, size_t m, const void* P, size_t r, void* Q,
                  DType dtype) {
  if (m == 0) return;
  on_device(
      ctx, "low-rank compression", [=] { low_rank::mtp_cpu(M, n, m, P, r, Q, dtype); },
      BAGUA_CUDA_LAUNCH(cuda::launch_low_rank_mtp(M, n, m, P, r, Q, dtype, stream)));
}

void low_rank_pqt(const ExecContext& ctx, const void* P, const void* Q, size_t n, size_t m, size_t r, void* M,
                  DType dtype, void* error) {
  if (n == 0 || m == 0) return;
  on_device(
      ctx, "low-rank decompression", [=] { low_rank::pqt_cpu(P, Q, n, m, r, M, dtype, error); },
      BAGUA_CUDA_LAUNCH(cuda::launch_low_rank_pqt(P, Q, n, m, r, M, dtype, error, stream)));
}

}  // namespace step_kernels
}  // namespace bagua
