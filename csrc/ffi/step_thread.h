// One thread per process that runs the algorithm steps of jitted JAX programs
// in the order XLA issues them, so a CPU step handler can return at once with
// an ffi::Future and XLA computes what does not depend on the step (the rest
// of backward) while the step communicates. The ordered effect's token still
// chains the steps: the next one is issued only once this one completed.
#pragma once

#include <functional>

namespace bagua {
namespace ffi {

// Queues `work` on the step thread (started on first use, joined at exit).
void run_on_step_thread(std::function<void()> work);

}  // namespace ffi
}  // namespace bagua
