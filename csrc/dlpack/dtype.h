// Conversions between Bagua's DType and DLPack's DLDataType.
#pragma once

#include <string>

#include "common/dtype.h"
#include "common/error.h"
#include "dlpack/dlpack.h"

namespace bagua {

// An array whose element type (or device) Bagua cannot communicate -> Python TypeError.
class UnsupportedType : public InvalidArgument {
 public:
  using InvalidArgument::InvalidArgument;
};

DLDataType to_dl_dtype(DType t);
// Throws UnsupportedType naming the type (e.g. "complex64", "bool", "int8").
DType from_dl_dtype(DLDataType t);
// "float32", "int8", "complex64", "bool", "float32x4" ...
std::string dl_dtype_name(DLDataType t);

}  // namespace bagua
