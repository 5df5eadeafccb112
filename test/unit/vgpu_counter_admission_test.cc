// The vGPU counters judged by what they admit. For one GPU, the slice builder's real output (the
// devices, what they consume and the counter sets) is taken as the scheduler takes it: every set
// of devices, each at most once, whose consumption fits every counter set is admitted. Each
// admitted set is checked against a model of the driver that is the simulated kernel's (one type
// per GPU, at most VgpuVfTypeSpec::max_instances of it, one vGPU per VF, the vGPUs that exist
// stay), and the largest admitted set must reach what the GPU holds: nothing over-allocated,
// nothing stranded.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "discovery/admin_policy.h"
#include "discovery/node_scan.h"
#include "slicepublisher/device_attributes.h"
#include "slicepublisher/slice_builder.h"
#include "slicepublisher/slice_validator.h"
#include "unit/fixture_node.h"

namespace vfio_dra::testing {
namespace {

using slicepublisher::CounterLayout;
using slicepublisher::DesiredPool;

// One published vGPU device as the scheduler sees it.
struct OfferedVgpu {
  std::string name;
  std::string vf;
  int type = 0;
  std::map<std::string, int64_t> consumes;  // counter set -> amount (one counter per set)
};

// The GPU's devices and counter sets in a pool.
struct GpuOffer {
  std::vector<OfferedVgpu> devices;
  std::map<std::string, int64_t> capacity;
};

GpuOffer OfferOf(const DesiredPool& pool, const std::string& pf) {
  GpuOffer offer;
  for (const auto& slice : pool.slices) {
    for (const auto& set : slice.shared_counters) {
      offer.capacity[set.name] = set.counters.at(slicepublisher::kCapacityCounter);
    }
    for (const auto& device : slice.devices) {
      const auto view = slicepublisher::DecodePublishedDevice(device);
      if (!view.IsVgpu() || view.parent_pci_address != pf) continue;
      OfferedVgpu vgpu{device.name, *view.pci_bus_id, static_cast<int>(*view.vgpu_type_id), {}};
      for (const auto& use : device.consumes_counters) {
        vgpu.consumes[use.counter_set] += use.counters.at(slicepublisher::kCapacityCounter);
      }
      offer.devices.push_back(vgpu);
    }
  }
  return offer;
}

// The simulated driver: the types a GPU can run and the vGPUs its VFs hold.
struct DriverModel {
  std::vector<VgpuVfTypeSpec> types;
  std::map<std::string, int> current;  // VF -> its type (0: none)

  // What is wrong with handing out `set` (empty: the driver can create it).
  std::string Check(const std::vector<const OfferedVgpu*>& set) const {
    std::map<int, int> count;
    for (const auto& [vf, type] : current) {
      if (type != 0) ++count[type];
    }
    std::set<std::string> vfs;
    for (const OfferedVgpu* device : set) {
      if (!vfs.insert(device->vf).second) return "two vGPUs on VF " + device->vf;
      const int held = current.at(device->vf);
      if (held == device->type) continue;  // it exists already
      if (held != 0) return device->name + ": VF " + device->vf + " holds another vGPU";
      ++count[device->type];
    }
    if (count.size() > 1) {
      return "two types on a GPU that runs one at a time (" + std::to_string(count.begin()->first) +
             " and " + std::to_string(count.rbegin()->first) + ")";
    }
    for (const auto& [type, n] : count) {
      for (const VgpuVfTypeSpec& spec : types) {
        if (spec.id == type && n > spec.max_instances) {
          return std::to_string(n) + " vGPUs of " + std::to_string(type) + " where the GPU holds " +
                 std::to_string(spec.max_instances);
        }
      }
    }
    return "";
  }
};

// Every admitted set, depth first; stops at the first set the driver cannot create.
struct Admission {
  std::string violation;  // the first admitted set the driver refuses, and why
  size_t largest = 0;     // the size of the largest admitted set
  size_t admitted = 0;
};

Admission Enumerate(const GpuOffer& offer, const DriverModel& driver) {
  Admission result;
  std::vector<const OfferedVgpu*> chosen;
  std::map<std::string, int64_t> used;
  auto visit = [&](auto&& self, size_t next) -> void {
    if (!result.violation.empty()) return;
    ++result.admitted;
    result.largest = std::max(result.largest, chosen.size());
    if (std::string why = driver.Check(chosen); !why.empty()) {
      std::string names;
      for (const OfferedVgpu* d : chosen) names += " " + d->name;
      result.violation = "admitted {" + names + " }: " + why;
      return;
    }
    for (size_t i = next; i < offer.devices.size(); ++i) {
      const OfferedVgpu& device = offer.devices[i];
      bool fits = true;
      for (const auto& [set, amount] : device.consumes) {
        const auto cap = offer.capacity.find(set);
        if (cap == offer.capacity.end() || used[set] + amount > cap->second) fits = false;
      }
      if (!fits) continue;
      for (const auto& [set, amount] : device.consumes) used[set] += amount;
      chosen.push_back(&device);
      self(self, i + 1);
      chosen.pop_back();
      for (const auto& [set, amount] : device.consumes) used[set] -= amount;
    }
  };
  visit(visit, 0);
  return result;
}

const std::vector<VgpuVfTypeSpec> kH100 = {
    {1414, "NVIDIA H100-20C", 4}, {1415, "NVIDIA H100-40C", 2}, {1416, "NVIDIA H100-80C", 1}};
const std::vector<VgpuVfTypeSpec> kL40s = {{1501, "NVIDIA L40S-4Q", 12},
                                           {1502, "NVIDIA L40S-8Q", 6},
                                           {1503, "NVIDIA L40S-12Q", 4},
                                           {1504, "NVIDIA L40S-24Q", 2},
                                           {1505, "NVIDIA L40S-48Q", 1}};

// Builds the GPU, scans it under `policy` and enumerates what its slices admit, in both layouts
// that carry counters; the two must agree.
Admission Admit(const std::vector<VgpuVfTypeSpec>& types, int vfs,
                const std::map<int, int>& current, const std::string& policy_yaml,
                std::string* state = nullptr, const discovery::VgpuGpuSizes& remembered = {}) {
  FixtureNode node("");
  BuildVgpuVfGpu(node.sysfs_root(), types, vfs, current);
  sysfs::SysfsReader sysfs(node.sysfs_root());
  auto policy = discovery::ParseAdminPolicy(policy_yaml, "policy.yaml");
  EXPECT_TRUE(policy.ok()) << policy.error().message;
  discovery::ScanContext context;
  context.vgpu_sizes = remembered;
  auto scan = discovery::ScanNode(sysfs, nullptr, *policy, context);
  DriverModel driver{types, {}};
  for (const auto& [address, fn] : scan->inventory.functions) {
    if (fn.vgpu_vf) driver.current[address] = fn.vgpu_vf->current_type;
  }
  EXPECT_EQ(driver.current.size(), static_cast<size_t>(vfs));
  if (state != nullptr && !scan->selection.vgpu_gpus.empty()) {
    *state = scan->selection.vgpu_gpus.front().state;
  }
  Admission first;
  for (CounterLayout layout : {CounterLayout::kOwnSlice, CounterLayout::kInDeviceSlice}) {
    slicepublisher::MdevTypeMaxima maxima;
    DesiredPool pool = slicepublisher::BuildDesiredPool(*scan, {"node-1", layout}, maxima);
    const int minor = layout == CounterLayout::kOwnSlice ? 35 : 34;
    Status valid = slicepublisher::ValidatePool(pool, {minor, "vfio.dra.io", "node-1", layout});
    EXPECT_TRUE(valid.ok()) << valid.error().message;
    Admission admission = Enumerate(OfferOf(pool, "0000:41:00.0"), driver);
    if (layout == CounterLayout::kOwnSlice) {
      first = admission;
    } else {
      EXPECT_EQ(admission.largest, first.largest);
      EXPECT_EQ(admission.admitted, first.admitted);
    }
  }
  return first;
}

std::string Pin(const std::string& type) {
  return "select:\n  - {kind: vgpu, pf: \"0000:41:00.0\", vgpuType: \"" + type + "\"}\n";
}

std::string OnDemand(const std::string& type, const std::string& count) {
  return "vgpuLayouts:\n  - match: {address: \"0000:41:00.0\"}\n    vgpuType: \"" + type +
         "\"\n    count: " + count + "\n    create: onDemand\n";
}

TEST(VgpuCounterAdmission, AnIdlePinnedGpuAdmitsExactlyTheCountOfItsType) {
  for (const auto& [type, holds] : std::vector<std::pair<std::string, size_t>>{
           {"1414", 4}, {"1415", 2}, {"NVIDIA H100-80C", 1}}) {
    const Admission a = Admit(kH100, 4, {}, Pin(type));
    EXPECT_EQ(a.violation, "") << type;
    EXPECT_EQ(a.largest, holds) << type;
  }
}

TEST(VgpuCounterAdmission, AnIdleOnDemandLayoutAdmitsItsCount) {
  const Admission a = Admit(kH100, 4, {}, OnDemand("1414", "3"));
  EXPECT_EQ(a.violation, "");
  EXPECT_EQ(a.largest, 3u);
  const Admission as_many = Admit(kH100, 4, {}, OnDemand("1415", "max"));
  EXPECT_EQ(as_many.violation, "");
  EXPECT_EQ(as_many.largest, 2u);
}

// The vGPUs that exist consume from the GPU's counter set like the offered ones.
TEST(VgpuCounterAdmission, ARunningTypeWithADeclaredCountAdmitsTheRest) {
  const Admission a = Admit(kH100, 4, {{0, 1415}}, OnDemand("1415", "2"));
  EXPECT_EQ(a.violation, "");
  EXPECT_EQ(a.largest, 2u);  // the existing one and one more
  // Without a count, the largest type is not listed while one runs: nothing new, and why.
  std::string state;
  const Admission unbounded = Admit(kH100, 4, {{0, 1415}}, "", &state);
  EXPECT_EQ(unbounded.violation, "");
  EXPECT_EQ(unbounded.largest, 1u);  // the existing vGPU, as it is
  EXPECT_THAT(state, ::testing::HasSubstr("nothing bounds how many the GPU holds"));
  EXPECT_THAT(state, ::testing::HasSubstr("count: N, create: onDemand"));
}

// With no layout, the type that runs is offered, bounded by its frame buffer against the whole
// GPU's as an earlier idle scan saw it.
TEST(VgpuCounterAdmission, ARunningTypeIsBoundedByTheRememberedFrameBuffer) {
  const discovery::VgpuGpuSizes h100 = {{"0000:41:00.0", {"10de:26b9", 80, "NVIDIA H100-80C", {}}}};
  const Admission a = Admit(kH100, 4, {{0, 1415}}, "", nullptr, h100);
  EXPECT_EQ(a.violation, "");
  EXPECT_EQ(a.largest, 2u);
  const discovery::VgpuGpuSizes l40s = {{"0000:41:00.0", {"10de:26b9", 48, "NVIDIA L40S-48Q", {}}}};
  const Admission partly = Admit(kL40s, 16, {{1, 1503}, {9, 1503}}, "", nullptr, l40s);
  EXPECT_EQ(partly.violation, "");
  EXPECT_EQ(partly.largest, 4u);
  // A size remembered for another model is not used.
  const discovery::VgpuGpuSizes other = {
      {"0000:41:00.0", {"10de:2331", 80, "NVIDIA H100-80C", {}}}};
  EXPECT_EQ(Admit(kH100, 4, {{0, 1415}}, "", nullptr, other).largest, 1u);
}

TEST(VgpuCounterAdmission, APartlyUsedL40sAdmitsWhatIsLeftOfItsCount) {
  const Admission a = Admit(kL40s, 16, {{0, 1502}, {3, 1502}, {7, 1502}}, OnDemand("1502", "6"));
  EXPECT_EQ(a.violation, "");
  EXPECT_EQ(a.largest, 6u);
}

TEST(VgpuCounterAdmission, AnIdleL40sWithSixteenVfsAdmitsEachTypesCount) {
  for (const VgpuVfTypeSpec& type : kL40s) {
    const Admission a = Admit(kL40s, 16, {}, Pin(std::to_string(type.id)));
    EXPECT_EQ(a.violation, "") << type.name;
    EXPECT_EQ(a.largest, static_cast<size_t>(type.max_instances)) << type.name;
  }
}

// The case the per-VF counters got wrong: an idle GPU with several types and nothing chosen.
TEST(VgpuCounterAdmission, AnIdleUnpinnedGpuAdmitsNothingAndSaysWhy) {
  for (int vfs : {4, 16}) {
    std::string state;
    const Admission a = Admit(vfs == 4 ? kH100 : kL40s, vfs, {}, "", &state);
    EXPECT_EQ(a.violation, "") << vfs;
    EXPECT_EQ(a.largest, 0u) << vfs;
    EXPECT_THAT(state, ::testing::HasSubstr("several types"));
    EXPECT_THAT(state, ::testing::HasSubstr("vgpuLayouts: [{match: {address: \"0000:41:00.0\"}"));
    EXPECT_THAT(state, ::testing::HasSubstr("select: [{kind: vgpu, pf: \"0000:41:00.0\""));
  }
}

// A layout created ahead publishes only what exists: each vGPU once, nothing more.
TEST(VgpuCounterAdmission, ALayoutCreatedAheadAdmitsOnlyTheVgpusThatExist) {
  const std::string ahead =
      "vgpuLayouts:\n  - {match: {address: \"0000:41:00.0\"}, vgpuType: \"1414\", count: max}\n";
  EXPECT_EQ(Admit(kH100, 4, {}, ahead).largest, 0u);
  const Admission a = Admit(kH100, 4, {{0, 1414}, {2, 1414}}, ahead);
  EXPECT_EQ(a.violation, "");
  EXPECT_EQ(a.largest, 2u);
  std::string state;
  const Admission other = Admit(kH100, 4, {{1, 1415}}, ahead, &state);
  EXPECT_EQ(other.largest, 1u);
  EXPECT_THAT(state, ::testing::HasSubstr("the layout cannot apply"));
}

}  // namespace
}  // namespace vfio_dra::testing
