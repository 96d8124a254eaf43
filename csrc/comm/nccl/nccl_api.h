// The part of NCCL's C ABI that Bagua uses, declared here because NCCL is
// loaded at run time (dlopen) and its header is not installed at build time.
// Values and layouts follow NCCL's public nccl.h (stable since 2.14, the first
// release with ncclCommInitRankConfig and non-blocking communicators).
#pragma once

#include <climits>
#include <cstddef>

#include <cuda_runtime_api.h>

namespace bagua {
namespace nccl {

using ncclComm_t = struct ncclComm*;

constexpr size_t kUniqueIdBytes = 128;
struct ncclUniqueId {
  char internal[kUniqueIdBytes];
};

enum ncclResult_t : int {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
};

enum ncclRedOp_t : int {
  ncclSum = 0,
  ncclProd = 1,
  ncclMax = 2,
  ncclMin = 3,
  ncclAvg = 4,  // NCCL >= 2.10
};

enum ncclDataType_t : int {
  ncclInt8 = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclFloat32 = 7,
  ncclFloat64 = 8,
  ncclBfloat16 = 9,
};

// NCCL_VERSION(X,Y,Z) of nccl.h: the encoding changed at 2.9.
constexpr int version_code(int major, int minor, int patch) {
  return (major <= 2 && minor <= 8) ? major * 1000 + minor * 100 + patch : major * 10000 + minor * 100 + patch;
}

// ncclConfig_t in its 2.28 layout. NCCL reads min(size, its own size) bytes
// and ignores fields newer than `version`, so older libraries accept it too.
struct ncclConfig_t {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
  int cgaClusterSize;
  int minCTAs;
  int maxCTAs;
  const char* netName;
  int splitShare;
  int trafficClass;
  const char* commName;
  int collnetEnable;
  int CTAPolicy;
  int shrinkShare;
  int nvlsCTAs;
  int nChannelsPerNetPeer;
  int nvlinkCentricSched;
  int graphUsageMode;
  int numRmaCtx;
};

// NCCL_CONFIG_INITIALIZER: every attribute "undefined" (NCCL's default).
inline ncclConfig_t default_config() {
  constexpr int kUndef = INT_MIN;
  ncclConfig_t c;
  c.size = sizeof(ncclConfig_t);
  c.magic = 0xcafebeef;
  c.version = static_cast<unsigned int>(version_code(2, 28, 0));
  c.blocking = kUndef;
  c.cgaClusterSize = kUndef;
  c.minCTAs = kUndef;
  c.maxCTAs = kUndef;
  c.netName = nullptr;
  c.splitShare = kUndef;
  c.trafficClass = kUndef;
  c.commName = nullptr;
  c.collnetEnable = kUndef;
  c.CTAPolicy = kUndef;
  c.shrinkShare = kUndef;
  c.nvlsCTAs = kUndef;
  c.nChannelsPerNetPeer = kUndef;
  c.nvlinkCentricSched = kUndef;
  c.graphUsageMode = kUndef;
  c.numRmaCtx = kUndef;
  return c;
}

// Signatures of the functions Bagua resolves with dlsym.
using GetVersionFn = ncclResult_t (*)(int*);
using GetUniqueIdFn = ncclResult_t (*)(ncclUniqueId*);
using CommInitRankConfigFn = ncclResult_t (*)(ncclComm_t*, int, ncclUniqueId, int, ncclConfig_t*);
using CommFn = ncclResult_t (*)(ncclComm_t);
using CommGetAsyncErrorFn = ncclResult_t (*)(ncclComm_t, ncclResult_t*);
using GetErrorStringFn = const char* (*)(ncclResult_t);
using GetLastErrorFn = const char* (*)(ncclComm_t);
using AllReduceFn = ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t);
using ReduceFn = ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, int, ncclComm_t,
                                  cudaStream_t);
using BroadcastFn = ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
using AllGatherFn = ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
using ReduceScatterFn = ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                                         cudaStream_t);
using SendFn = ncclResult_t (*)(const void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
using RecvFn = ncclResult_t (*)(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
using GroupFn = ncclResult_t (*)();

}  // namespace nccl
}  // namespace bagua
