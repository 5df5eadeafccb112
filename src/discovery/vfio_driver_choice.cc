#include "discovery/vfio_driver_choice.h"

#include <algorithm>

namespace vfio_dra::discovery {
namespace {

constexpr const char* kVfioPci = "vfio-pci";

// The driver name a module or driver name stands for, if that driver is registered now.
std::optional<std::string> RegisteredDriver(const std::string& name,
                                            const sysfs::SysfsReader& sysfs) {
  if (sysfs.IsDirectory("bus/pci/drivers/" + name)) return name;
  std::string module = name;
  std::replace(module.begin(), module.end(), '-', '_');
  if (auto entries = sysfs.List("module/" + module + "/drivers"); entries.ok()) {
    for (const std::string& entry : *entries) {
      if (entry.rfind("pci:", 0) == 0) return entry.substr(4);
    }
  }
  std::string dashed = name;
  std::replace(dashed.begin(), dashed.end(), '_', '-');
  if (sysfs.IsDirectory("bus/pci/drivers/" + dashed)) return dashed;
  return std::nullopt;
}

}  // namespace

VfioDriverChoice VfioDriverChooser::Choose(const PciFunction& fn,
                                           const sysfs::SysfsReader& sysfs) const {
  VfioDriverChoice choice;
  std::string wanted;
  for (const VfioDriverRule& rule : rules_) {
    if (rule.match.MatchesFunction(fn)) {
      wanted = rule.use;
      choice.source = VfioDriverChoice::Source::kPolicy;
      choice.why = "policy " + rule.match.where;
      break;
    }
  }
  if (wanted.empty() && !fn.modalias.empty()) {
    // vfio_pci's own catch-all alias means no variant: plain vfio-pci.
    if (auto module = aliases_.BestModule(fn.modalias); module && *module != "vfio_pci") {
      wanted = *module;
      choice.module = *module;
      choice.source = VfioDriverChoice::Source::kModuleAlias;
      choice.why = "module alias of " + *module;
    }
  }
  if (wanted.empty()) wanted = kVfioPci;
  if (auto driver = RegisteredDriver(wanted, sysfs)) {
    choice.driver = *driver;
  } else {
    choice.driver = wanted;
    choice.loaded = false;
  }
  return choice;
}

bool IsVfioDriverFor(const PciFunction& fn, const std::string& driver) {
  return !driver.empty() && (driver == kVfioPci || driver == fn.vfio_driver.driver);
}

}  // namespace vfio_dra::discovery
