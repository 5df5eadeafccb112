#include "slicepublisher/packed_device_table.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "slicepublisher/device_attributes.h"

namespace vfio_dra::slicepublisher {
namespace {

SliceDevice Vgpu(const std::string& name) {
  SliceDevice device;
  device.name = name;
  device.attributes[attribute::kType] = std::string("mdev");
  device.attributes[attribute::kMdevUuid] = std::string("0b1c9a5e-33ad-4b5f-9d55-2c1d3e6f7a80");
  device.attributes[attribute::kIommuGroup] = int64_t{-7};
  device.attributes[attribute::kUnsafeNoIommu] = false;
  device.attributes["driverVersion"] =
      VersionString{"550.54.15"};  // a name the table does not know
  device.attributes["example.com/long-attribute-name-of-another-driver"] = std::string(300, 'x');
  device.attributes["big"] = int64_t{1} << 62;
  device.consumes_counters.push_back(
      {"gpu-0000-3b-00-0", {{"memory", int64_t{24} << 30}, {"framebuffers", 1}}});
  device.consumes_counters.push_back({"other", {}});
  return device;
}

// What goes in comes out: every value type, names the table knows and names it does not, counter
// consumptions, empty strings and maps; lookups by name and the walk in name order.
TEST(PackedDeviceTable, UnpacksEveryDeviceAsPacked) {
  SliceDevice plain;
  plain.name = "vf-0000-5e-02-0";
  plain.attributes[attribute::kPciBusId] = std::string("0000:5e:02.0");
  plain.attributes[attribute::kProductName] = std::string();
  SliceDevice bare;
  bare.name = "a";
  const SliceDevice vgpu = Vgpu("mdev-0000-3b-00-0-nvidia-222-0");
  const PackedDeviceTable table({&plain, &vgpu, &bare});

  ASSERT_EQ(table.size(), 3u);
  EXPECT_EQ(table.Find("vf-0000-5e-02-0"), plain);
  EXPECT_EQ(table.Find("mdev-0000-3b-00-0-nvidia-222-0"), vgpu);
  EXPECT_EQ(table.Find("a"), bare);
  EXPECT_FALSE(table.Find("vf-0000-5e-02-1").has_value());
  EXPECT_FALSE(table.Find("").has_value());
  EXPECT_FALSE(table.Find("zzz").has_value());
  std::vector<SliceDevice> walked;
  table.ForEach([&](const SliceDevice& device) { walked.push_back(device); });
  EXPECT_EQ(walked, (std::vector<SliceDevice>{bare, vgpu, plain}));
}

// As a map assigned in turn would: the last device of a name stays.
TEST(PackedDeviceTable, KeepsTheLastDeviceOfAName) {
  SliceDevice first = Vgpu("d");
  SliceDevice second;
  second.name = "d";
  SliceDevice other;
  other.name = "c";
  const PackedDeviceTable table({&first, &other, &second});
  ASSERT_EQ(table.size(), 2u);
  EXPECT_EQ(table.Find("d"), second);
  EXPECT_EQ(table.Find("c"), other);
}

TEST(PackedDeviceTable, EmptyTableFindsNothing) {
  const PackedDeviceTable table;
  EXPECT_TRUE(table.empty());
  EXPECT_FALSE(table.Find("a").has_value());
  int visited = 0;
  table.ForEach([&](const SliceDevice&) { ++visited; });
  EXPECT_EQ(visited, 0);
}

}  // namespace
}  // namespace vfio_dra::slicepublisher
