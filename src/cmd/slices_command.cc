#include "cmd/slices_command.h"

#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <nlohmann/json.hpp>

#include "base/k8s_names.h"
#include "cmd/device_sources.h"
#include "discovery/admin_policy.h"
#include "discovery/node_scan.h"
#include "discovery/vgpu_gpu_sizes_file.h"
#include "slicepublisher/publishable_pool.h"
#include "slicepublisher/server_profile.h"
#include "slicepublisher/slice_json.h"

namespace vfio_dra::cmd {
namespace {

void EmitYaml(YAML::Emitter& out, const nlohmann::json& value) {
  if (value.is_object()) {
    out << YAML::BeginMap;
    for (const auto& [key, item] : value.items()) {
      out << YAML::Key << key << YAML::Value;
      EmitYaml(out, item);
    }
    out << YAML::EndMap;
  } else if (value.is_array()) {
    out << YAML::BeginSeq;
    for (const auto& item : value) EmitYaml(out, item);
    out << YAML::EndSeq;
  } else if (value.is_string()) {
    out << YAML::DoubleQuoted << value.get<std::string>();
  } else if (value.is_boolean()) {
    out << value.get<bool>();
  } else if (value.is_number_integer()) {
    out << value.get<int64_t>();
  } else if (value.is_null()) {
    out << YAML::Null;
  } else {
    out << value.dump();
  }
}

int Fail(const std::string& message) {
  std::cerr << "vfio-dra-plugin slices: " << message << std::endl;
  return 1;
}

}  // namespace

int RunSlices(SlicesOptions options) {
  if (options.node_name.empty()) {
    if (const char* env = std::getenv("NODE_NAME"); env != nullptr) options.node_name = env;
  }
  if (options.node_name.empty()) {
    char host[256] = {};
    if (::gethostname(host, sizeof host - 1) == 0) options.node_name = host;
  }
  if (!IsDnsSubdomain(options.node_name)) {
    std::cerr << "vfio-dra-plugin slices: --node-name: \"" << options.node_name
              << "\" is not a lower-case DNS subdomain" << std::endl;
    return 2;
  }
  auto minor = slicepublisher::ParseKubernetesMinor(options.kubernetes_version);
  if (!minor.ok()) {
    std::cerr << "vfio-dra-plugin slices: --kubernetes-version: " << minor.error().message
              << std::endl;
    return 2;
  }
  auto sources = OpenDeviceSources(
      {options.config_file, options.sysfs_root, options.pci_ids, options.modules_alias});
  if (!sources.ok()) return Fail(sources.error().message);
  for (const std::string& warning : sources->warnings) {
    std::cerr << "warning: " << warning << std::endl;
  }
  sysfs::SysfsReader sysfs(options.sysfs_root);
  const std::string data_dir = options.plugin_data_dir.empty()
                                   ? "/var/lib/kubelet/plugins/" + options.driver_name
                                   : options.plugin_data_dir;
  discovery::ScanContext scan_context;
  scan_context.vfio_drivers = sources->vfio_drivers.get();
  // Read only: the daemon keeps the file.
  auto sizes = discovery::LoadVgpuGpuSizes(data_dir + "/" + discovery::kVgpuGpuSizesFile);
  if (sizes.ok()) {
    scan_context.vgpu_sizes = std::move(*sizes);
  } else {
    std::cerr << "warning: " << sizes.error().message
              << " (a GPU that runs a vGPU type offers nothing new)" << std::endl;
  }
  auto scan = discovery::ScanNode(sysfs, sources->names.get(), sources->policy, scan_context);
  for (const std::string& warning : scan->inventory.warnings) {
    std::cerr << "warning: " << warning << std::endl;
  }
  const std::string maxima_path = data_dir + "/" + slicepublisher::kMdevTypeMaximaFile;
  auto maxima = slicepublisher::MdevTypeMaxima::Load(maxima_path);
  if (!maxima.ok()) {
    std::cerr << "warning: " << maxima.error().message
              << " (vGPU counters are computed from what the kernel shows alone)" << std::endl;
    maxima = slicepublisher::MdevTypeMaxima{};
  }
  maxima->Observe(scan->inventory);
  // Taints as the daemon would set them on its first publish (a device kept while a claim holds
  // it is the daemon's knowledge, not the command's).
  slicepublisher::TaintInputs taints;
  taints.driver = options.driver_name;
  taints.now = slicepublisher::Rfc3339(std::chrono::duration_cast<std::chrono::seconds>(
                                           std::chrono::system_clock::now().time_since_epoch())
                                           .count());
  const slicepublisher::PublishablePool publishable = slicepublisher::BuildPublishablePool(
      *scan, {options.node_name, options.driver_name, {options.api_version, *minor, false}},
      *maxima, &taints);
  const slicepublisher::DesiredPool& pool = publishable.pool;
  for (const std::string& warning : pool.warnings) std::cerr << "warning: " << warning << std::endl;
  if (!publishable.valid.ok()) {
    return Fail("the slices would be rejected: " + publishable.valid.error().message);
  }
  nlohmann::json items = nlohmann::json::array();
  for (const auto& content : pool.slices) {
    slicepublisher::SliceMeta meta;
    meta.api_version = options.api_version;
    meta.driver = options.driver_name;
    meta.node_name = options.node_name;
    meta.pool_name = pool.name;
    meta.generation = 1;
    meta.slice_count = static_cast<int64_t>(pool.slices.size());
    items.push_back(slicepublisher::SliceToJson(content, meta));
  }
  const nlohmann::json list = {{"apiVersion", "v1"}, {"kind", "List"}, {"items", items}};
  if (options.output == "json") {
    std::cout << list.dump(2) << std::endl;
  } else {
    YAML::Emitter out;
    EmitYaml(out, list);
    std::cout << out.c_str() << std::endl;
  }
  return 0;
}

}  // namespace vfio_dra::cmd
