#include "cmd/serve_daemon.h"

#include <algorithm>
#include <chrono>

#include "base/clock.h"
#include "base/file_io.h"
#include "cmd/device_sources.h"
#include "cmd/metric_catalog.h"
#include "discovery/change_probe.h"
#include "discovery/node_scan.h"
#include "discovery/vgpu_gpu_sizes_file.h"
#include "plugin/dead_sockets.h"
#include "prepare/device_health.h"

namespace vfio_dra::cmd {

ServeDaemon::ServeDaemon(const ServeOptions& options, const ServeEnvironment& environment,
                         Logger root)
    : options_(options),
      environment_(environment),
      root_(std::move(root)),
      log_(root_.WithComponent("serve")),
      layout_(plugin::SocketLayout::For(options.plugin_data_dir, options.registrar_dir,
                                        options.driver_name, options.pod_uid)) {}

ServeDaemon::~ServeDaemon() { Stop(); }

Result<std::unique_ptr<ServeDaemon>> ServeDaemon::Build(const ServeOptions& options,
                                                        const ServeEnvironment& environment,
                                                        Logger root) {
  std::unique_ptr<ServeDaemon> daemon(new ServeDaemon(options, environment, std::move(root)));
  if (Status s = daemon->BuildDiscovery(); !s.ok()) return s.error();
  if (Status s = daemon->BuildApiClients(); !s.ok()) return s.error();
  if (Status s = daemon->BuildPreparation(); !s.ok()) return s.error();
  daemon->BuildPublishing();
  daemon->BuildKubeletServices();
  daemon->DeclareMetrics();
  return daemon;
}

Status ServeDaemon::BuildDiscovery() {
  auto sources = OpenDeviceSources(
      {options_.config_file, options_.sysfs_root, options_.pci_ids, options_.modules_alias});
  if (!sources.ok()) return sources.error().Wrap("the admin policy is invalid");
  for (const std::string& warning : sources->warnings) log_.Warn(warning, {});
  policy_ = std::move(sources->policy);
  names_ = std::move(sources->names);
  vfio_drivers_ = std::move(sources->vfio_drivers);
  sysfs_.emplace(options_.sysfs_root);
  return Status::Ok();
}

Status ServeDaemon::BuildApiClients() {
  auto config = kube::ResolveClientConfig(options_.kubeconfig);
  if (!config.ok()) return config.error().Wrap("cannot configure the Kubernetes API client");
  client_config_ = std::move(*config);
  auto transport = kube::HttplibTransport::Create(*client_config_, UserAgent());
  if (!transport.ok()) return transport.error().Wrap("cannot configure the Kubernetes API client");
  transport_ = std::move(*transport);
  tokens_.emplace(client_config_->token, client_config_->token_file, RealClock());
  kube::ApiClientOptions api_options;
  api_options.qps = options_.kube_api_qps;
  api_options.burst = options_.kube_api_burst;
  api_.emplace(*transport_, *tokens_, RealClock(), root_.WithComponent("kube"), api_options);
  kube::ApiClientOptions claim_options;
  claim_options.qps = options_.claim_api_qps;
  claim_options.burst = options_.claim_api_burst;
  claim_api_.emplace(*transport_, *tokens_, RealClock(), root_.WithComponent("kube"),
                     claim_options);
  // One discovery of resource.k8s.io for claim reads and status writes alike.
  claim_api_versions_.emplace(*claim_api_);
  claim_reader_.emplace(*claim_api_, *claim_api_versions_);
  // Pod reads and claim status writes sit on the same path as claim reads (a pod start).
  pod_reader_.emplace(*claim_api_);
  claim_status_.emplace(*claim_api_, *claim_api_versions_, options_.driver_name);
  claim_status_queue_.emplace(*claim_status_, RealClock(), root_.WithComponent("claim-status"));
  claims_.emplace(*claim_reader_);
  log_.Info("Kubernetes API client ready",
            {{"server", client_config_->server}, {"source", client_config_->source}});
  return Status::Ok();
}

Status ServeDaemon::BuildPreparation() {
  if (Status s = EnsureDirectory(options_.plugin_data_dir); !s.ok()) {
    return s.error().Wrap("cannot prepare the plugin data directory");
  }
  if (Status s = EnsureDirectory(options_.cdi_dir); !s.ok()) {
    return s.error().Wrap("cannot prepare the CDI spec directory");
  }
  sysfs_writer_ = environment_.make_sysfs_writer ? environment_.make_sysfs_writer(options_)
                                                 : std::make_unique<sysfs::KernelSysfsWriter>();
  prepare::PreparerOptions preparer_options;
  preparer_options.metrics = &metrics_;
  preparer_options.driver_name = options_.driver_name;
  preparer_options.node_name = options_.node_name;
  preparer_options.plugin_data_dir = options_.plugin_data_dir;
  preparer_options.cdi_dir = options_.cdi_dir;
  preparer_options.dev_root = options_.dev_root;
  preparer_options.unbind_timeout = std::chrono::seconds(options_.unbind_timeout_seconds);
  preparer_options.before_step = environment_.before_prepare_step;
  preparer_options.vfio_drivers = vfio_drivers_;
  preparer_options.vf_network = options_.simulated_vf_network_dir.empty()
                                    ? std::shared_ptr<vfio::VfNetwork>(
                                          vfio::MakeNetlinkVfNetwork(options_.host_netns, &*sysfs_))
                                    : std::shared_ptr<vfio::VfNetwork>(vfio::MakeFileVfNetwork(
                                          options_.simulated_vf_network_dir));
  preparer_options.missing_privileges = [this] { return MissingPrivileges(); };
  preparer_options.holders_gap = vfio::HolderNamingGap(environment_.process_status).value_or("");
  preparer_options.pods = pod_reader_ ? &*pod_reader_ : nullptr;
  preparer_options.claim_status = claim_status_queue_ ? &*claim_status_queue_ : nullptr;
  // What a claim held is re-evaluated at once: a device kept only for it (lost) goes at a sync,
  // and a taint that came from it being prepared (driver-changed: the scan marks functions
  // prepared claims hold) needs a rescan, which the probe would not ask for when the unprepare
  // left the function where it was. Both are events, not the 10-minute full rescan; and both only
  // when the claim can have left such a mark (issue 58: a rebuild of the pool and a scan of the
  // node per claim were most of a claim's CPU at 1,000 devices). A scan under way may have read
  // the claim before it went, and may mark it: it counts as a mark.
  preparer_options.after_unprepare = [this] {
    if (reconciler_) reconciler_->HeldDevicesReleased();
    if (watcher_ && (scanning_ || scan_marked_foreign_)) watcher_->Trigger();
  };
  auto preparer = prepare::VfioDevicePreparer::Open(preparer_options, *sysfs_, *sysfs_writer_,
                                                    published_, root_.WithComponent("prepare"));
  if (!preparer.ok()) return preparer.error().Wrap("cannot start device preparation");
  preparer_ = std::move(*preparer);
  prepare::VgpuLayoutOptions layout_options;
  layout_options.plugin_data_dir = options_.plugin_data_dir;
  layout_options.write_timeout = preparer_options.unbind_timeout;
  layout_options.before_step = environment_.before_prepare_step;
  auto layouts =
      prepare::VgpuLayoutApplier::Open(layout_options, policy_, *sysfs_, *sysfs_writer_,
                                       preparer_->checkpoint(), root_.WithComponent("vgpu-layout"));
  if (!layouts.ok()) return layouts.error();
  if ((*layouts)->HasWork()) layouts_ = std::move(*layouts);

  // Recovery takes the preparer's locks itself: another instance (a rolling update) may be
  // working on the node.
  if (Status s = preparer_->Recover(); !s.ok()) {
    log_.Error(
        "recovery from the prepare checkpoint is incomplete; affected claims are retried on "
        "their next prepare or unprepare",
        {{"error", s.error().message}});
  }
  return Status::Ok();
}

void ServeDaemon::BuildPublishing() {
  slicepublisher::ReconcilerOptions reconciler_options;
  reconciler_options.published = &published_;
  reconciler_options.driver = options_.driver_name;
  reconciler_options.node_name = options_.node_name;
  reconciler_options.mdev_maxima_path =
      options_.plugin_data_dir + "/" + slicepublisher::kMdevTypeMaximaFile;
  reconciler_options.held_devices = [this] {
    std::set<std::string> held;
    for (const prepare::PreparedTarget& target : *preparer_->Prepared()) {
      if (target.pool == options_.node_name) held.insert(target.device);
    }
    return held;
  };
  reconciler_options.held_attributes = [this] {
    std::map<std::string, slicepublisher::RecordedAttributes> recorded;
    for (const prepare::PreparedTarget& target : *preparer_->Prepared()) {
      if (target.pool != options_.node_name) continue;
      slicepublisher::RecordedAttributes& attributes = recorded[target.device];
      // A value of no attribute shape (a damaged record) is left out; the builder publishes the
      // name alone when what is left would be refused.
      for (const auto& [name, value] : target.attributes) {
        if (auto parsed = slicepublisher::AttributeFromJson(value)) attributes[name] = *parsed;
      }
    }
    return recorded;
  };
  reconciler_.emplace(*api_, reconciler_options, root_.WithComponent("slices"));

  discovery::DeviceWatcherOptions watch_options;
  watch_options.rescan_interval = std::chrono::seconds(options_.rescan_interval_seconds);
  watch_options.on_settled = [this] {
    published_.Compact();
    reconciler_->Compact();
  };
  std::string sizes_warning;
  vgpu_sizes_ = discovery::LoadVgpuGpuSizesOrMoveAside(
      options_.plugin_data_dir + "/" + discovery::kVgpuGpuSizesFile, sizes_warning);
  if (!sizes_warning.empty()) log_.Warn(sizes_warning, {});
  watcher_.emplace([this] { return Scan(); },
                   [this](const std::shared_ptr<const discovery::NodeScan>& scan) {
                     log_.Info("node devices",
                               {{"pci_devices", std::to_string(scan->selection.devices.size())},
                                {"mdev_types", std::to_string(scan->selection.mdev_types.size())},
                                {"policy", policy_.source}});
                     CheckPrivileges(*scan);
                     reconciler_->SetScan(*scan);
                   },
                   watch_options, root_.WithComponent("discovery"),
                   [this, probe = std::make_shared<discovery::ChangeProbe>(*sysfs_)] {
                     // A digest that differs at every call while a layout waits: the periodic check
                     // scans.
                     return probe->Probe() + (layout_retry_ ? ++layout_retries_ : 0);
                   });
}

std::shared_ptr<const discovery::NodeScan> ServeDaemon::Scan() {
  const auto scan_once = [this] {
    discovery::ScanContext context;
    preparer_->Refresh();
    context.managed = *preparer_->ManagedFunctions();
    context.vfio_drivers = vfio_drivers_.get();
    context.vgpu_sizes = vgpu_sizes_;
    auto scan = discovery::ScanNode(*sysfs_, names_.get(), policy_, context);
    scan_marked_foreign_ =
        std::any_of(scan->inventory.functions.begin(), scan->inventory.functions.end(),
                    [](const auto& entry) { return !entry.second.foreign_driver.empty(); });
    if (names_ != nullptr) names_->ReleaseDatabase();
    KeepVgpuSizes(*scan);
    return scan;
  };
  // Set before the claims are read, cleared after the marks are: see after_unprepare.
  scanning_ = true;
  auto scan = scan_once();
  if (layouts_ != nullptr) {
    const prepare::VgpuLayoutPass pass = layouts_->Apply(scan->inventory);
    layout_retry_ = pass.retry;
    if (pass.created > 0) scan = scan_once();
  }
  scanning_ = false;
  return scan;
}

void ServeDaemon::CheckPrivileges(const discovery::NodeScan& scan) {
  const vfio::PrivilegeNeeds needs = vfio::PrivilegeNeedsOf(scan.inventory, scan.selection);
  std::set<vfio::PrivilegedFeature> features;
  for (const auto& entry : needs.features) features.insert(entry.first);
  if (checked_features_ == features) return;
  checked_features_ = features;
  vfio::PrivilegeCheckOptions check;
  check.dev_root = options_.dev_root;
  check.host_netns = options_.host_netns;
  check.vf_network_in_kernel = options_.simulated_vf_network_dir.empty();
  check.process_status = environment_.process_status;
  auto missing = std::make_shared<const std::vector<vfio::MissingPrivilege>>(
      vfio::CheckPrivileges(needs, *sysfs_, *sysfs_writer_, check));
  for (const vfio::MissingPrivilege& m : *missing) {
    const std::string line = m.Line();
    if (!logged_privileges_.insert(line).second) continue;
    const std::string feature = vfio::PrivilegedFeatureName(m.feature);
    // Naming a busy device's holders is best effort, and off in the default install: saying so
    // at every start is information, not a warning an admin must act on.
    if (m.feature == vfio::PrivilegedFeature::kHolderNaming) {
      log_.Info(line, {{"feature", feature}, {"privilege", m.privilege}});
    } else {
      log_.Warn(line, {{"feature", feature}, {"privilege", m.privilege}});
    }
  }
  std::lock_guard<std::mutex> lock(privileges_mu_);
  missing_privileges_ = std::move(missing);
}

std::shared_ptr<const std::vector<vfio::MissingPrivilege>> ServeDaemon::MissingPrivileges() const {
  std::lock_guard<std::mutex> lock(privileges_mu_);
  return missing_privileges_;
}

// The GPUs' whole frame buffers seen idle, for the next scan and the next start.
void ServeDaemon::KeepVgpuSizes(const discovery::NodeScan& scan) {
  if (scan.vgpu_sizes == vgpu_sizes_) return;
  vgpu_sizes_ = scan.vgpu_sizes;
  const std::string path = options_.plugin_data_dir + "/" + discovery::kVgpuGpuSizesFile;
  if (Status s = discovery::SaveVgpuGpuSizes(path, vgpu_sizes_); !s.ok()) {
    log_.Warn(
        "cannot keep the GPUs' vGPU frame buffers; after a restart a GPU that runs a vGPU type "
        "offers nothing new until it is idle again",
        {{"error", s.error().message}});
  }
}

void ServeDaemon::BuildKubeletServices() {
  // The preparer locks per device, so no call-wide serializer: claims on disjoint devices run in
  // parallel.
  node_.emplace(options_.driver_name, *claims_, *preparer_, nullptr, root_.WithComponent("node"),
                &metrics_);
  v1_.emplace(*node_, root_.WithComponent("grpc"));
  v1beta1_.emplace(*node_, root_.WithComponent("grpc"));
  health_.emplace(
      [this] {
        // The other instance of a rolling update may have prepared or unprepared claims.
        preparer_->Refresh();
        return prepare::CheckDeviceHealth(*sysfs_, published_.Current(), *preparer_->Prepared());
      },
      std::chrono::seconds(options_.health_interval_seconds), root_.WithComponent("health"));
  registration_.emplace(options_.driver_name, layout_.dra_socket, plugin::SupportedDraServices(),
                        root_.WithComponent("registration"));
}

void ServeDaemon::DeclareMetrics() {
  DeclareMetricCatalog(metrics_);
  metrics_.AddCollector([this](MetricsRegistry& m) {
    for (const auto& [kind, count] : published_.CountByType()) {
      m.Set("vfio_dra_published_devices", {{"kind", kind}}, count);
    }
    const slicepublisher::ReconcilerStats stats = reconciler_->Stats();
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
    m.Set("vfio_dra_device_scans_total", {{"cause", "event"}},
          static_cast<double>(watcher_->event_scans()));
    m.Set("vfio_dra_device_scans_total", {{"cause", "other"}},
          static_cast<double>(watcher_->full_scans() - watcher_->event_scans()));
    m.Set("vfio_dra_device_checks_total", {}, static_cast<double>(watcher_->periodic_checks()));
    const kube::ClaimStatusQueueStats writes = claim_status_queue_->Stats();
    m.Set("vfio_dra_claim_status_pending", {}, static_cast<double>(writes.pending));
    m.Set("vfio_dra_claim_status_writes_total", {{"result", "ok"}},
          static_cast<double>(writes.written));
    m.Set("vfio_dra_claim_status_writes_total", {{"result", "error"}},
          static_cast<double>(writes.failed));
    m.Set("vfio_dra_claim_status_writes_total", {{"result", "given_up"}},
          static_cast<double>(writes.given_up));
    if (const auto missing = MissingPrivileges()) {
      for (const vfio::MissingPrivilege& p : *missing) {
        m.Set("vfio_dra_privilege_missing",
              {{"feature", vfio::PrivilegedFeatureName(p.feature)}, {"privilege", p.privilege}}, 1);
      }
    }
    const prepare::CheckpointCounts counts = preparer_->Counts();
    m.Set("vfio_dra_checkpoint_claims", {{"state", "PrepareStarted"}}, counts.started);
    m.Set("vfio_dra_checkpoint_claims", {{"state", "PrepareCompleted"}}, counts.completed);
  });
}

HealthReport ServeDaemon::Health() const {
  HealthReport report;
  switch (registration_->state()) {
    case plugin::RegistrationState::kPending:
      report.registration = "pending (the kubelet has not called yet)";
      break;
    case plugin::RegistrationState::kRegistered:
      report.registered = true;
      report.registration = "registered";
      break;
    case plugin::RegistrationState::kRejected:
      report.registration = "rejected: " + registration_->last_error();
      break;
  }
  const slicepublisher::ReconcilerStats stats = reconciler_->Stats();
  report.api_reachable = stats.last_error.empty() && stats.syncs > 0;
  report.api = report.api_reachable       ? "ok"
               : stats.last_error.empty() ? "no successful ResourceSlice sync yet"
                                          : stats.last_error;
  return report;
}

Status ServeDaemon::Start() {
  started_ = true;
  if (!options_.metrics_address.empty()) {
    auto metrics_server = MetricsServer::Start(
        options_.metrics_address, metrics_, [this] { return Health(); },
        root_.WithComponent("metrics"));
    if (!metrics_server.ok()) return metrics_server.error();
    metrics_server_ = std::move(*metrics_server);
  }
  std::vector<plugin::GrpcMethod> dra_methods = v1_->Methods();
  for (const auto& more : {v1beta1_->Methods(), health_->Methods()}) {
    dra_methods.insert(dra_methods.end(), more.begin(), more.end());
  }
  // What earlier pods of this driver left when they died: the kubelet retries a registration
  // socket for as long as it exists. Before our own registration: a 1.32 kubelet de-registers
  // the driver by name when any of its registration sockets goes, so afterwards it would drop us.
  const plugin::DeadSocketSweep sweep =
      plugin::RemoveDeadSockets(layout_, options_.driver_name, std::chrono::system_clock::now());
  for (const std::string& path : sweep.removed) {
    log_.Info("removed the socket of a plugin instance that died without stopping",
              {{"path", path}});
  }
  for (const std::string& problem : sweep.problems) log_.Warn(problem, {});
  auto server = plugin::PluginServer::Start(
      layout_, dra_methods, registration_->Methods(), root_.WithComponent("server"),
      std::chrono::seconds(options_.close_idle_connections_seconds));
  if (!server.ok()) return server.error();
  server_ = std::move(*server);
  // The sockets come first, so the kubelet sees the plugin as soon as it can answer; the first
  // scan and publish follow (a prepare that arrives before them waits for the first publish).
  watcher_->Start();
  reconciler_->Start();
  return Status::Ok();
}

void ServeDaemon::Stop() {
  if (!started_) return;
  started_ = false;
  health_->Shutdown();
  if (server_) server_->Stop();
  // No call can submit a status write any more.
  claim_status_queue_->Stop();
  metrics_server_.reset();
  watcher_->Stop();
  reconciler_->Stop();
}

}  // namespace vfio_dra::cmd
