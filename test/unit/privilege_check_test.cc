// The privilege check (vfio/privilege_check.h) against fixture nodes and the SimulatedKernel: each
// missing privilege of an enabled feature gives its one line, and nothing missing gives none.
#include "vfio/privilege_check.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <memory>

#include "discovery/admin_policy.h"
#include "discovery/node_scan.h"
#include "simulated_kernel.h"
#include "unit/fixture_node.h"

namespace vfio_dra::testing {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::IsEmpty;
using vfio::PrivilegedFeature;

// Capability sets as CapEff shows them: every capability of a 6.x kernel, and that set without
// one of those the features need.
constexpr const char* kAllCaps = "000001ffffffffff";
constexpr const char* kNoNetAdmin = "000001ffffffefff";   // CAP_NET_ADMIN is bit 12
constexpr const char* kNoSysPtrace = "000001fffff7ffff";  // CAP_SYS_PTRACE is bit 19
constexpr const char* kNoSysAdmin = "000001ffffdfffff";   // CAP_SYS_ADMIN is bit 21

class PrivilegeCheckTest : public ::testing::Test {
 protected:
  void Use(const std::string& fixture) {
    node_ = std::make_unique<FixtureNode>(fixture);
    sysfs_ = std::make_unique<sysfs::SysfsReader>(node_->sysfs_root());
    kernel_ = std::make_unique<SimulatedKernel>(node_->sysfs_root(), node_->dir() + "/dev");
    options_.dev_root = node_->dir() + "/dev";
    options_.process_status = node_->dir() + "/status";
    Caps(kAllCaps);
  }
  void Caps(const std::string& hex) {
    std::ofstream(options_.process_status)
        << "Name:\tvfio-dra-plugin\nCapInh:\t0000000000000000\nCapPrm:\t" << hex << "\nCapEff:\t"
        << hex << "\nCapBnd:\t" << hex << "\n";
  }
  vfio::PrivilegeNeeds Needs() const {
    auto scan = discovery::ScanNode(*sysfs_, nullptr, discovery::AdminPolicy{});
    return vfio::PrivilegeNeedsOf(scan->inventory, scan->selection);
  }
  std::vector<std::string> Lines() {
    std::vector<std::string> lines;
    for (const vfio::MissingPrivilege& m :
         vfio::CheckPrivileges(Needs(), *sysfs_, *kernel_, options_)) {
      lines.push_back(m.Line());
    }
    return lines;
  }
  std::string Sys(const std::string& relative) const {
    return node_->sysfs_root() + "/" + relative;
  }

  std::unique_ptr<FixtureNode> node_;
  std::unique_ptr<sysfs::SysfsReader> sysfs_;
  std::unique_ptr<SimulatedKernel> kernel_;
  vfio::PrivilegeCheckOptions options_;
};

constexpr const char* kSysfsGrant =
    "; mount the host's /sys read-write and load the AppArmor profile "
    "deploy/apparmor/vfio-dra-plugin (or run Unconfined)";

TEST_F(PrivilegeCheckTest, NothingMissingGivesNoLine) {
  Use("vm-host");
  const vfio::PrivilegeNeeds needs = Needs();
  // Every feature of this node is enabled, so every check ran.
  for (PrivilegedFeature feature : {PrivilegedFeature::kPciPassthrough, PrivilegedFeature::kMdev,
                                    PrivilegedFeature::kDeviceNodes, PrivilegedFeature::kVfNetwork,
                                    PrivilegedFeature::kHolderNaming}) {
    EXPECT_EQ(needs.features.count(feature), 1u) << vfio::PrivilegedFeatureName(feature);
  }
  EXPECT_THAT(Lines(), IsEmpty());
  EXPECT_TRUE(kernel_->Writes().empty());  // the probes wrote nothing
}

TEST_F(PrivilegeCheckTest, AReadOnlySysfsMountNamesTheFirstAttributeEachFeatureWrites) {
  Use("vm-host");
  kernel_->DenyWrites("", EROFS);
  const vfio::PrivilegeNeeds needs = Needs();
  const std::string override = needs.features.at(PrivilegedFeature::kPciPassthrough).front();
  const std::string create = needs.features.at(PrivilegedFeature::kMdev).front();
  EXPECT_THAT(override, ::testing::EndsWith("/driver_override"));
  EXPECT_THAT(create, ::testing::EndsWith("/create"));
  EXPECT_THAT(
      Lines(),
      ElementsAre("privilege missing: write access to " + Sys(override) +
                      " for PCI passthrough (binding devices to their VFIO driver): opening it "
                      "for writing failed: Read-only file system (errno 30)" +
                      kSysfsGrant,
                  "privilege missing: write access to " + Sys(create) +
                      " for mediated devices (mdev create and remove): opening it for writing "
                      "failed: Read-only file system (errno 30)" +
                      kSysfsGrant));
  EXPECT_TRUE(kernel_->Writes().empty());
}

// An AppArmor profile that allows driver_override but denies the VFIO driver's bind.
TEST_F(PrivilegeCheckTest, AnAppArmorDenialOfOneAttributeIsNamed) {
  Use("workstation");
  kernel_->DenyWrites("bus/pci/drivers/vfio-pci/bind", EACCES);
  EXPECT_THAT(
      Lines(),
      ElementsAre("privilege missing: write access to " + Sys("bus/pci/drivers/vfio-pci/bind") +
                  " for PCI passthrough (binding devices to their VFIO driver): opening "
                  "it for writing failed: Permission denied (errno 13)" +
                  kSysfsGrant));
}

TEST_F(PrivilegeCheckTest, AVgpuVfTypeThatCannotBeWrittenIsNamed) {
  Use("vgpu-vf");
  kernel_->DenyWrites("bus/pci/devices", EACCES);
  const std::vector<std::string> lines = Lines();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_THAT(lines[0], ::testing::HasSubstr("/nvidia/current_vgpu_type for NVIDIA vGPUs on "
                                             "SR-IOV VFs (nvidia/current_vgpu_type): opening it "
                                             "for writing failed: Permission denied"));
}

TEST_F(PrivilegeCheckTest, VfNetworkSettingsWithoutNetAdminAskForItAlone) {
  Use("sriov");
  Caps(kNoNetAdmin);
  EXPECT_THAT(Lines(), ElementsAre("privilege missing: CAP_NET_ADMIN for VF network settings "
                                   "(MAC, VLAN, trust): the capability is not in the plugin's "
                                   "effective set (CapEff 000001ffffffefff); grant it with the "
                                   "Helm value sriovNetwork.enabled=true (hostNetwork and "
                                   "NET_ADMIN)"));
  // Settings kept in the simulated kernel's files need no capability.
  options_.vf_network_in_kernel = false;
  EXPECT_THAT(Lines(), IsEmpty());
}

TEST_F(PrivilegeCheckTest, NoNetworkVfNoNetAdminLine) {
  Use("workstation");
  Caps(kNoNetAdmin);
  EXPECT_THAT(Lines(), IsEmpty());
}

TEST_F(PrivilegeCheckTest, HostNetnsWithoutSysAdminAsksForItOrForHostNetwork) {
  Use("sriov");
  Caps(kNoSysAdmin);
  EXPECT_THAT(Lines(), IsEmpty());  // without --host-netns setns is never called
  options_.host_netns = node_->dir() + "/netns";
  std::ofstream(options_.host_netns) << "";
  EXPECT_THAT(Lines(),
              ElementsAre("privilege missing: CAP_SYS_ADMIN for VF network settings (MAC, VLAN, "
                          "trust): the capability is not in the plugin's effective set (CapEff "
                          "000001ffffdfffff); setns(2) into --host-netns " +
                          options_.host_netns +
                          " needs it; drop --host-netns and set the Helm value "
                          "sriovNetwork.enabled=true (hostNetwork and NET_ADMIN), or grant the "
                          "capability with --host-netns kept"));
}

TEST_F(PrivilegeCheckTest, AHostNetnsThatCannotBeOpenedIsNamed) {
  Use("sriov");
  options_.host_netns = node_->dir() + "/no-such-netns";
  const std::vector<std::string> lines = Lines();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_THAT(lines[0],
              ::testing::StartsWith("privilege missing: access to the network namespace " +
                                    options_.host_netns +
                                    " for VF network settings (MAC, VLAN, trust): "
                                    "opening it failed: No such file or directory"));
}

TEST_F(PrivilegeCheckTest, WithoutSysPtraceHoldersMayGoUnnamedAndPid1sNetnsCannotBeOpened) {
  Use("sriov");
  Caps(kNoSysPtrace);
  const std::string holders =
      "privilege missing: CAP_SYS_PTRACE for naming the processes that hold a busy device: the "
      "capability is not in the plugin's effective set (CapEff 000001fffff7ffff); /proc/<pid>/fd "
      "of other users' processes (KubeVirt's VMM runs as uid 107) cannot be read, so a busy "
      "device's holders may go unnamed; grant it with the Helm value deviceHolders.enabled=true "
      "(hostPID and SYS_PTRACE)";
  EXPECT_THAT(Lines(), ElementsAre(holders));
  options_.host_netns = "/proc/1/ns/net";
  EXPECT_THAT(Lines(),
              ElementsAre("privilege missing: CAP_SYS_PTRACE for VF network settings (MAC, VLAN, "
                          "trust): the capability is not in the plugin's effective set (CapEff "
                          "000001fffff7ffff); opening --host-netns /proc/1/ns/net (another "
                          "process's namespace) needs it; drop --host-netns and set the Helm "
                          "value sriovNetwork.enabled=true (hostNetwork and NET_ADMIN), or grant "
                          "the capability with --host-netns kept",
                          holders));
  EXPECT_THAT(vfio::HolderNamingGap(options_.process_status),
              ::testing::Optional(::testing::HasSubstr("holders may be unnamed")));
  Caps(kAllCaps);
  EXPECT_EQ(vfio::HolderNamingGap(options_.process_status), std::nullopt);
}

TEST_F(PrivilegeCheckTest, ADevRootWithoutVfioNodesIsNamed) {
  Use("workstation");
  options_.dev_root = node_->dir() + "/container-dev";
  fs::create_directories(options_.dev_root);
  EXPECT_THAT(Lines(), ElementsAre("privilege missing: access to " + options_.dev_root +
                                   "/vfio for handing VFIO device nodes to VMs: stat of it "
                                   "failed: No such file or directory (errno 2); mount the "
                                   "host's /dev at --dev-root and load the AppArmor profile "
                                   "deploy/apparmor/vfio-dra-plugin (or run Unconfined)"));
}

// Nothing published: no feature, so nothing is needed, whatever the process lacks.
TEST_F(PrivilegeCheckTest, ANodeWithNothingToPublishNeedsNothing) {
  Use("iommu-off");  // without IOMMU groups nothing is managed under the default policy
  Caps("0000000000000000");
  kernel_->DenyWrites("", EROFS);
  EXPECT_TRUE(Needs().features.empty());
  EXPECT_THAT(Lines(), IsEmpty());
}

TEST(EffectiveCapabilities, AreReadFromCapEffAndAMissingLineIsAnError) {
  FixtureNode node("");
  const std::string path = node.dir() + "/status";
  std::ofstream(path) << "Name:\tx\nCapEff:\t0000000000001000\n";
  auto caps = vfio::ReadEffectiveCapabilities(path);
  ASSERT_TRUE(caps.ok()) << caps.error().message;
  EXPECT_EQ(*caps, 0x1000u);
  std::ofstream(path) << "Name:\tx\n";
  EXPECT_THAT(vfio::ReadEffectiveCapabilities(path).error().message,
              ::testing::HasSubstr("has no readable CapEff line"));
}

}  // namespace
}  // namespace vfio_dra::testing
