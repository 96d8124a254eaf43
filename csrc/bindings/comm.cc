#include "bindings/bindings.h"

namespace py = pybind11;

namespace bagua {
namespace bindings {

void bind_comm(py::module_& m) {}

}  // namespace bindings
}  // namespace bagua
