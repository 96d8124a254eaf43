// The one registry of algorithm steps: name -> factory. Both adapters (the
// engine's bucket ops and the XLA FFI step handler) make steps only through
// it, and both frontends' algorithm descriptions name their steps here.
#pragma once

#include <string>
#include <vector>

#include "ops/algorithm_step.h"

namespace bagua {

// Makes the step called `name` over `comms` with `params`, for a bucket laid
// out as `layout` (ops/algorithm_step.h; empty when unknown: describing a step, or a
// step that needs none). Throws InvalidArgument for an unknown name or bad
// parameters.
StepPtr make_step(const std::string& name, const CommSet& comms, const StepParams& params,
                  const BucketLayout& layout = {});

// Registered names, sorted.
std::vector<std::string> step_names();

}  // namespace bagua
