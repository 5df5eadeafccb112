#include "discovery/admin_policy.h"

#include <gtest/gtest.h>

namespace vfio_dra::discovery {
namespace {

// A policy text and a part of the error it must be refused with.
struct PolicyErrorCase {
  const char* yaml;
  const char* expected;
};

template <size_t N>
void ExpectErrors(const PolicyErrorCase (&cases)[N]) {
  for (const PolicyErrorCase& c : cases) {
    auto policy = ParseAdminPolicy(c.yaml, "p.yaml");
    ASSERT_FALSE(policy.ok()) << c.yaml;
    EXPECT_NE(policy.error().message.find(c.expected), std::string::npos)
        << "yaml: " << c.yaml << "\nerror: " << policy.error().message;
  }
}

TEST(AdminPolicy, EmptyFileIsTheDefaultPolicy) {
  auto policy = ParseAdminPolicy("", "/etc/vfio-dra/policy.yaml");
  ASSERT_TRUE(policy.ok());
  EXPECT_TRUE(policy->gpu_enabled && policy->mdev_enabled && policy->vf_enabled &&
              policy->hostdev_enabled);
  EXPECT_FALSE(policy->unsafe_no_iommu);
  EXPECT_EQ(policy->source, "/etc/vfio-dra/policy.yaml");
}

TEST(AdminPolicy, ParsesSelectorsDenyAndKinds) {
  auto policy = ParseAdminPolicy(R"(version: v1
kinds:
  gpu: false
  mdev: {enabled: true}
select:
  - kind: hostdev
    vendor: "8086"
    device: ["1572", "0x1583"]
    class: "0200"
  - kind: vf
    pf: "0000:5E:00.0"
  - kind: mdev
    mdevType: nvidia-223
deny:
  - address: "0000:00:1f.6"
unsafeNoIommu: true
)",
                                 "p.yaml");
  ASSERT_TRUE(policy.ok()) << policy.error().message;
  EXPECT_FALSE(policy->gpu_enabled);
  EXPECT_TRUE(policy->unsafe_no_iommu);
  ASSERT_EQ(policy->select.size(), 3u);
  EXPECT_EQ(policy->select[0].devices, (std::set<uint32_t>{0x1572, 0x1583}));
  EXPECT_EQ(policy->select[1].pfs, (std::set<std::string>{"0000:5e:00.0"}));
  EXPECT_EQ(policy->select[2].where, "select[2]");
  ASSERT_EQ(policy->deny.size(), 1u);
  EXPECT_TRUE(policy->HasSelectorsFor(DeviceKind::kVf));
  EXPECT_FALSE(policy->HasSelectorsFor(DeviceKind::kGpu));
}

TEST(AdminPolicy, ErrorsNameTheFileLineAndKey) {
  const PolicyErrorCase cases[] = {
      {"kinds:\n  gpu: maybe\n", "p.yaml:2: kinds.gpu: must be true or false"},
      {"select:\n  - kind: hostdev\n    vendor: 10de0\n",
       "p.yaml:3: select[0].vendor: \"10de0\" "
       "is not 4 hex digits"},
      {"select:\n  - vendor: \"10de\"\n", "p.yaml:2: select[0].kind: is required"},
      {"select:\n  - kind: gpu\n    colour: red\n", "p.yaml:3: select[0].colour: unknown key"},
      {"select:\n  - kind: tpu\n    vendor: \"10de\"\n", "select[0].kind: must be one of"},
      {"select:\n  - kind: hostdev\n", "selects every device of its kind"},
      {"select:\n  - kind: gpu\n    pf: 0000:5e:00.0\n",
       "select[0].pf: only applies to kinds vf and vgpu"},
      {"select:\n  - kind: hostdev\n    address: 5e:00.0\n", "is not a PCI address"},
      {"deny:\n  - {}\n", "deny[0]: is empty and would deny everything"},
      {"version: v2\n", "p.yaml:1: version: must be v1"},
      {"unsafeNoIOMMU: true\n", "p.yaml:1: unsafeNoIOMMU: unknown key"},
      {"select: [\n", "invalid policy p.yaml:"},
      {"- a\n- b\n", "(document): must be a mapping"},
  };
  ExpectErrors(cases);
}

TEST(AdminPolicy, ParsesVgpuLayoutsAndMatchesTheFirstForAGpu) {
  auto policy = ParseAdminPolicy(R"(vgpuLayouts:
  - match: {address: "0000:41:00.0"}
    vgpuType: "1415"
    count: 2
  - match: {vendor: "10de", device: "26b9"}
    vgpuType: NVIDIA L40S-12Q
    count: max
    create: onDemand
)",
                                 "p.yaml");
  ASSERT_TRUE(policy.ok()) << policy.error().message;
  ASSERT_EQ(policy->vgpu_layouts.size(), 2u);
  const VgpuLayout& first = policy->vgpu_layouts[0];
  EXPECT_EQ(first.where, "vgpuLayouts[0]");
  EXPECT_EQ(first.count, 2);
  EXPECT_EQ(first.create, VgpuCreation::kAhead);
  EXPECT_TRUE(first.MatchesType({1415, "NVIDIA H100-40C"}));
  EXPECT_FALSE(first.MatchesType({1414, "NVIDIA H100-20C"}));
  const VgpuLayout& second = policy->vgpu_layouts[1];
  EXPECT_FALSE(second.count.has_value());
  EXPECT_EQ(second.create, VgpuCreation::kOnDemand);
  EXPECT_TRUE(second.MatchesType({1001, "NVIDIA L40S-12Q"}));

  PciFunction h100;
  h100.address = "0000:41:00.0";
  h100.vendor_id = 0x10de;
  h100.device_id = 0x2330;
  EXPECT_EQ(policy->VgpuLayoutFor(h100), &first);
  PciFunction l40s = h100;
  l40s.address = "0000:81:00.0";
  l40s.device_id = 0x26b9;
  EXPECT_EQ(policy->VgpuLayoutFor(l40s), &second);
  l40s.device_id = 0x26b5;
  EXPECT_EQ(policy->VgpuLayoutFor(l40s), nullptr);
}

TEST(AdminPolicy, VgpuLayoutErrorsNameTheEntryAndKey) {
  const PolicyErrorCase cases[] = {
      {"vgpuLayouts:\n  - vgpuType: \"1\"\n    count: 1\n", "vgpuLayouts[0].match: is required"},
      {"vgpuLayouts:\n  - match: {address: \"0000:41:00.0\"}\n    count: 1\n",
       "vgpuLayouts[0].vgpuType: is required"},
      {"vgpuLayouts:\n  - match: {address: \"0000:41:00.0\"}\n    vgpuType: \"1\"\n",
       "vgpuLayouts[0].count: is required"},
      {"vgpuLayouts:\n  - match: {address: \"0000:41:00.0\"}\n    vgpuType: \"1\"\n"
       "    count: 0\n",
       "p.yaml:4: vgpuLayouts[0].count: must be max or a whole number from 1 to 4096"},
      {"vgpuLayouts:\n  - match: {address: \"0000:41:00.0\"}\n    vgpuType: \"1\"\n"
       "    count: many\n",
       "vgpuLayouts[0].count: must be max or a whole number"},
      {"vgpuLayouts:\n  - match: {address: \"0000:41:00.0\"}\n    vgpuType: \"1\"\n"
       "    count: 1\n    create: later\n",
       "p.yaml:5: vgpuLayouts[0].create: must be ahead or onDemand"},
      {"vgpuLayouts:\n  - match: {}\n    vgpuType: \"1\"\n    count: 1\n",
       "vgpuLayouts[0].match: selects no GPU"},
      {"vgpuLayouts:\n  - match: {kind: vgpu, address: \"0000:41:00.0\"}\n    vgpuType: \"1\"\n"
       "    count: 1\n",
       "vgpuLayouts[0].match.kind: does not apply"},
      {"vgpuLayouts:\n  - match: {vgpuType: \"2\"}\n    vgpuType: \"1\"\n    count: 1\n",
       "vgpuLayouts[0].match.vgpuType: does not apply"},
      {"vgpuLayouts:\n  - match: {address: \"0000:41:00.0\"}\n    vgpuType: \"1\"\n"
       "    count: 1\n    instances: 2\n",
       "vgpuLayouts[0].instances: unknown key (known: match, vgpuType, count, create)"},
      {"vgpuLayouts: {}\n", "p.yaml:1: vgpuLayouts: must be a list"},
  };
  ExpectErrors(cases);
}

TEST(AdminPolicy, MissingFileIsAnErrorNamingIt) {
  auto policy = LoadAdminPolicy("/nonexistent/policy.yaml");
  ASSERT_FALSE(policy.ok());
  EXPECT_NE(policy.error().message.find("/nonexistent/policy.yaml"), std::string::npos);
}

}  // namespace
}  // namespace vfio_dra::discovery
