// ServeDaemon: the `serve` process as one object. Its parts are built in the order they depend on
// each other (discovery, API clients, device preparation with start-up recovery, publishing, the
// kubelet-facing services, metrics), started sockets first (the kubelet sees the plugin as soon
// as it can answer; the first scan and publish follow), and stopped in the reverse order:
// members are declared in build order, so destruction undoes construction too.
// ResourceSlices are left in place on shutdown (the kubelet wipes a driver's slices only after it
// stays away).
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "base/log.h"
#include "base/metrics.h"
#include "base/result.h"
#include "cmd/metrics_server.h"
#include "cmd/serve_command.h"
#include "discovery/admin_policy.h"
#include "discovery/device_watcher.h"
#include "discovery/pci_names.h"
#include "kube/api_client.h"
#include "kube/claim_reader.h"
#include "kube/claim_status_queue.h"
#include "kube/claim_status_writer.h"
#include "kube/client_config.h"
#include "kube/httplib_transport.h"
#include "kube/pod.h"
#include "kube/token_source.h"
#include "plugin/dra_grpc_service.h"
#include "plugin/health_grpc_service.h"
#include "plugin/node_service.h"
#include "plugin/plugin_server.h"
#include "plugin/registration_service.h"
#include "prepare/vfio_device_preparer.h"
#include "prepare/vgpu_layout_applier.h"
#include "slicepublisher/published_devices.h"
#include "slicepublisher/slice_reconciler.h"
#include "sysfs/sysfs_reader.h"
#include "vfio/privilege_check.h"

namespace vfio_dra::cmd {

class ServeDaemon {
 public:
  // Builds every part; the first failure comes back with what could not be set up.
  static Result<std::unique_ptr<ServeDaemon>> Build(const ServeOptions& options,
                                                    const ServeEnvironment& environment,
                                                    Logger root);
  ~ServeDaemon();
  ServeDaemon(const ServeDaemon&) = delete;
  ServeDaemon& operator=(const ServeDaemon&) = delete;

  // Opens the metrics endpoint and the kubelet sockets, then starts discovery and publishing.
  Status Start();
  // Ends health streams, closes the sockets and the endpoint, stops discovery and publishing.
  void Stop();

 private:
  ServeDaemon(const ServeOptions& options, const ServeEnvironment& environment, Logger root);
  Status BuildDiscovery();
  Status BuildApiClients();
  Status BuildPreparation();
  void BuildPublishing();
  void BuildKubeletServices();
  void DeclareMetrics();
  HealthReport Health() const;
  // One scan of the node for the watcher. The declared vGPU layouts are applied to what it finds
  // first, and a scan that made vGPUs is taken again, so they are published with it.
  std::shared_ptr<const discovery::NodeScan> Scan();
  // Keeps the GPUs' whole frame buffers a scan saw (vgpu_gpu_sizes_file.h) when they changed.
  void KeepVgpuSizes(const discovery::NodeScan& scan);
  // Checks the privileges of the features the scan's devices enable, when they are not the ones
  // checked last (the first scan, then a new kind of device), and warns once per missing one.
  void CheckPrivileges(const discovery::NodeScan& scan);
  std::shared_ptr<const std::vector<vfio::MissingPrivilege>> MissingPrivileges() const;

  const ServeOptions& options_;
  const ServeEnvironment& environment_;
  Logger root_;
  Logger log_;
  bool started_ = false;

  // Discovery.
  discovery::AdminPolicy policy_;
  std::optional<sysfs::SysfsReader> sysfs_;
  std::unique_ptr<discovery::PciNames> names_;
  discovery::VgpuGpuSizes vgpu_sizes_;  // only the scan callback reads and writes it
  std::shared_ptr<const discovery::VfioDriverChooser> vfio_drivers_;
  // The API clients: one for slices, one (with its own rate budget) for claim reads.
  std::optional<kube::ClientConfig> client_config_;
  std::unique_ptr<kube::HttplibTransport> transport_;
  std::optional<kube::TokenSource> tokens_;
  std::optional<kube::ApiClient> api_;
  std::optional<kube::ApiClient> claim_api_;
  std::optional<kube::ResourceApiVersions> claim_api_versions_;
  std::optional<kube::ResourceClaimReader> claim_reader_;
  std::optional<kube::ApiPodReader> pod_reader_;
  std::optional<kube::ApiClaimStatusWriter> claim_status_;
  // Its writes run in the background; stopped (its worker joined) once no call can submit more.
  std::optional<kube::ClaimStatusQueue> claim_status_queue_;
  std::optional<plugin::ApiClaimSource> claims_;
  // Device preparation.
  plugin::SocketLayout layout_;
  std::unique_ptr<sysfs::SysfsWriter> sysfs_writer_;
  slicepublisher::PublishedDevices published_;
  MetricsRegistry metrics_;
  std::unique_ptr<prepare::VfioDevicePreparer> preparer_;
  // Null without a `create: ahead` layout in the policy.
  std::unique_ptr<prepare::VgpuLayoutApplier> layouts_;
  // A layout's last pass was cut short by something that may pass (a lock, an open VF): the next
  // periodic check scans in full although no device changed.
  std::atomic<bool> layout_retry_{false};
  std::atomic<uint64_t> layout_retries_{0};
  // A scan runs, and the last one marked a function a claim holds as bound to a foreign driver
  // (set by the watcher's thread, read by unprepares).
  std::atomic<bool> scanning_{false};
  std::atomic<bool> scan_marked_foreign_{false};
  // The privilege check: its features and logged lines are the watcher thread's alone; the
  // result is read by prepares and metrics.
  std::optional<std::set<vfio::PrivilegedFeature>> checked_features_;
  std::set<std::string> logged_privileges_;
  mutable std::mutex privileges_mu_;
  std::shared_ptr<const std::vector<vfio::MissingPrivilege>> missing_privileges_;
  // Publishing.
  std::optional<slicepublisher::SliceReconciler> reconciler_;
  std::optional<discovery::DeviceWatcher> watcher_;
  // The kubelet-facing services.
  std::optional<plugin::DraNodeService> node_;
  std::optional<plugin::DraGrpcService<plugin::DraV1Api>> v1_;
  std::optional<plugin::DraGrpcService<plugin::DraV1beta1Api>> v1beta1_;
  std::optional<plugin::DeviceHealthService> health_;
  std::optional<plugin::RegistrationService> registration_;
  // Started last, stopped first.
  std::unique_ptr<MetricsServer> metrics_server_;
  std::unique_ptr<plugin::PluginServer> server_;
};

}  // namespace vfio_dra::cmd
