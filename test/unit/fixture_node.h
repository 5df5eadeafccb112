// FixtureNode: a named fake sysfs tree in a temporary directory, with the test pci.ids, scanned
// into an Inventory; removed when the test ends.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "discovery/inventory_scanner.h"
#include "discovery/pci_names.h"
#include "sysfs_fixture.h"

namespace vfio_dra::testing {

class FixtureNode {
 public:
  explicit FixtureNode(const std::string& name) {
    char tmpl[] = "/tmp/vfio-dra-fixture-XXXXXX";
    dir_ = mkdtemp(tmpl);
    if (!name.empty()) BuildFixture(name, sysfs_root());
    WritePciIds(pci_ids());
  }
  ~FixtureNode() { std::filesystem::remove_all(dir_); }
  FixtureNode(const FixtureNode&) = delete;
  FixtureNode& operator=(const FixtureNode&) = delete;

  std::string sysfs_root() const { return dir_ + "/sys"; }
  std::string pci_ids() const { return dir_ + "/pci.ids"; }
  const std::string& dir() const { return dir_; }

  discovery::Inventory Scan() const {
    sysfs::SysfsReader sysfs(sysfs_root());
    auto names = discovery::PciNames::Open({sysfs_root(), pci_ids(), false});
    return discovery::ScanInventory(sysfs, names.ok() ? names->get() : nullptr);
  }

 private:
  std::string dir_;
};

}  // namespace vfio_dra::testing
