// The `discover` command's output: every PCI function and mdev type of the node, what vfio-dra
// would publish it as, and why not where it would not. A table for people, JSON for tools.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>

#include "discovery/device_selection.h"
#include "discovery/inventory.h"

namespace vfio_dra::discovery {

struct DiscoverContext {
  std::string sysfs_root;
  std::string policy_source;
};

std::string DiscoverTable(const Inventory& inventory, const DeviceSelection& selection,
                          const DiscoverContext& context);
nlohmann::json DiscoverJson(const Inventory& inventory, const DeviceSelection& selection,
                            const DiscoverContext& context);

}  // namespace vfio_dra::discovery
