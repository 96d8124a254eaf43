#include "comm/nccl/nccl_library.h"

#include <dlfcn.h>

#include <map>
#include <mutex>
#include <sstream>

#include "common/error.h"

namespace bagua {
namespace nccl {
namespace {

void* open_library(const std::string& path) {
  if (path.empty()) {
    throw InvalidArgument("NCCL library path is empty (pass the full path of libnccl.so.2)");
  }
  // RTLD_LOCAL: NCCL's symbols stay private to us; if the same file is already
  // loaded (by torch, say) the loader returns that copy rather than a second one.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    throw Error("cannot load the NCCL library '" + path + "': " + (why ? why : "unknown error") +
                " (set BAGUA_NCCL_LIBRARY to the full path of libnccl.so.2, or pip install "
                "the 'gpu' extra)");
  }
  return handle;
}

template <typename Fn>
void resolve(void* handle, const std::string& path, const char* name, Fn* out, int version) {
  dlerror();
  void* sym = dlsym(handle, name);
  if (sym == nullptr) {
    std::ostringstream msg;
    msg << "the NCCL library '" << path << "' has no symbol '" << name << "'";
    if (version > 0) {
      msg << " (it is NCCL " << version_to_string(version) << "; Bagua needs NCCL >= " << version_to_string(kMinVersion)
          << ")";
    } else {
      msg << " (is it libnccl.so.2?)";
    }
    throw Error(msg.str());
  }
  *out = reinterpret_cast<Fn>(sym);
}

int call_get_version(GetVersionFn fn, const std::string& path) {
  int version = 0;
  ncclResult_t r = fn(&version);
  if (r != ncclSuccess) {
    throw Error("ncclGetVersion failed in '" + path + "' with code " + std::to_string(r));
  }
  return version;
}

}  // namespace

std::string version_to_string(int code) {
  int major, minor, patch;
  if (code >= 10000) {  // 2.9 and later: X*10000 + Y*100 + Z
    major = code / 10000;
    minor = (code / 100) % 100;
  } else {  // up to 2.8: X*1000 + Y*100 + Z
    major = code / 1000;
    minor = (code / 100) % 10;
  }
  patch = code % 100;
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}

std::string Library::version_string() const { return version_to_string(version); }

std::string Library::describe_error(ncclResult_t r, ncclComm_t comm) const {
  std::ostringstream msg;
  msg << "NCCL error " << static_cast<int>(r);
  const char* name = GetErrorString ? GetErrorString(r) : nullptr;
  if (name != nullptr) msg << " (" << name << ")";
  const char* last = GetLastError ? GetLastError(comm) : nullptr;
  if (last != nullptr && last[0] != '\0') msg << ": " << last;
  return msg.str();
}

int query_version(const std::string& path) {
  void* handle = open_library(path);
  GetVersionFn fn = nullptr;
  resolve(handle, path, "ncclGetVersion", &fn, 0);
  return call_get_version(fn, path);
}

std::shared_ptr<const Library> load_library(const std::string& path) {
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<const Library>> loaded;
  std::lock_guard<std::mutex> lock(mu);
  auto it = loaded.find(path);
  if (it != loaded.end()) return it->second;

  void* handle = open_library(path);
  auto lib = std::make_shared<Library>();
  lib->path = path;
  resolve(handle, path, "ncclGetVersion", &lib->GetVersion, 0);
  lib->version = call_get_version(lib->GetVersion, path);
  const int v = lib->version;
  resolve(handle, path, "ncclGetUniqueId", &lib->GetUniqueId, v);
  resolve(handle, path, "ncclCommInitRankConfig", &lib->CommInitRankConfig, v);
  resolve(handle, path, "ncclCommFinalize", &lib->CommFinalize, v);
  resolve(handle, path, "ncclCommDestroy", &lib->CommDestroy, v);
  resolve(handle, path, "ncclCommAbort", &lib->CommAbort, v);
  resolve(handle, path, "ncclCommGetAsyncError", &lib->CommGetAsyncError, v);
  resolve(handle, path, "ncclGetErrorString", &lib->GetErrorString, v);
  resolve(handle, path, "ncclGetLastError", &lib->GetLastError, v);
  resolve(handle, path, "ncclAllReduce", &lib->AllReduce, v);
  resolve(handle, path, "ncclReduce", &lib->Reduce, v);
  resolve(handle, path, "ncclBroadcast", &lib->Broadcast, v);
  resolve(handle, path, "ncclAllGather", &lib->AllGather, v);
  resolve(handle, path, "ncclReduceScatter", &lib->ReduceScatter, v);
  resolve(handle, path, "ncclSend", &lib->Send, v);
  resolve(handle, path, "ncclRecv", &lib->Recv, v);
  resolve(handle, path, "ncclGroupStart", &lib->GroupStart, v);
  resolve(handle, path, "ncclGroupEnd", &lib->GroupEnd, v);
  if (v < kMinVersion) {
    throw Error("the NCCL library '" + path + "' is NCCL " + version_to_string(v) +
                "; Bagua needs NCCL >= " + version_to_string(kMinVersion));
  }
  if (v / 10000 != kConfigLayoutMajor) {
    throw Error("the NCCL library '" + path + "' is NCCL " + version_to_string(v) + "; Bagua passes NCCL " +
                std::to_string(kConfigLayoutMajor) +
                "'s ncclConfig_t layout (2.14 to 2.28 fields) and cannot use another major version");
  }
  loaded.emplace(path, lib);
  return lib;
}

}  // namespace nccl
}  // namespace bagua
