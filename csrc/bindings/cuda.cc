// CUDA availability and the NCCL communicator (csrc/comm/nccl/, csrc/kernels/*.cu).
#include "bindings/bindings.h"

namespace py = pybind11;

namespace bagua {
namespace bindings {

void bind_cuda(py::module_& m) {
#ifdef BAGUA_WITH_CUDA
  m.attr("built_with_cuda") = true;
#else
  m.attr("built_with_cuda") = false;
#endif
}

}  // namespace bindings
}  // namespace bagua
