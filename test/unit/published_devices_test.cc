#include "slicepublisher/published_devices.h"

#include <gtest/gtest.h>

namespace vfio_dra::slicepublisher {
namespace {

DesiredPool PoolOf(const std::vector<std::string>& names) {
  DesiredPool pool;
  pool.name = "node-1";
  SliceContent slice;
  for (const std::string& name : names) {
    SliceDevice device;
    device.name = name;
    device.attributes["type"] = std::string("vf");
    device.attributes["resource.kubernetes.io/pciBusID"] = "0000:5e:02." + name;
    slice.devices.push_back(device);
  }
  pool.slices.push_back(slice);
  return pool;
}

// Compact repacks the devices without changing what readers see; a snapshot taken before stays
// valid and unchanged; a Set after it wins.
TEST(PublishedDevices, CompactKeepsTheContentAndSnapshotsTaken) {
  PublishedDevices published;
  published.Compact();  // before the first publish: nothing to repack, and no crash
  EXPECT_FALSE(published.Find("node-1", "a").has_value());
  published.Set(PoolOf({"a", "b"}));
  const PublishedDevices::Snapshot before = published.Current();
  published.Compact();
  const PublishedDevices::Snapshot after = published.Current();
  EXPECT_NE(before.devices.get(), after.devices.get()) << "a fresh copy";
  EXPECT_EQ(*before.devices, *after.devices);
  EXPECT_EQ(after.pool, "node-1");
  ASSERT_TRUE(published.Find("node-1", "b").has_value());
  EXPECT_EQ(published.Find("node-1", "b")->attributes.at("resource.kubernetes.io/pciBusID"),
            AttributeValue(std::string("0000:5e:02.b")));
  published.Set(PoolOf({"c"}));
  EXPECT_FALSE(published.Find("node-1", "a").has_value());
  EXPECT_TRUE(published.Find("node-1", "c").has_value());
  EXPECT_EQ(before.devices->size(), 2u);
}

// Counted when set, for the metrics; a device without a type counts as "unknown".
TEST(PublishedDevices, CountsDevicesByType) {
  PublishedDevices published;
  EXPECT_TRUE(published.CountByType().empty());
  DesiredPool pool = PoolOf({"a", "b"});
  SliceDevice untyped;
  untyped.name = "c";
  pool.slices.push_back(SliceContent{{untyped}, {}});
  published.Set(pool);
  EXPECT_EQ(published.CountByType(), (std::map<std::string, int>{{"vf", 2}, {"unknown", 1}}));
  EXPECT_EQ(published.Current().devices->size(), 3u);
}

}  // namespace
}  // namespace vfio_dra::slicepublisher
