#include "plugin/vfio_device_preparer.h"

#include <algorithm>
#include <set>

#include "base/k8s_names.h"
#include "slicepublisher/slice_json.h"

namespace vfio_dra::plugin {
namespace {

constexpr const char* kPodClaimNameAnnotation = "resource.kubernetes.io/pod-claim-name";

// The answer given to the kubelet, plus what each device occupies on the node (its functions or
// its mdev), which the health stream checks.
nlohmann::json AnswerJson(const std::vector<PreparedDevice>& devices,
                          const std::vector<PlannedDevice>& plan) {
  nlohmann::json out = nlohmann::json::array();
  for (size_t i = 0; i < devices.size(); ++i) {
    const PreparedDevice& d = devices[i];
    nlohmann::json entry = {{"requests", d.request_names},
                            {"pool", d.pool_name},
                            {"device", d.device_name},
                            {"cdiDeviceIDs", d.cdi_device_ids}};
    if (d.share_id) entry["shareID"] = *d.share_id;
    if (i < plan.size()) {
      if (plan[i].kind == PlannedKind::kPci) {
        entry["functions"] = plan[i].functions;
      } else {
        entry["mdevUUID"] = plan[i].mdev.uuid;
      }
    }
    out.push_back(entry);
  }
  return out;
}

bool Contains(const std::vector<std::string>& list, const std::string& value) {
  return std::find(list.begin(), list.end(), value) != list.end();
}

cdi::DeviceNode CdiNode(const vfio::CharDeviceNode& node) {
  return cdi::DeviceNode{node.path, "", node.major, node.minor};
}

}  // namespace

Result<std::unique_ptr<VfioDevicePreparer>> VfioDevicePreparer::Open(
    PreparerOptions options, const discovery::SysfsReader& sysfs, vfio::SysfsWriter& writer,
    const slicepublisher::PublishedDevices& published, Logger log) {
  auto boot_id = ReadBootId(options.boot_id_file);
  if (!boot_id.ok()) return boot_id.error();
  std::string problem;
  auto checkpoint =
      PrepareCheckpoint::Load(options.plugin_data_dir + "/" + kCheckpointFile, *boot_id, &problem);
  if (!checkpoint.ok()) return checkpoint.error();
  if (!problem.empty()) log.Error("prepare checkpoint moved aside", {{"problem", problem}});
  return std::unique_ptr<VfioDevicePreparer>(new VfioDevicePreparer(
      std::move(options), sysfs, writer, published, std::move(*checkpoint), std::move(log)));
}

VfioDevicePreparer::VfioDevicePreparer(PreparerOptions options, const discovery::SysfsReader& sysfs,
                                       vfio::SysfsWriter& writer,
                                       const slicepublisher::PublishedDevices& published,
                                       PrepareCheckpoint checkpoint, Logger log)
    : options_(std::move(options)),
      sysfs_(sysfs),
      published_(published),
      checkpoint_(std::move(checkpoint)),
      binder_(sysfs, writer, vfio::BinderOptions{options_.unbind_timeout}),
      mdevs_(sysfs, writer),
      nodes_(sysfs, options_.dev_root),
      cdi_(options_.cdi_dir),
      metadata_(options_.plugin_data_dir, cdi::SpecDirectory(options_.cdi_dir),
                options_.driver_name),
      kind_(options_.driver_name + "/vfio"),
      log_(std::move(log)) {
  NoteCheckpoint();
  if (options_.metrics != nullptr) {
    options_.metrics->DeclareHistogram(
        "vfio_dra_device_operation_duration_seconds",
        "time of one device operation: bind (to vfio-pci), restore (to the original driver), "
        "mdev_create, mdev_remove");
    options_.metrics->DeclareCounter("vfio_dra_device_operation_errors_total",
                                     "device operations that failed, by operation");
  }
}

template <typename Op>
auto VfioDevicePreparer::Timed(const char* operation, Op op) -> decltype(op()) {
  const auto start = std::chrono::steady_clock::now();
  auto result = op();
  if (options_.metrics != nullptr) {
    options_.metrics->Observe(
        "vfio_dra_device_operation_duration_seconds", {{"operation", operation}},
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    if (!result.ok()) {
      options_.metrics->Increment("vfio_dra_device_operation_errors_total",
                                  {{"operation", operation}});
    }
  }
  return result;
}

void VfioDevicePreparer::NoteCheckpoint() {
  CheckpointCounts counts;
  for (const auto& [uid, record] : checkpoint_.claims()) {
    (record.state == PrepareState::kPrepareCompleted ? counts.completed : counts.started) += 1;
  }
  auto prepared = std::make_shared<const std::vector<PreparedTarget>>(PreparedTargets(checkpoint_));
  std::lock_guard<std::mutex> lock(counts_mu_);
  counts_ = counts;
  prepared_ = std::move(prepared);
}

CheckpointCounts VfioDevicePreparer::Counts() const {
  std::lock_guard<std::mutex> lock(counts_mu_);
  return counts_;
}

std::shared_ptr<const std::vector<PreparedTarget>> VfioDevicePreparer::Prepared() const {
  std::lock_guard<std::mutex> lock(counts_mu_);
  return prepared_;
}

void VfioDevicePreparer::Step(const std::string& name) const {
  if (options_.before_step) options_.before_step(name);
}

std::string VfioDevicePreparer::SpecFileName(const std::string& claim_uid) const {
  return cdi::TransientSpecFileName(kind_, claim_uid);
}

Status VfioDevicePreparer::RecordStart(const kube::ResourceClaim& claim,
                                       const std::vector<PlannedDevice>& plan,
                                       ClaimRecord& record) {
  record.uid = claim.uid;
  record.namespace_ = claim.namespace_;
  record.name = claim.name;
  std::set<std::string> recorded;
  for (const FunctionRecord& f : record.functions) recorded.insert(f.address);
  std::set<std::string> recorded_mdevs;
  for (const MdevRecord& m : record.mdevs) recorded_mdevs.insert(m.uuid);
  for (const PlannedDevice& device : plan) {
    if (device.kind == PlannedKind::kPci) {
      for (const std::string& address : device.functions) {
        if (!recorded.insert(address).second) continue;
        auto original = binder_.Inspect(address);
        if (!original.ok()) return original.error();
        record.functions.push_back(*original);
      }
    } else if (recorded_mdevs.insert(device.mdev.uuid).second) {
      record.mdevs.push_back({device.mdev.parent, device.mdev.type_id, device.mdev.uuid,
                              device.mdev_created_by_driver && !mdevs_.Exists(device.mdev.uuid)});
    }
  }
  std::vector<std::string> files{SpecFileName(claim.uid)};
  for (const PlannedDevice& device : plan) {
    const std::string request = kube::BaseRequestName(device.result.request);
    const std::string file = metadata_.CdiFileName(claim.uid, request);
    if (!Contains(files, file)) files.push_back(file);
  }
  for (const std::string& file : files) {
    if (!Contains(record.cdi_files, file)) record.cdi_files.push_back(file);
  }
  Step("checkpoint:started");
  Status put = checkpoint_.Put(record);
  NoteCheckpoint();
  return put;
}

Result<cdi::Device> VfioDevicePreparer::CdiDevice(const std::string& claim_uid,
                                                  const PlannedDevice& device,
                                                  bool& needs_container) {
  cdi::Device out;
  out.name = claim_uid + "-" + device.result.device;
  const IommuInterface iommu = device.config.iommu;
  const bool legacy = iommu != IommuInterface::kIommufd;
  std::optional<int> group = device.iommu_group;
  std::string sysfs_dir = "bus/pci/devices/" + device.address;
  if (device.kind == PlannedKind::kMdev) {
    auto mdev_group = mdevs_.IommuGroup(device.mdev.uuid);
    if (!mdev_group.ok()) return mdev_group.error();
    group = *mdev_group;
    sysfs_dir = "bus/mdev/devices/" + device.mdev.uuid;
  } else if (!group) {
    // No-IOMMU mode: the kernel makes a group when vfio-pci binds the device.
    auto bound = sysfs_.LinkBaseName(sysfs_dir + "/iommu_group");
    if (!bound.ok()) return bound.error().Wrap("device " + device.address + " has no VFIO group");
    group = std::stoi(*bound);
  }
  if (legacy) {
    needs_container = true;
    auto node = nodes_.Group(*group);
    if (!node.ok()) return node.error().Wrap("device " + device.result.device);
    out.device_nodes.push_back(CdiNode(*node));
  }
  if (iommu != IommuInterface::kLegacy) {
    auto iommufd = nodes_.Iommufd();
    if (!iommufd.ok()) {
      if (iommu == IommuInterface::kIommufd) {
        return iommufd.error().Wrap("device " + device.result.device +
                                    ": VfioConfig asks for iommuInterface iommufd");
      }
    } else {
      out.device_nodes.push_back(CdiNode(*iommufd));
      std::vector<std::string> dirs;
      if (device.kind == PlannedKind::kMdev) {
        dirs.push_back(sysfs_dir);
      } else {
        for (const std::string& f : device.functions) dirs.push_back("bus/pci/devices/" + f);
      }
      for (const std::string& dir : dirs) {
        auto cdevs = nodes_.DeviceCdevs(dir);
        if (!cdevs.ok()) return cdevs.error().Wrap("device " + device.result.device);
        if (cdevs->empty() && iommu == IommuInterface::kIommufd) {
          return MakeError(ErrorKind::kFailedPrecondition,
                           "device " + device.result.device + ": " + sysfs_.Path(dir) +
                               " has no vfio-dev cdev (the kernel lacks "
                               "CONFIG_VFIO_DEVICE_CDEV); use iommuInterface legacy or both");
        }
        for (const auto& cdev : *cdevs) out.device_nodes.push_back(CdiNode(cdev));
      }
    }
  }
  return out;
}

Status VfioDevicePreparer::WriteMetadata(const kube::ResourceClaim& claim,
                                         const std::vector<PlannedDevice>& plan,
                                         std::vector<PreparedDevice>& answer) {
  std::vector<std::string> requests;
  for (const PlannedDevice& device : plan) {
    const std::string request = kube::BaseRequestName(device.result.request);
    if (!Contains(requests, request)) requests.push_back(request);
  }
  for (const std::string& request : requests) {
    cdi::RequestMetadata metadata;
    metadata.claim_namespace = claim.namespace_;
    metadata.claim_name = claim.name;
    metadata.claim_uid = claim.uid;
    metadata.request = request;
    metadata.generation = claim.generation;
    if (auto it = claim.annotations.find(kPodClaimNameAnnotation); it != claim.annotations.end()) {
      metadata.pod_claim_name = it->second;
    }
    for (const PlannedDevice& device : plan) {
      if (kube::BaseRequestName(device.result.request) != request) continue;
      cdi::MetadataDevice entry{options_.driver_name, device.result.pool, device.result.device, {}};
      for (const auto& [name, value] : device.published.attributes) {
        entry.attributes[name] = slicepublisher::AttributeJson(value);
      }
      metadata.devices.push_back(std::move(entry));
    }
    Step("metadata:write:" + request);
    auto id = metadata_.Write(metadata);
    if (!id.ok()) return id.error();
    for (PreparedDevice& prepared : answer) {
      if (prepared.request_names.front() == request) {
        prepared.cdi_device_ids.push_back(*id);
        break;
      }
    }
  }
  return Status::Ok();
}

Result<std::vector<PreparedDevice>> VfioDevicePreparer::Apply(const kube::ResourceClaim& claim,
                                                              std::vector<PlannedDevice>& plan) {
  for (PlannedDevice& device : plan) {
    if (device.kind == PlannedKind::kPci) {
      for (const std::string& address : device.functions) {
        Step("bind:" + address);
        if (Status s = Timed("bind", [&] { return binder_.BindToVfio(address); }); !s.ok()) {
          return s.error().Wrap("device " + device.result.device);
        }
      }
    } else if (device.mdev_created_by_driver) {
      Step("mdev-create:" + device.mdev.uuid);
      auto created = Timed("mdev_create", [&] { return mdevs_.Create(device.mdev); });
      if (!created.ok()) return created.error().Wrap("device " + device.result.device);
    }
  }

  cdi::Spec spec;
  spec.kind = kind_;
  bool needs_container = false;
  std::vector<PreparedDevice> answer;
  for (const PlannedDevice& device : plan) {
    auto cdi_device = CdiDevice(claim.uid, device, needs_container);
    if (!cdi_device.ok()) return cdi_device.error();
    PreparedDevice prepared;
    prepared.request_names = {kube::BaseRequestName(device.result.request)};
    prepared.pool_name = device.result.pool;
    prepared.device_name = device.result.device;
    prepared.share_id = device.result.share_id;
    prepared.cdi_device_ids = {cdi::QualifiedDeviceId(kind_, cdi_device->name)};
    spec.devices.push_back(std::move(*cdi_device));
    answer.push_back(std::move(prepared));
  }
  if (needs_container) {
    auto container = nodes_.Container();
    if (!container.ok()) return container.error();
    spec.common_device_nodes.push_back(CdiNode(*container));
  }
  Step("cdi:write");
  if (Status s = cdi_.Write(SpecFileName(claim.uid), spec); !s.ok()) return s.error();
  if (Status s = WriteMetadata(claim, plan, answer); !s.ok()) return s.error();
  return answer;
}

Result<std::vector<PreparedDevice>> VfioDevicePreparer::Prepare(
    const kube::ResourceClaim& claim,
    const std::vector<kube::DeviceRequestAllocationResult>& ours) {
  const std::string who = "claim " + claim.namespace_ + "/" + claim.name;
  if (!IsObjectUid(claim.uid)) {
    return MakeError(ErrorKind::kInvalidArgument, who + ": uid is not a valid object UID");
  }
  auto plan = PlanClaim(claim, ours,
                        PlanContext{options_.driver_name, options_.node_name, published_, sysfs_});
  if (!plan.ok()) return plan.error().Wrap(who);

  const ClaimRecord* existing = checkpoint_.Find(claim.uid);
  const bool was_completed =
      existing != nullptr && existing->state == PrepareState::kPrepareCompleted;
  ClaimRecord record = existing != nullptr ? *existing : ClaimRecord{};
  if (!was_completed) record.state = PrepareState::kPrepareStarted;
  if (Status s = RecordStart(claim, *plan, record); !s.ok()) {
    return s.error().Wrap(who + ": cannot record the prepare in the checkpoint");
  }

  auto answer = Apply(claim, *plan);
  if (!answer.ok()) {
    Error error = answer.error().Wrap(who);
    if (!was_completed) {
      // Leave the node as it was: nothing of a failed first prepare may linger.
      if (Status undo = Undo(record); !undo.ok()) {
        error.message += "; rolling back also failed: " + undo.error().message +
                         " (unprepare or a restart will retry)";
      }
    }
    return error;
  }
  record.state = PrepareState::kPrepareCompleted;
  record.response = AnswerJson(*answer, *plan);
  Step("checkpoint:completed");
  Status completed = checkpoint_.Put(record);
  NoteCheckpoint();
  if (!completed.ok()) {
    return completed.error().Wrap(who + ": cannot record the completed prepare");
  }
  Step("prepare:done");
  return std::move(*answer);
}

Status VfioDevicePreparer::Undo(const ClaimRecord& record) {
  const std::string who =
      "claim " + record.namespace_ + "/" + record.name + " (uid " + record.uid + ")";
  std::optional<Error> first;
  auto note = [&](const Error& e) {
    log_.Error("undo step failed", {{"claim", who}, {"error", e.message}});
    if (!first) first = e;
  };
  Step("cdi:remove");
  for (auto it = record.cdi_files.rbegin(); it != record.cdi_files.rend(); ++it) {
    if (Status s = cdi_.Remove(*it); !s.ok()) note(s.error());
  }
  Step("metadata:remove");
  if (Status s = metadata_.RemoveClaim(record.namespace_, record.name, record.uid); !s.ok()) {
    note(s.error());
  }
  for (auto it = record.mdevs.rbegin(); it != record.mdevs.rend(); ++it) {
    if (!it->created_by_us) continue;
    Step("mdev-remove:" + it->uuid);
    if (Status s = Timed("mdev_remove", [&] { return mdevs_.Remove(it->uuid); }); !s.ok()) {
      note(s.error());
    }
  }
  for (auto it = record.functions.rbegin(); it != record.functions.rend(); ++it) {
    Step("restore:" + it->address);
    auto warning = Timed("restore", [&] { return binder_.Restore(*it); });
    if (!warning.ok()) {
      note(warning.error());
    } else if (!warning->empty()) {
      log_.Warn("device not fully restored", {{"claim", who}, {"warning", *warning}});
    }
  }
  if (first) return first->Wrap(who + ": unprepare is incomplete");
  Step("checkpoint:remove");
  Status removed = checkpoint_.Remove(record.uid);
  NoteCheckpoint();
  if (!removed.ok()) return removed.error().Wrap(who);
  Step("unprepare:done");
  return Status::Ok();
}

Status VfioDevicePreparer::Unprepare(const ClaimRef& claim) {
  const ClaimRecord* record = checkpoint_.Find(claim.uid);
  if (record == nullptr) return Status::Ok();  // never prepared, or already undone
  const ClaimRecord copy = *record;
  return Undo(copy);
}

Status VfioDevicePreparer::Recover() {
  std::optional<Error> first;
  std::vector<ClaimRecord> started;
  for (const auto& [uid, record] : checkpoint_.claims()) {
    if (record.state == PrepareState::kPrepareStarted) started.push_back(record);
  }
  for (const ClaimRecord& record : started) {
    log_.Info("rolling back a prepare interrupted by a restart",
              {{"claim", record.namespace_ + "/" + record.name}, {"uid", record.uid}});
    if (Status s = Undo(record); !s.ok() && !first) first = s.error();
  }
  // CDI specs of ours that no claim owns (left by a checkpoint that was lost) would inject
  // devices nobody prepared; metadata specs go with them.
  std::set<std::string> owned;
  for (const auto& [uid, record] : checkpoint_.claims()) {
    owned.insert(record.cdi_files.begin(), record.cdi_files.end());
  }
  const std::string spec_prefix = SpecFileName("");
  const std::string metadata_prefix = options_.driver_name + "_metadata_";
  for (const std::string& prefix :
       {spec_prefix.substr(0, spec_prefix.size() - 5), metadata_prefix}) {
    auto files = cdi_.List(prefix);
    if (!files.ok()) {
      if (!first) first = files.error();
      continue;
    }
    for (const std::string& file : *files) {
      if (owned.count(file) != 0) continue;
      log_.Warn("removing a CDI spec no prepared claim owns", {{"file", cdi_.PathOf(file)}});
      if (Status s = cdi_.Remove(file); !s.ok() && !first) first = s.error();
    }
  }
  if (first) return first->Wrap("recovering from the prepare checkpoint");
  return Status::Ok();
}

}  // namespace vfio_dra::plugin
