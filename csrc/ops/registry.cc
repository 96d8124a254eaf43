#include "ops/registry.h"

#include <functional>
#include <map>
#include <memory>
#include <type_traits>

#include "common/error.h"
#include "ops/async_model_average.h"
#include "ops/bytegrad.h"
#include "ops/centralized_allreduce.h"
#include "ops/decentralized.h"
#include "ops/halfgrad.h"
#include "ops/local_steps.h"
#include "ops/low_precision_decentralized.h"
#include "ops/low_rank.h"
#include "ops/qadam.h"

namespace bagua {
namespace {

using Factory = std::function<StepPtr(const CommSet&, const StepParams&, const BucketLayout&)>;

// Steps constructible with a layout get it; the others are made without.
template <typename T>
Factory factory() {
  return [](const CommSet& comms, const StepParams& params, const BucketLayout& layout) -> StepPtr {
    if constexpr (std::is_constructible_v<T, const CommSet&, const StepParams&, const BucketLayout&>)
      return std::make_shared<const T>(comms, params, layout);
    else
      return std::make_shared<const T>(comms, params);
  };
}

const std::map<std::string, Factory>& table() {
  static const std::map<std::string, Factory> steps = {
      {"async_model_average", factory<AsyncModelAverageStep>()},
      {"centralized_allreduce", factory<CentralizedAllreduceStep>()},
      {"bytegrad", factory<ByteGradStep>()},
      {"decentralized", factory<DecentralizedStep>()},
      {"halfgrad", factory<HalfGradStep>()},
      {"local_steps", factory<LocalStepsStep>()},
      {"low_precision_decentralized", factory<LowPrecisionDecentralizedStep>()},
      {"low_rank", factory<LowRankStep>()},
      {"qadam", factory<QAdamStep>()},
  };
  return steps;
}

}  // namespace

StepPtr make_step(const std::string& name, const CommSet& comms, const StepParams& params, const BucketLayout& layout) {
  auto it = table().find(name);
  if (it == table().end()) {
    std::string known;
    for (const auto& n : step_names()) known += (known.empty() ? "" : ", ") + n;
    throw InvalidArgument("unknown step '" + name + "' (known: " + known + ")");
  }
  return it->second(comms, params, layout);
}

std::vector<std::string> step_names() {
  std::vector<std::string> out;
  for (const auto& [name, f] : table()) out.push_back(name);
  return out;
}

}  // namespace bagua
