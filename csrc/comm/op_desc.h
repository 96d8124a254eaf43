// A communicator call described in a few integers: used in error messages and
// exchanged between ranks by the debug checks (comm/checked_communicator.h).
#pragma once

#include <cstdint>
#include <string>

#include "common/dtype.h"

namespace bagua {

enum class OpKind : int64_t {
  kAllreduce = 1,
  kReduce = 2,
  kBroadcast = 3,
  kAllgather = 4,
  kGather = 5,
  kScatter = 6,
  kReduceScatter = 7,
  kAlltoall = 8,
  kAlltoallV = 9,
  kSend = 10,
  kRecv = 11,
  kBarrier = 12,
};

inline const char* op_kind_name(OpKind k) {
  switch (k) {
    case OpKind::kAllreduce: return "allreduce";
    case OpKind::kReduce: return "reduce";
    case OpKind::kBroadcast: return "broadcast";
    case OpKind::kAllgather: return "allgather";
    case OpKind::kGather: return "gather";
    case OpKind::kScatter: return "scatter";
    case OpKind::kReduceScatter: return "reduce_scatter";
    case OpKind::kAlltoall: return "alltoall";
    case OpKind::kAlltoallV: return "alltoall_v";
    case OpKind::kSend: return "send";
    case OpKind::kRecv: return "recv";
    case OpKind::kBarrier: return "barrier";
  }
  return "unknown-op";
}

struct OpDesc {
  OpKind kind = OpKind::kBarrier;
  DType dtype = DType::kFloat32;
  int64_t count = 0;  // elements (per chunk where the op has one chunk per rank)
  int64_t root = -1;  // root, or peer of send/recv; -1 when the op has none
  ReduceOp op = ReduceOp::kSum;

  bool has_dtype() const { return kind != OpKind::kBarrier; }
  bool has_reduce_op() const {
    return kind == OpKind::kAllreduce || kind == OpKind::kReduce || kind == OpKind::kReduceScatter;
  }
  bool has_root() const {
    return kind == OpKind::kReduce || kind == OpKind::kBroadcast || kind == OpKind::kGather || kind == OpKind::kScatter;
  }
  bool has_peer() const { return kind == OpKind::kSend || kind == OpKind::kRecv; }
};

// e.g. "allreduce(float32, count=10, SUM)", "broadcast(float16, count=3, root=0)"
inline std::string to_string(const OpDesc& d) {
  std::string s = op_kind_name(d.kind);
  s += "(";
  if (d.has_dtype()) {
    s += dtype_name(d.dtype);
    s += d.kind == OpKind::kAlltoallV ? ", total send count=" : ", count=";
    s += std::to_string(d.count);
  }
  if (d.has_reduce_op()) s += std::string(", ") + reduce_op_name(d.op);
  if (d.has_root()) s += ", root=" + std::to_string(d.root);
  if (d.has_peer()) s += ", peer=" + std::to_string(d.root);
  s += ")";
  return s;
}

}  // namespace bagua
