// Choosing the VFIO driver of a function: the kernel's vfio_pci module aliases, the admin's
// vfioDrivers rules, and the module-to-driver resolution through /sys/module.
#include "discovery/vfio_driver_choice.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "discovery/inventory_scanner.h"
#include "sysfs/vfio_aliases.h"
#include "unit/fixture_node.h"

namespace vfio_dra::discovery {
namespace {

using ::testing::HasSubstr;
using vfio_dra::testing::FixtureNode;
using vfio_dra::testing::ModulesAliasFile;

constexpr const char* kConnectX7Vf = "pci:v000015B3d0000101Esv000015B3sd00000001bc02sc00i00";

TEST(VfioAliases, ReadsOnlyTheVfioPciLinesAndPrefersTheMostSpecificPattern) {
  auto aliases = sysfs::VfioAliases::Parse(
      "# Aliases extracted from modules themselves.\n"
      "alias pci:v000015B3d0000101Esv*sd*bc*sc*i* mlx5_core\n"
      "alias vfio_pci:v*d*sv*sd*bc*sc*i* vfio_pci\n"
      "alias vfio_pci:v000015B3d*sv*sd*bc*sc*i* some_mlx_vfio_pci\n"
      "alias vfio_pci:v000015B3d0000101Esv*sd*bc*sc*i* mlx5_vfio_pci\n",
      "modules.alias");
  ASSERT_TRUE(aliases.ok()) << aliases.error().message;
  EXPECT_EQ(aliases->entries().size(), 3u);
  EXPECT_EQ(aliases->BestModule(std::string(kConnectX7Vf) + "\n"), "mlx5_vfio_pci");
  EXPECT_EQ(aliases->BestModule("pci:v000015B3d00001021sv000015B3sd00000001bc02sc00i00"),
            "some_mlx_vfio_pci");
  EXPECT_EQ(aliases->BestModule("pci:v00008086d00001572sv00008086sd00000000bc02sc00i00"),
            "vfio_pci");
  EXPECT_EQ(aliases->BestModule("virtio:d00000001v00001AF4"), std::nullopt);
  EXPECT_EQ(sysfs::VfioAliases().BestModule(kConnectX7Vf), std::nullopt);
}

TEST(VfioAliases, AMalformedLineIsAnErrorNamingItAndAMissingFileIsEmpty) {
  auto bad = sysfs::VfioAliases::Parse("alias x y\nalias vfio_pci:v000015B3d*\n", "m.alias");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.error().message, HasSubstr("m.alias:2"));
  auto missing = sysfs::VfioAliases::Load("/nonexistent/modules.alias");
  ASSERT_TRUE(missing.ok());
  EXPECT_TRUE(missing->empty());
}

TEST(VfioDriverPolicy, RulesParseAndBadOnesNameTheirKey) {
  auto policy = ParseAdminPolicy(
      "vfioDrivers:\n"
      "  - match: {vendor: \"15b3\", device: \"101e\"}\n"
      "    use: vfio-pci\n"
      "  - match: {}\n"
      "    use: vfio-pci\n",
      "policy.yaml");
  ASSERT_TRUE(policy.ok()) << policy.error().message;
  ASSERT_EQ(policy->vfio_drivers.size(), 2u);
  EXPECT_EQ(policy->vfio_drivers[0].use, "vfio-pci");
  EXPECT_EQ(policy->vfio_drivers[0].match.vendors.count(0x15b3), 1u);
  const std::pair<const char*, const char*> cases[] = {
      {"vfioDrivers:\n  - match: {vendor: \"15b3\"}\n    use: ../../x\n",
       "policy.yaml:3: vfioDrivers[0].use"},
      {"vfioDrivers:\n  - use: vfio-pci\n", "vfioDrivers[0].match: is required"},
      {"vfioDrivers:\n  - match: {vendor: \"15b3\"}\n", "vfioDrivers[0].use: is required"},
      {"vfioDrivers:\n  - match: {mdevType: nvidia-222}\n    use: vfio-pci\n",
       "vfioDrivers[0].match.mdevType"},
      {"vfioDrivers:\n  - match: {vendor: \"15b3\"}\n    driver: vfio-pci\n",
       "vfioDrivers[0].driver: unknown key (known: match, use)"},
  };
  for (const auto& [yaml, expected] : cases) {
    auto bad = ParseAdminPolicy(yaml, "policy.yaml");
    ASSERT_FALSE(bad.ok()) << yaml;
    EXPECT_THAT(bad.error().message, HasSubstr(expected)) << yaml;
  }
}

class VfioDriverChooserTest : public ::testing::Test {
 protected:
  VfioDriverChoice Choose(const std::string& address, std::vector<VfioDriverRule> rules = {}) {
    auto aliases = sysfs::VfioAliases::Load(ModulesAliasFile(node_.sysfs_root()));
    EXPECT_TRUE(aliases.ok());
    const VfioDriverChooser chooser(std::move(*aliases), std::move(rules));
    sysfs::SysfsReader sysfs(node_.sysfs_root());
    auto fn = ReadPciFunction(sysfs, address);
    EXPECT_TRUE(fn.ok());
    return chooser.Choose(*fn, sysfs);
  }
  FixtureNode node_{"variant"};
};

TEST_F(VfioDriverChooserTest, TheAliasNamesAModuleThatIsResolvedToItsDriver) {
  const VfioDriverChoice gpu = Choose("0000:01:00.0");
  EXPECT_EQ(gpu.driver, "nvgrace-gpu-vfio-pci");
  EXPECT_EQ(gpu.module, "nvgrace_gpu_vfio_pci");
  EXPECT_EQ(gpu.source, VfioDriverChoice::Source::kModuleAlias);
  EXPECT_TRUE(gpu.loaded);
  const VfioDriverChoice vf = Choose("0000:6e:02.0");
  EXPECT_EQ(vf.driver, "pds_vfio_pci");
  EXPECT_FALSE(vf.loaded);
  // vfio_pci's catch-all alias is no variant.
  const VfioDriverChoice disk = Choose("0000:02:00.0");
  EXPECT_EQ(disk.driver, "vfio-pci");
  EXPECT_EQ(disk.source, VfioDriverChoice::Source::kDefault);
}

TEST_F(VfioDriverChooserTest, TheFirstMatchingPolicyRuleWins) {
  auto policy = ParseAdminPolicy(
      "vfioDrivers:\n"
      "  - match: {address: \"0000:01:00.0\"}\n"
      "    use: vfio_pci\n"
      "  - match: {}\n"
      "    use: mlx5_vfio_pci\n",
      "policy.yaml");
  ASSERT_TRUE(policy.ok()) << policy.error().message;
  const VfioDriverChoice gpu = Choose("0000:01:00.0", policy->vfio_drivers);
  EXPECT_EQ(gpu.driver, "vfio-pci");  // the module name, resolved to the driver
  EXPECT_EQ(gpu.source, VfioDriverChoice::Source::kPolicy);
  EXPECT_EQ(gpu.why, "policy vfioDrivers[0].match");
  EXPECT_EQ(Choose("0000:6e:02.0", policy->vfio_drivers).driver, "mlx5_vfio_pci");
}

}  // namespace
}  // namespace vfio_dra::discovery
