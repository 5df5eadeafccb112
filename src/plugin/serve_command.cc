#include "plugin/serve_command.h"

#include <sys/utsname.h>

#include <csignal>
#include <iostream>
#include <string>

#include "base/clock.h"
#include "base/log.h"
#include "base/metrics.h"
#include "discovery/admin_policy.h"
#include "discovery/change_probe.h"
#include "discovery/device_watcher.h"
#include "discovery/node_scan.h"
#include "discovery/pci_names.h"
#include "discovery/sysfs_reader.h"
#include "kube/api_client.h"
#include "kube/claim_reader.h"
#include "kube/client_config.h"
#include "kube/curl_transport.h"
#include "kube/token_source.h"
#include "plugin/call_serializer.h"
#include "plugin/device_health.h"
#include "plugin/dra_grpc_service.h"
#include "plugin/health_grpc_service.h"
#include "plugin/metrics_server.h"
#include "plugin/node_service.h"
#include "plugin/plugin_server.h"
#include "plugin/registration_service.h"
#include "plugin/vfio_device_preparer.h"
#include "slicepublisher/slice_reconciler.h"

#ifndef VFIO_DRA_VERSION
#define VFIO_DRA_VERSION "0.0.0-dev"
#endif

namespace vfio_dra::plugin {

const char* PluginVersion() { return VFIO_DRA_VERSION; }

std::string UserAgent() {
  struct utsname uts {};
  std::string arch = "unknown";
  if (::uname(&uts) == 0) {
    arch = uts.machine;
    if (arch == "x86_64") arch = "amd64";
    if (arch == "aarch64") arch = "arm64";
  }
  return std::string("vfio-dra-plugin/") + PluginVersion() + " (linux/" + arch + ")";
}

void BlockShutdownSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

int RunServe(const ServeOptions& options, const ServeEnvironment& environment) {
  Logger root = Logger::ToStderr(options.verbosity);
  Logger log = root.WithComponent("serve");
  log.Info(
      "starting",
      {{"version", PluginVersion()}, {"driver", options.driver_name}, {"node", options.node_name}});

  discovery::AdminPolicy policy;
  if (!options.config_file.empty()) {
    auto loaded = discovery::LoadAdminPolicy(options.config_file);
    if (!loaded.ok()) {
      log.Error("cannot start: the admin policy is invalid", {{"error", loaded.error().message}});
      return 1;
    }
    policy = std::move(*loaded);
  }
  discovery::SysfsReader sysfs(options.sysfs_root);
  auto names = discovery::PciNames::Open({options.sysfs_root, options.pci_ids, false});
  if (!names.ok()) log.Warn("device names unavailable", {{"error", names.error().message}});
  discovery::PciNames* names_ptr = names.ok() ? names->get() : nullptr;

  auto client_config = kube::ResolveClientConfig(options.kubeconfig);
  if (!client_config.ok()) {
    log.Error("cannot configure the Kubernetes API client",
              {{"error", client_config.error().message}});
    return 1;
  }
  auto transport = kube::CurlTransport::Create(*client_config, UserAgent());
  if (!transport.ok()) {
    log.Error("cannot configure the Kubernetes API client", {{"error", transport.error().message}});
    return 1;
  }
  kube::TokenSource tokens(client_config->token, client_config->token_file, RealClock());
  kube::ApiClientOptions api_options;
  api_options.qps = options.kube_api_qps;
  api_options.burst = options.kube_api_burst;
  kube::ApiClient api(**transport, tokens, RealClock(), root.WithComponent("kube"), api_options);
  kube::ApiClientOptions claim_api_options;
  claim_api_options.qps = options.claim_api_qps;
  claim_api_options.burst = options.claim_api_burst;
  kube::ApiClient claim_api(**transport, tokens, RealClock(), root.WithComponent("kube"),
                            claim_api_options);
  kube::ResourceClaimReader claim_reader(claim_api);
  ApiClaimSource claims(claim_reader);
  log.Info("Kubernetes API client ready",
           {{"server", client_config->server}, {"source", client_config->source}});

  const SocketLayout layout = SocketLayout::For(options);
  if (Status s = EnsureDirectory(options.plugin_data_dir); !s.ok()) {
    log.Error("cannot prepare the plugin data directory", {{"error", s.error().message}});
    return 1;
  }
  auto serializer = CallSerializer::Open(layout.lock_file);
  if (!serializer.ok()) {
    log.Error("cannot set up call serialization", {{"error", serializer.error().message}});
    return 1;
  }

  if (Status s = EnsureDirectory(options.cdi_dir); !s.ok()) {
    log.Error("cannot prepare the CDI spec directory", {{"error", s.error().message}});
    return 1;
  }
  std::unique_ptr<vfio::SysfsWriter> sysfs_writer =
      environment.make_sysfs_writer ? environment.make_sysfs_writer(options)
                                    : std::make_unique<vfio::KernelSysfsWriter>();
  slicepublisher::PublishedDevices published;
  MetricsRegistry metrics;
  PreparerOptions preparer_options;
  preparer_options.metrics = &metrics;
  preparer_options.driver_name = options.driver_name;
  preparer_options.node_name = options.node_name;
  preparer_options.plugin_data_dir = options.plugin_data_dir;
  preparer_options.cdi_dir = options.cdi_dir;
  preparer_options.dev_root = options.dev_root;
  preparer_options.unbind_timeout = std::chrono::seconds(options.unbind_timeout_seconds);
  preparer_options.before_step = environment.before_prepare_step;
  auto preparer = VfioDevicePreparer::Open(preparer_options, sysfs, *sysfs_writer, published,
                                           root.WithComponent("prepare"));
  if (!preparer.ok()) {
    log.Error("cannot start device preparation", {{"error", preparer.error().message}});
    return 1;
  }
  {
    // Another instance (a rolling update) may be working on the node: recover under its lock,
    // from what is on disk then.
    auto guard = (*serializer)->Acquire();
    if (!guard.ok()) {
      log.Error("cannot take the node lock for recovery", {{"error", guard.error().message}});
      return 1;
    }
    if (Status s = (*preparer)->Recover(); !s.ok()) {
      log.Error(
          "recovery from the prepare checkpoint is incomplete; affected claims are retried "
          "on their next prepare or unprepare",
          {{"error", s.error().message}});
    }
  }

  slicepublisher::ReconcilerOptions reconciler_options;
  reconciler_options.published = &published;
  reconciler_options.driver = options.driver_name;
  reconciler_options.node_name = options.node_name;
  slicepublisher::SliceReconciler reconciler(api, reconciler_options, root.WithComponent("slices"));

  discovery::DeviceWatcherOptions watch_options;
  watch_options.rescan_interval = std::chrono::seconds(options.rescan_interval_seconds);
  discovery::DeviceWatcher watcher(
      [&] { return discovery::ScanNode(sysfs, names_ptr, policy); },
      [&](const std::shared_ptr<const discovery::NodeScan>& scan) {
        log.Info("node devices", {{"pci_devices", std::to_string(scan->selection.devices.size())},
                                  {"mdev_types", std::to_string(scan->selection.mdev_types.size())},
                                  {"policy", policy.source}});
        reconciler.SetScan(scan);
      },
      watch_options, root.WithComponent("discovery"),
      [&] { return discovery::ProbeDeviceState(sysfs); });

  DraNodeService node(options.driver_name, claims, **preparer, **serializer,
                      root.WithComponent("node"), &metrics);
  DraGrpcService<DraV1Api> v1(node, root.WithComponent("grpc"));
  DraGrpcService<DraV1beta1Api> v1beta1(node, root.WithComponent("grpc"));
  DeviceHealthService health(
      [&] {
        // The other instance of a rolling update may have prepared or unprepared claims.
        (*preparer)->Refresh();
        return CheckDeviceHealth(sysfs, published.Current(), *(*preparer)->Prepared());
      },
      std::chrono::seconds(options.health_interval_seconds), root.WithComponent("health"));
  RegistrationService registration(options.driver_name, layout.dra_socket, SupportedDraServices(),
                                   root.WithComponent("registration"));
  metrics.DeclareGauge("vfio_dra_published_devices",
                       "devices in this node's ResourceSlices, by kind");
  metrics.DeclareCounter("vfio_dra_slice_writes_total",
                         "ResourceSlice writes, by operation (create, update, delete)");
  metrics.DeclareCounter("vfio_dra_slice_syncs_total",
                         "ResourceSlice syncs, by result (ok, error)");
  metrics.DeclareGauge("vfio_dra_checkpoint_claims", "claims in the prepare checkpoint, by state");
  metrics.AddCollector([&](MetricsRegistry& m) {
    for (const auto& [kind, count] : published.CountByType()) {
      m.Set("vfio_dra_published_devices", {{"kind", kind}}, count);
    }
    const slicepublisher::ReconcilerStats stats = reconciler.Stats();
    m.Set("vfio_dra_slice_writes_total", {{"operation", "create"}},
          static_cast<double>(stats.creates));
    m.Set("vfio_dra_slice_writes_total", {{"operation", "update"}},
          static_cast<double>(stats.updates));
    m.Set("vfio_dra_slice_writes_total", {{"operation", "delete"}},
          static_cast<double>(stats.deletes));
    m.Set("vfio_dra_slice_syncs_total", {{"result", "ok"}},
          static_cast<double>(stats.syncs - stats.failed_syncs));
    m.Set("vfio_dra_slice_syncs_total", {{"result", "error"}},
          static_cast<double>(stats.failed_syncs));
    const CheckpointCounts counts = (*preparer)->Counts();
    m.Set("vfio_dra_checkpoint_claims", {{"state", "PrepareStarted"}}, counts.started);
    m.Set("vfio_dra_checkpoint_claims", {{"state", "PrepareCompleted"}}, counts.completed);
  });
  std::unique_ptr<MetricsServer> metrics_server;
  if (!options.metrics_address.empty()) {
    auto started = MetricsServer::Start(
        options.metrics_address, metrics,
        [&] {
          HealthReport report;
          switch (registration.state()) {
            case RegistrationState::kPending:
              report.registration = "pending (the kubelet has not called yet)";
              break;
            case RegistrationState::kRegistered:
              report.registered = true;
              report.registration = "registered";
              break;
            case RegistrationState::kRejected:
              report.registration = "rejected: " + registration.last_error();
              break;
          }
          const slicepublisher::ReconcilerStats stats = reconciler.Stats();
          report.api_reachable = stats.last_error.empty() && stats.syncs > 0;
          report.api = report.api_reachable       ? "ok"
                       : stats.last_error.empty() ? "no successful ResourceSlice sync yet"
                                                  : stats.last_error;
          return report;
        },
        root.WithComponent("metrics"));
    if (!started.ok()) {
      log.Error("cannot start", {{"error", started.error().message}});
      return 1;
    }
    metrics_server = std::move(*started);
  }
  auto server = PluginServer::Start(layout, {&v1, &v1beta1, &health}, &registration,
                                    root.WithComponent("server"));
  if (!server.ok()) {
    log.Error("cannot start", {{"error", server.error().message}});
    return 1;
  }
  // The sockets come first, so the kubelet sees the plugin as soon as it can answer; the first
  // scan and publish follow (a prepare that arrives before them waits for the first publish).
  watcher.Start();
  reconciler.Start();

  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  int signal_number = 0;
  while (sigwait(&set, &signal_number) != 0) {
  }
  log.Info("shutting down; ResourceSlices stay in place",
           {{"signal", signal_number == SIGTERM ? "SIGTERM" : "SIGINT"}});
  health.Shutdown();
  (*server)->Stop();
  metrics_server.reset();
  watcher.Stop();
  reconciler.Stop();
  log.Info("stopped");
  return 0;
}

}  // namespace vfio_dra::plugin
