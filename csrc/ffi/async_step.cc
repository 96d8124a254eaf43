#include "ffi/async_step.h"

#include <string>

#include "common/error.h"

namespace bagua {
namespace ffi {
namespace {

Span buffer_span(const xffi::AnyBuffer& buffer, const char* what, size_t i) {
  DType d;
  if (!to_engine_dtype(buffer.element_type(), &d))
    throw InvalidArgument(std::string("asynchronous model average: ") + what + " " + std::to_string(i) +
                          " has an element type the engine lacks");
  return Span{buffer.untyped_data(), buffer.element_count(), d};
}

}  // namespace

AsyncStepCall prepare_async_step(int64_t handle, const xffi::RemainingArgs& args, const xffi::RemainingRets& rets) {
  AsyncStepCall call;
  call.weights = lookup_async_weights(handle);
  const size_t n = call.weights->num_leaves();
  if (args.size() != 2 * n || rets.size() != n)
    throw InvalidArgument("asynchronous model average: " + std::to_string(args.size()) + " operands and " +
                          std::to_string(rets.size()) + " results for " + std::to_string(n) +
                          " weights (want params and updates, then the updates)");
  for (size_t i = 0; i < 2 * n; ++i) {
    auto buffer = args.get<xffi::AnyBuffer>(i);
    if (!buffer) throw InvalidArgument("asynchronous model average: operand " + std::to_string(i) + " is not a buffer");
    (i < n ? call.params : call.updates).push_back(buffer_span(*buffer, "operand", i));
  }
  for (size_t i = 0; i < n; ++i) {
    auto buffer = rets.get<xffi::AnyBuffer>(i);
    if (!buffer) throw InvalidArgument("asynchronous model average: result " + std::to_string(i) + " is not a buffer");
    call.out.push_back(buffer_span(**buffer, "result", i));
  }
  return call;  // AsyncWeights::step checks the sizes and dtypes
}

}  // namespace ffi
}  // namespace bagua
