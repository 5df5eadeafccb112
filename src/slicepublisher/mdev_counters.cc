#include "slicepublisher/mdev_counters.h"

#include <algorithm>
#include <numeric>

namespace vfio_dra::slicepublisher {
namespace {

// Counter values stay far below what a resource.Quantity holds exactly.
constexpr int64_t kLargestCounter = int64_t{1} << 40;

// lcm of the positive values, or 0 when it would exceed kLargestCounter.
int64_t BoundedLcm(const std::map<std::string, int>& values) {
  int64_t lcm = 1;
  for (const auto& [key, value] : values) {
    if (value <= 0) continue;
    const int64_t step = value / std::gcd(lcm, int64_t{value});
    if (lcm > kLargestCounter / step) return 0;
    lcm *= step;
  }
  return lcm;
}

// True when every type the kernel can still create can be allocated as often as the kernel
// allows within `plan`'s capacity.
bool HoldsWhatTheKernelOffers(const MdevCounterPlan& plan) {
  for (const auto& [id, type] : plan.types) {
    if (type.offerable > 0 && type.consumes * type.offerable > plan.capacity) return false;
  }
  return true;
}

}  // namespace

MdevCounterPlan PlanMdevCounters(const discovery::MdevParent& parent,
                                 const MdevTypeMaxima& maxima) {
  std::map<std::string, int> max;
  std::map<std::string, int> available;
  for (const discovery::MdevType& type : parent.types) {
    max[type.id] = maxima.Max(parent.name, type.id).value;
    available[type.id] = type.available_instances;
  }
  MdevCounterPlan plan;
  const int64_t lcm = BoundedLcm(max);
  if (lcm == 0) {
    plan.problem = "the instance counts of its types have no common multiple below 2^40";
    plan.capacity = 0;
    plan.whole_consumes = 1;
    for (const auto& [id, value] : max) plan.types[id] = {value, 0, 0};
    return plan;
  }
  int64_t used = 0;
  for (const discovery::MdevInstance& instance : parent.instances) {
    auto it = max.find(instance.type_id);
    // An instance of a type the parent no longer lists: assume it takes the whole parent.
    used += (it == max.end() || it->second <= 0) ? lcm : lcm / it->second;
  }
  plan.capacity = std::max<int64_t>(0, lcm - used);
  plan.whole_consumes = lcm;
  for (const auto& [id, value] : max) {
    plan.types[id] = {value, std::min(available[id], value), value > 0 ? lcm / value : 0};
  }
  if (parent.instances.empty() || HoldsWhatTheKernelOffers(plan)) return plan;

  // The maxima are lower bounds that contradict the kernel (learned only after instances
  // existed): count in what the kernel says can still be created instead.
  const int64_t c = BoundedLcm(available);
  plan.availability_model = true;
  if (c == 0) {
    plan.problem = "the available instance counts of its types have no common multiple below 2^40";
    plan.capacity = 0;
    plan.whole_consumes = 1;
    for (auto& [id, type] : plan.types) type.offerable = 0;
    return plan;
  }
  plan.capacity = c;
  plan.whole_consumes = c + 1;  // instances exist: the whole device must not fit
  for (auto& [id, type] : plan.types) {
    type.offerable = std::min(available[id], type.names);
    type.consumes = available[id] > 0 ? c / available[id] : 0;
  }
  return plan;
}

}  // namespace vfio_dra::slicepublisher
