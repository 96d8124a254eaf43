// Element types and reduction operators understood by every communicator.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace bagua {

enum class DType : int {
  kFloat32 = 0,
  kFloat64 = 1,
  kFloat16 = 2,
  kBFloat16 = 3,
  kInt32 = 4,
  kInt64 = 5,
  kUInt8 = 6,
};

// Values follow the original Bagua's ReduceOp so that user code keeps working.
enum class ReduceOp : int {
  kSum = 0,
  kProd = 1,
  kMin = 2,
  kMax = 3,
  kBor = 7,  // bitwise or, and, xor: integer dtypes only
  kBand = 8,
  kBxor = 9,
  kAvg = 10,
};

enum class DeviceType : int { kCPU = 0, kCUDA = 1 };

// A device stream's native handle: cudaStream_t on CUDA, the host device's
// queue (device/device.h), or null for plain synchronous host work.
using Stream = void*;

inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::kFloat64:
    case DType::kInt64: return 8;
    case DType::kFloat32:
    case DType::kInt32: return 4;
    case DType::kFloat16:
    case DType::kBFloat16: return 2;
    case DType::kUInt8: return 1;
  }
  return 0;
}

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::kFloat32: return "float32";
    case DType::kFloat64: return "float64";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kUInt8: return "uint8";
  }
  return "unknown";
}

inline const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "SUM";
    case ReduceOp::kProd: return "PROD";
    case ReduceOp::kMin: return "MIN";
    case ReduceOp::kMax: return "MAX";
    case ReduceOp::kBor: return "BOR";
    case ReduceOp::kBand: return "BAND";
    case ReduceOp::kBxor: return "BXOR";
    case ReduceOp::kAvg: return "AVG";
  }
  return "unknown";
}

inline bool is_valid_reduce_op(int op) { return (op >= 0 && op <= 3) || (op >= 7 && op <= 10); }

inline bool is_bitwise(ReduceOp op) { return op == ReduceOp::kBor || op == ReduceOp::kBand || op == ReduceOp::kBxor; }

inline bool is_valid_dtype(int t) { return t >= 0 && t <= 6; }

}  // namespace bagua
