#include "dlpack/dtype.h"

namespace bagua {

DLDataType to_dl_dtype(DType t) {
  switch (t) {
    case DType::kFloat32: return {kDLFloat, 32, 1};
    case DType::kFloat64: return {kDLFloat, 64, 1};
    case DType::kFloat16: return {kDLFloat, 16, 1};
    case DType::kBFloat16: return {kDLBfloat, 16, 1};
    case DType::kInt32: return {kDLInt, 32, 1};
    case DType::kInt64: return {kDLInt, 64, 1};
    case DType::kUInt8: return {kDLUInt, 8, 1};
  }
  throw InvalidArgument("invalid dtype " + std::to_string(static_cast<int>(t)));
}

std::string dl_dtype_name(DLDataType t) {
  std::string base;
  switch (t.code) {
    case kDLInt: base = "int"; break;
    case kDLUInt: base = "uint"; break;
    case kDLFloat: base = "float"; break;
    case kDLBfloat: base = "bfloat"; break;
    case kDLComplex: base = "complex"; break;
    case kDLOpaqueHandle: base = "opaque"; break;
    case kDLBool: base = "bool"; break;
    default: base = "code" + std::to_string(t.code) + "_"; break;
  }
  std::string name = t.code == kDLBool && t.bits == 8 ? base : base + std::to_string(t.bits);
  if (t.lanes != 1) name += "x" + std::to_string(t.lanes);
  return name;
}

DType from_dl_dtype(DLDataType t) {
  if (t.lanes == 1) {
    switch (t.code) {
      case kDLFloat:
        if (t.bits == 32) return DType::kFloat32;
        if (t.bits == 64) return DType::kFloat64;
        if (t.bits == 16) return DType::kFloat16;
        break;
      case kDLBfloat:
        if (t.bits == 16) return DType::kBFloat16;
        break;
      case kDLInt:
        if (t.bits == 32) return DType::kInt32;
        if (t.bits == 64) return DType::kInt64;
        break;
      case kDLUInt:
        if (t.bits == 8) return DType::kUInt8;
        break;
      default: break;
    }
  }
  throw UnsupportedType("unsupported dtype " + dl_dtype_name(t) +
                        ": Bagua communicates float32, float64, float16, bfloat16, int32, "
                        "int64 and uint8 arrays");
}

}  // namespace bagua
