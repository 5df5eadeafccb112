// The simulated kernel itself: tests elsewhere trust it to behave like sysfs, so its rules are
// pinned here (vfio-pci only through driver_override, drivers_probe reporting success, group
// nodes appearing and disappearing, SR-IOV enable/disable, refusals).
#include "simulated_kernel.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <future>
#include <set>
#include <thread>
#include <vector>

#include "unit/fixture_node.h"

namespace vfio_dra::testing {
namespace {

namespace fs = std::filesystem;

class SimulatedKernelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    node_ = std::make_unique<FixtureNode>("vm-host");
    kernel_ = std::make_unique<SimulatedKernel>(node_->sysfs_root(), node_->dir() + "/dev");
  }
  int Write(const std::string& rel, const std::string& value) {
    return kernel_->Write(node_->sysfs_root() + "/" + rel, value);
  }
  std::string Driver(const std::string& address) const {
    std::error_code ec;
    auto target =
        fs::read_symlink(node_->sysfs_root() + "/bus/pci/devices/" + address + "/driver", ec);
    return ec ? "" : target.filename().string();
  }
  bool IsCharDevice(const std::string& dev_relative) const {
    struct stat st {};
    return ::stat((node_->dir() + "/dev/" + dev_relative).c_str(), &st) == 0 && S_ISCHR(st.st_mode);
  }
  std::unique_ptr<FixtureNode> node_;
  std::unique_ptr<SimulatedKernel> kernel_;
};

TEST_F(SimulatedKernelTest, VfioPciBindsOnlyThroughDriverOverride) {
  EXPECT_EQ(Write("bus/pci/drivers/nvme/unbind", "0000:06:00.0"), 0);
  EXPECT_EQ(Driver("0000:06:00.0"), "");
  EXPECT_EQ(Write("bus/pci/drivers/vfio-pci/bind", "0000:06:00.0"), ENODEV);
  EXPECT_EQ(Write("bus/pci/devices/0000:06:00.0/driver_override", "vfio-pci"), 0);
  EXPECT_EQ(Write("bus/pci/drivers/vfio-pci/bind", "0000:06:00.0"), 0);
  EXPECT_EQ(Driver("0000:06:00.0"), "vfio-pci");
  EXPECT_TRUE(IsCharDevice("vfio/60"));
  EXPECT_TRUE(IsCharDevice("vfio/devices/vfio0"));
  EXPECT_TRUE(IsCharDevice("vfio/vfio"));
  EXPECT_EQ(Write("bus/pci/drivers/vfio-pci/bind", "0000:06:00.0"), EBUSY);
  // Back: clear the override, unbind, probe: the host driver takes it again.
  EXPECT_EQ(Write("bus/pci/devices/0000:06:00.0/driver_override", "\n"), 0);
  EXPECT_EQ(Write("bus/pci/drivers/vfio-pci/unbind", "0000:06:00.0"), 0);
  EXPECT_FALSE(fs::exists(node_->dir() + "/dev/vfio/60"));
  EXPECT_EQ(Write("bus/pci/drivers_probe", "0000:06:00.0"), 0);
  EXPECT_EQ(Driver("0000:06:00.0"), "nvme");
}

// Variant drivers mark their ID tables override-only (PCI_DRIVER_OVERRIDE_DEVICE_VFIO): like
// vfio-pci they take a device only through driver_override, and give it a VFIO group node.
TEST(SimulatedKernelVariant, AVariantDriverBindsOnlyThroughDriverOverrideAndMakesTheGroupNode) {
  FixtureNode node("variant");
  SimulatedKernel kernel(node.sysfs_root(), node.dir() + "/dev");
  const std::string root = node.sysfs_root() + "/";
  EXPECT_EQ(kernel.Write(root + "bus/pci/drivers/mlx5_core/unbind", "0000:5e:02.0"), 0);
  EXPECT_EQ(kernel.Write(root + "bus/pci/drivers/mlx5_vfio_pci/bind", "0000:5e:02.0"), ENODEV);
  EXPECT_EQ(kernel.Write(root + "bus/pci/devices/0000:5e:02.0/driver_override", "mlx5_vfio_pci"),
            0);
  EXPECT_EQ(kernel.Write(root + "bus/pci/drivers/mlx5_vfio_pci/bind", "0000:5e:02.0"), 0);
  EXPECT_TRUE(fs::exists(node.dir() + "/dev/vfio/51"));
  EXPECT_EQ(kernel.Write(root + "bus/pci/drivers/mlx5_vfio_pci/unbind", "0000:5e:02.0"), 0);
  EXPECT_FALSE(fs::exists(node.dir() + "/dev/vfio/51"));
}

TEST_F(SimulatedKernelTest, GroupNodeStaysWhileAnyMemberIsOnVfio) {
  for (const char* f : {"0000:01:00.0", "0000:01:00.1"}) {
    ASSERT_EQ(Write(std::string("bus/pci/devices/") + f + "/driver_override", "vfio-pci"), 0);
    ASSERT_EQ(Write(std::string("bus/pci/devices/") + f + "/driver/unbind", f), 0);
    ASSERT_EQ(Write("bus/pci/drivers_probe", f), 0);
    EXPECT_EQ(Driver(f), "vfio-pci");
  }
  ASSERT_EQ(Write("bus/pci/drivers/vfio-pci/unbind", "0000:01:00.1"), 0);
  EXPECT_TRUE(IsCharDevice("vfio/10"));
  ASSERT_EQ(Write("bus/pci/drivers/vfio-pci/unbind", "0000:01:00.0"), 0);
  EXPECT_FALSE(fs::exists(node_->dir() + "/dev/vfio/10"));
}

TEST_F(SimulatedKernelTest, RefusesWhatTheKernelRefuses) {
  ASSERT_EQ(Write("bus/pci/devices/0000:5e:00.0/driver_override", "vfio-pci"), 0);
  ASSERT_EQ(Write("bus/pci/drivers/i40e/unbind", "0000:5e:00.0"), 0);
  EXPECT_EQ(Write("bus/pci/drivers/vfio-pci/bind", "0000:5e:00.0"), EBUSY) << "PF with VFs";
  EXPECT_EQ(Write("bus/pci/drivers/nvidia/bind", "0000:06:00.0"), EBUSY) << "already bound";
  EXPECT_EQ(Write("bus/pci/devices/0000:06:00.0/remove", "x"), EINVAL) << "not a number";
  EXPECT_EQ(Write("kernel/iommu_groups/10/type", "identity"), EACCES);
  EXPECT_EQ(Write("bus/pci/drivers/nvme/unbind", "0000:01:00.0"), ENODEV) << "not its driver";
  const auto writes = kernel_->Writes();
  ASSERT_EQ(writes.size(), 7u);
  EXPECT_EQ(writes.back().path, "bus/pci/drivers/nvme/unbind");
  EXPECT_EQ(writes.back().result, ENODEV);
}

// A denied path (a read-only mount, an AppArmor rule) fails writes and probes with the errno set
// for it and everything under it, and the kernel does nothing; a probe opens and changes nothing.
TEST_F(SimulatedKernelTest, DeniedPathsFailWritesAndProbesAndProbesChangeNothing) {
  const std::string override =
      node_->sysfs_root() + "/bus/pci/devices/0000:06:00.0/driver_override";
  EXPECT_EQ(kernel_->ProbeWritable(override), 0);
  EXPECT_EQ(kernel_->ProbeWritable(node_->sysfs_root() + "/bus/pci/devices/0000:06:00.0/nope"),
            ENOENT);
  EXPECT_TRUE(kernel_->Writes().empty());
  kernel_->DenyWrites("bus/pci/devices/0000:06:00.0", EACCES);
  kernel_->DenyWrites("bus/pci/drivers/nvme/unbind", EROFS);
  EXPECT_EQ(kernel_->ProbeWritable(override), EACCES);
  EXPECT_EQ(Write("bus/pci/devices/0000:06:00.0/driver_override", "vfio-pci"), EACCES);
  EXPECT_EQ(Write("bus/pci/drivers/nvme/unbind", "0000:06:00.0"), EROFS);
  EXPECT_EQ(Driver("0000:06:00.0"), "nvme");
  std::ifstream in(override);
  std::string content;
  std::getline(in, content);
  EXPECT_EQ(content, "(null)");
  // Another device is not denied.
  EXPECT_EQ(Write("bus/pci/devices/0000:01:00.0/driver_override", "vfio-pci"), 0);
  kernel_->DenyWrites("", EROFS);  // the whole tree
  EXPECT_EQ(Write("bus/pci/devices/0000:01:00.0/driver_override", "\n"), EROFS);
}

TEST_F(SimulatedKernelTest, SriovVfsAreCreatedAndRemovedThroughSriovNumvfs) {
  EXPECT_EQ(Write("bus/pci/devices/0000:5e:00.0/sriov_numvfs", "2"), EBUSY) << "4 -> 2 needs 0";
  EXPECT_EQ(Write("bus/pci/devices/0000:5e:00.0/sriov_numvfs", "0"), 0);
  EXPECT_FALSE(fs::exists(node_->sysfs_root() + "/bus/pci/devices/0000:5e:02.0"));
  EXPECT_EQ(Write("bus/pci/devices/0000:5e:00.0/sriov_numvfs", "100"), ERANGE);
  EXPECT_EQ(Write("bus/pci/devices/0000:5e:00.0/sriov_numvfs", "6"), 0);
  EXPECT_TRUE(fs::exists(node_->sysfs_root() + "/bus/pci/devices/0000:5e:02.5/physfn"));
  EXPECT_TRUE(fs::exists(node_->sysfs_root() + "/bus/pci/devices/0000:5e:00.0/virtfn5"));
}

// `remove` (pci_stop_and_remove_bus_device): a PF's VFs go first, then the function leaves its
// driver and IOMMU group (the group goes with its last member) and the bus; 0 does nothing.
TEST_F(SimulatedKernelTest, RemoveTakesAFunctionAndItsVfsOffTheBusAndOutOfTheirGroups) {
  const std::string root = node_->sysfs_root();
  ASSERT_TRUE(fs::exists(root + "/bus/pci/devices/0000:01:00.1"));
  const auto group_of = [&](const std::string& address) {
    return fs::read_symlink(root + "/bus/pci/devices/" + address + "/iommu_group")
        .filename()
        .string();
  };
  const std::string shared = group_of("0000:01:00.1");
  EXPECT_EQ(Write("bus/pci/devices/0000:01:00.1/remove", "0"), 0);
  EXPECT_TRUE(fs::exists(root + "/bus/pci/devices/0000:01:00.1"));
  EXPECT_EQ(Write("bus/pci/devices/0000:01:00.1/remove", "1"), 0);
  EXPECT_FALSE(fs::exists(root + "/bus/pci/devices/0000:01:00.1"));
  EXPECT_FALSE(fs::exists(root + "/kernel/iommu_groups/" + shared + "/devices/0000:01:00.1"));
  EXPECT_TRUE(fs::exists(root + "/kernel/iommu_groups/" + shared + "/devices/0000:01:00.0"))
      << "the group stays while it has members";
  const std::string vf_group = group_of("0000:5e:02.0");
  EXPECT_EQ(Write("bus/pci/devices/0000:5e:00.0/remove", "1"), 0);
  EXPECT_FALSE(fs::exists(root + "/bus/pci/devices/0000:5e:00.0"));
  EXPECT_FALSE(fs::exists(root + "/bus/pci/devices/0000:5e:02.0")) << "its VFs went first";
  EXPECT_FALSE(fs::exists(root + "/kernel/iommu_groups/" + vf_group));
  EXPECT_EQ(Write("bus/pci/devices/0000:5e:00.0/remove", "1"), ENOENT);
}

// The kernel locks one device per bind: a probe that waits (for a reset, say) holds its own
// device only, and a bind of another device goes through meanwhile. The simulation once ran every
// write under one lock, so work on one device delayed all others and benchmarks measured that.
TEST_F(SimulatedKernelTest, AWaitingProbeHoldsOnlyItsOwnDevice) {
  for (const std::string f : {"0000:06:00.0", "0000:04:00.0"}) {
    ASSERT_EQ(Write("bus/pci/devices/" + f + "/driver_override", "vfio-pci"), 0);
    ASSERT_EQ(Write("bus/pci/drivers/nvme/unbind", f), 0);
  }
  kernel_->HangVfioBind("0000:06:00.0");
  std::future<int> waiting = std::async(
      std::launch::async, [&] { return Write("bus/pci/drivers/vfio-pci/bind", "0000:06:00.0"); });
  ASSERT_TRUE(kernel_->WaitUntilHanging(1, std::chrono::seconds(60)));
  EXPECT_EQ(Write("bus/pci/drivers/vfio-pci/bind", "0000:04:00.0"), 0);
  EXPECT_EQ(Driver("0000:04:00.0"), "vfio-pci");
  EXPECT_TRUE(IsCharDevice("vfio/13"));
  EXPECT_EQ(kernel_->Hanging(), 1) << "the other bind returned while this probe still waits";
  struct stat st {};
  ASSERT_EQ(
      ::lstat((node_->sysfs_root() + "/bus/pci/devices/0000:06:00.0/driver_override").c_str(), &st),
      0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode)) << "the waiting device is locked: its driver_override blocks";
  kernel_->ReleaseHangs();
  EXPECT_EQ(waiting.get(), 0);
  EXPECT_EQ(Driver("0000:06:00.0"), "vfio-pci");
  EXPECT_TRUE(IsCharDevice("vfio/60"));
}

// Binds of different devices run at once, and the numbers every device shares (vfio-dev cdevs)
// are still handed out once each.
TEST_F(SimulatedKernelTest, ConcurrentBindsOfDifferentDevicesGetDistinctNodes) {
  ASSERT_EQ(Write("bus/pci/devices/0000:5e:00.0/sriov_numvfs", "0"), 0);
  ASSERT_EQ(Write("bus/pci/devices/0000:5e:00.0/sriov_numvfs", "6"), 0);
  std::vector<std::future<int>> binds;
  for (int i = 0; i < 6; ++i) {
    binds.push_back(std::async(std::launch::async, [this, i] {
      const std::string vf = "0000:5e:02." + std::to_string(i);
      if (int err = Write("bus/pci/devices/" + vf + "/driver_override", "vfio-pci"); err != 0) {
        return err;
      }
      return Write("bus/pci/drivers/vfio-pci/bind", vf);
    }));
  }
  for (auto& bind : binds) EXPECT_EQ(bind.get(), 0);
  std::set<std::string> cdevs;
  for (int i = 0; i < 6; ++i) {
    const std::string vf = "0000:5e:02." + std::to_string(i);
    EXPECT_EQ(Driver(vf), "vfio-pci") << vf;
    for (const auto& entry :
         fs::directory_iterator(node_->sysfs_root() + "/bus/pci/devices/" + vf + "/vfio-dev")) {
      cdevs.insert(entry.path().filename().string());
    }
  }
  EXPECT_EQ(cdevs.size(), 6u);
  for (const std::string& cdev : cdevs) EXPECT_TRUE(IsCharDevice("vfio/devices/" + cdev)) << cdev;
}

// vfio-dev numbers come as the kernel's IDA hands them out: the lowest free one, a number this
// simulated kernel freed first; a number taken outside it (a fixture, another process) is skipped.
TEST_F(SimulatedKernelTest, VfioDevNumbersAreTheLowestFreeAndNeverShared) {
  ASSERT_EQ(Write("bus/pci/devices/0000:5e:00.0/sriov_numvfs", "0"), 0);
  ASSERT_EQ(Write("bus/pci/devices/0000:5e:00.0/sriov_numvfs", "4"), 0);
  const auto cdev_of = [&](const std::string& vf) {
    std::vector<std::string> names;
    std::error_code ec;
    for (const auto& entry :
         fs::directory_iterator(node_->sysfs_root() + "/bus/pci/devices/" + vf + "/vfio-dev", ec)) {
      names.push_back(entry.path().filename().string());
    }
    return names.size() == 1 ? names.front() : "";
  };
  const auto bind = [&](const std::string& vf) {
    EXPECT_EQ(Write("bus/pci/devices/" + vf + "/driver_override", "vfio-pci"), 0);
    EXPECT_EQ(Write("bus/pci/drivers/vfio-pci/bind", vf), 0);
    return cdev_of(vf);
  };
  // Taken by someone else: a link the simulated kernel did not make.
  fs::create_directories(node_->sysfs_root() + "/class/vfio-dev");
  fs::create_symlink("../../devices/elsewhere", node_->sysfs_root() + "/class/vfio-dev/vfio1");
  EXPECT_EQ(bind("0000:5e:02.0"), "vfio0");
  EXPECT_EQ(bind("0000:5e:02.1"), "vfio2");
  EXPECT_EQ(bind("0000:5e:02.2"), "vfio3");
  EXPECT_EQ(Write("bus/pci/drivers/vfio-pci/unbind", "0000:5e:02.0"), 0);
  EXPECT_FALSE(fs::is_symlink(node_->sysfs_root() + "/class/vfio-dev/vfio0"));
  EXPECT_FALSE(IsCharDevice("vfio/devices/vfio0"));
  EXPECT_EQ(bind("0000:5e:02.3"), "vfio0");
  EXPECT_EQ(bind("0000:5e:02.0"), "vfio4");
  EXPECT_EQ(fs::read_symlink(node_->sysfs_root() + "/class/vfio-dev/vfio4").string(),
            "../../" +
                fs::relative(fs::canonical(node_->sysfs_root() + "/bus/pci/devices/0000:5e:02.0"),
                             fs::canonical(node_->sysfs_root()))
                    .string() +
                "/vfio-dev/vfio4");
  for (const char* cdev : {"vfio0", "vfio2", "vfio3", "vfio4"}) {
    EXPECT_TRUE(IsCharDevice(std::string("vfio/devices/") + cdev)) << cdev;
  }
}

// Links are written as the kernel writes sysfs links, which is what lexically_relative gives.
TEST(RelativeLinkTarget, IsWhatLexicallyRelativeGives) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"devices/pci0000:00/0000:00:01.0/driver", "bus/pci/drivers/vfio-pci"},
      {"bus/pci/drivers/vfio-pci/0000:00:01.0", "devices/pci0000:00/0000:00:01.0"},
      {"class/vfio-dev/vfio3", "devices/pci0000:00/0000:00:01.0/vfio-dev/vfio3"},
      {"devices/a/b/link", "devices/a/b/c/d"},
      {"devices/a/b/link", "devices/a/b"},
      {"devices/a/b/link", "devices/a"},
      {"link", "devices/a"},
      {"a//b/link", "a/c"},
      {"a/b/link", "a/../c"},
      {"a/./link", "a/c"},
      {"/abs/link", "a/c"},
      {"a/link", "/abs/c"},
      {"a/b/", "a/c"},
  };
  for (const auto& [link, target] : cases) {
    EXPECT_EQ(RelativeLinkTarget(link, target),
              fs::path(target).lexically_relative(fs::path(link).parent_path()).string())
        << link << " -> " << target;
  }
}

TEST_F(SimulatedKernelTest, MdevCreateCountsInstancesAndAppliesNvidiasOneTypeRule) {
  const std::string types = "class/mdev_bus/0000:3b:00.0/mdev_supported_types/";
  const std::string uuid = "7a1c2f0e-5b7d-4c1e-9a11-000000000001";
  EXPECT_EQ(Write(types + "nvidia-223/create", uuid), 0);
  EXPECT_EQ(Write(types + "nvidia-223/create", uuid), EEXIST);
  EXPECT_EQ(Write(types + "nvidia-222/create", "7a1c2f0e-5b7d-4c1e-9a11-000000000002"), EUSERS);
  std::ifstream available(node_->sysfs_root() + "/" + types + "nvidia-223/available_instances");
  int left = 0;
  available >> left;
  EXPECT_EQ(left, 7);
  EXPECT_EQ(Write("bus/mdev/devices/" + uuid + "/remove", "1"), 0);
  EXPECT_FALSE(fs::exists(node_->sysfs_root() + "/bus/mdev/devices/" + uuid));
  EXPECT_EQ(Write(types + "nvidia-222/create", "7a1c2f0e-5b7d-4c1e-9a11-000000000002"), 0);
}

// mtty (and Intel GVT-g, and NVIDIA in heterogeneous mode) count space: an instance of one type
// lowers what every other type offers.
TEST(SimulatedKernelSpace, ParentsThatMixTypesCountSpace) {
  FixtureNode node("vgpu-busy");
  SimulatedKernel kernel(node.sysfs_root(), node.dir() + "/dev");
  auto available = [&](const std::string& parent, const std::string& type) {
    std::ifstream in(node.sysfs_root() + "/class/mdev_bus/" + parent + "/mdev_supported_types/" +
                     type + "/available_instances");
    int n = -1;
    in >> n;
    return n;
  };
  auto create = [&](const std::string& parent, const std::string& type, int n) {
    return kernel.Write(node.sysfs_root() + "/class/mdev_bus/" + parent + "/mdev_supported_types/" +
                            type + "/create",
                        "9e8d7c6b-0000-4000-8000-00000000000" + std::to_string(n));
  };
  // mtty: 19 ports left; a dual-port instance takes 2 of them.
  ASSERT_EQ(create("mtty", "mtty-2", 1), 0);
  EXPECT_EQ(available("mtty", "mtty-1"), 17);
  EXPECT_EQ(available("mtty", "mtty-2"), 8);
  // A heterogeneous T4 with 12 of 16 units free: an 8A instance takes 8.
  ASSERT_EQ(create("0000:3b:00.0", "nvidia-228", 2), 0);
  EXPECT_EQ(available("0000:3b:00.0", "nvidia-222"), 4);
  EXPECT_EQ(available("0000:3b:00.0", "nvidia-226"), 1);
  EXPECT_EQ(available("0000:3b:00.0", "nvidia-228"), 0);
  // A T4 in one-type mode refuses any other type.
  EXPECT_EQ(create("0000:3c:00.0", "nvidia-222", 3), EUSERS);
  EXPECT_EQ(available("0000:3c:00.0", "nvidia-223"), 6);
}

// NVIDIA vGPU on SR-IOV VFs, as the vGPU manager's VFIO framework and the upstream RFC document
// it: per-VF nvidia/creatable_vgpu_types and current_vgpu_type, no mdev, the VF stays on nvidia.
class SimulatedVgpuVfTest : public ::testing::Test {
 protected:
  void SetUp() override {
    node_ = std::make_unique<FixtureNode>("vgpu-vf");
    kernel_ = std::make_unique<SimulatedKernel>(node_->sysfs_root(), node_->dir() + "/dev");
  }
  int SetType(const std::string& vf, const std::string& value) {
    return kernel_->Write(Path(vf, "current_vgpu_type"), value);
  }
  std::string Read(const std::string& vf, const std::string& file) const {
    std::ifstream in(Path(vf, file));
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  std::string Path(const std::string& vf, const std::string& file) const {
    return node_->sysfs_root() + "/bus/pci/devices/" + vf + "/nvidia/" + file;
  }
  std::unique_ptr<FixtureNode> node_;
  std::unique_ptr<SimulatedKernel> kernel_;
};

constexpr char kAllTypes[] =
    "ID    : vGPU Name\n"
    "1414  : NVIDIA H100-20C\n"
    "1415  : NVIDIA H100-40C\n"
    "1416  : NVIDIA H100-80C\n";

TEST_F(SimulatedVgpuVfTest, AnIdleCardListsEveryTypeOnEveryVfInTheDriversFormat) {
  for (const char* vf : {"0000:41:00.4", "0000:41:00.5", "0000:41:00.6", "0000:41:00.7"}) {
    EXPECT_EQ(Read(vf, "creatable_vgpu_types"), kAllTypes) << vf;
    EXPECT_EQ(Read(vf, "current_vgpu_type"), "0\n") << vf;
  }
}

TEST_F(SimulatedVgpuVfTest, WritingAnIdCreatesAndSiblingsListOnlyThatTypeUntilTheCardIsFull) {
  EXPECT_EQ(SetType("0000:41:00.4", "1415"), 0);
  EXPECT_EQ(Read("0000:41:00.4", "current_vgpu_type"), "1415\n");
  // The VF holding it lists nothing; siblings only the type in use (homogeneous per PF).
  EXPECT_EQ(Read("0000:41:00.4", "creatable_vgpu_types"), "ID    : vGPU Name\n");
  EXPECT_EQ(Read("0000:41:00.5", "creatable_vgpu_types"),
            "ID    : vGPU Name\n1415  : NVIDIA H100-40C\n");
  EXPECT_EQ(SetType("0000:41:00.5", "1414"), ENODEV);  // another type: not creatable now
  EXPECT_EQ(SetType("0000:41:00.5", "1415"), 0);
  // Two 40C vGPUs fill the card: every VF shows only the header.
  for (const char* vf : {"0000:41:00.4", "0000:41:00.5", "0000:41:00.6", "0000:41:00.7"}) {
    EXPECT_EQ(Read(vf, "creatable_vgpu_types"), "ID    : vGPU Name\n") << vf;
  }
  EXPECT_EQ(SetType("0000:41:00.6", "1415"), ENODEV);
  // The other card is not affected.
  EXPECT_EQ(Read("0000:c1:00.5", "creatable_vgpu_types"),
            "ID    : vGPU Name\n1415  : NVIDIA H100-40C\n");
}

TEST_F(SimulatedVgpuVfTest, WritingZeroDestroysAndTheListsGrowBack) {
  ASSERT_EQ(SetType("0000:41:00.4", "1414"), 0);
  EXPECT_EQ(SetType("0000:41:00.4", "0"), 0);
  EXPECT_EQ(Read("0000:41:00.4", "current_vgpu_type"), "0\n");
  EXPECT_EQ(Read("0000:41:00.5", "creatable_vgpu_types"), kAllTypes);
  EXPECT_EQ(SetType("0000:41:00.4", "0"), 0);  // nothing to destroy
}

TEST_F(SimulatedVgpuVfTest, UnknownIdsAndTypesOnAVfThatHoldsOneAreNoDevice) {
  EXPECT_EQ(SetType("0000:41:00.4", "9999"), ENODEV);
  EXPECT_EQ(SetType("0000:41:00.4", "NVIDIA H100-20C"), EINVAL);
  EXPECT_EQ(SetType("0000:c1:00.4", "1415"), ENODEV);  // holds one already
  EXPECT_EQ(Read("0000:c1:00.4", "current_vgpu_type"), "1415\n");
}

TEST_F(SimulatedVgpuVfTest, AVfOpenedByAVmmIsBusy) {
  kernel_->OpenVgpuVf("0000:c1:00.4");
  EXPECT_EQ(SetType("0000:c1:00.4", "0"), EBUSY);
  EXPECT_EQ(Read("0000:c1:00.4", "current_vgpu_type"), "1415\n");
  // Every process's kernel sees it.
  SimulatedKernel other(node_->sysfs_root(), node_->dir() + "/dev");
  EXPECT_EQ(other.Write(Path("0000:c1:00.4", "current_vgpu_type"), "0"), EBUSY);
  kernel_->CloseVgpuVf("0000:c1:00.4");
  EXPECT_EQ(SetType("0000:c1:00.4", "0"), 0);
}

TEST_F(SimulatedVgpuVfTest, TheVfStaysOnNvidiaWithItsVfioNodes) {
  const std::string vf = node_->sysfs_root() + "/bus/pci/devices/0000:41:00.4";
  ASSERT_EQ(SetType("0000:41:00.4", "1414"), 0);
  EXPECT_EQ(fs::read_symlink(vf + "/driver").filename(), "nvidia");
  EXPECT_TRUE(fs::is_directory(vf + "/vfio-dev"));
  struct stat st {};
  EXPECT_EQ(::stat((node_->dir() + "/dev/vfio/81").c_str(), &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
  EXPECT_TRUE(fs::is_empty(node_->sysfs_root() + "/class/mdev_bus"));
}

TEST_F(SimulatedVgpuVfTest, ARestartedKernelKnowsTheCardsTypes) {
  ASSERT_EQ(SetType("0000:41:00.4", "1415"), 0);
  kernel_.reset();
  kernel_ = std::make_unique<SimulatedKernel>(node_->sysfs_root(), node_->dir() + "/dev");
  EXPECT_EQ(SetType("0000:41:00.4", "0"), 0);
  EXPECT_EQ(Read("0000:41:00.5", "creatable_vgpu_types"), kAllTypes);
}

}  // namespace
}  // namespace vfio_dra::testing
