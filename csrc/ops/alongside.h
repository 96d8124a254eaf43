// run_alongside(ctx, elements, wire, work): `work` (CPU element math over
// `elements` elements that needs nothing `wire` produces) runs on a helper
// thread while the calling thread blocks in `wire` (a collective), so computing
// and the link overlap. Both have finished when it returns; the first failure
// (wire's first) is rethrown. Off the CPU, below kAlongsideMinElements (a
// thread start would cost more than the work), on a Device (its work is
// queued on the stream), or when the helper cannot start, `work` runs (or is
// enqueued) first, in stream order. The two must not
// write memory the other touches.
#pragma once

#include <cstddef>
#include <exception>
#include <future>
#include <system_error>
#include <utility>

#include "ops/algorithm_step.h"

namespace bagua {

constexpr size_t kAlongsideMinElements = size_t{1} << 16;

template <typename Wire, typename Work>
void run_alongside(const ExecContext& ctx, size_t elements, Wire&& wire, Work&& work) {
  std::future<void> helper;
  if (ctx.device == DeviceType::kCPU && ctx.dev == nullptr && elements >= kAlongsideMinElements) {
    try {
      helper = std::async(std::launch::async, [&work] { work(); });
    } catch (const std::system_error&) {  // no thread: do it here
    }
  }
  if (!helper.valid()) {
    work();
    wire();
    return;
  }
  std::exception_ptr first;
  try {
    wire();
  } catch (...) {
    first = std::current_exception();
  }
  try {
    helper.get();
  } catch (...) {
    if (!first) first = std::current_exception();
  }
  if (first) std::rethrow_exception(first);
}

}  // namespace bagua
