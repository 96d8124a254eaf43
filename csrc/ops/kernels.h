// The element math a step needs, dispatched on the context's device: the host
// loops (kernels/compress_cpu.h, ops/elementwise.h) on CPU, the launchers of
// kernels/compress_cuda.h and kernels/cuda_kernels.h on CUDA (enqueued on the
// context's stream; same bits as the host, NaN payloads aside), and on the
// host implementation of a Device the host loops enqueued on its stream's
// queue (ExecContext::dev). Only this dispatch differs by device; the steps
// themselves are written once.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/lowbit.h"
#include "ops/algorithm_step.h"

namespace bagua {
namespace step_kernels {

// MinMaxUInt8 (layout: kernels/minmax_uint8.h), as kernels/compress_cpu.h.
void compress(const ExecContext& ctx, const void* src, size_t n, DType dtype, size_t n_chunks, void* dst,
              int64_t target_chunk = -1);
void decompress(const ExecContext& ctx, const void* src, size_t n, DType dtype, size_t n_chunks, void* dst,
                int64_t target_chunk = -1);
// e = x - decompress(src) (MinMaxUInt8's `residual`), every chunk or only target_chunk.
void residual(const ExecContext& ctx, const void* src, const void* x, size_t n, DType dtype, size_t n_chunks, void* e,
              int64_t target_chunk = -1);
void reduce_chunks(const ExecContext& ctx, const void* src, size_t chunk_len, size_t n_records, DType dtype,
                   bool average, void* dst);
// The low-bit block codecs (layout: kernels/lowbit.h), as kernels/lowbit_cpu.h.
void lowbit_compress(const ExecContext& ctx, lowbit::Spec spec, const void* src, size_t n, DType dtype, size_t n_chunks,
                     void* dst, int64_t target_chunk = -1);
void lowbit_decompress(const ExecContext& ctx, lowbit::Spec spec, const void* src, size_t n, DType dtype,
                       size_t n_chunks, void* dst, int64_t target_chunk = -1);
void lowbit_residual(const ExecContext& ctx, lowbit::Spec spec, const void* src, const void* x, size_t n, DType dtype,
                     size_t n_chunks, void* e, int64_t target_chunk = -1);
void lowbit_reduce_chunks(const ExecContext& ctx, lowbit::Spec spec, const void* src, size_t chunk_len,
                          size_t n_records, DType dtype, bool average, void* dst);
// How many of x's n elements are NaN or +-Inf. Waits for everything queued before it on the
// context's stream (a device readback): for rare checks, such as an outer step's. Uses scratch
// slot `slot` on CUDA.
size_t count_nonfinite(const ExecContext& ctx, const void* x, size_t n, DType dtype, int slot);
// acc[i] = (acc[i] + other[i]) / 2 (ops/elementwise.h).
void average_into(const ExecContext& ctx, void* acc, const void* other, size_t count, DType dtype);
// t = t + l/3 + r/3 - w*5/3; acc += other (ops/elementwise.h ReplicaMath).
void replica_diff(const ExecContext& ctx, void* t, const void* w, const void* l, const void* r, size_t count,
                  DType dtype);
void add_into(const ExecContext& ctx, void* acc, const void* other, size_t count, DType dtype);
// m = beta * m + (1 - beta) * g (ops/elementwise.h MomentumMath).
void momentum_update(const ExecContext& ctx, void* m, const void* g, size_t count, DType dtype, double beta);
// w = avg + (w - snapshot) (ops/elementwise.h AsyncAverageMath).
void apply_average(const ExecContext& ctx, void* w, const void* snapshot, const void* avg, size_t count, DType dtype);
// d = a - d; then w, a, m from the averaged d (ops/elementwise.h OuterSgdMath).
void pseudo_gradient(const ExecContext& ctx, void* d, const void* a, size_t count, DType dtype);
// w = alpha * w + (1 - alpha) * a (ops/elementwise.h outer_mix_element).
void outer_mix(const ExecContext& ctx, void* w, const void* a, size_t count, DType dtype, double alpha);
void outer_sgd(const ExecContext& ctx, void* w, void* a, void* m, const void* d, size_t count, DType dtype, double lr,
               double mu, bool nesterov, bool fresh);
// HalfGrad's 16-bit wire (kernels/half_wire.h): encode count elements of
// dtype to the wire dtype, decode them back, and reduce n_records records of
// chunk_len wire elements into chunk_len elements of dtype (float32 sum).
void wire_encode(const ExecContext& ctx, const void* src, size_t count, DType dtype, DType wire, void* dst);
void wire_decode(const ExecContext& ctx, const void* src, size_t count, DType wire, DType dtype, void* dst);
void wire_reduce(const ExecContext& ctx, const void* src, size_t chunk_len, size_t n_records, DType wire, DType dtype,
                 bool average, void* dst);
// dst <- src, nbytes (overlapping allowed on the host).
void copy(const ExecContext& ctx, void* dst, const void* src, size_t nbytes);
// dst[0, nbytes) <- 0.
void fill_zero(const ExecContext& ctx, void* dst, size_t nbytes);

}  // namespace step_kernels
}  // namespace bagua
