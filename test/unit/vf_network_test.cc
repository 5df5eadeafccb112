// VF network settings: what a restore writes back, when a wish is already met, MAC parsing, and
// the simulated kernel's VF state (the stand-in for rtnetlink in daemon tests), including a
// driver that refuses a setting.
#include "vfio/vf_network.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "sysfs/sysfs_reader.h"
#include "sysfs_fixture.h"

namespace vfio_dra::vfio {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

TEST(VfNetSettings, RestoreWritesBackOnlyWhatPrepareChangedAsTheDriverReportedIt) {
  VfNetSettings previous;
  previous.mac = "00:00:00:00:00:00";
  previous.vlan = 0;
  previous.qos = 0;
  previous.spoof_check = true;  // trust not reported by this driver
  VfNetSettings applied;
  applied.mac = "02:00:00:00:be:ef";
  applied.trust = true;
  const VfNetSettings restore = applied.RestoreFrom(previous);
  EXPECT_EQ(restore.mac, "00:00:00:00:00:00");
  EXPECT_FALSE(restore.vlan.has_value());         // never changed
  EXPECT_FALSE(restore.spoof_check.has_value());  // never changed
  EXPECT_FALSE(restore.trust.has_value());        // changed, but nothing known to restore
  EXPECT_EQ(restore.Display(), "mac 00:00:00:00:00:00");
}

TEST(VfNetSettings, AWishIsMetWhenEveryFieldItSetsIsThere) {
  VfNetSettings want;
  want.vlan = 42;
  want.trust = true;
  VfNetSettings current;
  current.mac = "02:00:00:00:00:01";
  current.vlan = 42;
  current.qos = 0;
  current.trust = true;
  EXPECT_TRUE(want.SatisfiedBy(current));
  current.trust = false;
  EXPECT_FALSE(want.SatisfiedBy(current));
  EXPECT_TRUE(VfNetSettings{}.SatisfiedBy(current));
  EXPECT_EQ(want.Display(), "vlan 42, trust on");
  EXPECT_EQ(VfNetSettings{}.Display(), "nothing");
}

// What still has to be written: only the differing fields, the VLAN tag as a whole.
TEST(VfNetSettings, WhatIsUnmetIsOnlyTheFieldsThatDiffer) {
  VfNetSettings want;
  want.mac = "02:00:00:00:00:01";
  want.vlan = 42;
  want.qos = 3;
  want.trust = false;
  VfNetSettings current;
  current.mac = "02:00:00:00:00:01";
  current.vlan = 42;
  current.qos = 0;
  current.trust = false;
  EXPECT_EQ(want.Unmet(current).Display(), "vlan 42 qos 3");
  current.qos = 3;
  EXPECT_TRUE(want.Unmet(current).Empty());
  current.mac = "02:00:00:00:00:02";
  current.trust = true;
  EXPECT_EQ(want.Unmet(current).Display(), "mac 02:00:00:00:00:01, trust off");
}

// A VLAN tag is one setting of three parts. A write fills the parts it does not ask for with what
// the VF has (untagged: no priority, 802.1Q); a restore brings the recorded tag back whole, and a
// VLAN recorded without a protocol (read through IFLA_VF_VLAN, or recorded before protocols
// were) was 802.1Q.
TEST(VfNetSettings, AVlanTagIsWrittenAndRestoredWhole) {
  VfNetSettings current;
  current.vlan = 10;
  current.qos = 5;
  current.vlan_proto = VlanProtocol::k8021ad;
  VfNetSettings want;
  want.vlan = 42;
  const VlanTag tag = want.TagOver(current);
  EXPECT_EQ(tag.vlan, 42);
  EXPECT_EQ(tag.qos, 5);
  EXPECT_EQ(tag.protocol, VlanProtocol::k8021ad);
  want.vlan = 0;
  const VlanTag untagged = want.TagOver(current);
  EXPECT_EQ(untagged.qos, 0);
  EXPECT_EQ(untagged.protocol, VlanProtocol::k8021Q);

  want.vlan = 10;
  EXPECT_TRUE(want.SatisfiedBy(current));
  want.vlan_proto = VlanProtocol::k8021Q;
  EXPECT_EQ(want.Unmet(current).Display(), "vlan 10");
  EXPECT_EQ(want.Unmet(current).vlan_proto, VlanProtocol::k8021Q);

  VfNetSettings applied;
  applied.vlan = 42;
  const VfNetSettings restore = applied.RestoreFrom(current);
  EXPECT_EQ(restore.Display(), "vlan 10 qos 5 proto 802.1ad");
  current.vlan_proto.reset();
  EXPECT_EQ(applied.RestoreFrom(current).vlan_proto, VlanProtocol::k8021Q);
  EXPECT_EQ(ParseVlanProtocol("802.1ad"), VlanProtocol::k8021ad);
  EXPECT_EQ(ParseVlanProtocol("802.1Q"), VlanProtocol::k8021Q);
  EXPECT_EQ(ParseVlanProtocol("qinq"), std::nullopt);
}

TEST(VfNetSettings, MacsAreNormalisedOrRefused) {
  EXPECT_EQ(NormalizeMac("02:AB:cd:00:00:0F"), "02:ab:cd:00:00:0f");
  EXPECT_EQ(NormalizeMac("02-ab-cd-00-00-0f"), std::nullopt);
  EXPECT_EQ(NormalizeMac("02:ab:cd:00:00"), std::nullopt);
  EXPECT_EQ(NormalizeMac("02:ab:cd:00:00:0g"), std::nullopt);
}

class FileVfNetworkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/vfio-dra-vfnet-XXXXXX";
    dir_ = mkdtemp(tmpl);
    fs::create_directories(dir_ + "/0000:5e:00.0");
    std::ofstream(dir_ + "/0000:5e:00.0/netdev") << "ens1f0\n";
    std::ofstream(dir_ + "/0000:5e:00.0/vf1.json")
        << R"({"mac":"00:00:00:00:00:00","vlan":0,"qos":0,"spoofchk":true,"trust":false})";
    network_ = MakeFileVfNetwork(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir_;
  std::unique_ptr<VfNetwork> network_;
  const VfLink vf1_{"0000:5e:00.0", 1};
};

TEST_F(FileVfNetworkTest, WritesWhatIsAskedAndReadsItBack) {
  auto before = network_->Read(vf1_);
  ASSERT_TRUE(before.ok()) << before.error().message;
  EXPECT_EQ(before->Display(), "mac 00:00:00:00:00:00, vlan 0 qos 0, spoofchk on, trust off");
  VfNetSettings want;
  want.mac = "02:00:00:00:be:ef";
  want.vlan = 42;
  want.qos = 3;
  want.trust = true;
  ASSERT_TRUE(network_->Write(vf1_, want).ok());
  auto after = network_->Read(vf1_);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->Display(), "mac 02:00:00:00:be:ef, vlan 42 qos 3, spoofchk on, trust on");
  ASSERT_TRUE(network_->Write(vf1_, want.RestoreFrom(*before)).ok());
  EXPECT_EQ(network_->Read(vf1_)->Display(), before->Display());
  EXPECT_EQ(*network_->PfNetdev(vf1_), "ens1f0");
}

// The simulated PF keeps a VLAN tag's protocol, as the kernel reports it (vlan_proto of
// IFLA_VF_VLAN_LIST): an 802.1ad tag reads back as one, and a write of the VLAN alone leaves the
// tag's priority and protocol as they were.
TEST_F(FileVfNetworkTest, ATagKeepsItsProtocolAndAVlanAloneKeepsThePriority) {
  std::ofstream(dir_ + "/0000:5e:00.0/vf1.json", std::ios::trunc)
      << R"({"mac":"00:00:00:00:00:00","vlan":10,"qos":5,"vlanProto":"802.1ad","spoofchk":true,
             "trust":false})";
  auto before = network_->Read(vf1_);
  ASSERT_TRUE(before.ok()) << before.error().message;
  EXPECT_EQ(before->Display(),
            "mac 00:00:00:00:00:00, vlan 10 qos 5 proto 802.1ad, spoofchk on, trust off");
  VfNetSettings want;
  want.vlan = 42;
  ASSERT_TRUE(network_->Write(vf1_, want).ok());
  EXPECT_EQ(network_->Read(vf1_)->Display(),
            "mac 00:00:00:00:00:00, vlan 42 qos 5 proto 802.1ad, spoofchk on, trust off");
}

TEST_F(FileVfNetworkTest, ARefusedSettingIsNamedAndTheOnesBeforeItStay) {
  std::ofstream(dir_ + "/0000:5e:00.0/unsupported") << "trust\n";
  VfNetSettings want;
  want.mac = "02:00:00:00:be:ef";
  want.trust = true;
  Status s = network_->Write(vf1_, want);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().kind, ErrorKind::kUnimplemented);
  EXPECT_THAT(s.error().message, HasSubstr("cannot set trust on VF 1 of 0000:5e:00.0"));
  EXPECT_EQ(network_->Read(vf1_)->mac, "02:00:00:00:be:ef");
}

TEST_F(FileVfNetworkTest, AVfThatDoesNotExistIsNotFound) {
  auto read = network_->Read({"0000:5e:00.0", 7});
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.error().kind, ErrorKind::kNotFound);
  EXPECT_THAT(read.error().message, HasSubstr("VF 7 of 0000:5e:00.0 does not exist"));
  EXPECT_EQ(network_->Write({"0000:5e:00.0", 7}, VfNetSettings{{}, 5, {}, {}, {}, {}}).error().kind,
            ErrorKind::kNotFound);
  EXPECT_EQ(network_->PfNetdev({"0000:99:00.0", 0}).error().kind, ErrorKind::kNotFound);
}

// The kernel's VfNetwork finds a PCI PF's netdev through sysfs first: a PF without a net/
// directory (its own or a child device's, as virtio-net has) has no netdev, which is said without
// asking the kernel; a name sysfs lists that is not the PF's in the target namespace (here: no such
// link on this machine), or an empty net/ (a sysfs of another namespace), falls back to listing
// every link, which finds none either (PCI domain ffff exists on no machine). Only reads: nothing
// is changed on this machine.
TEST(NetlinkVfNetwork, APciPfWithoutANetDirectoryHasNoNetdevAndAStaleNameFallsBackToTheListing) {
  char tmpl[] = "/tmp/vfio-dra-vfnet-sysfs-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  {
    testing::SysfsFixture fx(dir);
    fx.AddPci(testing::MakePciSpec("ffff:5e:00.0", 0x8086, 0x1572, 0x020000, "i40e", 50));
    fx.AddPci(testing::MakePciSpec("ffff:5f:00.0", 0x8086, 0x1572, 0x020000, "i40e", 51));
    fx.WriteFile("bus/pci/devices/ffff:5f:00.0/net/vfio-dra-gone0/ifindex", "9999\n");
    // virtio-net's netdev hangs off the virtio device under the PCI function.
    fx.AddPci(testing::MakePciSpec("ffff:60:00.0", 0x1af4, 0x1041, 0x020000, "virtio-pci", 52));
    fx.WriteFile("bus/pci/devices/ffff:60:00.0/virtio0/net/vfio-dra-gone1/ifindex", "9998\n");
    // What a sysfs mounted in another network namespace shows: the net/ directory, empty.
    fx.AddPci(testing::MakePciSpec("ffff:61:00.0", 0x8086, 0x1572, 0x020000, "i40e", 53));
    std::filesystem::create_directories(dir + "/bus/pci/devices/ffff:61:00.0/net");
    sysfs::SysfsReader sysfs(dir);
    auto network = MakeNetlinkVfNetwork("", &sysfs);

    auto none = network->Read({"ffff:5e:00.0", 0});
    ASSERT_FALSE(none.ok());
    EXPECT_EQ(none.error().kind, ErrorKind::kNotFound);
    EXPECT_THAT(none.error().message,
                HasSubstr("PCI device ffff:5e:00.0 has no network interface"));

    auto stale = network->PfNetdev({"ffff:5f:00.0", 0});
    ASSERT_FALSE(stale.ok());
    EXPECT_EQ(stale.error().kind, ErrorKind::kNotFound);
    EXPECT_THAT(stale.error().message, HasSubstr("no network interface belongs to ffff:5f:00.0"));

    auto child = network->PfNetdev({"ffff:60:00.0", 0});
    ASSERT_FALSE(child.ok());
    EXPECT_THAT(child.error().message, HasSubstr("no network interface belongs to ffff:60:00.0"))
        << "a netdev of a child device is not taken for none";

    auto elsewhere = network->PfNetdev({"ffff:61:00.0", 0});
    ASSERT_FALSE(elsewhere.ok());
    EXPECT_THAT(elsewhere.error().message,
                HasSubstr("no network interface belongs to ffff:61:00.0"))
        << "an empty net/ (another namespace's view) is not taken for none";
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace vfio_dra::vfio
