// `_C.kernels`: the element kernels for tests, on two kinds of arguments.
//   * host_scale / host_divide / cuda_scale / cuda_divide (kernels/scale.h) on
//     raw addresses (ints) with a count and a dtype code; CUDA launches go on a
//     stream (int, 0 = the legacy default stream) that the caller synchronizes.
//   * The step kernels of ops/kernels.h and ops/low_rank_kernels.h on arrays (anything with the buffer
//     protocol, C-contiguous; element arrays of the dtype's item size, record
//     arrays of bytes), run on device "cpu" (a plain host ExecContext on the
//     arrays themselves) or "cuda" (copies in CUDA device 0's memory, the
//     outputs copied back and the stream synchronized before returning; Error
//     naming why when there is no usable CUDA device). Sizes are checked here,
//     so a bad call raises instead of touching memory it does not own.
#include <pybind11/pybind11.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bindings/bindings.h"
#include "common/dtype.h"
#include "common/error.h"
#include "device/device.h"
#include "kernels/compress_cpu.h"
#include "kernels/half_wire.h"
#include "kernels/minmax_uint8.h"
#include "kernels/scale.h"
#include "ops/codec.h"
#include "ops/kernels.h"
#include "ops/low_rank_kernels.h"
#include "ops/algorithm_step.h"

#ifdef BAGUA_WITH_CUDA
#include "comm/nccl/cuda_util.h"
#include "kernels/cuda_kernels.h"
#endif

namespace py = pybind11;

namespace bagua {
namespace bindings {
namespace {

void* as_ptr(uintptr_t address) { return reinterpret_cast<void*>(address); }

// ---- the step kernels on arrays ----------------------------------------------------------------

struct Array {
  py::buffer_info info;
  bool output;  // written by the kernel (copied back from the device)
  size_t nbytes() const { return static_cast<size_t>(info.size) * static_cast<size_t>(info.itemsize); }
};

// BufferError (from the buffer protocol) when an output is read-only.
Array array_of(const py::buffer& b, const char* name, bool output) {
  Array a{b.request(output), output};
  py::ssize_t expect = a.info.itemsize;
  for (py::ssize_t d = a.info.ndim - 1; d >= 0; --d) {
    if (a.info.shape[d] != 1 && a.info.strides[d] != expect)
      throw InvalidArgument(std::string(name) + " must be C-contiguous");
    expect *= a.info.shape[d];
  }
  return a;
}

// Number of `dtype` elements of an element array.
size_t elements(const Array& a, DType dtype, const char* name) {
  if (static_cast<size_t>(a.info.itemsize) != dtype_size(dtype)) {
    throw InvalidArgument(std::string(name) + ": " + dtype_name(dtype) + " needs items of " +
                          std::to_string(dtype_size(dtype)) + " bytes, got " + std::to_string(a.info.itemsize));
  }
  return static_cast<size_t>(a.info.size);
}

// The common element count of arrays that all hold `dtype` elements.
size_t same_count(const std::vector<Array>& arrays, const std::vector<const char*>& names, DType dtype) {
  const size_t n = elements(arrays[0], dtype, names[0]);
  for (size_t i = 1; i < arrays.size(); ++i) {
    if (elements(arrays[i], dtype, names[i]) != n) {
      throw InvalidArgument(std::string(names[i]) + " has " + std::to_string(arrays[i].info.size) + " elements, " +
                            names[0] + " " + std::to_string(n));
    }
  }
  return n;
}

void check_nbytes(const Array& a, size_t expected, const char* name) {
  if (a.nbytes() != expected) {
    throw InvalidArgument(std::string(name) + " must have " + std::to_string(expected) + " bytes, got " +
                          std::to_string(a.nbytes()));
  }
}

#ifdef BAGUA_WITH_CUDA
// One stream for all calls (the device, one per index, owns it).
Stream test_stream(Device& dev) {
  static Stream stream = dev.new_stream();
  return stream;
}
#endif

// Runs op(ctx, pointers), one pointer per array, on `device` (see the top of the file).
template <typename Op>
void run_on(const std::string& device, const std::vector<Array>& arrays, Op&& op) {
  std::vector<void*> ptrs;
  if (device == "cpu") {
    for (const Array& a : arrays) ptrs.push_back(a.info.ptr);
    py::gil_scoped_release release;
    op(ExecContext{}, ptrs);
    return;
  }
  if (device != "cuda") throw InvalidArgument("device must be 'cpu' or 'cuda', got '" + device + "'");
  py::gil_scoped_release release;
  DevicePtr dev = cuda_device(0);  // Error naming why without a usable GPU
#ifdef BAGUA_WITH_CUDA
  const Stream stream = test_stream(*dev);
  std::vector<std::shared_ptr<void>> memory;
  for (const Array& a : arrays) {
    memory.push_back(dev->allocate(std::max<size_t>(a.nbytes(), 1)));
    ptrs.push_back(memory.back().get());
    dev->copy_async(ptrs.back(), a.info.ptr, a.nbytes(), stream);
  }
  ExecContext ctx;
  ctx.device = DeviceType::kCUDA;
  ctx.stream = stream;
  ctx.dev = dev.get();
  op(ctx, ptrs);
  for (size_t i = 0; i < arrays.size(); ++i) {
    if (arrays[i].output) dev->copy_async(arrays[i].info.ptr, ptrs[i], arrays[i].nbytes(), stream);
  }
  dev->synchronize(stream, std::chrono::seconds(60));
#else
  (void)dev;
#endif
}

using Ptrs = const std::vector<void*>&;

void bind_step_kernels(py::module_& k) {
  const auto dev = py::arg("device") = "cpu";
  k.def(
      "average_into",
      [](py::buffer acc, py::buffer other, int dtype, const std::string& device) {
        const DType t = to_dtype(dtype);
        std::vector<Array> a;
        a.push_back(array_of(acc, "acc", true));
        a.push_back(array_of(other, "other", false));
        const size_t n = same_count(a, {"acc", "other"}, t);
        run_on(device, a, [&](const ExecContext& ctx, Ptrs p) { step_kernels::average_into(ctx, p[0], p[1], n, t); });
      },
      py::arg("acc"), py::arg("other"), py::arg("dtype"), dev, "acc = (acc + other) / 2 (ops/elementwise.h).");
  k.def(
      "replica_diff",
      [](py::buffer t, py::buffer w, py::buffer l, py::buffer r, int dtype, const std::string& device) {
        const DType dt = to_dtype(dtype);
        std::vector<Array> a;
        a.push_back(array_of(t, "t", true));
        a.push_back(array_of(w, "w", false));
        a.push_back(array_of(l, "l", false));
        a.push_back(array_of(r, "r", false));
        const size_t n = same_count(a, {"t", "w", "l", "r"}, dt);
        run_on(device, a,
               [&](const ExecContext& ctx, Ptrs p) { step_kernels::replica_diff(ctx, p[0], p[1], p[2], p[3], n, dt); });
      },
      py::arg("t"), py::arg("w"), py::arg("l"), py::arg("r"), py::arg("dtype"), dev,
      "t = t + l/3 + r/3 - w*5/3 (ops/elementwise.h ReplicaMath).");
  k.def(
      "add_into",
      [](py::buffer acc, py::buffer other, int dtype, const std::string& device) {
        const DType t = to_dtype(dtype);
        std::vector<Array> a;
        a.push_back(array_of(acc, "acc", true));
        a.push_back(array_of(other, "other", false));
        const size_t n = same_count(a, {"acc", "other"}, t);
        run_on(device, a, [&](const ExecContext& ctx, Ptrs p) { step_kernels::add_into(ctx, p[0], p[1], n, t); });
      },
      py::arg("acc"), py::arg("other"), py::arg("dtype"), dev, "acc = acc + other.");
  k.def(
      "momentum_update",
      [](py::buffer m, py::buffer g, int dtype, double beta, const std::string& device) {
        const DType t = to_dtype(dtype);
        std::vector<Array> a;
        a.push_back(array_of(m, "m", true));
        a.push_back(array_of(g, "g", false));
        const size_t n = same_count(a, {"m", "g"}, t);
        run_on(device, a,
               [&](const ExecContext& ctx, Ptrs p) { step_kernels::momentum_update(ctx, p[0], p[1], n, t, beta); });
      },
      py::arg("m"), py::arg("g"), py::arg("dtype"), py::arg("beta"), dev,
      "m = beta * m + (1 - beta) * g (ops/elementwise.h MomentumMath).");
  k.def(
      "apply_average",
      [](py::buffer w, py::buffer snapshot, py::buffer avg, int dtype, const std::string& device) {
        const DType t = to_dtype(dtype);
        std::vector<Array> a;
        a.push_back(array_of(w, "w", true));
        a.push_back(array_of(snapshot, "snapshot", false));
        a.push_back(array_of(avg, "avg", false));
        const size_t n = same_count(a, {"w", "snapshot", "avg"}, t);
        run_on(device, a,
               [&](const ExecContext& ctx, Ptrs p) { step_kernels::apply_average(ctx, p[0], p[1], p[2], n, t); });
      },
      py::arg("w"), py::arg("snapshot"), py::arg("avg"), py::arg("dtype"), dev,
      "w = avg + (w - snapshot) (ops/elementwise.h AsyncAverageMath).");

  namespace mm = minmax_uint8;
  k.def(
      "compress",
      [](py::buffer src, int dtype, int64_t n_chunks, py::buffer dst, int64_t target_chunk, const std::string& device) {
        const DType t = to_dtype(dtype);
        const size_t chunks = to_size(n_chunks, "n_chunks");
        std::vector<Array> a;
        a.push_back(array_of(src, "src", false));
        a.push_back(array_of(dst, "dst", true));
        const size_t n = elements(a[0], t, "src");
        mm::check_compress_args(n, t, chunks, target_chunk);
        check_nbytes(a[1], mm::compressed_size(n, chunks), "dst");
        run_on(device, a, [&](const ExecContext& ctx, Ptrs p) {
          step_kernels::compress(ctx, p[0], n, t, chunks, p[1], target_chunk);
        });
      },
      py::arg("src"), py::arg("dtype"), py::arg("n_chunks"), py::arg("dst"), py::arg("target_chunk") = -1, dev,
      "MinMaxUInt8: src's elements into dst's records (kernels/minmax_uint8.h).");
  k.def(
      "decompress",
      [](py::buffer src, int dtype, int64_t n_chunks, py::buffer dst, int64_t target_chunk, const std::string& device) {
        const DType t = to_dtype(dtype);
        const size_t chunks = to_size(n_chunks, "n_chunks");
        std::vector<Array> a;
        a.push_back(array_of(src, "src", false));
        a.push_back(array_of(dst, "dst", true));
        const size_t n = elements(a[1], t, "dst");
        mm::check_compress_args(n, t, chunks, target_chunk);
        check_nbytes(a[0], mm::compressed_size(n, chunks), "src");
        run_on(device, a, [&](const ExecContext& ctx, Ptrs p) {
          step_kernels::decompress(ctx, p[0], n, t, chunks, p[1], target_chunk);
        });
      },
      py::arg("src"), py::arg("dtype"), py::arg("n_chunks"), py::arg("dst"), py::arg("target_chunk") = -1, dev,
      "MinMaxUInt8: src's records decoded into dst's elements.");
  k.def(
      "reduce_chunks",
      [](py::buffer src, int64_t n_records, int dtype, bool average, py::buffer dst, const std::string& device) {
        const DType t = to_dtype(dtype);
        const size_t records = to_size(n_records, "n_records");
        std::vector<Array> a;
        a.push_back(array_of(src, "src", false));
        a.push_back(array_of(dst, "dst", true));
        const size_t len = elements(a[1], t, "dst");
        mm::check_reduce_args(len, records, t);
        check_nbytes(a[0], records * mm::record_bytes(len), "src");
        run_on(device, a, [&](const ExecContext& ctx, Ptrs p) {
          step_kernels::reduce_chunks(ctx, p[0], len, records, t, average, p[1]);
        });
      },
      py::arg("src"), py::arg("n_records"), py::arg("dtype"), py::arg("average"), py::arg("dst"), dev,
      "MinMaxUInt8: the sum (or mean) of n_records records of len(dst) codes into dst.");
  // The codecs of ops/codec.h by name (MinMaxUInt8 and the low-bit block formats, kernels/lowbit.h).
  k.def(
      "codec_compressed_nbytes",
      [](const std::string& name, double density, int64_t n, int64_t n_chunks) {
        const Codec c = Codec::make("codec", name, density);
        mm::check_compress_args(to_size(n, "n"), DType::kFloat32, to_size(n_chunks, "n_chunks"), -1);
        return c.compressed_size(static_cast<size_t>(n), static_cast<size_t>(n_chunks));
      },
      py::arg("name"), py::arg("topk_density"), py::arg("n"), py::arg("n_chunks"),
      "Bytes of n elements compressed in n_chunks records.");
  k.def(
      "codec_compress",
      [](const std::string& name, double density, py::buffer src, int dtype, int64_t n_chunks, py::buffer dst,
         int64_t target_chunk, const std::string& device) {
        const Codec c = Codec::make("codec", name, density);
        const DType t = to_dtype(dtype);
        const size_t chunks = to_size(n_chunks, "n_chunks");
        std::vector<Array> a;
        a.push_back(array_of(src, "src", false));
        a.push_back(array_of(dst, "dst", true));
        const size_t n = elements(a[0], t, "src");
        mm::check_compress_args(n, t, chunks, target_chunk);
        check_nbytes(a[1], c.compressed_size(n, chunks), "dst");
        run_on(device, a,
               [&](const ExecContext& ctx, Ptrs p) { c.compress(ctx, p[0], n, t, chunks, p[1], target_chunk); });
      },
      py::arg("name"), py::arg("topk_density"), py::arg("src"), py::arg("dtype"), py::arg("n_chunks"), py::arg("dst"),
      py::arg("target_chunk") = -1, dev, "src's elements into dst's records.");
  k.def(
      "codec_decompress",
      [](const std::string& name, double density, py::buffer src, int dtype, int64_t n_chunks, py::buffer dst,
         int64_t target_chunk, const std::string& device) {
        const Codec c = Codec::make("codec", name, density);
        const DType t = to_dtype(dtype);
        const size_t chunks = to_size(n_chunks, "n_chunks");
        std::vector<Array> a;
        a.push_back(array_of(src, "src", false));
        a.push_back(array_of(dst, "dst", true));
        const size_t n = elements(a[1], t, "dst");
        mm::check_compress_args(n, t, chunks, target_chunk);
        check_nbytes(a[0], c.compressed_size(n, chunks), "src");
        run_on(device, a,
               [&](const ExecContext& ctx, Ptrs p) { c.decompress(ctx, p[0], n, t, chunks, p[1], target_chunk); });
      },
      py::arg("name"), py::arg("topk_density"), py::arg("src"), py::arg("dtype"), py::arg("n_chunks"), py::arg("dst"),
      py::arg("target_chunk") = -1, dev, "src's records decoded into dst's elements.");
  k.def(
      "codec_residual",
      [](const std::string& name, double density, py::buffer src, py::buffer x, int dtype, int64_t n_chunks,
         py::buffer e, const std::string& device) {
        const Codec c = Codec::make("codec", name, density);
        const DType t = to_dtype(dtype);
        const size_t chunks = to_size(n_chunks, "n_chunks");
        std::vector<Array> a;
        a.push_back(array_of(src, "src", false));
        a.push_back(array_of(x, "x", false));
        a.push_back(array_of(e, "e", true));
        const size_t n = elements(a[1], t, "x");
        if (elements(a[2], t, "e") != n)
          throw InvalidArgument("e has " + std::to_string(a[2].info.size) + " elements, x " + std::to_string(n));
        mm::check_compress_args(n, t, chunks, -1);
        check_nbytes(a[0], c.compressed_size(n, chunks), "src");
        run_on(device, a, [&](const ExecContext& ctx, Ptrs p) { c.residual(ctx, p[0], p[1], n, t, chunks, p[2]); });
      },
      py::arg("name"), py::arg("topk_density"), py::arg("src"), py::arg("x"), py::arg("dtype"), py::arg("n_chunks"),
      py::arg("e"), dev, "e = x - decompress(src).");
  k.def(
      "codec_reduce_chunks",
      [](const std::string& name, double density, py::buffer src, int64_t n_records, int dtype, bool average,
         py::buffer dst, const std::string& device) {
        const Codec c = Codec::make("codec", name, density);
        const DType t = to_dtype(dtype);
        const size_t records = to_size(n_records, "n_records");
        std::vector<Array> a;
        a.push_back(array_of(src, "src", false));
        a.push_back(array_of(dst, "dst", true));
        const size_t len = elements(a[1], t, "dst");
        mm::check_reduce_args(len, records, t);
        check_nbytes(a[0], records * c.record_bytes(len), "src");
        run_on(device, a,
               [&](const ExecContext& ctx, Ptrs p) { c.reduce_chunks(ctx, p[0], len, records, t, average, p[1]); });
      },
      py::arg("name"), py::arg("topk_density"), py::arg("src"), py::arg("n_records"), py::arg("dtype"),
      py::arg("average"), py::arg("dst"), dev, "The sum (or mean) of n_records records of len(dst) elements into dst.");
  k.def(
      "count_nonfinite",
      [](py::buffer x, int dtype, const std::string& device) {
        const DType t = to_dtype(dtype);
        std::vector<Array> a;
        a.push_back(array_of(x, "x", false));
        const size_t n = elements(a[0], t, "x");
        size_t count = 0;
        run_on(device, a, [&](const ExecContext& ctx, Ptrs p) {
          GrowOnlyScratch scratch(ctx.dev ? cuda_device(0) : nullptr);
          ExecContext c = ctx;
          c.scratch = &scratch;
          count = step_kernels::count_nonfinite(c, p[0], n, t, 0);
        });
        return count;
      },
      py::arg("x"), py::arg("dtype"), dev, "How many of x's elements are NaN or +-Inf.");
  // HalfGrad's 16-bit wire (kernels/half_wire.h); wire arrays hold 2-byte items.
  k.def(
      "wire_encode",
      [](py::buffer src, int dtype, int wire, py::buffer dst, const std::string& device) {
        const DType t = to_dtype(dtype), w = to_dtype(wire);
        half_wire::check_dtypes(t, w);
        std::vector<Array> a;
        a.push_back(array_of(src, "src", false));
        a.push_back(array_of(dst, "dst", true));
        const size_t n = elements(a[0], t, "src");
        check_nbytes(a[1], n * dtype_size(w), "dst");
        run_on(device, a, [&](const ExecContext& ctx, Ptrs p) { step_kernels::wire_encode(ctx, p[0], n, t, w, p[1]); });
      },
      py::arg("src"), py::arg("dtype"), py::arg("wire"), py::arg("dst"), dev, "dst = src rounded to the wire dtype.");
  k.def(
      "wire_decode",
      [](py::buffer src, int wire, int dtype, py::buffer dst, const std::string& device) {
        const DType t = to_dtype(dtype), w = to_dtype(wire);
        half_wire::check_dtypes(t, w);
        std::vector<Array> a;
        a.push_back(array_of(src, "src", false));
        a.push_back(array_of(dst, "dst", true));
        const size_t n = elements(a[1], t, "dst");
        check_nbytes(a[0], n * dtype_size(w), "src");
        run_on(device, a, [&](const ExecContext& ctx, Ptrs p) { step_kernels::wire_decode(ctx, p[0], n, w, t, p[1]); });
      },
      py::arg("src"), py::arg("wire"), py::arg("dtype"), py::arg("dst"), dev, "dst = the wire values src as dtype.");
  k.def(
      "wire_reduce",
      [](py::buffer src, int64_t n_records, int wire, int dtype, bool average, py::buffer dst,
         const std::string& device) {
        const DType t = to_dtype(dtype), w = to_dtype(wire);
        half_wire::check_dtypes(t, w);
        const size_t records = to_size(n_records, "n_records");
        if (records == 0) throw InvalidArgument("n_records must be at least 1");
        std::vector<Array> a;
        a.push_back(array_of(src, "src", false));
        a.push_back(array_of(dst, "dst", true));
        const size_t len = elements(a[1], t, "dst");
        check_nbytes(a[0], records * len * dtype_size(w), "src");
        run_on(device, a, [&](const ExecContext& ctx, Ptrs p) {
          step_kernels::wire_reduce(ctx, p[0], len, records, w, t, average, p[1]);
        });
      },
      py::arg("src"), py::arg("n_records"), py::arg("wire"), py::arg("dtype"), py::arg("average"), py::arg("dst"), dev,
      "The float32 sum (or mean) of n_records records of len(dst) wire values into dst.");
}

// The low-rank step's kernels (ops/low_rank_kernels.h): M of `dtype`, P, Q and the error memory of
// its compute type; the sizes n, m, r are given and every array's size is checked against them.
void bind_low_rank_kernels(py::module_& k) {
  const auto dev = py::arg("device") = "cpu";
  auto check = [](const Array& a, size_t count, DType t, const char* name) {
    check_nbytes(a, count * dtype_size(t), name);
  };
  auto rank = [](int64_t r) {
    if (r < 1) throw InvalidArgument("r must be >= 1, got " + std::to_string(r));
    return static_cast<size_t>(r);
  };
  k.def(
      "low_rank_fold_error",
      [](py::buffer data, py::buffer error, int dtype, const std::string& device) {
        const DType t = to_dtype(dtype), c = step_kernels::low_rank_compute_dtype(t);
        std::vector<Array> a;
        a.push_back(array_of(data, "data", true));
        a.push_back(array_of(error, "error", true));
        const size_t n = elements(a[0], t, "data");
        check_nbytes(a[1], n * dtype_size(c), "error");
        run_on(device, a,
               [&](const ExecContext& ctx, Ptrs p) { step_kernels::low_rank_fold_error(ctx, p[0], p[1], n, t); });
      },
      py::arg("data"), py::arg("error"), py::arg("dtype"), dev,
      "data += error (rounded to data's dtype); error = data.");
  k.def(
      "low_rank_finish_error",
      [](py::buffer data, py::buffer error, int dtype, const std::string& device) {
        const DType t = to_dtype(dtype), c = step_kernels::low_rank_compute_dtype(t);
        std::vector<Array> a;
        a.push_back(array_of(error, "error", true));
        a.push_back(array_of(data, "data", false));
        const size_t n = elements(a[1], t, "data");
        check_nbytes(a[0], n * dtype_size(c), "error");
        run_on(device, a,
               [&](const ExecContext& ctx, Ptrs p) { step_kernels::low_rank_finish_error(ctx, p[1], p[0], n, t); });
      },
      py::arg("data"), py::arg("error"), py::arg("dtype"), dev, "error -= data.");
  k.def(
      "low_rank_orthogonalize",
      [check](py::buffer mat, int64_t rows, int64_t cols, int compute, double epsilon, const std::string& device) {
        const DType c = to_dtype(compute);
        const size_t nr = to_size(rows, "rows"), nc = to_size(cols, "cols");
        std::vector<Array> a;
        a.push_back(array_of(mat, "mat", true));
        check(a[0], nr * nc, c, "mat");
        run_on(device, a, [&](const ExecContext& ctx, Ptrs p) {
          step_kernels::low_rank_orthogonalize(ctx, p[0], nr, nc, c, epsilon);
        });
      },
      py::arg("mat"), py::arg("rows"), py::arg("cols"), py::arg("compute_dtype"), py::arg("epsilon"), dev,
      "Modified Gram-Schmidt of the columns of the rows x cols row-major matrix mat.");
  k.def(
      "low_rank_mq",
      [check, rank](py::buffer M, py::buffer Q, py::buffer P, int64_t n, int64_t m, int64_t r, int dtype,
                    const std::string& device, py::object error) {
        const DType t = to_dtype(dtype), c = step_kernels::low_rank_compute_dtype(t);
        const size_t nn = to_size(n, "n"), nm = to_size(m, "m"), nr = rank(r);
        std::vector<Array> a;
        a.push_back(array_of(P, "P", true));
        a.push_back(array_of(M, "M", !error.is_none()));
        a.push_back(array_of(Q, "Q", false));
        if (!error.is_none()) a.push_back(array_of(error.cast<py::buffer>(), "error", true));
        check(a[0], nn * nr, c, "P");
        check(a[1], nn * nm, t, "M");
        check(a[2], nm * nr, c, "Q");
        if (a.size() > 3) check(a[3], nn * nm, c, "error");
        run_on(device, a, [&](const ExecContext& ctx, Ptrs p) {
          step_kernels::low_rank_mq(ctx, p[1], nn, nm, p[2], nr, p[0], t, p.size() > 3 ? p[3] : nullptr);
        });
      },
      py::arg("M"), py::arg("Q"), py::arg("P"), py::arg("n"), py::arg("m"), py::arg("r"), py::arg("dtype"), dev,
      py::arg("error") = py::none(),
      "P = M Q (M: n x m of dtype; Q: m x r, P: n x r of its compute dtype); with error (M's error "
      "memory), error feedback's fold on M first.");
  k.def(
      "low_rank_mtp",
      [check, rank](py::buffer M, py::buffer P, py::buffer Q, int64_t n, int64_t m, int64_t r, int dtype,
                    const std::string& device) {
        const DType t = to_dtype(dtype), c = step_kernels::low_rank_compute_dtype(t);
        const size_t nn = to_size(n, "n"), nm = to_size(m, "m"), nr = rank(r);
        std::vector<Array> a;
        a.push_back(array_of(Q, "Q", true));
        a.push_back(array_of(M, "M", false));
        a.push_back(array_of(P, "P", false));
        check(a[0], nm * nr, c, "Q");
        check(a[1], nn * nm, t, "M");
        check(a[2], nn * nr, c, "P");
        run_on(device, a, [&](const ExecContext& ctx, Ptrs p) {
          step_kernels::low_rank_mtp(ctx, p[1], nn, nm, p[2], nr, p[0], t);
        });
      },
      py::arg("M"), py::arg("P"), py::arg("Q"), py::arg("n"), py::arg("m"), py::arg("r"), py::arg("dtype"), dev,
      "Q = M^T P.");
  k.def(
      "low_rank_pqt",
      [check, rank](py::buffer P, py::buffer Q, py::buffer M, int64_t n, int64_t m, int64_t r, int dtype,
                    const std::string& device, py::object error) {
        const DType t = to_dtype(dtype), c = step_kernels::low_rank_compute_dtype(t);
        const size_t nn = to_size(n, "n"), nm = to_size(m, "m"), nr = rank(r);
        std::vector<Array> a;
        a.push_back(array_of(M, "M", true));
        a.push_back(array_of(P, "P", false));
        a.push_back(array_of(Q, "Q", false));
        if (!error.is_none()) a.push_back(array_of(error.cast<py::buffer>(), "error", true));
        check(a[0], nn * nm, t, "M");
        check(a[1], nn * nr, c, "P");
        check(a[2], nm * nr, c, "Q");
        if (a.size() > 3) check(a[3], nn * nm, c, "error");
        run_on(device, a, [&](const ExecContext& ctx, Ptrs p) {
          step_kernels::low_rank_pqt(ctx, p[1], p[2], nn, nm, nr, p[0], t, p.size() > 3 ? p[3] : nullptr);
        });
      },
      py::arg("P"), py::arg("Q"), py::arg("M"), py::arg("n"), py::arg("m"), py::arg("r"), py::arg("dtype"), dev,
      py::arg("error") = py::none(),
      "M = P Q^T, rounded to dtype; with error (M's error memory), error feedback's finish on M after.");
}

// ---- scale and divide on raw addresses ---------------------------------------------------------

[[noreturn, maybe_unused]] void no_cuda(const char* what) {
  throw Error(std::string(what) + ": bagua_core was built without CUDA (no CUDA toolkit was found at build time)");
}

void bind_scale(py::module_& k) {
  auto release = py::call_guard<py::gil_scoped_release>();
  k.def(
      "host_scale",
      [](uintptr_t data, size_t count, int dtype, double factor) {
        scale_host(as_ptr(data), count, to_dtype(dtype), factor);
      },
      py::arg("data"), py::arg("count"), py::arg("dtype"), py::arg("factor"), release);
  k.def(
      "host_divide",
      [](uintptr_t data, size_t count, int dtype, double divisor) {
        divide_host(as_ptr(data), count, to_dtype(dtype), divisor);
      },
      py::arg("data"), py::arg("count"), py::arg("dtype"), py::arg("divisor"), release);
#ifdef BAGUA_WITH_CUDA
  // The kernel runs on the device that holds `data` (else the current one).
  auto device_of = [](uintptr_t data) {
    cudaPointerAttributes attr;
    cudaError_t err = cudaPointerGetAttributes(&attr, as_ptr(data));
    if (err != cudaSuccess) {
      cudaGetLastError();
      int current = 0;
      cuda::check(cudaGetDevice(&current), "cudaGetDevice");
      return current;
    }
    if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged) {
      throw InvalidArgument("the kernel needs device memory, got a host pointer");
    }
    return attr.device;
  };
  k.def(
      "cuda_scale",
      [device_of](uintptr_t data, size_t count, int dtype, double factor, uintptr_t stream) {
        DType t = to_dtype(dtype);
        if (count == 0) return;
        cuda::DeviceGuard guard(device_of(data));
        cuda::launch_scale(as_ptr(data), count, t, factor, static_cast<cudaStream_t>(as_ptr(stream)));
      },
      py::arg("data"), py::arg("count"), py::arg("dtype"), py::arg("factor"), py::arg("stream") = 0, release);
  k.def(
      "cuda_divide",
      [device_of](uintptr_t data, size_t count, int dtype, double divisor, uintptr_t stream) {
        DType t = to_dtype(dtype);
        if (count == 0) return;
        cuda::DeviceGuard guard(device_of(data));
        cuda::launch_divide(as_ptr(data), count, t, divisor, static_cast<cudaStream_t>(as_ptr(stream)));
      },
      py::arg("data"), py::arg("count"), py::arg("dtype"), py::arg("divisor"), py::arg("stream") = 0, release);
#else
  k.def("cuda_scale", [](py::args, py::kwargs) { no_cuda("cuda_scale"); });
  k.def("cuda_divide", [](py::args, py::kwargs) { no_cuda("cuda_divide"); });
#endif
}

}  // namespace

void bind_kernels(py::module_& m) {
  py::module_ k = m.def_submodule(
      "kernels",
      "Element kernels for tests: scale/divide on raw addresses (host loops, and CUDA launches on a "
      "stream the caller synchronizes), and the step kernels (ops/kernels.h, ops/low_rank_kernels.h) on arrays, "
      "on device 'cpu' or 'cuda'. Host and CUDA run the same element functions.");
  bind_scale(k);
  bind_step_kernels(k);
  bind_low_rank_kernels(k);
}

}  // namespace bindings
}  // namespace bagua
