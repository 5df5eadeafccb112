#include "sysfs/sysfs_reader.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>

namespace vfio_dra::sysfs {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;

class SysfsReaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/vfio-dra-sysfs-reader-XXXXXX";
    root_ = mkdtemp(tmpl);
  }
  void TearDown() override { fs::remove_all(root_); }
  std::string root_;
};

// What a PCI function's directory holds: attribute files, links (driver, iommu_group, a PF's
// virtfnN) and child devices. Only the child devices are directories of their own.
TEST_F(SysfsReaderTest, ListDirectoriesGivesTheChildDevicesNotTheFilesOrTheLinks) {
  const fs::path device = fs::path(root_) / "devices/0000:5e:00.0";
  fs::create_directories(device / "virtio0/net");
  fs::create_directories(device / "power");
  fs::create_directories(fs::path(root_) / "devices/0000:5e:02.0");
  std::ofstream(device / "vendor") << "0x8086\n";
  fs::create_directory_symlink("../0000:5e:02.0", device / "virtfn0");
  std::ofstream(fs::path(root_) / "devices/driver-file") << "";
  fs::create_symlink("../driver-file", device / "driver");
  SysfsReader reader(root_);

  auto directories = reader.ListDirectories("devices/0000:5e:00.0");
  ASSERT_TRUE(directories.ok()) << directories.error().message;
  EXPECT_THAT(*directories, ElementsAre("power", "virtio0"));
  auto all = reader.List("devices/0000:5e:00.0");
  ASSERT_TRUE(all.ok());
  EXPECT_THAT(*all, ElementsAre("driver", "power", "vendor", "virtfn0", "virtio0"));

  auto missing = reader.ListDirectories("devices/0000:99:00.0");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().kind, ErrorKind::kNotFound);
}

}  // namespace
}  // namespace vfio_dra::sysfs
