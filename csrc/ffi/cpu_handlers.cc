// CPU handlers: buffers are host memory, the communicator is Gloo.
#include <cstring>

#include "ffi/collectives.h"
#include "ffi/handlers.h"

namespace bagua {
namespace ffi {
namespace {

void host_copy(void* dst, const void* src, size_t bytes, Stream) { std::memcpy(dst, src, bytes); }

const Platform kCpu{DeviceType::kCPU, nullptr, host_copy};

xffi::Error allreduce_cpu(xffi::AnyBuffer in, xffi::Token, xffi::Result<xffi::AnyBuffer> out,
                          xffi::Result<xffi::Token>, int64_t comm, int64_t op) {
  return allreduce(kCpu, comm, op, in, out);
}

xffi::Error broadcast_cpu(xffi::AnyBuffer in, xffi::Token, xffi::Result<xffi::AnyBuffer> out,
                          xffi::Result<xffi::Token>, int64_t comm, int64_t root) {
  return broadcast(kCpu, comm, root, in, out);
}

xffi::Error allgather_cpu(xffi::AnyBuffer in, xffi::Token, xffi::Result<xffi::AnyBuffer> out,
                          xffi::Result<xffi::Token>, int64_t comm) {
  return allgather(kCpu, comm, in, out);
}

}  // namespace
}  // namespace ffi
}  // namespace bagua

namespace xffi = ::xla::ffi;

XLA_FFI_DEFINE_HANDLER_SYMBOL(bagua_ffi_allreduce_cpu, bagua::ffi::allreduce_cpu,
                              xffi::Ffi::Bind()
                                  .Arg<xffi::AnyBuffer>()
                                  .Arg<xffi::Token>()
                                  .Ret<xffi::AnyBuffer>()
                                  .Ret<xffi::Token>()
                                  .Attr<int64_t>("comm")
                                  .Attr<int64_t>("op"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(bagua_ffi_broadcast_cpu, bagua::ffi::broadcast_cpu,
                              xffi::Ffi::Bind()
                                  .Arg<xffi::AnyBuffer>()
                                  .Arg<xffi::Token>()
                                  .Ret<xffi::AnyBuffer>()
                                  .Ret<xffi::Token>()
                                  .Attr<int64_t>("comm")
                                  .Attr<int64_t>("root"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(bagua_ffi_allgather_cpu, bagua::ffi::allgather_cpu,
                              xffi::Ffi::Bind()
                                  .Arg<xffi::AnyBuffer>()
                                  .Arg<xffi::Token>()
                                  .Ret<xffi::AnyBuffer>()
                                  .Ret<xffi::Token>()
                                  .Attr<int64_t>("comm"));
