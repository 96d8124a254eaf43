// The XLA FFI adapter of the algorithm steps (ops/registry.h), shared by every
// platform: the same step code the engine runs on torch buckets, run on XLA
// buffers inside a jitted JAX program.
//
// Operands: data (the bucket: gradients or weights) and the step number (an
// int32 or int64 scalar); result: the data after the step (in-place steps; the
// lowering aliases it to the operand) or the step's result (weight steps: the
// peer average; the weights themselves when the step does not communicate).
// Attributes: "step" (the registry name), "params" ("key=value;..."), "comm",
// "intra", "inter" (communicator handles; -1 when absent).
#pragma once

#include <cstdint>
#include <string_view>

#include "ffi/collectives.h"

namespace bagua {
namespace ffi {

xffi::Error run_step(const Platform& p, std::string_view name, std::string_view params, int64_t comm,
                     int64_t intra, int64_t inter, xffi::AnyBuffer data, xffi::AnyBuffer step,
                     xffi::Result<xffi::AnyBuffer> out);

}  // namespace ffi
}  // namespace bagua
