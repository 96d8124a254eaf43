// An NCCL shared library opened at run time by full path, with every function
// Bagua calls resolved up front, so a wrong or old library fails at load time
// with a message naming the path and the missing symbol.
#pragma once

#include <memory>
#include <string>

#include "comm/nccl/nccl_api.h"

namespace bagua {
namespace nccl {

// Oldest NCCL with ncclCommInitRankConfig and non-blocking communicators.
constexpr int kMinVersion = version_code(2, 14, 0);
// ncclConfig_t (nccl_api.h) is NCCL 2's layout, fields appended release by
// release from 2.14 to the 2.28 fields Bagua fills in; NCCL reads the prefix
// it knows. A library of another major version may lay it out differently:
// load_library refuses it.
constexpr int kConfigLayoutMajor = 2;
// First NCCL with the ncclAvg reduction.
constexpr int kAvgVersion = version_code(2, 10, 0);

struct Library {
  std::string path;
  int version = 0;  // ncclGetVersion's code, e.g. 22907 for 2.29.7

  GetVersionFn GetVersion = nullptr;
  GetUniqueIdFn GetUniqueId = nullptr;
  CommInitRankConfigFn CommInitRankConfig = nullptr;
  CommFn CommFinalize = nullptr;
  CommFn CommDestroy = nullptr;
  CommFn CommAbort = nullptr;
  CommGetAsyncErrorFn CommGetAsyncError = nullptr;
  GetErrorStringFn GetErrorString = nullptr;
  GetLastErrorFn GetLastError = nullptr;
  AllReduceFn AllReduce = nullptr;
  ReduceFn Reduce = nullptr;
  BroadcastFn Broadcast = nullptr;
  AllGatherFn AllGather = nullptr;
  ReduceScatterFn ReduceScatter = nullptr;
  SendFn Send = nullptr;
  RecvFn Recv = nullptr;
  GroupFn GroupStart = nullptr;
  GroupFn GroupEnd = nullptr;

  // "2.29.7"
  std::string version_string() const;
  // "NCCL error 2 (unhandled system error): <last error text>"
  std::string describe_error(ncclResult_t r, ncclComm_t comm = nullptr) const;
};

// Opens `path` (once per process; later calls return the same library; it is
// never closed since NCCL keeps threads running). Throws bagua::Error naming
// the path when it cannot be opened or lacks a required symbol, and
// bagua::InvalidArgument for an empty path.
std::shared_ptr<const Library> load_library(const std::string& path);

// ncclGetVersion of the library at `path`: needs only that one symbol, so it
// also reports the version of libraries too old for load_library.
int query_version(const std::string& path);

// Decodes ncclGetVersion's code into "major.minor.patch".
std::string version_to_string(int code);

}  // namespace nccl
}  // namespace bagua
