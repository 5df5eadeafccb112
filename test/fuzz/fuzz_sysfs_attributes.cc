// sysfs attribute contents (and modules.alias): every parser directly, then the input as the
// content of one attribute (chosen by the first byte) of a realistic node, read by the real
// scanner, VFIO driver choice and selection. The node is built once in a temporary directory; the
// attribute is restored after each input.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "discovery/admin_policy.h"
#include "discovery/inventory_scanner.h"
#include "discovery/node_scan.h"
#include "sysfs/sysfs_parse.h"
#include "sysfs/sysfs_reader.h"
#include "sysfs/vfio_aliases.h"
#include "sysfs_fixture.h"

namespace {

namespace fs = std::filesystem;

struct Node {
  std::string root;
  std::vector<std::pair<std::string, std::string>> attributes;  // path, original content
};

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

Node& TheNode() {
  static Node* node = [] {
    auto* n = new Node;
    char tmpl[] = "/tmp/vfio-dra-fuzz-sysfs-XXXXXX";
    n->root = std::string(mkdtemp(tmpl)) + "/sys";
    vfio_dra::testing::BuildFixture("vm-host", n->root);
    const std::string gpu = n->root + "/bus/pci/devices/0000:01:00.0/";
    const std::string vf = n->root + "/bus/pci/devices/0000:5e:02.1/";
    const std::string type =
        n->root + "/class/mdev_bus/0000:3b:00.0/mdev_supported_types/nvidia-222/";
    for (const std::string& path :
         {gpu + "vendor", gpu + "device", gpu + "class", gpu + "modalias", gpu + "numa_node",
          gpu + "driver_override", vf + "sriov_numvfs", vf + "modalias", vf + "class",
          type + "available_instances", type + "device_api", type + "name"}) {
      if (fs::exists(path)) n->attributes.emplace_back(path, Slurp(path));
    }
    return n;
  }();
  return *node;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace vfio_dra::sysfs;
  using vfio_dra::discovery::AdminPolicy;
  using vfio_dra::discovery::ScanNode;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  (void)ParseHexAttribute(text, 4);
  (void)ParseHexAttribute(text, 6);
  (void)ParseDecimalAttribute(text);
  (void)ParsePciModalias(text);
  (void)ParseDriverOverride(text);
  (void)ParseBareHex(text, 4);
  (void)CanonicalBdf(text);
  (void)PcieRootFromPath(text);
  (void)IsMdevUuid(text);
  (void)ParseMdevMaxInstance(text);
  (void)ParseCreatableVgpuTypes(text);
  (void)IsDriverName(text);
  // The input as a modules.alias, and as a modalias against the kernel's kind of table.
  if (auto aliases = VfioAliases::Parse(text, "fuzz"); aliases.ok()) {
    (void)aliases->BestModule("pci:v000015B3d0000101Esv000015B3sd00000001bc02sc00i00");
  }
  static const VfioAliases kAliases = *VfioAliases::Parse(
      "alias vfio_pci:v*d*sv*sd*bc*sc*i* vfio_pci\n"
      "alias vfio_pci:v000010DEd*sv*sd*bc03sc*i* nvgrace_gpu_vfio_pci\n",
      "aliases");
  (void)kAliases.BestModule(text);

  if (size == 0) return 0;
  Node& node = TheNode();
  const auto& [path, original] = node.attributes[data[0] % node.attributes.size()];
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data + 1), static_cast<std::streamsize>(size - 1));
  SysfsReader sysfs(node.root);
  // With a chooser, so that the (fuzzed) uevent's MODALIAS goes through the alias match too.
  static const vfio_dra::discovery::VfioDriverChooser kChooser(kAliases, {});
  vfio_dra::discovery::ScanContext context;
  context.vfio_drivers = &kChooser;
  (void)ScanNode(sysfs, nullptr, AdminPolicy{}, context);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << original;
  return 0;
}
