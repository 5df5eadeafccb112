#include "sysfs/sysfs_parse.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace vfio_dra::sysfs {
namespace {

TEST(SysfsParse, HexAttributesInTheKernelsFormat) {
  EXPECT_EQ(*ParseHexAttribute("0x10de\n", 4), 0x10deu);
  EXPECT_EQ(*ParseHexAttribute("0x030000\n", 6), 0x030000u);
  EXPECT_EQ(*ParseHexAttribute("0xa1", 2), 0xa1u);
  EXPECT_FALSE(ParseHexAttribute("10de\n", 4).ok());
  EXPECT_FALSE(ParseHexAttribute("0x\n", 4).ok());
  EXPECT_FALSE(ParseHexAttribute("0x10dex\n", 4).ok());
  EXPECT_FALSE(ParseHexAttribute("0x110de\n", 4).ok());
  EXPECT_NE(ParseHexAttribute("garbage\x01", 4).error().message.find("\\x01"), std::string::npos);
}

TEST(SysfsParse, DecimalBareHexAndDriverOverride) {
  EXPECT_EQ(*ParseDecimalAttribute("-1\n"), -1);
  EXPECT_EQ(*ParseDecimalAttribute("64\n"), 64);
  EXPECT_FALSE(ParseDecimalAttribute("").ok());
  EXPECT_FALSE(ParseDecimalAttribute("-").ok());
  EXPECT_FALSE(ParseDecimalAttribute("1 2").ok());
  EXPECT_FALSE(ParseDecimalAttribute("99999999999999999999").ok());
  EXPECT_EQ(*ParseBareHex("154c\n", 4), 0x154cu);
  EXPECT_EQ(ParseDriverOverride("(null)\n"), "");
  EXPECT_EQ(ParseDriverOverride("vfio-pci\n"), "vfio-pci");
}

TEST(SysfsParse, PciModalias) {
  auto m = ParsePciModalias("pci:v000010DEd00002230sv000010DEsd00001459bc03sc02i00\n");
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_EQ(m->vendor, 0x10deu);
  EXPECT_EQ(m->device, 0x2230u);
  EXPECT_EQ(m->subsystem_vendor, 0x10deu);
  EXPECT_EQ(m->subsystem_device, 0x1459u);
  EXPECT_EQ(m->class_code, 0x030200u);
  EXPECT_EQ(m->text, "pci:v000010DEd00002230sv000010DEsd00001459bc03sc02i00");
  for (const char* bad :
       {"", "pci:v000010DE", "usb:v000010DEd00002230sv000010DEsd00001459bc03sc02i00",
        "pci:v000010ded00002230sv000010DEsd00001459bc03sc02i00",
        "pci:v000010DEd00002230sv000010DEsd00001459bc03sc02i00x",
        "pci:v000110DEd00002230sv000010DEsd00001459bc03sc02i00",
        "pci:v000010DEd0002230sv000010DEsd00001459bc03sc02i000"}) {
    auto parsed = ParsePciModalias(bad);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_THAT(parsed.error().message, ::testing::HasSubstr("expected pci:v")) << bad;
  }
}

TEST(SysfsParse, CanonicalBdfIncludingVmdDomains) {
  EXPECT_EQ(*CanonicalBdf("0000:3B:00.0"), "0000:3b:00.0");
  EXPECT_EQ(*CanonicalBdf("10000:01:00.0"), "10000:01:00.0");
  EXPECT_EQ(*CanonicalBdf("0001:00:1f.7"), "0001:00:1f.7");
  for (const char* bad : {"3b:00.0", "0000:3b:00", "0000:3b:20.0", "0000:3b:00.8", "0000:3b:0.0",
                          "0000:3b:00.0x", "000:3b:00.0", "0000:3b:00.0/..", ""}) {
    EXPECT_FALSE(CanonicalBdf(bad).ok()) << bad;
  }
}

TEST(SysfsParse, MdevUuid) {
  EXPECT_TRUE(IsMdevUuid("4b20d080-1b54-4048-85b3-a6a62d165c01"));
  EXPECT_FALSE(IsMdevUuid("4B20D080-1B54-4048-85B3-A6A62D165C01"));
  EXPECT_FALSE(IsMdevUuid("mdev_supported_types"));
  EXPECT_FALSE(IsMdevUuid("4b20d080-1b54-4048-85b3-a6a62d165c0"));
}

}  // namespace
}  // namespace vfio_dra::sysfs
