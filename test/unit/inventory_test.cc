#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "discovery/pci_names.h"
#include "unit/fixture_node.h"

namespace vfio_dra::discovery {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using vfio_dra::testing::FixtureNode;
using vfio_dra::testing::SysfsFixture;

TEST(Inventory, WorkstationGpusAudioAndGroups) {
  FixtureNode node("workstation");
  const Inventory inv = node.Scan();
  EXPECT_TRUE(inv.warnings.empty()) << inv.warnings.front();
  EXPECT_TRUE(inv.iommu_enabled);
  EXPECT_EQ(inv.functions.size(), 12u);
  const PciFunction* gpu = inv.Find("0000:01:00.0");
  ASSERT_NE(gpu, nullptr);
  EXPECT_EQ(gpu->vendor_id, 0x10deu);
  EXPECT_EQ(gpu->device_id, 0x2230u);
  EXPECT_EQ(gpu->subsystem_vendor_id, 0x10deu);
  EXPECT_EQ(gpu->subsystem_device_id, 0x1230u);
  EXPECT_EQ(gpu->class_code, 0x030000u);
  EXPECT_EQ(gpu->revision, 0xa1u);
  EXPECT_EQ(gpu->vendor_name, "NVIDIA Corporation");
  EXPECT_EQ(gpu->device_name, "GA102GL [RTX A6000]");
  EXPECT_EQ(gpu->driver, "nvidia");
  EXPECT_EQ(gpu->driver_override, "");
  EXPECT_EQ(gpu->iommu_group, 10);
  EXPECT_EQ(gpu->numa_node, 0);
  EXPECT_EQ(gpu->pcie_root, "pci0000:00");
  EXPECT_THAT(inv.iommu_groups.at(10).members, ElementsAre("0000:01:00.0", "0000:01:00.1"));
  EXPECT_THAT(inv.iommu_groups.at(11).members,
              ElementsAre("0000:02:00.0", "0000:02:00.1", "0000:02:00.2", "0000:02:00.3"));
  EXPECT_EQ(inv.Find("0000:02:00.3")->class_code, 0x0c8000u);
  EXPECT_THAT(inv.Find("0000:03:00.0")->netdevs, ElementsAre("enp3s0"));
  EXPECT_TRUE(inv.Find("0000:00:01.0")->IsBridge());
}

TEST(Inventory, DataCenterGpusKeepTheirRootsAndNumaNodes) {
  FixtureNode node("datacenter");
  const Inventory inv = node.Scan();
  EXPECT_TRUE(inv.warnings.empty());
  int gpus = 0;
  for (const auto& [address, fn] : inv.functions) {
    if (fn.class_code != 0x030200) continue;
    ++gpus;
    const bool socket0 = address < "0000:80";
    EXPECT_EQ(fn.pcie_root, socket0 ? "pci0000:17" : "pci0000:b0") << address;
    EXPECT_EQ(fn.numa_node, socket0 ? 0 : 1) << address;
    EXPECT_EQ(inv.iommu_groups.at(*fn.iommu_group).members.size(), 1u);
  }
  EXPECT_EQ(gpus, 8);
  EXPECT_EQ(inv.Find("0000:1f:00.0")->class_code, 0x068000u);  // NVSwitch
}

TEST(Inventory, VgpuParentTypesAndExistingInstance) {
  FixtureNode node("vgpu");
  const Inventory inv = node.Scan();
  EXPECT_TRUE(inv.warnings.empty());
  ASSERT_EQ(inv.mdev_parents.size(), 1u);
  const MdevParent& parent = inv.mdev_parents[0];
  EXPECT_EQ(parent.name, "0000:3b:00.0");
  EXPECT_EQ(parent.pci_address, "0000:3b:00.0");
  ASSERT_EQ(parent.types.size(), 4u);
  EXPECT_EQ(parent.types[1].id, "nvidia-223");
  EXPECT_EQ(parent.types[1].name, "GRID T4-2B");
  EXPECT_EQ(parent.types[1].description, "num_heads=4, frl_config=45");
  EXPECT_EQ(parent.types[1].device_api, "vfio-pci");
  EXPECT_EQ(parent.types[1].available_instances, 7);
  EXPECT_EQ(parent.types[0].available_instances, 0);
  ASSERT_EQ(parent.instances.size(), 1u);
  EXPECT_EQ(parent.instances[0].uuid, "4b20d080-1b54-4048-85b3-a6a62d165c01");
  EXPECT_EQ(parent.instances[0].type_id, "nvidia-223");
  EXPECT_EQ(parent.instances[0].iommu_group, 100);
  EXPECT_EQ(inv.Find("0000:3b:00.0")->pcie_root, "pci0000:3a");
}

TEST(Inventory, SriovPfsAndVfsAreLinkedBothWays) {
  FixtureNode node("sriov");
  const Inventory inv = node.Scan();
  EXPECT_TRUE(inv.warnings.empty());
  const PciFunction* pf = inv.Find("0000:5e:00.0");
  ASSERT_TRUE(pf && pf->sriov_pf);
  EXPECT_EQ(pf->sriov_pf->total_vfs, 64);
  EXPECT_EQ(pf->sriov_pf->num_vfs, 8);
  ASSERT_EQ(pf->sriov_pf->vfs.size(), 8u);
  EXPECT_EQ(pf->sriov_pf->vfs[0], "0000:5e:02.0");
  EXPECT_EQ(pf->sriov_pf->vfs[7], "0000:5e:02.7");
  const PciFunction* vf = inv.Find("0000:5e:02.3");
  ASSERT_TRUE(vf && vf->sriov_vf);
  EXPECT_EQ(vf->sriov_vf->pf, "0000:5e:00.0");
  EXPECT_EQ(vf->sriov_vf->index, 3);
  EXPECT_THAT(vf->netdevs, ElementsAre("ens785f0v3"));
  EXPECT_EQ(vf->iommu_group, 54);
  const PciFunction* pf2 = inv.Find("0000:5e:00.1");
  ASSERT_TRUE(pf2 && pf2->sriov_pf);
  EXPECT_EQ(pf2->sriov_pf->total_vfs, 128);
  EXPECT_EQ(pf2->sriov_pf->num_vfs, 0);
  EXPECT_THAT(inv.iommu_groups.at(70).members,
              ElementsAre("0000:00:1c.0", "0000:70:00.0", "0000:70:00.1"));
}

TEST(Inventory, IommuOffNodeHasNoGroups) {
  FixtureNode node("iommu-off");
  const Inventory inv = node.Scan();
  EXPECT_FALSE(inv.iommu_enabled);
  EXPECT_TRUE(inv.iommu_groups.empty());
  EXPECT_EQ(inv.functions.size(), 4u);
  EXPECT_FALSE(inv.Find("0000:00:02.0")->iommu_group.has_value());
  EXPECT_FALSE(inv.Find("0000:00:02.0")->numa_node.has_value());
}

TEST(Inventory, VmdDomainsWithFiveDigits) {
  FixtureNode node("vmd");
  const Inventory inv = node.Scan();
  EXPECT_TRUE(inv.warnings.empty());
  const PciFunction* nvme = inv.Find("10000:01:00.0");
  ASSERT_NE(nvme, nullptr);
  EXPECT_EQ(nvme->pcie_root, "pci10000:00");
  EXPECT_EQ(nvme->device_name, "NVMe SSD Controller SM981/PM981/PM983");
  EXPECT_THAT(inv.iommu_groups.at(30).members,
              ElementsAre("0000:64:00.5", "10000:00:02.0", "10000:01:00.0"));
}

TEST(Inventory, NonPciMdevParent) {
  FixtureNode node("mtty");
  const Inventory inv = node.Scan();
  ASSERT_EQ(inv.mdev_parents.size(), 1u);
  EXPECT_EQ(inv.mdev_parents[0].name, "mtty");
  EXPECT_EQ(inv.mdev_parents[0].pci_address, "");
  ASSERT_EQ(inv.mdev_parents[0].types.size(), 2u);
  EXPECT_EQ(inv.mdev_parents[0].types[0].id, "mtty-1");
  EXPECT_EQ(inv.mdev_parents[0].types[0].available_instances, 24);
  EXPECT_EQ(inv.mdev_parents[0].types[1].available_instances, 12);
  EXPECT_EQ(inv.mdev_parents[0].types[0].description, "");
}

TEST(Inventory, MalformedEntriesAreSkippedWithOneWarningEach) {
  FixtureNode node("workstation");
  SysfsFixture fx(node.sysfs_root());
  const std::string gpu = "devices/pci0000:00/0000:00:01.0/0000:01:00.0";
  std::filesystem::remove(node.sysfs_root() + "/" + gpu + "/modalias");
  fx.WriteFile("devices/pci0000:00/0000:04:00.0/modalias",
               "pci:v0000144Dd0000A80Asv0000144Dsd0000A801bc01sc08i0\x02\n");
  std::filesystem::create_directories(node.sysfs_root() + "/bus/pci/devices/not-a-bdf");
  const std::string parent = "devices/pci0000:00/0000:00:03.0/0000:02:00.0";
  fx.Symlink("class/mdev_bus/0000:02:00.0", parent);
  fx.WriteFile(parent + "/mdev_supported_types/nvidia-1/device_api", "vfio-pci\n");
  fx.WriteFile(parent + "/mdev_supported_types/nvidia-1/available_instances", "2\n");
  fx.WriteFile(parent + "/mdev_supported_types/nvidia-2/available_instances", "1\n");
  const Inventory inv = node.Scan();
  EXPECT_EQ(inv.Find("0000:01:00.0"), nullptr);
  EXPECT_EQ(inv.Find("0000:04:00.0"), nullptr);
  EXPECT_TRUE(inv.Listed("0000:01:00.0")) << "unreadable, but still there";
  EXPECT_NE(inv.Find("0000:01:00.1"), nullptr);
  EXPECT_EQ(inv.functions.size(), 10u);
  ASSERT_EQ(inv.warnings.size(), 4u);
  EXPECT_THAT(inv.warnings[0], HasSubstr("skipping PCI function 0000:01:00.0"));
  EXPECT_THAT(inv.warnings[0], HasSubstr("0000:01:00.0/modalias"));
  EXPECT_THAT(inv.warnings[1], HasSubstr("skipping PCI function 0000:04:00.0"));
  EXPECT_THAT(inv.warnings[1], HasSubstr("0000:04:00.0/modalias: expected pci:v"));
  EXPECT_THAT(inv.warnings[1], HasSubstr("i0\\x02")) << "the bad text, escaped for display";
  EXPECT_THAT(inv.warnings[2], HasSubstr("bus/pci/devices/not-a-bdf"));
  EXPECT_THAT(inv.warnings[3], HasSubstr("skipping mdev type nvidia-2 of 0000:02:00.0"));
  ASSERT_EQ(inv.mdev_parents.size(), 1u);
  EXPECT_EQ(inv.mdev_parents[0].types.size(), 1u);
}

// The kernel takes a removed function off the bus listing before its directory goes: a scan that
// overlaps the removal lists the function and then cannot open it. That function is gone, not
// unreadable (a listed one keeps a claim's device published as it was; device_taints.h).
TEST(Inventory, AFunctionThatLeavesTheBusWhileReadIsNotListed) {
  FixtureNode node("workstation");
  SysfsFixture fx(node.sysfs_root());
  // The bus's entry outlives its target: the state a scan meets between listing and opening.
  std::filesystem::remove_all(node.sysfs_root() + "/devices/pci0000:00/0000:00:01.0/0000:01:00.1");
  const Inventory inv = node.Scan();
  EXPECT_EQ(inv.Find("0000:01:00.1"), nullptr);
  EXPECT_FALSE(inv.Listed("0000:01:00.1"));
  EXPECT_TRUE(inv.Listed("0000:01:00.0"));
  ASSERT_EQ(inv.warnings.size(), 1u) << "the scan is incomplete: the next check scans again";
  EXPECT_THAT(inv.warnings[0], HasSubstr("PCI function 0000:01:00.1 went away while it was read"));
}

TEST(Inventory, ADanglingIommuGroupLinkDoesNotCrash) {
  FixtureNode node("");
  SysfsFixture fx(node.sysfs_root());
  fx.AddPci(
      vfio_dra::testing::MakePciSpec("0000:01:00.0", 0x10de, 0x2230, 0x030000, "", std::nullopt));
  fx.Symlink("devices/pci0000:00/0000:01:00.0/iommu_group", "kernel/iommu_groups/notanumber");
  const Inventory inv = node.Scan();
  EXPECT_EQ(inv.Find("0000:01:00.0"), nullptr);
  ASSERT_EQ(inv.warnings.size(), 1u);
  EXPECT_THAT(inv.warnings[0], HasSubstr("not an IOMMU group number"));
}

}  // namespace
}  // namespace vfio_dra::discovery

namespace vfio_dra::discovery {
namespace {

// The daemon frees the pci.ids database after each scan; the next lookup reads the file again,
// including a change made to it meanwhile (a package update).
TEST(PciNamesTest, NamesAreReadAgainAfterTheDatabaseIsReleased) {
  FixtureNode node("workstation");
  auto names = PciNames::Open({node.sysfs_root(), node.pci_ids(), false});
  ASSERT_TRUE(names.ok()) << names.error().message;
  EXPECT_EQ((*names)->DeviceName(0x10de, 0x1eb8), "TU104GL [Tesla T4]");
  (*names)->ReleaseDatabase();
  EXPECT_EQ((*names)->DeviceName(0x10de, 0x1eb8), "TU104GL [Tesla T4]");
  std::ofstream(node.pci_ids(), std::ios::app) << "1b36  Red Hat, Inc.\n";
  EXPECT_EQ((*names)->VendorName(0x1b36), "") << "still the database read before the change";
  (*names)->ReleaseDatabase();
  EXPECT_EQ((*names)->VendorName(0x1b36), "Red Hat, Inc.");
  EXPECT_EQ((*names)->LoadError(), "");
}

}  // namespace
}  // namespace vfio_dra::discovery
