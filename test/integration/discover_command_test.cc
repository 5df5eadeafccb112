// `vfio-dra-plugin discover` on every fixture node (golden tables under test/golden/discover),
// its JSON form, policy errors, and a read-only run on this machine's real /sys.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "integration/daemon_process.h"
#include "simulated_kernel.h"
#include "sysfs_fixture.h"

namespace vfio_dra::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string ReplaceAll(std::string text, const std::string& from, const std::string& to) {
  for (size_t pos = 0; (pos = text.find(from, pos)) != std::string::npos; pos += to.size()) {
    text.replace(pos, from.size(), to);
  }
  return text;
}

class DiscoverCommandTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/vfio-dra-discover-XXXXXX";
    dir_ = mkdtemp(tmpl);
    WritePciIds(dir_ + "/pci.ids");
    // The privilege check sees a /dev with VFIO and every capability, whatever this machine has.
    std::filesystem::create_directories(dir_ + "/dev/vfio");
    std::ofstream(dir_ + "/status") << "CapEff:\t000001ffffffffff\n";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  CommandResult Discover(const std::vector<std::string>& extra) {
    std::vector<std::string> args = {
        VFIO_DRA_PLUGIN_BINARY, "discover",   "--sysfs-root", dir_ + "/sys",      "--pci-ids",
        dir_ + "/pci.ids",      "--dev-root", dir_ + "/dev",  "--process-status", dir_ + "/status"};
    args.insert(args.end(), extra.begin(), extra.end());
    AddModulesAlias(args);
    return RunCommand(args, std::chrono::seconds(30));
  }
  // Fixtures with variant drivers state the kernel's module aliases; others have none.
  void AddModulesAlias(std::vector<std::string>& args) const {
    const std::string aliases = ModulesAliasFile(dir_ + "/sys");
    if (std::filesystem::exists(aliases)) args.insert(args.end(), {"--modules-alias", aliases});
  }
  std::string dir_;
};

TEST_P(DiscoverCommandTest, TableMatchesTheGoldenFile) {
  ASSERT_TRUE(BuildFixture(GetParam(), dir_ + "/sys"));
  CommandResult result = Discover({});
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const std::string actual = ReplaceAll(result.output, dir_, "<dir>");
  const std::string golden =
      std::string(VFIO_DRA_SOURCE_DIR) + "/test/golden/discover/" + GetParam() + ".txt";
  if (std::getenv("UPDATE_GOLDEN") != nullptr) {
    std::ofstream(golden, std::ios::trunc) << actual;
  }
  EXPECT_EQ(actual, ReadAll(golden)) << "regenerate with UPDATE_GOLDEN=1 after checking the diff";
}

TEST_P(DiscoverCommandTest, JsonAgreesWithTheTable) {
  ASSERT_TRUE(BuildFixture(GetParam(), dir_ + "/sys"));
  CommandResult table = Discover({});
  CommandResult json_out = Discover({"-o", "json"});
  ASSERT_EQ(json_out.exit_code, 0);
  auto json = nlohmann::json::parse(json_out.output, nullptr, false);
  ASSERT_FALSE(json.is_discarded()) << json_out.output;
  int published = 0;
  int vgpu_vfs = 0;  // NVIDIA vGPU VFs are counted apart: they are not handed out as PCI devices
  for (const auto& fn : json["functions"]) {
    if (fn["published"].get<bool>()) ++(fn.value("kind", "") == "vgpu" ? vgpu_vfs : published);
    EXPECT_NE(table.output.find(fn["address"].get<std::string>()), std::string::npos);
  }
  EXPECT_THAT(table.output, HasSubstr("Published: " + std::to_string(published) + " PCI device"));
  if (vgpu_vfs > 0) {
    EXPECT_THAT(table.output, HasSubstr("; " + std::to_string(vgpu_vfs) + " vGPU VF"));
  }
}

TEST_P(DiscoverCommandTest, SlicesMatchTheGoldenFileForEachRelease) {
  ASSERT_TRUE(BuildFixture(GetParam(), dir_ + "/sys"));
  for (const std::string release : {"1.34", "1.35", "1.36"}) {
    std::vector<std::string> args = {VFIO_DRA_PLUGIN_BINARY,
                                     "slices",
                                     "--sysfs-root",
                                     dir_ + "/sys",
                                     "--pci-ids",
                                     dir_ + "/pci.ids",
                                     "--node-name",
                                     "node-1",
                                     "--kubernetes-version",
                                     release,
                                     "-o",
                                     "json",
                                     "--plugin-data-dir",
                                     dir_ + "/data"};
    AddModulesAlias(args);
    CommandResult result = RunCommand(args, std::chrono::seconds(30));
    ASSERT_EQ(result.exit_code, 0) << result.output;
    auto list = nlohmann::json::parse(result.output, nullptr, false);
    ASSERT_FALSE(list.is_discarded()) << result.output;
    EXPECT_EQ(list["apiVersion"], "v1");
    EXPECT_EQ(list["kind"], "List");
    for (const auto& item : list["items"]) {
      EXPECT_EQ(item["spec"]["pool"]["resourceSliceCount"], list["items"].size());
    }
    const std::string golden = std::string(VFIO_DRA_SOURCE_DIR) + "/test/golden/slices/" +
                               GetParam() + "-" + release + ".json";
    if (std::getenv("UPDATE_GOLDEN") != nullptr) {
      std::ofstream(golden, std::ios::trunc) << result.output;
    }
    EXPECT_EQ(result.output, ReadAll(golden)) << release;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, DiscoverCommandTest, ::testing::ValuesIn(FixtureNames()));

// What the plugin would lack is a section of the table, one line per missing privilege as `serve`
// logs it, and a list in the JSON form.
TEST_F(DiscoverCommandTest, ShowsEachMissingPrivilegeInTheTableAndTheJson) {
  ASSERT_TRUE(BuildFixture("sriov", dir_ + "/sys"));
  std::ofstream(dir_ + "/status") << "CapEff:\t000001ffffffefff\n";  // no CAP_NET_ADMIN
  const std::string line =
      "privilege missing: CAP_NET_ADMIN for VF network settings (MAC, VLAN, trust): the "
      "capability is not in the plugin's effective set (CapEff 000001ffffffefff); grant it with "
      "the Helm value sriovNetwork.enabled=true (hostNetwork and NET_ADMIN)";
  CommandResult table = Discover({});
  ASSERT_EQ(table.exit_code, 0) << table.output;
  EXPECT_THAT(
      table.output,
      HasSubstr("\nPrivileges for the features of these devices: 1 missing\n  " + line + "\n"));
  CommandResult json_out = Discover({"-o", "json"});
  ASSERT_EQ(json_out.exit_code, 0) << json_out.output;
  auto json = nlohmann::json::parse(json_out.output, nullptr, false);
  ASSERT_FALSE(json.is_discarded()) << json_out.output;
  ASSERT_EQ(json["missingPrivileges"].size(), 1u) << json_out.output;
  EXPECT_EQ(json["missingPrivileges"][0]["feature"], "vf-network");
  EXPECT_EQ(json["missingPrivileges"][0]["privilege"], "CAP_NET_ADMIN");
  EXPECT_EQ(json["missingPrivileges"][0]["message"], line);
}

TEST(SlicesCommand, TheV1beta1ShapeAndYaml) {
  char tmpl[] = "/tmp/vfio-dra-slices-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  BuildFixture("workstation", dir + "/sys");
  CommandResult beta = RunCommand(
      {VFIO_DRA_PLUGIN_BINARY, "slices", "--sysfs-root", dir + "/sys", "--node-name", "node-1",
       "--api-version", "v1beta1", "--kubernetes-version", "1.32", "-o", "json"},
      std::chrono::seconds(30));
  ASSERT_EQ(beta.exit_code, 0) << beta.output;
  auto list = nlohmann::json::parse(beta.output);
  const auto& device = list["items"][0]["spec"]["devices"][0];
  EXPECT_EQ(list["items"][0]["apiVersion"], "resource.k8s.io/v1beta1");
  EXPECT_TRUE(device.contains("basic"));
  EXPECT_EQ(device["basic"]["attributes"]["resource.kubernetes.io/pciBusID"]["string"],
            "0000:01:00.0");
  CommandResult yaml = RunCommand(
      {VFIO_DRA_PLUGIN_BINARY, "slices", "--sysfs-root", dir + "/sys", "--node-name", "node-1"},
      std::chrono::seconds(30));
  EXPECT_EQ(yaml.exit_code, 0);
  EXPECT_THAT(yaml.output, HasSubstr("kind: \"ResourceSlice\""));
  CommandResult bad = RunCommand({VFIO_DRA_PLUGIN_BINARY, "slices", "--sysfs-root", dir + "/sys",
                                  "--node-name", "node-1", "--kubernetes-version", "two"},
                                 std::chrono::seconds(30));
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.output, HasSubstr("--kubernetes-version"));
  std::filesystem::remove_all(dir);
}

TEST(DiscoverCommand, PolicyFileErrorsNameFileAndLine) {
  char tmpl[] = "/tmp/vfio-dra-policy-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  std::ofstream(dir + "/policy.yaml") << "select:\n  - kind: hostdev\n    vendor: 12345\n";
  CommandResult result = RunCommand({VFIO_DRA_PLUGIN_BINARY, "discover", "--sysfs-root",
                                     dir + "/nosys", "--config", dir + "/policy.yaml"},
                                    std::chrono::seconds(30));
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_THAT(result.output, HasSubstr(dir + "/policy.yaml:3: select[0].vendor"));
  std::filesystem::remove_all(dir);
}

TEST(DiscoverCommand, AMissingSysfsRootIsReportedNotFatal) {
  CommandResult result =
      RunCommand({VFIO_DRA_PLUGIN_BINARY, "discover", "--sysfs-root", "/nonexistent-sysfs"},
                 std::chrono::seconds(30));
  EXPECT_EQ(result.exit_code, 0);
  EXPECT_THAT(result.output,
              HasSubstr("no PCI devices: cannot list /nonexistent-sysfs/bus/pci/devices"));
}

// discover only reads: a declared vGPU layout is what the daemon makes, never the command.
TEST(DiscoverCommand, ADeclaredVgpuLayoutIsNotMadeByDiscover) {
  char tmpl[] = "/tmp/vfio-dra-discover-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  ASSERT_TRUE(BuildFixture("vgpu-vf", dir + "/sys"));
  std::ofstream(dir + "/policy.yaml")
      << "vgpuLayouts:\n  - match: {address: \"0000:41:00.0\"}\n    vgpuType: \"1414\"\n"
         "    count: 2\n";
  CommandResult result = RunCommand({VFIO_DRA_PLUGIN_BINARY, "discover", "--sysfs-root",
                                     dir + "/sys", "--config", dir + "/policy.yaml"},
                                    std::chrono::seconds(30));
  EXPECT_EQ(result.exit_code, 0) << result.output;
  for (const char* vf : {"0000:41:00.4", "0000:41:00.5"}) {
    std::ifstream in(dir + "/sys/bus/pci/devices/" + vf + "/nvidia/current_vgpu_type");
    std::string type;
    std::getline(in, type);
    EXPECT_EQ(type, "0") << vf;
  }
  std::filesystem::remove_all(dir);
}

// Admins run discover when a device is stuck: another process (a daemon whose unbind waits for a
// VM) holds the audio function's device lock. The command still answers, shows the overrides it
// can read, and says which one it could not.
TEST(DiscoverCommand, AFunctionAnotherProcessIsStuckOnIsReportedAndTheCommandAnswers) {
  char tmpl[] = "/tmp/vfio-dra-discover-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  ASSERT_TRUE(BuildFixture("workstation", dir + "/sys"));
  std::ofstream(dir + "/sys/bus/pci/devices/0000:02:00.0/driver_override", std::ios::trunc)
      << "vfio-pci\n";
  SimulatedKernel other_process(dir + "/sys", dir + "/dev");
  other_process.HangUnbind("0000:01:00.1");
  auto stuck = std::async(std::launch::async, [&] {
    return other_process.Write(dir + "/sys/bus/pci/drivers/snd_hda_intel/unbind", "0000:01:00.1");
  });
  ASSERT_TRUE(other_process.WaitUntilHanging(1, std::chrono::seconds(30)));
  CommandResult result =
      RunCommand({VFIO_DRA_PLUGIN_BINARY, "discover", "--sysfs-root", dir + "/sys", "-o", "json"},
                 std::chrono::seconds(60));
  other_process.ReleaseHangs();
  EXPECT_EQ(stuck.get(), 0);
  other_process.WaitIdle();
  ASSERT_EQ(result.exit_code, 0) << result.output;
  auto report = nlohmann::json::parse(result.output, nullptr, false);
  ASSERT_FALSE(report.is_discarded()) << result.output;
  std::map<std::string, std::string> overrides;
  for (const auto& fn : report["functions"]) {
    overrides[fn["address"].get<std::string>()] = fn["driverOverride"].get<std::string>();
  }
  ASSERT_EQ(overrides.count("0000:02:00.0"), 1u);
  EXPECT_EQ(overrides["0000:02:00.0"], "vfio-pci") << "read, after the stuck function";
  EXPECT_EQ(overrides.count("0000:01:00.1"), 1u) << "the stuck function is still listed";
  std::string warnings;
  for (const auto& w : report["warnings"]) warnings += w.get<std::string>() + "\n";
  EXPECT_THAT(warnings, Not(HasSubstr("0000:01:00.0"))) << "the GPU's override was read";
  EXPECT_THAT(warnings,
              HasSubstr("PCI function 0000:01:00.1 is shown without its driver_override"));
  EXPECT_THAT(warnings, HasSubstr("the kernel holds the device's lock"));
  std::filesystem::remove_all(dir);
}

// Reads this machine's real /sys (read only: discover has no code path that writes; its privilege
// check opens attributes for writing and closes them unwritten, which sysfs does not act on).
// This machine's /sys is never opened for writing (the project's rule): --no-write-probes.
TEST(DiscoverCommand, RunsOnThisMachinesRealSysfs) {
  CommandResult result = RunCommand({VFIO_DRA_PLUGIN_BINARY, "discover", "--no-write-probes"},
                                    std::chrono::seconds(30));
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_THAT(result.output, HasSubstr("Node devices (sysfs root /sys"));
  EXPECT_THAT(result.output, HasSubstr("Published: "));
  EXPECT_THAT(result.output, HasSubstr("(sysfs write access not probed: --no-write-probes)"));
  CommandResult json =
      RunCommand({VFIO_DRA_PLUGIN_BINARY, "discover", "--no-write-probes", "-o", "json"},
                 std::chrono::seconds(30));
  EXPECT_EQ(json.exit_code, 0);
  EXPECT_FALSE(nlohmann::json::parse(json.output, nullptr, false).is_discarded());
}

}  // namespace
}  // namespace vfio_dra::testing
