// MinMaxUInt8 compression on raw addresses (Python ints). bagua_core/compression.py checks the
// arrays and passes their addresses; these functions trust the sizes and release the GIL. Also the
// names of every codec (ops/codec.h), which the algorithm descriptions check settings against.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>

#include "bindings/bindings.h"
#include "common/dtype.h"
#include "common/error.h"
#include "kernels/compress_cpu.h"
#include "kernels/compress_cuda.h"
#include "kernels/cpu_isa.h"
#include "kernels/minmax_uint8.h"
#include "ops/codec.h"

namespace py = pybind11;

namespace bagua {
namespace bindings {
namespace {

const void* to_cptr(uintptr_t p) { return reinterpret_cast<const void*>(p); }
void* to_ptr(uintptr_t p) { return reinterpret_cast<void*>(p); }

CpuIsa isa_from_name(const std::string& name) {
  for (CpuIsa isa : {CpuIsa::kBaseline, CpuIsa::kAvx2, CpuIsa::kAvx512})
    if (name == cpu_isa_name(isa)) return isa;
  throw InvalidArgument("unknown CPU instruction set '" + name + "': expected baseline, avx2 or avx512");
}

}  // namespace

void bind_compression(py::module_& m) {
  namespace mm = minmax_uint8;
  using release = py::call_guard<py::gil_scoped_release>;

  m.attr("minmax_uint8_header_nbytes") = mm::kHeaderBytes;
  m.attr("minmax_uint8_record_align") = mm::kRecordAlign;
  m.def(
      "minmax_uint8_record_nbytes", [](int64_t chunk_len) { return mm::record_bytes(to_size(chunk_len, "chunk_len")); },
      py::arg("chunk_len"), "Bytes of one compressed chunk record (header, codes, padding).");
  m.def(
      "minmax_uint8_compressed_nbytes",
      [](int64_t n, int64_t n_chunks) {
        mm::check_compress_args(to_size(n, "n"), DType::kFloat32, to_size(n_chunks, "n_chunks"), -1);
        return mm::compressed_size(static_cast<size_t>(n), static_cast<size_t>(n_chunks));
      },
      py::arg("n"), py::arg("n_chunks"), "Bytes of the compressed form of n elements in n_chunks chunks.");
  m.def(
      "minmax_uint8_compress",
      [](uintptr_t src, int64_t n, int dtype, int64_t n_chunks, uintptr_t dst, int64_t target_chunk) {
        mm::compress_cpu(to_cptr(src), to_size(n, "n"), to_dtype(dtype), to_size(n_chunks, "n_chunks"), to_ptr(dst),
                         target_chunk);
      },
      py::arg("src"), py::arg("n"), py::arg("dtype"), py::arg("n_chunks"), py::arg("dst"), py::arg("target_chunk") = -1,
      release(), "Compresses n host elements at address src into dst (see kernels/minmax_uint8.h).");
  m.def(
      "minmax_uint8_decompress",
      [](uintptr_t src, int64_t n, int dtype, int64_t n_chunks, uintptr_t dst, int64_t target_chunk) {
        mm::decompress_cpu(to_cptr(src), to_size(n, "n"), to_dtype(dtype), to_size(n_chunks, "n_chunks"), to_ptr(dst),
                           target_chunk);
      },
      py::arg("src"), py::arg("n"), py::arg("dtype"), py::arg("n_chunks"), py::arg("dst"), py::arg("target_chunk") = -1,
      release(), "Decodes host records at address src into n elements at dst.");
  m.def(
      "minmax_uint8_reduce_chunks",
      [](uintptr_t src, int64_t chunk_len, int64_t n_records, int dtype, bool average, uintptr_t dst) {
        mm::reduce_chunks_cpu(to_cptr(src), to_size(chunk_len, "chunk_len"), to_size(n_records, "n_records"),
                              to_dtype(dtype), average, to_ptr(dst));
      },
      py::arg("src"), py::arg("chunk_len"), py::arg("n_records"), py::arg("dtype"), py::arg("average"), py::arg("dst"),
      release(), "Decodes n_records host records and writes their float32 sum (or mean) to dst.");
  m.def(
      "codec_names", [] { return Codec::names(); },
      "The names of the compressed exchanges' codecs (ops/codec.h), the one registry of them.");
  m.def(
      "cpu_isa", [] { return std::string(cpu_isa_name(cpu_isa())); },
      "The instruction set the host kernels use now: 'baseline', 'avx2' or 'avx512' (kernels/cpu_isa.h).");
  m.def(
      "cpu_isa_supported", [](const std::string& name) { return cpu_isa_supported(isa_from_name(name)); },
      py::arg("name"), "Whether this CPU and OS run the host kernels built for name.");
  m.def(
      "set_cpu_isa", [](const std::string& name) { set_cpu_isa(isa_from_name(name)); }, py::arg("name"),
      "Makes the host kernels use name from now on (for tests and benchmarks; results do not change).");

#ifdef BAGUA_WITH_CUDA
  // Device addresses and a cudaStream_t as an int (0 = legacy default stream); asynchronous.
  m.def(
      "minmax_uint8_compress_cuda",
      [](uintptr_t src, int64_t n, int dtype, int64_t n_chunks, uintptr_t dst, int64_t target_chunk, uintptr_t stream) {
        mm::compress_cuda(to_cptr(src), to_size(n, "n"), to_dtype(dtype), to_size(n_chunks, "n_chunks"), to_ptr(dst),
                          target_chunk, to_ptr(stream));
      },
      py::arg("src"), py::arg("n"), py::arg("dtype"), py::arg("n_chunks"), py::arg("dst"), py::arg("target_chunk"),
      py::arg("stream"), release());
  m.def(
      "minmax_uint8_decompress_cuda",
      [](uintptr_t src, int64_t n, int dtype, int64_t n_chunks, uintptr_t dst, int64_t target_chunk, uintptr_t stream) {
        mm::decompress_cuda(to_cptr(src), to_size(n, "n"), to_dtype(dtype), to_size(n_chunks, "n_chunks"), to_ptr(dst),
                            target_chunk, to_ptr(stream));
      },
      py::arg("src"), py::arg("n"), py::arg("dtype"), py::arg("n_chunks"), py::arg("dst"), py::arg("target_chunk"),
      py::arg("stream"), release());
  m.def(
      "minmax_uint8_reduce_chunks_cuda",
      [](uintptr_t src, int64_t chunk_len, int64_t n_records, int dtype, bool average, uintptr_t dst,
         uintptr_t stream) {
        mm::reduce_chunks_cuda(to_cptr(src), to_size(chunk_len, "chunk_len"), to_size(n_records, "n_records"),
                               to_dtype(dtype), average, to_ptr(dst), to_ptr(stream));
      },
      py::arg("src"), py::arg("chunk_len"), py::arg("n_records"), py::arg("dtype"), py::arg("average"), py::arg("dst"),
      py::arg("stream"), release());
#endif
}

}  // namespace bindings
}  // namespace bagua
