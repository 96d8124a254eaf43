// The Python half of DLPack export, shared by every producer (Buffer,
// MemoryView): reading the consumer's __dlpack__ arguments and wrapping an
// export (dlpack/export.h) in a capsule that frees it if never consumed.
#pragma once

#include <pybind11/pybind11.h>

#include <string>

#include "dlpack/dlpack.h"
#include "dlpack/export.h"

namespace bagua {
namespace bindings {

// Capsule names of the protocol; a consumer renames a capsule it took.
constexpr const char* kDLTensorName = "dltensor";
constexpr const char* kDLTensorVersionedName = "dltensor_versioned";
constexpr const char* kUsedDLTensorName = "used_dltensor";
constexpr const char* kUsedDLTensorVersionedName = "used_dltensor_versioned";

// Raises Python's BufferError (what the protocol asks producers to raise).
[[noreturn]] void raise_buffer_error(const std::string& msg);

// Raises BufferError unless `dl_device` (None or a (device_type, device_id)
// pair) names `have`; TypeError when it is not such a pair. `what` names the
// producer in the message.
void check_requested_device(const pybind11::handle& dl_device, DLDevice have, const std::string& what);

// Whether the consumer asked for a copy (copy=True); TypeError unless copy is
// None or a bool.
bool copy_requested(const pybind11::handle& copy);

// A capsule owning the export of `spec`: "dltensor_versioned" when the
// consumer's max_version (None or a (major, minor) pair) reaches DLPack 1.x,
// else the legacy "dltensor". TypeError for a malformed max_version.
pybind11::object make_dlpack_capsule(ExportSpec spec, const pybind11::handle& max_version);

}  // namespace bindings
}  // namespace bagua
