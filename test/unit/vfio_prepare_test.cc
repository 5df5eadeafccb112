// Device preparation end to end in one process: the real VfioDevicePreparer (binding, mdevs, CDI,
// metadata, checkpoint) against fixture nodes and the SimulatedKernel.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "base/file_io.h"
#include "base/file_lock.h"
#include "discovery/admin_policy.h"
#include "discovery/node_scan.h"
#include "prepare/device_health.h"
#include "prepare/vfio_device_preparer.h"
#include "simulated_kernel.h"
#include "slicepublisher/device_attributes.h"
#include "slicepublisher/slice_builder.h"
#include "sysfs/vfio_aliases.h"
#include "unit/fake_clock.h"
#include "unit/fixture_node.h"

namespace vfio_dra::testing {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using prepare::PreparedDevice;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr const char* kDriver = "vfio.dra.io";
constexpr const char* kUid = "4f1c2a9e-0000-4000-8000-000000000001";

std::string Slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

struct Alloc {
  std::string request;
  std::string device;
};

class FakePods final : public kube::PodReader {
 public:
  std::map<std::string, kube::Pod> pods;
  Result<kube::Pod> Get(const std::string& namespace_, const std::string& name, Deadline) override {
    auto it = pods.find(namespace_ + "/" + name);
    if (it == pods.end()) return MakeError(ErrorKind::kNotFound, "pod " + name + " not found");
    return it->second;
  }
};

// Called from the claim status queue's worker: read `applied` once the queue settled, change
// `fail` only then. Reads show the claim with what was applied last (across daemon restarts: the
// claim is on the server).
class RecordingClaimStatus final : public kube::ClaimStatusWriter {
 public:
  std::vector<std::vector<kube::AllocatedDeviceStatus>> applied;
  std::optional<Error> fail;
  int attempts = 0;
  Status Apply(const kube::ClaimStatusTarget&, const std::vector<kube::AllocatedDeviceStatus>& d,
               Deadline) override {
    ++attempts;
    if (fail) return *fail;
    applied.push_back(d);
    return Status::Ok();
  }
  // `fail` stands for a write the server refuses: reads succeed.
  Result<kube::ClaimStatusReading> Read(const kube::ClaimStatusTarget&, Deadline) override {
    return kube::ClaimStatusReading{
        "resource.k8s.io/v1", "",
        applied.empty() ? std::vector<kube::AllocatedDeviceStatus>() : applied.back()};
  }
};

class PrepareTest : public ::testing::Test {
 protected:
  void Use(const std::string& fixture) {
    node_ = std::make_unique<FixtureNode>(fixture);
    sysfs_ = std::make_unique<sysfs::SysfsReader>(node_->sysfs_root());
    kernel_ = std::make_unique<SimulatedKernel>(node_->sysfs_root(), DevRoot());
    WriteBootId("boot-1");
    ChooseVfioDrivers();
    Publish();
    Open();
  }
  // The kernel's aliases as the fixture states them (none: vfio-pci for all) and `rules`.
  void ChooseVfioDrivers(std::vector<discovery::VfioDriverRule> rules = {}) {
    auto aliases = sysfs::VfioAliases::Load(ModulesAliasFile(node_->sysfs_root()));
    ASSERT_TRUE(aliases.ok()) << aliases.error().message;
    vfio_drivers_ =
        std::make_shared<const discovery::VfioDriverChooser>(std::move(*aliases), std::move(rules));
  }
  std::string DevRoot() const { return node_->dir() + "/dev"; }
  std::string CdiDir() const { return node_->dir() + "/cdi"; }
  std::string DataDir() const { return node_->dir() + "/data"; }
  std::string VfNetDir() const { return node_->dir() + "/vfnet"; }
  // The simulated PF driver's state of `count` VFs of `pf`: all zero, spoof checking on.
  void SeedVfs(const std::string& pf, int count) {
    fs::create_directories(VfNetDir() + "/" + pf);
    for (int i = 0; i < count; ++i) {
      std::ofstream(VfNetDir() + "/" + pf + "/vf" + std::to_string(i) + ".json")
          << R"({"mac":"00:00:00:00:00:00","vlan":0,"qos":0,"spoofchk":true,"trust":false})";
    }
  }
  json VfState(const std::string& pf, int index) const {
    return json::parse(Slurp(VfNetDir() + "/" + pf + "/vf" + std::to_string(index) + ".json"));
  }
  void WriteBootId(const std::string& id) {
    std::ofstream(node_->dir() + "/boot_id") << id << "\n";
  }
  void Publish() {
    discovery::ScanContext context;
    context.vfio_drivers = vfio_drivers_.get();
    auto scan = discovery::ScanNode(*sysfs_, nullptr, discovery::AdminPolicy{}, context);
    capacity_.Observe(scan->inventory);
    slicepublisher::DesiredPool pool = slicepublisher::BuildDesiredPool(
        *scan, {"node1", slicepublisher::CounterLayout::kOwnSlice}, capacity_);
    if (!scan->selection.vgpu_gpus.empty()) AddVgpusOfEveryType(context, pool);
    published_.Set(pool);
  }
  // A GPU offers one type at a time; prepare must still cope with allocations made from slices
  // published before the GPU's state or the policy changed (stale ones), so every type the idle
  // GPUs list is published on every VF, as a layout created on demand would offer it.
  void AddVgpusOfEveryType(const discovery::ScanContext& context,
                           slicepublisher::DesiredPool& pool) {
    std::set<std::string> names;
    for (const auto& slice : pool.slices) {
      for (const auto& device : slice.devices) names.insert(device.name);
    }
    slicepublisher::SliceContent extra;
    for (const char* type : {"1414", "1415", "1416"}) {
      auto policy = discovery::ParseAdminPolicy(
          std::string("vgpuLayouts:\n  - {match: {vendor: \"10de\"}, vgpuType: \"") + type +
              "\", count: 4, create: onDemand}\n",
          "stale.yaml");
      ASSERT_TRUE(policy.ok()) << policy.error().message;
      auto scan = discovery::ScanNode(*sysfs_, nullptr, *policy, context);
      for (const auto& slice :
           slicepublisher::BuildDesiredPool(
               *scan, {"node1", slicepublisher::CounterLayout::kOwnSlice}, capacity_)
               .slices) {
        for (const auto& device : slice.devices) {
          if (names.insert(device.name).second) extra.devices.push_back(device);
        }
      }
    }
    pool.slices.push_back(std::move(extra));
  }
  // Publishes as the daemon does, with taints: a device a prepared claim holds stays published
  // while it holds it (tainted lost when it is gone from the node).
  void PublishWithTaints() {
    discovery::ScanContext context;
    context.vfio_drivers = vfio_drivers_.get();
    auto scan = discovery::ScanNode(*sysfs_, nullptr, discovery::AdminPolicy{}, context);
    const slicepublisher::PublishedDevices::Snapshot before = published_.Current();
    slicepublisher::TaintInputs taints{kDriver, "2026-01-01T00:00:00Z", before.devices.get()};
    for (const prepare::PreparedTarget& target : *preparer_->Prepared()) {
      taints.held.insert(target.device);
    }
    capacity_.Observe(scan->inventory);
    published_.Set(slicepublisher::BuildDesiredPool(
        *scan, {"node1", slicepublisher::CounterLayout::kOwnSlice, &taints}, capacity_));
  }
  void Open() {
    preparer_.reset();
    // A restarted daemon has a queue of its own.
    status_queue_.reset();
    kube::ClaimStatusQueueOptions queue_options;
    queue_options.jitter_seed = 1;
    status_queue_ =
        std::make_unique<kube::ClaimStatusQueue>(status_, clock_, Logger::Discard(), queue_options);
    prepare::PreparerOptions options;
    options.driver_name = kDriver;
    options.node_name = "node1";
    options.plugin_data_dir = DataDir();
    options.cdi_dir = CdiDir();
    options.dev_root = DevRoot();
    options.unbind_timeout = unbind_timeout_;
    options.boot_id_file = node_->dir() + "/boot_id";
    options.before_step = step_hook_;
    options.vfio_drivers = vfio_drivers_;
    options.vf_network = vfio::MakeFileVfNetwork(VfNetDir());
    options.pods = &pods_;
    options.claim_status = status_queue_.get();
    options.missing_privileges = [this] { return missing_privileges_; };
    options.holders_gap = holders_gap_;
    options.checkpoint_sync = checkpoint_sync_;
    fs::create_directories(DataDir());
    fs::create_directories(CdiDir());
    auto opened = prepare::VfioDevicePreparer::Open(options, *sysfs_, *kernel_, published_,
                                                    Logger::Discard());
    ASSERT_TRUE(opened.ok()) << opened.error().message;
    preparer_ = std::move(*opened);
  }
  // A reboot: sysfs comes back with the host drivers, /dev/vfio and /var/run/cdi are empty, and
  // the boot ID changes; the plugin data dir (with the checkpoint) survives.
  void Reboot(const std::string& fixture) {
    kernel_.reset();
    fs::remove_all(node_->sysfs_root());
    fs::remove(node_->sysfs_root() + ".sim.json");
    fs::remove_all(DevRoot());
    fs::remove_all(CdiDir());
    BuildFixture(fixture, node_->sysfs_root());
    kernel_ = std::make_unique<SimulatedKernel>(node_->sysfs_root(), DevRoot());
    WriteBootId("boot-2");
    Open();
  }
  kube::ResourceClaim Claim(const std::vector<Alloc>& allocs, const std::string& uid = kUid,
                            const std::string& name = "gpu-claim") {
    kube::ResourceClaim claim;
    claim.namespace_ = "vms";
    claim.name = name;
    claim.uid = uid;
    claim.generation = 1;
    claim.allocation.emplace();
    for (const Alloc& a : allocs) {
      kube::DeviceRequestAllocationResult r;
      r.request = a.request;
      r.driver = kDriver;
      r.pool = "node1";
      r.device = a.device;
      claim.allocation->results.push_back(r);
    }
    return claim;
  }
  void AddConfig(kube::ResourceClaim& claim, const json& parameters,
                 std::vector<std::string> requests = {}) {
    kube::DeviceAllocationConfiguration config;
    config.source = "FromClaim";
    config.requests = std::move(requests);
    config.opaque = kube::OpaqueDeviceConfiguration{kDriver, parameters};
    claim.allocation->config.push_back(config);
  }
  Result<std::vector<PreparedDevice>> Prepare(const kube::ResourceClaim& claim) {
    return preparer_->Prepare(claim, claim.allocation->results, Deadline());
  }
  std::optional<prepare::ClaimRecord> Recorded(const std::string& uid) const {
    auto record = preparer_->checkpoint().Find(uid);
    EXPECT_TRUE(record.ok()) << record.error().message;
    return record.ok() ? *record : std::nullopt;
  }
  Status Unprepare(const std::string& uid = kUid, const std::string& name = "gpu-claim") {
    return preparer_->Unprepare(prepare::ClaimRef{"vms", name, uid}, Deadline());
  }
  std::string Driver(const std::string& address) const {
    auto link = sysfs_->LinkBaseName("bus/pci/devices/" + address + "/driver");
    return link.ok() ? *link : "";
  }
  std::string Override(const std::string& address) const {
    return Slurp(node_->sysfs_root() + "/bus/pci/devices/" + address + "/driver_override");
  }
  std::vector<std::string> CdiFiles() const {
    std::vector<std::string> files;
    for (const auto& entry : fs::directory_iterator(CdiDir())) {
      files.push_back(entry.path().filename().string());
    }
    std::sort(files.begin(), files.end());
    return files;
  }
  json CdiSpec(const std::string& file) const { return json::parse(Slurp(CdiDir() + "/" + file)); }
  // Every write went to an attribute of `functions` or to bind/unbind of a driver, with the
  // function's address as the value.
  void ExpectWritesConfinedTo(const std::set<std::string>& functions) const {
    for (const SimWrite& w : kernel_->Writes()) {
      EXPECT_TRUE(IsManagedWrite(w, functions))
          << "write outside the managed devices: " << w.path << " <- " << w.value;
    }
  }
  static std::string Uid(int n) {
    char buffer[48];
    std::snprintf(buffer, sizeof buffer, "4f1c2a9e-0000-4000-8000-%012d", n);
    return buffer;
  }

  std::unique_ptr<FixtureNode> node_;
  std::unique_ptr<sysfs::SysfsReader> sysfs_;
  std::unique_ptr<SimulatedKernel> kernel_;
  slicepublisher::MdevTypeMaxima capacity_;
  slicepublisher::PublishedDevices published_;
  std::unique_ptr<prepare::VfioDevicePreparer> preparer_;
  std::shared_ptr<const discovery::VfioDriverChooser> vfio_drivers_;
  std::function<void(const std::string&)> step_hook_;
  std::chrono::milliseconds unbind_timeout_{std::chrono::seconds(5)};
  DiskSync checkpoint_sync_;  // unset: fsync(2)
  // Waits until the status writes due now are done (not those waiting for a retry).
  void SettleStatus() { ASSERT_TRUE(status_queue_->WaitUntilSettled(std::chrono::seconds(60))); }

  // What the daemon's privilege check found: CheckPrivileges on the published devices with the
  // kernel's VF network (rtnetlink) and the capabilities `cap_eff`.
  void CheckPrivileges(const std::string& cap_eff) {
    const std::string status = node_->dir() + "/status";
    std::ofstream(status) << "CapEff:\t" << cap_eff << "\n";
    discovery::ScanContext context;
    context.vfio_drivers = vfio_drivers_.get();
    auto scan = discovery::ScanNode(*sysfs_, nullptr, discovery::AdminPolicy{}, context);
    vfio::PrivilegeCheckOptions check;
    check.dev_root = DevRoot();
    check.process_status = status;
    missing_privileges_ =
        std::make_shared<const std::vector<vfio::MissingPrivilege>>(vfio::CheckPrivileges(
            vfio::PrivilegeNeedsOf(scan->inventory, scan->selection), *sysfs_, *kernel_, check));
    Open();
  }
  std::shared_ptr<const std::vector<vfio::MissingPrivilege>> missing_privileges_;
  std::string holders_gap_;

  FakePods pods_;
  FakeClock clock_;
  RecordingClaimStatus status_;
  std::unique_ptr<kube::ClaimStatusQueue> status_queue_;
};

TEST_F(PrepareTest, GpuWithItsAudioFunctionIsBoundAsAGroupAndRestoredExactly) {
  Use("workstation");
  auto prepared = Prepare(Claim({{"gpu", "gpu-0000-01-00-0"}}));
  ASSERT_TRUE(prepared.ok()) << prepared.error().message;
  EXPECT_EQ(Driver("0000:01:00.0"), "vfio-pci");
  EXPECT_EQ(Driver("0000:01:00.1"), "vfio-pci");
  EXPECT_EQ(Override("0000:01:00.0"), "vfio-pci\n");
  EXPECT_EQ(Driver("0000:02:00.0"), "nouveau");  // the other GPU is untouched

  ASSERT_EQ(prepared->size(), 1u);
  const PreparedDevice& device = prepared->front();
  EXPECT_EQ(device.device_name, "gpu-0000-01-00-0");
  EXPECT_EQ(device.pool_name, "node1");
  EXPECT_THAT(device.request_names, ElementsAre("gpu"));
  EXPECT_THAT(device.cdi_device_ids,
              ElementsAre(std::string("vfio.dra.io/vfio=") + kUid + "-gpu-0000-01-00-0",
                          std::string("vfio.dra.io/metadata=") + kUid + "_gpu"));

  const std::string spec_file = std::string("vfio.dra.io-vfio_") + kUid + ".json";
  const std::string metadata_spec = std::string("vfio.dra.io_metadata_") + kUid + "_gpu.json";
  EXPECT_THAT(CdiFiles(), ElementsAre(spec_file, metadata_spec));
  EXPECT_EQ(CdiSpec(spec_file), json::parse(R"({"cdiVersion":"0.5.0","kind":"vfio.dra.io/vfio",
              "containerEdits":{"deviceNodes":[
                {"path":"/dev/vfio/vfio","type":"c","major":10,"minor":196}]},
              "devices":[{"name":")" + std::string(kUid) +
                                            R"(-gpu-0000-01-00-0",
                "containerEdits":{"deviceNodes":[
                  {"path":"/dev/vfio/10","type":"c","major":241,"minor":10}]}}]})"));
  struct stat st {};
  ASSERT_EQ(::stat((CdiDir() + "/" + spec_file).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644u);

  const std::string host_metadata = DataDir() + "/dra-device-metadata/" + kUid + "_gpu.json";
  EXPECT_EQ(
      CdiSpec(metadata_spec), json::parse(R"({"cdiVersion":"0.5.0","kind":"vfio.dra.io/metadata",
              "devices":[{"name":")" + std::string(kUid) +
                                          R"(_gpu","containerEdits":{"mounts":[
                {"hostPath":")" + host_metadata +
                                          R"(",
                 "containerPath":"/var/run/kubernetes.io/dra-device-attributes/resourceclaims/gpu-claim/gpu/vfio.dra.io-metadata.json",
                 "options":["ro","bind"]}]}}]})"));
  const std::string stream = Slurp(host_metadata);
  ASSERT_FALSE(stream.empty());
  EXPECT_EQ(stream.back(), '\n');
  const json metadata = json::parse(stream);
  EXPECT_EQ(metadata["apiVersion"], "metadata.resource.k8s.io/v1alpha1");
  EXPECT_EQ(metadata["kind"], "DeviceMetadata");
  EXPECT_EQ(metadata["metadata"]["uid"], kUid);
  EXPECT_EQ(metadata["metadata"]["namespace"], "vms");
  EXPECT_EQ(metadata["metadata"]["name"], "gpu-claim");
  EXPECT_FALSE(metadata.contains("podClaimName"));
  const json& dev = metadata["requests"][0]["devices"][0];
  EXPECT_EQ(metadata["requests"][0]["name"], "gpu");
  EXPECT_EQ(dev["driver"], kDriver);
  EXPECT_EQ(dev["pool"], "node1");
  EXPECT_EQ(dev["name"], "gpu-0000-01-00-0");
  EXPECT_EQ(dev["attributes"]["resource.kubernetes.io/pciBusID"],
            json({{"string", "0000:01:00.0"}}));

  const auto record = Recorded(kUid);
  ASSERT_TRUE(record.has_value());
  EXPECT_EQ(record->state, prepare::PrepareState::kPrepareCompleted);
  ASSERT_EQ(record->functions.size(), 2u);
  EXPECT_EQ(record->functions[0].Binding(),
            (vfio::OriginalBinding{"0000:01:00.0", "nvidia", "", false}));
  EXPECT_EQ(record->functions[1].Binding(),
            (vfio::OriginalBinding{"0000:01:00.1", "snd_hda_intel", "", false}));
  // What each function is, to recognise it after a reboot: the same strings as earlier versions
  // recorded from the vendor, device and subsystem files ("0x10de\n" -> "10de"), so their
  // records still compare equal.
  for (const prepare::FunctionRecord& f : record->functions) {
    auto file = [&](const char* name) {
      std::string text =
          *ReadFileToString(node_->sysfs_root() + "/bus/pci/devices/" + f.address + "/" + name);
      return text.substr(2, text.find('\n') - 2);
    };
    EXPECT_EQ(f.identity,
              (prepare::PciIdentity{file("vendor"), file("device"), file("subsystem_vendor"),
                                    file("subsystem_device")}))
        << f.address << ": " << f.identity.Display();
  }
  EXPECT_EQ(record->functions[0].identity.vendor, "10de");

  ASSERT_TRUE(Unprepare().ok());
  EXPECT_EQ(Driver("0000:01:00.0"), "nvidia");
  EXPECT_EQ(Driver("0000:01:00.1"), "snd_hda_intel");
  EXPECT_EQ(Override("0000:01:00.0"), "(null)\n");
  EXPECT_EQ(Override("0000:01:00.1"), "(null)\n");
  EXPECT_TRUE(CdiFiles().empty());
  EXPECT_FALSE(fs::exists(DataDir() + "/dra-device-metadata/" + kUid + "_gpu.json"));
  EXPECT_EQ(Recorded(kUid), std::nullopt);
  EXPECT_FALSE(fs::exists(DevRoot() + "/vfio/10"));
  ExpectWritesConfinedTo({"0000:01:00.0", "0000:01:00.1"});
  ASSERT_TRUE(Unprepare().ok()) << "a second unprepare is a no-op";
}

TEST_F(PrepareTest, TuringGpuTakesAllFourFunctionsOfItsGroup) {
  Use("workstation");
  ASSERT_TRUE(Prepare(Claim({{"gpu", "gpu-0000-02-00-0"}})).ok());
  for (const char* f : {"0000:02:00.0", "0000:02:00.1", "0000:02:00.2", "0000:02:00.3"}) {
    EXPECT_EQ(Driver(f), "vfio-pci") << f;
  }
  ASSERT_TRUE(Unprepare().ok());
  EXPECT_EQ(Driver("0000:02:00.0"), "nouveau");
  EXPECT_EQ(Driver("0000:02:00.1"), "snd_hda_intel");
  EXPECT_EQ(Driver("0000:02:00.2"), "xhci_hcd");
  EXPECT_EQ(Driver("0000:02:00.3"), "nvidia-gpu");
}

TEST_F(PrepareTest, SriovVfIsBoundAndReturnedToItsVfDriver) {
  Use("sriov");
  auto prepared = Prepare(Claim({{"nic", "vf-0000-5e-02-3"}}));
  ASSERT_TRUE(prepared.ok()) << prepared.error().message;
  EXPECT_EQ(Driver("0000:5e:02.3"), "vfio-pci");
  EXPECT_EQ(Driver("0000:5e:02.2"), "iavf");
  EXPECT_EQ(Driver("0000:5e:00.0"), "i40e");
  ASSERT_TRUE(Unprepare().ok());
  EXPECT_EQ(Driver("0000:5e:02.3"), "iavf");
  ExpectWritesConfinedTo({"0000:5e:02.3"});
}

// A network VF gets the claim's VfioConfig settings and the MAC its KubeVirt pod asks for (which
// wins over the config's), before it is bound; the checkpoint records what it had; the metadata
// and the claim status carry the MAC; unprepare restores exactly what was changed.
TEST_F(PrepareTest, AVfGetsItsNetworkSettingsBeforeBindingAndThemRestoredAfter) {
  Use("sriov");
  SeedVfs("0000:5e:00.0", 8);
  kube::ResourceClaim claim = Claim({{"nic", "vf-0000-5e-02-3"}});
  AddConfig(claim, {{"apiVersion", "vfio.dra.io/v1alpha1"},
                    {"kind", "VfioConfig"},
                    {"macAddress", "02:00:00:00:00:01"},
                    {"vlan", 42},
                    {"qos", 3},
                    {"trust", true}});
  claim.reserved_for.push_back({"", "pods", "virt-launcher-vm", "pod-uid-1"});
  claim.annotations[kube::kPodClaimNameAnnotation] = "sriov";
  kube::Pod pod;
  pod.namespace_ = "vms";
  pod.name = "virt-launcher-vm";
  pod.uid = "pod-uid-1";
  pod.annotations["kubevirt.io/dra-networks"] =
      R"([{"claimName":"sriov","requestName":"nic","mac":"02:00:00:00:be:ef"}])";
  pods_.pods["vms/virt-launcher-vm"] = pod;
  std::vector<std::string> steps;
  step_hook_ = [&](const std::string& step) {
    if (step.rfind("vf-config:", 0) == 0 || step.rfind("bind:", 0) == 0) steps.push_back(step);
  };
  Open();

  auto prepared = Prepare(claim);
  ASSERT_TRUE(prepared.ok()) << prepared.error().message;
  EXPECT_THAT(steps, ElementsAre("vf-config:0000:5e:02.3", "bind:0000:5e:02.3"));
  EXPECT_EQ(Driver("0000:5e:02.3"), "vfio-pci");
  EXPECT_EQ(VfState("0000:5e:00.0", 3),
            json::parse(R"({"mac":"02:00:00:00:be:ef","vlan":42,"qos":3,"spoofchk":true,
                            "trust":true})"));
  EXPECT_EQ(VfState("0000:5e:00.0", 2)["mac"], "00:00:00:00:00:00");
  auto record = Recorded(kUid);
  ASSERT_TRUE(record.has_value());
  ASSERT_EQ(record->vf_networks.size(), 1u);
  EXPECT_EQ(record->vf_networks[0].previous.mac, "00:00:00:00:00:00");
  EXPECT_EQ(record->vf_networks[0].applied.Display(),
            "mac 02:00:00:00:be:ef, vlan 42 qos 3, trust on");
  // The metadata file carries the MAC as an attribute.
  const json metadata =
      json::parse(Slurp(DataDir() + "/dra-device-metadata/" + kUid + "_nic.json"));
  EXPECT_EQ(metadata["requests"][0]["devices"][0]["attributes"]["macAddress"],
            json({{"string", "02:00:00:00:be:ef"}}));
  // The claim status: Ready, with the MAC as the hardware address.
  SettleStatus();
  ASSERT_EQ(status_.applied.size(), 1u);
  ASSERT_EQ(status_.applied[0].size(), 1u);
  const kube::AllocatedDeviceStatus& status = status_.applied[0][0];
  EXPECT_EQ(status.device, "vf-0000-5e-02-3");
  ASSERT_EQ(status.conditions.size(), 1u);
  EXPECT_EQ(status.conditions[0].type, "Ready");
  EXPECT_EQ(status.conditions[0].status, "True");
  ASSERT_TRUE(status.network_data.has_value());
  EXPECT_EQ(status.network_data->hardware_address, "02:00:00:00:be:ef");

  // A repeated prepare (the kubelet's retry) changes nothing and answers the same.
  steps.clear();
  ASSERT_TRUE(Prepare(claim).ok());
  EXPECT_THAT(steps, ElementsAre("vf-config:0000:5e:02.3", "bind:0000:5e:02.3"));
  EXPECT_EQ(VfState("0000:5e:00.0", 3)["mac"], "02:00:00:00:be:ef");

  ASSERT_TRUE(Unprepare().ok());
  EXPECT_EQ(Driver("0000:5e:02.3"), "iavf");
  EXPECT_EQ(VfState("0000:5e:00.0", 3),
            json::parse(R"({"mac":"00:00:00:00:00:00","vlan":0,"qos":0,"spoofchk":true,
                            "trust":false})"));
}

// Without CAP_NET_ADMIN a claim that sets a VF's MAC is refused with the privilege check's line,
// before anything is recorded or written; a claim of a VF that sets nothing does not need it.
TEST_F(PrepareTest, AVfWithAMacIsRefusedWithoutNetAdminBeforeAnySysfsWrite) {
  Use("sriov");
  SeedVfs("0000:5e:00.0", 8);
  CheckPrivileges("000001ffffffefff");  // all but CAP_NET_ADMIN
  ASSERT_EQ(missing_privileges_->size(), 1u);
  const std::string line = missing_privileges_->front().Line();
  EXPECT_THAT(line, HasSubstr("privilege missing: CAP_NET_ADMIN for VF network settings"));
  kube::ResourceClaim claim = Claim({{"nic", "vf-0000-5e-02-3"}});
  AddConfig(claim, {{"apiVersion", "vfio.dra.io/v1alpha1"},
                    {"kind", "VfioConfig"},
                    {"macAddress", "02:00:00:00:00:01"}});
  auto prepared = Prepare(claim);
  ASSERT_FALSE(prepared.ok());
  EXPECT_EQ(prepared.error().message,
            "claim vms/gpu-claim: device vf-0000-5e-02-3 is not prepared: " + line);
  EXPECT_EQ(prepared.error().kind, ErrorKind::kFailedPrecondition);
  EXPECT_TRUE(kernel_->Writes().empty());
  EXPECT_EQ(Recorded(kUid), std::nullopt);
  EXPECT_EQ(VfState("0000:5e:00.0", 3)["mac"], "00:00:00:00:00:00");
  EXPECT_EQ(Driver("0000:5e:02.3"), "iavf");
  EXPECT_TRUE(CdiFiles().empty());

  auto plain = Prepare(Claim({{"nic", "vf-0000-5e-02-3"}}));
  ASSERT_TRUE(plain.ok()) << plain.error().message;
  EXPECT_EQ(Driver("0000:5e:02.3"), "vfio-pci");
}

// A read-only /sys: the GPU's claim is refused naming the attribute, before any write.
TEST_F(PrepareTest, AGpuIsRefusedOnAReadOnlySysfsBeforeAnyWrite) {
  Use("workstation");
  kernel_->DenyWrites("", EROFS);
  CheckPrivileges("000001ffffffffff");
  ASSERT_EQ(missing_privileges_->size(), 1u);
  auto prepared = Prepare(Claim({{"gpu", "gpu-0000-01-00-0"}}));
  ASSERT_FALSE(prepared.ok());
  EXPECT_EQ(prepared.error().message,
            "claim vms/gpu-claim: device gpu-0000-01-00-0 is not "
            "prepared: " +
                missing_privileges_->front().Line());
  EXPECT_THAT(prepared.error().message, HasSubstr("Read-only file system"));
  EXPECT_TRUE(kernel_->Writes().empty());
  EXPECT_EQ(Recorded(kUid), std::nullopt);
}

// Without CAP_SYS_PTRACE the message of a busy device says its holders may be unnamed, and why.
TEST_F(PrepareTest, ABusyDeviceSaysItsHoldersMayBeUnnamedWithoutSysPtrace) {
  unbind_timeout_ = std::chrono::milliseconds(300);
  holders_gap_ = "holders may be unnamed: without CAP_SYS_PTRACE (test)";
  Use("workstation");
  kernel_->HangUnbind("0000:01:00.1");
  auto prepared = Prepare(Claim({{"gpu", "gpu-0000-01-00-0"}}));
  ASSERT_FALSE(prepared.ok());
  EXPECT_THAT(prepared.error().message,
              HasSubstr("no process in this PID namespace holds its /dev/vfio nodes (holders may "
                        "be unnamed: without CAP_SYS_PTRACE (test))"));
  kernel_->ReleaseHangs();
  kernel_->WaitIdle();
}

// Killed after the MAC was set and before the VF was bound: the record written first lets
// recovery put the VF's settings back.
TEST_F(PrepareTest, ACrashBetweenSettingTheMacAndBindingIsRolledBackByRecovery) {
  Use("sriov");
  SeedVfs("0000:5e:00.0", 8);
  kube::ResourceClaim claim = Claim({{"nic", "vf-0000-5e-02-3"}});
  AddConfig(claim, {{"apiVersion", "vfio.dra.io/v1alpha1"},
                    {"kind", "VfioConfig"},
                    {"macAddress", "02:00:00:00:00:01"},
                    {"spoofChk", false}});
  struct Crash {};
  step_hook_ = [](const std::string& step) {
    if (step == "bind:0000:5e:02.3") throw Crash{};
  };
  Open();
  EXPECT_THROW((void)Prepare(claim), Crash);
  EXPECT_EQ(VfState("0000:5e:00.0", 3)["mac"], "02:00:00:00:00:01");
  EXPECT_EQ(Recorded(kUid)->state, prepare::PrepareState::kPrepareStarted);

  step_hook_ = nullptr;
  Open();  // the restarted daemon
  ASSERT_TRUE(preparer_->Recover().ok());
  EXPECT_EQ(VfState("0000:5e:00.0", 3),
            json::parse(R"({"mac":"00:00:00:00:00:00","vlan":0,"qos":0,"spoofchk":true,
                            "trust":false})"));
  EXPECT_EQ(Driver("0000:5e:02.3"), "iavf");
  EXPECT_EQ(Recorded(kUid), std::nullopt);
}

// The VMM still holds the VF at unprepare: its unbind from vfio-pci blocks past the wait. The VF
// keeps the MAC and VLAN the VM was given (putting the PF's settings back under a running guest
// resets its NIC), through the kubelet's retries while the VMM runs; the retry after the VMM let
// go puts them back and returns the VF to iavf.
TEST_F(PrepareTest, AVfAVmStillHoldsKeepsItsSettingsUntilVfioLetsItGo) {
  unbind_timeout_ = std::chrono::milliseconds(300);
  Use("sriov");
  SeedVfs("0000:5e:00.0", 8);
  const json fresh = VfState("0000:5e:00.0", 3);
  kube::ResourceClaim claim = Claim({{"nic", "vf-0000-5e-02-3"}});
  AddConfig(claim, {{"apiVersion", "vfio.dra.io/v1alpha1"},
                    {"kind", "VfioConfig"},
                    {"macAddress", "02:00:00:00:00:01"},
                    {"vlan", 42}});
  ASSERT_TRUE(Prepare(claim).ok());
  const json given = VfState("0000:5e:00.0", 3);
  ASSERT_EQ(given["mac"], "02:00:00:00:00:01");

  kernel_->HangUnbind("0000:5e:02.3");
  Status held = Unprepare();
  ASSERT_FALSE(held.ok());
  EXPECT_THAT(held.error().message, HasSubstr("did not finish within 300 ms"));
  EXPECT_EQ(VfState("0000:5e:00.0", 3), given) << "the VF was reset under the VM";
  Status retried = Unprepare();
  ASSERT_FALSE(retried.ok());
  EXPECT_THAT(retried.error().message, HasSubstr("0000:5e:02.3 is still in use"));
  EXPECT_EQ(VfState("0000:5e:00.0", 3), given) << "the VF was reset under the VM";

  kernel_->ReleaseHangs();
  kernel_->WaitIdle();
  // The writer thread forgets the blocked write just after the kernel returns, hence the retries.
  Status undone = Unprepare();
  for (int attempt = 0; !undone.ok() && attempt < 1000; ++attempt) {
    std::this_thread::yield();
    undone = Unprepare();
  }
  ASSERT_TRUE(undone.ok()) << undone.error().message;
  EXPECT_EQ(Driver("0000:5e:02.3"), "iavf");
  EXPECT_EQ(VfState("0000:5e:00.0", 3), fresh);
  EXPECT_EQ(Recorded(kUid), std::nullopt);
}

// A host driver reads its VF's MAC when it probes: the settings go back while the VF is on no
// driver, after vfio-pci let it go and before iavf is bound, so iavf never sees the VM's MAC.
TEST_F(PrepareTest, AVfsSettingsGoBackBeforeItsHostDriverProbesIt) {
  Use("sriov");
  SeedVfs("0000:5e:00.0", 8);
  kube::ResourceClaim claim = Claim({{"nic", "vf-0000-5e-02-3"}});
  AddConfig(claim, {{"apiVersion", "vfio.dra.io/v1alpha1"},
                    {"kind", "VfioConfig"},
                    {"macAddress", "02:00:00:00:00:01"}});
  std::optional<std::string> driver_at_restore;
  std::optional<json> state_at_restore;
  step_hook_ = [&](const std::string& step) {
    if (step != "vf-restore:0000:5e:02.3") return;
    driver_at_restore = Driver("0000:5e:02.3");
    state_at_restore = VfState("0000:5e:00.0", 3);
  };
  Open();
  ASSERT_TRUE(Prepare(claim).ok());
  ASSERT_TRUE(Unprepare().ok());
  ASSERT_TRUE(driver_at_restore.has_value()) << "no VF settings were restored";
  EXPECT_EQ(*driver_at_restore, "") << "the VF's settings went back while it was on a driver";
  EXPECT_EQ((*state_at_restore)["mac"], "02:00:00:00:00:01");
  EXPECT_EQ(Driver("0000:5e:02.3"), "iavf");
  EXPECT_EQ(Override("0000:5e:02.3"), "(null)\n");
  EXPECT_EQ(VfState("0000:5e:00.0", 3)["mac"], "00:00:00:00:00:00");
}

// A claim that asks only for a VLAN changes only the VLAN: the priority and the protocol of the
// tag there (an 802.1ad tag an admin set) stay, the checkpoint records the protocol, and
// unprepare brings back exactly the tag that was there.
TEST_F(PrepareTest, AVlanAloneKeepsTheTagsPriorityAndProtocolAndTheTagComesBackWhole) {
  Use("sriov");
  SeedVfs("0000:5e:00.0", 8);
  std::ofstream(VfNetDir() + "/0000:5e:00.0/vf3.json", std::ios::trunc)
      << R"({"mac":"00:00:00:00:00:00","vlan":10,"qos":5,"vlanProto":"802.1ad","spoofchk":true,
             "trust":false})";
  const json before = VfState("0000:5e:00.0", 3);
  kube::ResourceClaim claim = Claim({{"nic", "vf-0000-5e-02-3"}});
  AddConfig(claim, {{"apiVersion", "vfio.dra.io/v1alpha1"}, {"kind", "VfioConfig"}, {"vlan", 42}});
  ASSERT_TRUE(Prepare(claim).ok());
  const json prepared = VfState("0000:5e:00.0", 3);
  EXPECT_EQ(prepared["vlan"], 42);
  EXPECT_EQ(prepared["qos"], 5) << "the tag's priority was cleared";
  EXPECT_EQ(prepared["vlanProto"], "802.1ad") << "the tag's protocol was changed";
  const json record = json::parse(Slurp(DataDir() + "/claims/" + kUid + ".json"));
  EXPECT_EQ(record["claim"]["vfNetworks"][0]["previous"],
            json::parse(R"({"mac":"00:00:00:00:00:00","vlan":10,"qos":5,
                            "vlanProtocol":"802.1ad","spoofChk":true,"trust":false})"));
  ASSERT_TRUE(Unprepare().ok());
  EXPECT_EQ(VfState("0000:5e:00.0", 3), before);
}

// After a reboot the VF's settings and its place on its PF are this boot's: preparing the claim
// again records them afresh, so its unprepare puts back what the VF had in this boot, on the VF
// the address names now (here the PF's VF 5, no longer VF 3).
TEST_F(PrepareTest, AfterARebootAVfsSettingsAndLinkAreRecordedAfresh) {
  Use("sriov");
  SeedVfs("0000:5e:00.0", 8);
  kube::ResourceClaim claim = Claim({{"nic", "vf-0000-5e-02-3"}});
  AddConfig(claim, {{"apiVersion", "vfio.dra.io/v1alpha1"},
                    {"kind", "VfioConfig"},
                    {"macAddress", "02:00:00:00:00:01"}});
  ASSERT_TRUE(Prepare(claim).ok());
  Reboot("sriov");
  SeedVfs("0000:5e:00.0", 8);  // the PF's driver starts its VFs afresh
  const std::string pf = node_->sysfs_root() + "/bus/pci/devices/0000:5e:00.0";
  fs::remove(pf + "/virtfn3");
  fs::remove(pf + "/virtfn5");
  fs::create_directory_symlink("../0000:5e:02.5", pf + "/virtfn3");
  fs::create_directory_symlink("../0000:5e:02.3", pf + "/virtfn5");
  std::ofstream(VfNetDir() + "/0000:5e:00.0/vf5.json", std::ios::trunc)
      << R"({"mac":"02:00:00:00:00:55","vlan":0,"qos":0,"spoofchk":true,"trust":false})";
  const json before = VfState("0000:5e:00.0", 5);
  ASSERT_TRUE(preparer_->Recover().ok());

  auto again = Prepare(claim);
  ASSERT_TRUE(again.ok()) << again.error().message;
  EXPECT_EQ(VfState("0000:5e:00.0", 5)["mac"], "02:00:00:00:00:01");
  EXPECT_EQ(VfState("0000:5e:00.0", 3)["mac"], "00:00:00:00:00:00") << "another VF was changed";
  auto record = Recorded(kUid);
  ASSERT_TRUE(record.has_value());
  ASSERT_EQ(record->vf_networks.size(), 1u);
  EXPECT_EQ(record->vf_networks[0].link.Display(), "VF 5 of 0000:5e:00.0");
  EXPECT_EQ(record->vf_networks[0].previous.mac, "02:00:00:00:00:55");
  ASSERT_EQ(record->devices.size(), 1u);
  ASSERT_TRUE(record->devices[0].vf_link.has_value());
  EXPECT_EQ(record->devices[0].vf_link->Display(), "VF 5 of 0000:5e:00.0");
  ASSERT_TRUE(Unprepare().ok());
  EXPECT_EQ(VfState("0000:5e:00.0", 5), before);
  EXPECT_EQ(Driver("0000:5e:02.3"), "iavf");
}

TEST_F(PrepareTest, ANetworkSettingTheDriverRefusesFailsTheClaimAndLeavesTheVfAsItWas) {
  Use("sriov");
  SeedVfs("0000:5e:00.0", 8);
  std::ofstream(VfNetDir() + "/0000:5e:00.0/unsupported") << "trust\n";
  kube::ResourceClaim claim = Claim({{"nic", "vf-0000-5e-02-3"}});
  AddConfig(claim, {{"apiVersion", "vfio.dra.io/v1alpha1"},
                    {"kind", "VfioConfig"},
                    {"macAddress", "02:00:00:00:00:01"},
                    {"trust", true}});
  auto prepared = Prepare(claim);
  ASSERT_FALSE(prepared.ok());
  EXPECT_THAT(prepared.error().message, HasSubstr("cannot set trust on VF 3 of 0000:5e:00.0"));
  EXPECT_THAT(prepared.error().message, HasSubstr("device vf-0000-5e-02-3"))
      << prepared.error().message;
  EXPECT_EQ(VfState("0000:5e:00.0", 3)["mac"], "00:00:00:00:00:00");  // rolled back
  EXPECT_EQ(Driver("0000:5e:02.3"), "iavf");
  EXPECT_EQ(Recorded(kUid), std::nullopt);
}

TEST_F(PrepareTest, NetworkSettingsOnADeviceThatIsNoNetworkVfAreRefused) {
  Use("workstation");
  kube::ResourceClaim claim = Claim({{"gpu", "gpu-0000-01-00-0"}});
  AddConfig(claim, {{"apiVersion", "vfio.dra.io/v1alpha1"}, {"kind", "VfioConfig"}, {"vlan", 7}});
  auto prepared = Prepare(claim);
  ASSERT_FALSE(prepared.ok());
  EXPECT_THAT(prepared.error().message,
              HasSubstr("VfioConfig vlan 7 applies only to SR-IOV VFs of network adapters"));
  EXPECT_EQ(Driver("0000:01:00.0"), "nvidia");
}

// The claim's status is information for the cluster, not a condition for the VM to run: a
// prepare that did its work answers success however the status write fares.
TEST_F(PrepareTest, AStatusThatCannotBeWrittenDoesNotFailAPrepareThatDidItsWork) {
  Use("sriov");
  SeedVfs("0000:5e:00.0", 8);
  kube::ResourceClaim claim = Claim({{"nic", "vf-0000-5e-02-3"}});
  AddConfig(claim, {{"apiVersion", "vfio.dra.io/v1alpha1"}, {"kind", "VfioConfig"}, {"vlan", 7}});
  status_.fail = MakeError(ErrorKind::kPermissionDenied, "resourceclaims/status is forbidden");
  auto prepared = Prepare(claim);
  ASSERT_TRUE(prepared.ok()) << prepared.error().message;
  EXPECT_EQ(Driver("0000:5e:02.3"), "vfio-pci");
  EXPECT_EQ(Recorded(kUid)->state, prepare::PrepareState::kPrepareCompleted);
  // The write failed and waits for its retry, in the background.
  SettleStatus();
  EXPECT_EQ(status_.attempts, 1);
  EXPECT_EQ(status_queue_->Stats().pending, 1u);
  status_.fail.reset();
  clock_.Advance(std::chrono::minutes(5));
  SettleStatus();
  ASSERT_EQ(status_.applied.size(), 1u);
  ASSERT_EQ(status_.applied[0].size(), 1u);
  EXPECT_EQ(status_.applied[0][0].conditions.at(0).type, "Ready");
  EXPECT_FALSE(status_.applied[0][0].conditions.at(0).last_transition_time.empty());
  // The VF has no MAC of its own (all zeros): there is no hardware address to report.
  EXPECT_FALSE(status_.applied[0][0].network_data.has_value());
  EXPECT_EQ(status_queue_->Stats().pending, 0u);

  // Prepared again (the kubelet's retry), with the claim showing the condition written: its
  // status did not change, and neither does its lastTransitionTime.
  kube::AllocatedDeviceStatus shown = status_.applied[0][0];
  shown.conditions[0].last_transition_time = "2026-01-02T03:04:05Z";
  claim.device_statuses = {shown};
  ASSERT_TRUE(Prepare(claim).ok());
  SettleStatus();
  ASSERT_EQ(status_.applied.size(), 2u);
  EXPECT_EQ(status_.applied[1].at(0).conditions.at(0).last_transition_time, "2026-01-02T03:04:05Z");

  // Unprepare removes this driver's entries.
  ASSERT_TRUE(Unprepare().ok());
  SettleStatus();
  ASSERT_EQ(status_.applied.size(), 3u);
  EXPECT_TRUE(status_.applied[2].empty());
}

// A VF claim with no settings on a VF without a MAC of its own has nothing to report: no status
// write (an API call per VM start for nobody); with a MAC set on the PF by hand, it is reported.
TEST_F(PrepareTest, AVfWithNothingToReportWritesNoStatusAndOneWithAMacDoes) {
  Use("sriov");
  SeedVfs("0000:5e:00.0", 8);
  kube::ResourceClaim claim = Claim({{"nic", "vf-0000-5e-02-3"}});
  ASSERT_TRUE(Prepare(claim).ok());
  ASSERT_TRUE(Unprepare().ok());
  SettleStatus();
  EXPECT_EQ(status_.attempts, 0);

  std::ofstream(VfNetDir() + "/0000:5e:00.0/vf3.json", std::ios::trunc)
      << R"({"mac":"02:00:00:00:00:33","vlan":0,"qos":0,"spoofchk":true,"trust":false})";
  ASSERT_TRUE(Prepare(claim).ok());
  SettleStatus();
  ASSERT_EQ(status_.applied.size(), 1u);
  ASSERT_TRUE(status_.applied[0].at(0).network_data.has_value());
  EXPECT_EQ(status_.applied[0][0].network_data->hardware_address, "02:00:00:00:00:33");
  ASSERT_TRUE(Unprepare().ok());
  EXPECT_EQ(VfState("0000:5e:00.0", 3)["mac"], "02:00:00:00:00:33");  // never changed, kept
}

// The status of a VF that carried only its MAC (no settings were asked) is ours as much as one
// with settings: a restarted daemon, whose queue knows nothing of it, learns from the record that
// the device is a VF and clears its entries at unprepare.
TEST_F(PrepareTest, ARestartedDaemonClearsTheStatusOfAVfThatReportedOnlyItsMac) {
  Use("sriov");
  SeedVfs("0000:5e:00.0", 8);
  std::ofstream(VfNetDir() + "/0000:5e:00.0/vf3.json", std::ios::trunc)
      << R"({"mac":"02:00:00:00:00:33","vlan":0,"qos":0,"spoofchk":true,"trust":false})";
  ASSERT_TRUE(Prepare(Claim({{"nic", "vf-0000-5e-02-3"}})).ok());
  SettleStatus();
  ASSERT_EQ(status_.applied.size(), 1u);
  ASSERT_TRUE(status_.applied[0].at(0).network_data.has_value());
  Open();  // the daemon restarts
  ASSERT_TRUE(Unprepare().ok());
  SettleStatus();
  ASSERT_EQ(status_.applied.size(), 2u);
  EXPECT_TRUE(status_.applied[1].empty());
}

// The kernel's module aliases give ConnectX-7 VFs to mlx5_vfio_pci: prepare binds the VF there
// (the published vfioDriver says so beforehand), records it, and a restarted daemon's unprepare
// takes it off that driver and back to mlx5_core.
TEST_F(PrepareTest, AFunctionWhoseModaliasAVariantDriverServesIsBoundToItAndRestored) {
  Use("variant");
  auto published = published_.Find("node1", "vf-0000-5e-02-0");
  ASSERT_TRUE(published.has_value());
  EXPECT_EQ(slicepublisher::StringAttribute(*published, slicepublisher::attribute::kVfioDriver),
            "mlx5_vfio_pci");
  auto prepared = Prepare(Claim({{"nic", "vf-0000-5e-02-0"}}));
  ASSERT_TRUE(prepared.ok()) << prepared.error().message;
  EXPECT_EQ(Driver("0000:5e:02.0"), "mlx5_vfio_pci");
  EXPECT_EQ(Override("0000:5e:02.0"), "mlx5_vfio_pci\n");
  EXPECT_TRUE(fs::exists(DevRoot() + "/vfio/51"));
  EXPECT_EQ(Driver("0000:5e:02.1"), "mlx5_core");
  auto record = Recorded(kUid);
  ASSERT_TRUE(record.has_value());
  ASSERT_EQ(record->functions.size(), 1u);
  EXPECT_EQ(record->functions[0].vfio_driver, "mlx5_vfio_pci");
  EXPECT_EQ(record->functions[0].driver, "mlx5_core");
  // The health stream judges the function by the driver it was bound to.
  for (const auto& status :
       prepare::CheckDeviceHealth(*sysfs_, published_.Current(), *preparer_->Prepared())) {
    if (status.device == "vf-0000-5e-02-0") {
      EXPECT_TRUE(status.healthy) << status.message;
    }
  }

  Open();  // a restarted daemon knows the driver from the checkpoint alone
  Status undone = Unprepare();
  ASSERT_TRUE(undone.ok()) << undone.error().message;
  EXPECT_EQ(Driver("0000:5e:02.0"), "mlx5_core");
  EXPECT_EQ(Override("0000:5e:02.0"), "(null)\n");
  EXPECT_FALSE(fs::exists(DevRoot() + "/vfio/51"));
  ExpectWritesConfinedTo({"0000:5e:02.0"});
}

// nvgrace_gpu_vfio_pci registers itself as nvgrace-gpu-vfio-pci: the module named by the alias
// is resolved to the driver through /sys/module.
TEST_F(PrepareTest, AVariantModuleIsResolvedToTheDriverItRegisters) {
  Use("variant");
  ASSERT_TRUE(Prepare(Claim({{"gpu", "gpu-0000-01-00-0"}})).ok());
  EXPECT_EQ(Driver("0000:01:00.0"), "nvgrace-gpu-vfio-pci");
  ASSERT_TRUE(Unprepare().ok());
  EXPECT_EQ(Driver("0000:01:00.0"), "nvidia");
}

// pds_vfio_pci serves the Pensando VF but is not loaded: prepare binds nothing else behind the
// admin's back and says what to do.
TEST_F(PrepareTest, AVariantDriverThatIsNotLoadedFailsTheClaimNamingTheModuleAndThePolicyRule) {
  Use("variant");
  auto published = published_.Find("node1", "vf-0000-6e-02-0");
  ASSERT_TRUE(published.has_value());
  EXPECT_EQ(slicepublisher::StringAttribute(*published, slicepublisher::attribute::kVfioDriver),
            "pds_vfio_pci");
  auto prepared = Prepare(Claim({{"nic", "vf-0000-6e-02-0"}}));
  ASSERT_FALSE(prepared.ok());
  EXPECT_THAT(prepared.error().message, HasSubstr("0000:6e:02.0"));
  EXPECT_THAT(prepared.error().message, HasSubstr("modprobe pds_vfio_pci"));
  EXPECT_THAT(prepared.error().message,
              HasSubstr(R"(vfioDrivers: [{match: {address: "0000:6e:02.0"}, use: vfio-pci}])"));
  EXPECT_EQ(Driver("0000:6e:02.0"), "");
  EXPECT_EQ(Recorded(kUid), std::nullopt);
  EXPECT_TRUE(kernel_->Writes().empty());
}

// The admin's vfioDrivers rule wins over the kernel's aliases.
TEST_F(PrepareTest, APolicyRulePinsTheVfioDriver) {
  Use("variant");
  auto policy = discovery::ParseAdminPolicy(
      "vfioDrivers:\n  - match: {vendor: \"15b3\"}\n    use: vfio-pci\n", "policy.yaml");
  ASSERT_TRUE(policy.ok()) << policy.error().message;
  ChooseVfioDrivers(policy->vfio_drivers);
  Publish();
  Open();
  ASSERT_TRUE(Prepare(Claim({{"nic", "vf-0000-5e-02-0"}})).ok());
  EXPECT_EQ(Driver("0000:5e:02.0"), "vfio-pci");
  ASSERT_TRUE(Unprepare().ok());
  EXPECT_EQ(Driver("0000:5e:02.0"), "mlx5_core");
}

TEST_F(PrepareTest, MdevIsCreatedWithItsPublishedUuidAndRemovedAtUnprepare) {
  Use("vgpu");
  auto device = published_.Find("node1", "mdev-0000-3b-00-0-nvidia-223-0");
  ASSERT_TRUE(device.has_value());
  const std::string uuid = *slicepublisher::StringAttribute(*device, "mdevUUID");
  const std::string available = node_->sysfs_root() +
                                "/class/mdev_bus/0000:3b:00.0/mdev_supported_types/nvidia-223/"
                                "available_instances";
  EXPECT_EQ(Slurp(available), "7\n");

  auto prepared = Prepare(Claim({{"vgpu", "mdev-0000-3b-00-0-nvidia-223-0"}}));
  ASSERT_TRUE(prepared.ok()) << prepared.error().message;
  EXPECT_TRUE(fs::exists(node_->sysfs_root() + "/bus/mdev/devices/" + uuid));
  EXPECT_EQ(Slurp(available), "6\n");
  EXPECT_EQ(Driver("0000:3b:00.0"), "nvidia") << "an mdev parent stays on its host driver";
  auto group = sysfs_->LinkBaseName("bus/mdev/devices/" + uuid + "/iommu_group");
  ASSERT_TRUE(group.ok());
  const json spec = CdiSpec(std::string("vfio.dra.io-vfio_") + kUid + ".json");
  EXPECT_EQ(spec["devices"][0]["containerEdits"]["deviceNodes"][0]["path"], "/dev/vfio/" + *group);
  const json metadata =
      json::parse(Slurp(DataDir() + "/dra-device-metadata/" + kUid + "_vgpu.json"));
  EXPECT_EQ(metadata["requests"][0]["devices"][0]["attributes"]["mdevUUID"],
            json({{"string", uuid}}));

  // The kubelet repeats prepare until it sees success: the same answer, nothing new created.
  auto again = Prepare(Claim({{"vgpu", "mdev-0000-3b-00-0-nvidia-223-0"}}));
  ASSERT_TRUE(again.ok()) << again.error().message;
  EXPECT_EQ(again->front().cdi_device_ids, prepared->front().cdi_device_ids);
  EXPECT_EQ(Slurp(available), "6\n");

  ASSERT_TRUE(Unprepare().ok());
  EXPECT_FALSE(fs::exists(node_->sysfs_root() + "/bus/mdev/devices/" + uuid));
  EXPECT_FALSE(fs::exists(DevRoot() + "/vfio/" + *group));
  EXPECT_EQ(Slurp(available), "7\n");
}

// A parent that is not on PCI (the mtty sample driver's "mtty", as on the real-kernel node) is
// locked by its name like a PCI function by its address.
TEST_F(PrepareTest, AnMdevOnAParentThatIsNotOnPciIsPreparedAndRemoved) {
  Use("mtty");
  auto prepared = Prepare(Claim({{"vgpu", "mdev-mtty-mtty-2-0"}}));
  ASSERT_TRUE(prepared.ok()) << prepared.error().message;
  EXPECT_TRUE(fs::exists(DataDir() + "/devices/parent-mtty.lock"));
  auto record = Recorded(kUid);
  ASSERT_TRUE(record.has_value());
  ASSERT_EQ(record->mdevs.size(), 1u);
  EXPECT_TRUE(fs::exists(node_->sysfs_root() + "/bus/mdev/devices/" + record->mdevs[0].uuid));
  auto other = Prepare(Claim({{"vgpu", "mdev-mtty-mtty-2-0"}}, Uid(2), "other"));
  ASSERT_FALSE(other.ok());
  EXPECT_THAT(other.error().message, HasSubstr("already prepared for claim vms/gpu-claim"));
  ASSERT_TRUE(Unprepare().ok());
  EXPECT_FALSE(fs::exists(node_->sysfs_root() + "/bus/mdev/devices/" + record->mdevs[0].uuid));
}

// The health verdicts the kubelet's stream carries, over a prepare and changes behind our back.
TEST_F(PrepareTest, HealthFollowsWhatIsPreparedAndWhatTheKernelChanges) {
  Use("vm-host");
  auto health = [&] {
    std::map<std::string, prepare::DeviceHealthStatus> out;
    for (auto& s :
         prepare::CheckDeviceHealth(*sysfs_, published_.Current(), *preparer_->Prepared()))
      out[s.device] = s;
    return out;
  };
  auto before = health();
  ASSERT_EQ(before.size(), published_.Current().devices->size());
  for (const auto& [name, status] : before) EXPECT_TRUE(status.healthy) << name << status.message;

  auto vgpu = published_.Find("node1", "mdev-0000-3b-00-0-nvidia-222-0");
  ASSERT_TRUE(vgpu.has_value());
  const std::string uuid = *slicepublisher::StringAttribute(*vgpu, "mdevUUID");
  ASSERT_TRUE(
      Prepare(Claim({{"gpu", "gpu-0000-01-00-0"}, {"vgpu", "mdev-0000-3b-00-0-nvidia-222-0"}}))
          .ok());
  const auto prepared = preparer_->Prepared();
  ASSERT_EQ(prepared->size(), 2u);
  EXPECT_EQ((*prepared)[0].device, "gpu-0000-01-00-0");
  EXPECT_THAT((*prepared)[0].functions, ElementsAre("0000:01:00.0", "0000:01:00.1"));
  EXPECT_EQ((*prepared)[1].mdev_uuid, uuid);
  for (const auto& [name, status] : health()) EXPECT_TRUE(status.healthy) << name << status.message;

  // Someone unbinds the GPU's audio function, removes the vGPU, regroups a VF and unplugs another.
  ASSERT_EQ(
      kernel_->Write(node_->sysfs_root() + "/bus/pci/drivers/vfio-pci/unbind", "0000:01:00.1"), 0);
  ASSERT_EQ(kernel_->Write(node_->sysfs_root() + "/bus/mdev/devices/" + uuid + "/remove", "1"), 0);
  const fs::path group_link = node_->sysfs_root() + "/bus/pci/devices/0000:5e:02.2/iommu_group";
  const fs::path target = fs::read_symlink(group_link);
  fs::remove(group_link);
  fs::create_symlink(target.parent_path() / "999", group_link);
  kernel_->RemoveDevice("0000:5e:02.3");
  auto after = health();
  EXPECT_FALSE(after["gpu-0000-01-00-0"].healthy);
  EXPECT_THAT(after["gpu-0000-01-00-0"].message,
              HasSubstr("0000:01:00.1 prepared for claim vms/gpu-claim has no driver"));
  EXPECT_FALSE(after["mdev-0000-3b-00-0-nvidia-222-0"].healthy);
  EXPECT_THAT(after["mdev-0000-3b-00-0-nvidia-222-0"].message,
              HasSubstr("mediated device " + uuid + " prepared for claim vms/gpu-claim is gone"));
  EXPECT_FALSE(after["vf-0000-5e-02-2"].healthy);
  EXPECT_THAT(after["vf-0000-5e-02-2"].message, HasSubstr("moved from IOMMU group"));
  EXPECT_FALSE(after["vf-0000-5e-02-3"].healthy);
  EXPECT_THAT(after["vf-0000-5e-02-3"].message, HasSubstr("0000:5e:02.3 is gone"));
  EXPECT_TRUE(after["vf-0000-5e-02-0"].healthy);

  // A prepared device that is no longer published is still reported (the pod still holds it).
  Publish();
  auto republished = health();
  EXPECT_EQ(republished.count("vf-0000-5e-02-3"), 0u);
  ASSERT_EQ(republished.count("gpu-0000-01-00-0"), 1u);
  EXPECT_FALSE(republished["gpu-0000-01-00-0"].healthy);

  ASSERT_TRUE(Unprepare().ok());
  EXPECT_TRUE(preparer_->Prepared()->empty());
}

// Files vfio-dra creates have the modes docs/preparation.md documents: the checkpoint is private
// to root, CDI specs and metadata files are readable by the runtime and by QEMU in the pod.
TEST_F(PrepareTest, FilesAreCreatedWithTheirDocumentedModes) {
  Use("vm-host");
  ASSERT_TRUE(Prepare(Claim({{"gpu", "gpu-0000-01-00-0"}})).ok());
  auto mode = [](const std::string& path) {
    struct stat st {};
    EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
    return st.st_mode & 07777;
  };
  EXPECT_EQ(mode(DataDir() + "/claims"), 0700u);
  EXPECT_EQ(mode(DataDir() + "/claims/" + kUid + ".json"), 0600u);
  for (const std::string& file : CdiFiles()) EXPECT_EQ(mode(CdiDir() + "/" + file), 0644u) << file;
  const std::string metadata_dir = DataDir() + "/dra-device-metadata";
  EXPECT_EQ(mode(metadata_dir), 0755u);
  EXPECT_EQ(mode(metadata_dir + "/" + kUid + "_gpu.json"), 0644u);
}

// A request name is a path component of the metadata file: a hostile one fails the claim and
// leaves the node and the disk as they were.
TEST_F(PrepareTest, AHostileRequestNameFailsTheClaimAndTouchesNothing) {
  Use("vm-host");
  for (const std::string& bad :
       std::vector<std::string>{"../../../etc", "a/../b", "..", std::string(300, 'r')}) {
    SCOPED_TRACE(bad);
    auto prepared = Prepare(Claim({{bad, "gpu-0000-01-00-0"}}));
    ASSERT_FALSE(prepared.ok());
    EXPECT_THAT(prepared.error().message, HasSubstr("request"));
    EXPECT_EQ(Driver("0000:01:00.0"), "nvidia");
    EXPECT_TRUE(CdiFiles().empty());
    if (fs::exists(DataDir() + "/dra-device-metadata")) {
      for (const auto& entry : fs::directory_iterator(DataDir() + "/dra-device-metadata")) {
        EXPECT_EQ(entry.path().filename().string().find(kUid), std::string::npos)
            << "a metadata file of the refused claim: " << entry.path();
      }
    }
    EXPECT_TRUE(preparer_->checkpoint().Load().claims.empty());
    EXPECT_TRUE(kernel_->Writes().empty()) << "refused before the node is touched";
  }
  std::set<std::string> outside;
  for (const auto& entry : fs::recursive_directory_iterator(node_->dir())) {
    const std::string rel = fs::relative(entry.path(), node_->dir()).string();
    if (rel.rfind("sys", 0) == 0 || rel.rfind("dev", 0) == 0 || rel.rfind("data", 0) == 0 ||
        rel.rfind("cdi", 0) == 0 || rel == "pci.ids" || rel == "boot_id") {
      continue;
    }
    outside.insert(rel);
  }
  EXPECT_TRUE(outside.empty()) << ::testing::PrintToString(outside);
}

// A version-1 checkpoint (one file, raw answers) is split into per-claim records at startup; the
// oldest answers, without the functions of each device, read as holding all of the claim's.
TEST(CheckpointUpgradeTest, AVersion1FileBecomesOneRecordPerClaim) {
  char tmpl[] = "/tmp/vfio-dra-ckpt-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const json v1 = {{"version", 1},
                   {"bootID", "boot-0"},
                   {"claims",
                    {{kUid,
                      {{"namespace", "vms"},
                       {"name", "old"},
                       {"state", "PrepareCompleted"},
                       {"functions",
                        {{{"address", "0000:01:00.0"},
                          {"originalDriver", "nvidia"},
                          {"originalOverride", ""},
                          {"wasOnVfio", false}},
                         {{"address", "0000:01:00.1"},
                          {"originalDriver", ""},
                          {"originalOverride", ""},
                          {"wasOnVfio", false}}}},
                       {"mdevs", json::array()},
                       {"cdiFiles", {"vfio.dra.io-vfio_x.json"}},
                       {"response",
                        {{{"requests", {"gpu"}}, {"pool", "node1"}, {"device", "gpu-0000-01-00-0"}},
                         {{"pool", 7}, {"device", json::array()}}}}}}}}};
  std::ofstream(dir + "/checkpoint.json") << v1.dump();
  auto checkpoint = prepare::PrepareCheckpoint::Open(dir, "boot-1");
  ASSERT_TRUE(checkpoint.ok());
  std::string problem;
  auto moved = checkpoint->Upgrade(&problem);
  ASSERT_TRUE(moved.ok()) << moved.error().message;
  EXPECT_EQ(*moved, 1);
  EXPECT_TRUE(problem.empty()) << problem;
  EXPECT_FALSE(fs::exists(dir + "/checkpoint.json"));
  const prepare::CheckpointView view = checkpoint->Load();
  ASSERT_EQ(view.claims.size(), 1u);
  const prepare::ClaimRecord& record = *view.claims.begin()->second;
  EXPECT_EQ(record.boot_id, "boot-0") << "the old boot stays recorded, so a reboot is noticed";
  EXPECT_FALSE(record.replayable);
  EXPECT_EQ(record.functions[0].driver, "nvidia");
  const auto targets = prepare::PreparedTargets(view);
  ASSERT_EQ(targets.size(), 2u);
  EXPECT_EQ(targets[0].claim, "vms/old");
  EXPECT_THAT(targets[0].functions, ElementsAre("0000:01:00.0", "0000:01:00.1"));
  EXPECT_EQ(targets[1].pool, "") << "a field of the wrong type reads as absent";
  auto again = checkpoint->Upgrade(&problem);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, 0) << "upgrading twice is a no-op";
  fs::remove_all(dir);
}

TEST_F(PrepareTest, AnExistingMdevIsUsedAndLeftInPlace) {
  Use("vgpu");
  const std::string uuid = "4b20d080-1b54-4048-85b3-a6a62d165c01";
  auto prepared = Prepare(Claim({{"vgpu", "mdev-" + uuid}}));
  ASSERT_TRUE(prepared.ok()) << prepared.error().message;
  Status undone = Unprepare();
  ASSERT_TRUE(undone.ok()) << undone.error().message;
  EXPECT_TRUE(fs::exists(node_->sysfs_root() + "/bus/mdev/devices/" + uuid));
  EXPECT_TRUE(kernel_->Writes().empty());
}

TEST_F(PrepareTest, AGpuWithMediatedDevicesIsNotHandedOutWhole) {
  Use("vgpu");
  auto prepared = Prepare(Claim({{"gpu", "gpu-0000-3b-00-0"}}));
  ASSERT_FALSE(prepared.ok());
  EXPECT_THAT(prepared.error().message, HasSubstr("has 1 mediated devices"));
  EXPECT_TRUE(kernel_->Writes().empty());
}

TEST_F(PrepareTest, NoMdevCapacityIsAClearClaimErrorAndLeavesNothingBehind) {
  Use("vgpu");
  kernel_->FailMdevCreate(EUSERS);
  auto prepared = Prepare(Claim({{"vgpu", "mdev-0000-3b-00-0-nvidia-223-1"}}));
  ASSERT_FALSE(prepared.ok());
  EXPECT_THAT(prepared.error().message, HasSubstr("vms/gpu-claim"));
  EXPECT_THAT(prepared.error().message, HasSubstr("no capacity"));
  EXPECT_THAT(prepared.error().message, HasSubstr("nvidia-223 on 0000:3b:00.0"));
  EXPECT_TRUE(CdiFiles().empty());
  EXPECT_EQ(Recorded(kUid), std::nullopt);
}

// The window before a one-type parent's first instance exists: the scheduler may allocate two
// types of it at once. The second prepare fails naming the parent, the type in use and the
// policy setting that avoids it.
TEST_F(PrepareTest, ASecondTypeOnAOneTypeParentNamesTheTypeInUseAndThePolicyPin) {
  Use("vm-host");
  ASSERT_TRUE(Prepare(Claim({{"vgpu", "mdev-0000-3b-00-0-nvidia-222-0"}})).ok());
  auto second = Prepare(Claim({{"vgpu", "mdev-0000-3b-00-0-nvidia-223-0"}}, Uid(2), "other"));
  ASSERT_FALSE(second.ok());
  EXPECT_THAT(second.error().message, HasSubstr("no capacity left on the parent"));
  EXPECT_THAT(second.error().message, HasSubstr("in use on 0000:3b:00.0: nvidia-222 (1 instance)"));
  EXPECT_THAT(
      second.error().message,
      HasSubstr(R"(select: [{kind: mdev, address: "0000:3b:00.0", mdevType: "nvidia-222"}])"));
  EXPECT_EQ(Recorded(Uid(2)), std::nullopt);
  // Once published again, the parent offers only the type in use.
  Publish();
  EXPECT_TRUE(published_.Find("node1", "mdev-0000-3b-00-0-nvidia-222-1").has_value());
  EXPECT_FALSE(published_.Find("node1", "mdev-0000-3b-00-0-nvidia-223-0").has_value());
}

TEST_F(PrepareTest, AFunctionAlreadyOnVfioPciIsUsedAsItIsAndStaysBound) {
  Use("workstation");
  for (const char* f : {"0000:01:00.0", "0000:01:00.1"}) {
    ASSERT_EQ(kernel_->Write(node_->sysfs_root() + "/bus/pci/devices/" + f + "/driver_override",
                             "vfio-pci"),
              0);
    ASSERT_EQ(
        kernel_->Write(node_->sysfs_root() + "/bus/pci/drivers/" +
                           (std::string(f).back() == '0' ? "nvidia" : "snd_hda_intel") + "/unbind",
                       f),
        0);
    ASSERT_EQ(kernel_->Write(node_->sysfs_root() + "/bus/pci/drivers_probe", f), 0);
  }
  Publish();
  const size_t writes_before = kernel_->Writes().size();
  ASSERT_TRUE(Prepare(Claim({{"gpu", "gpu-0000-01-00-0"}})).ok());
  ASSERT_TRUE(Unprepare().ok());
  EXPECT_EQ(kernel_->Writes().size(), writes_before) << "nothing to bind, nothing to restore";
  EXPECT_EQ(Driver("0000:01:00.0"), "vfio-pci");
  EXPECT_EQ(Driver("0000:01:00.1"), "vfio-pci");
}

TEST_F(PrepareTest, AnUnbindThatHangsFailsTheClaimAtTheDeadlineAndUnprepareFinishesLater) {
  unbind_timeout_ = std::chrono::milliseconds(300);
  Use("workstation");
  kernel_->HangUnbind("0000:01:00.1");
  auto prepared = Prepare(Claim({{"gpu", "gpu-0000-01-00-0"}}));
  ASSERT_FALSE(prepared.ok());
  EXPECT_THAT(prepared.error().message, HasSubstr("did not finish within 300 ms"));
  EXPECT_THAT(prepared.error().message, HasSubstr("0000:01:00.1"));
  EXPECT_EQ(kernel_->Hanging(), 1);
  EXPECT_EQ(Driver("0000:01:00.0"), "nvidia") << "the GPU itself was rolled back";
  // The blocked function keeps its record so that it can still be put back.
  ASSERT_TRUE(Recorded(kUid).has_value());
  EXPECT_TRUE(CdiFiles().empty());
  Status blocked = Unprepare();
  ASSERT_FALSE(blocked.ok());
  EXPECT_THAT(blocked.error().message, HasSubstr("0000:01:00.1 is still in use"));
  EXPECT_THAT(blocked.error().message, HasSubstr("has not returned"));
  kernel_->ReleaseHangs();
  kernel_->WaitIdle();
  // The blocked unbind completes once released; unprepare then returns the function home. (The
  // writer thread forgets the blocked write just after the kernel returns, hence the retries: on
  // a busy machine that thread may not run for a while, so they are bounded by a generous time,
  // not by a count.)
  Status undone = Unprepare();
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!undone.ok() && std::chrono::steady_clock::now() < give_up) {
    EXPECT_THAT(undone.error().message, HasSubstr("has not returned"));
    std::this_thread::yield();
    undone = Unprepare();
  }
  ASSERT_TRUE(undone.ok()) << undone.error().message;
  EXPECT_EQ(Driver("0000:01:00.1"), "snd_hda_intel");
  EXPECT_EQ(Recorded(kUid), std::nullopt);
}

// Another process (the other instance of a rolling update) is stuck unbinding a function of the
// group: the kernel holds the device lock, and the gate of this process knows nothing of it. The
// prepare fails at its wait with the function named, instead of blocking on a lock-taking read
// while it plans (which, on a real node, is an unkillable wait for as long as a VM holds the
// device), and nothing is touched or recorded.
TEST_F(PrepareTest, ADeviceAnotherProcessIsStuckOnFailsTheClaimAtTheWaitInsteadOfBlocking) {
  unbind_timeout_ = std::chrono::milliseconds(300);
  Use("workstation");
  SimulatedKernel other_process(node_->sysfs_root(), DevRoot());
  other_process.HangUnbind("0000:01:00.1");
  auto stuck = std::async(std::launch::async, [&] {
    return other_process.Write(node_->sysfs_root() + "/bus/pci/drivers/snd_hda_intel/unbind",
                               "0000:01:00.1");
  });
  ASSERT_TRUE(other_process.WaitUntilHanging(1, std::chrono::seconds(30)));
  auto prepare = std::async(std::launch::async, [&] {
    return Prepare(Claim({{"gpu", "gpu-0000-01-00-0"}}));
  });
  // A failure detector, not a synchronisation: the prepare answers after about 300 ms; only a
  // prepare blocked on the lock would still be running after a minute.
  const bool answered = prepare.wait_for(std::chrono::minutes(1)) == std::future_status::ready;
  other_process.ReleaseHangs();  // lets a blocked prepare finish, so the test ends either way
  ASSERT_TRUE(answered) << "the prepare blocked on the device lock another process holds";
  auto prepared = prepare.get();
  ASSERT_FALSE(prepared.ok());
  EXPECT_THAT(prepared.error().message, HasSubstr("0000:01:00.1"));
  EXPECT_THAT(prepared.error().message, HasSubstr("did not finish within 300 ms"));
  EXPECT_EQ(Driver("0000:01:00.0"), "nvidia") << "nothing was touched";
  EXPECT_EQ(Recorded(kUid), std::nullopt) << "nothing was recorded";
  EXPECT_EQ(stuck.get(), 0);
  other_process.WaitIdle();
}

TEST_F(PrepareTest, ABindRefusedByTheKernelIsRolledBack) {
  Use("workstation");
  kernel_->FailVfioBind("0000:01:00.1", EBUSY);
  auto prepared = Prepare(Claim({{"gpu", "gpu-0000-01-00-0"}}));
  ASSERT_FALSE(prepared.ok());
  EXPECT_THAT(prepared.error().message, HasSubstr("binding 0000:01:00.1 to vfio-pci failed"));
  EXPECT_EQ(Driver("0000:01:00.0"), "nvidia");
  EXPECT_EQ(Driver("0000:01:00.1"), "snd_hda_intel");
  EXPECT_EQ(Override("0000:01:00.1"), "(null)\n");
  EXPECT_EQ(Recorded(kUid), std::nullopt);
}

TEST_F(PrepareTest, AnOriginalDriverThatIsGoneLeavesTheFunctionUnboundAndUnprepareSucceeds) {
  Use("sriov");
  ASSERT_TRUE(Prepare(Claim({{"nic", "vf-0000-5e-02-3"}})).ok());
  // The admin unloaded iavf while the VM ran.
  fs::remove_all(node_->sysfs_root() + "/bus/pci/drivers/iavf");
  Status undone = Unprepare();
  ASSERT_TRUE(undone.ok()) << undone.error().message;
  EXPECT_EQ(Driver("0000:5e:02.3"), "");
  EXPECT_EQ(Override("0000:5e:02.3"), "(null)\n");
  EXPECT_EQ(Recorded(kUid), std::nullopt);
}

TEST_F(PrepareTest, ADeviceThatVanishedAfterPublishingFailsWithoutTouchingAnything) {
  Use("workstation");
  kernel_->RemoveDevice("0000:01:00.0");
  auto prepared = Prepare(Claim({{"gpu", "gpu-0000-01-00-0"}}));
  ASSERT_FALSE(prepared.ok());
  EXPECT_THAT(prepared.error().message, HasSubstr("has vanished from the node"));
  EXPECT_TRUE(kernel_->Writes().empty());
  EXPECT_EQ(Recorded(kUid), std::nullopt);
}

TEST_F(PrepareTest, UnknownDeviceOrPoolIsRefused) {
  Use("workstation");
  auto unknown = Prepare(Claim({{"gpu", "gpu-0000-09-00-0"}}));
  ASSERT_FALSE(unknown.ok());
  EXPECT_THAT(unknown.error().message, HasSubstr("not (or no longer) published"));
  auto claim = Claim({{"gpu", "gpu-0000-01-00-0"}});
  claim.allocation->results[0].pool = "node2";
  auto other_pool = Prepare(claim);
  ASSERT_FALSE(other_pool.ok());
  EXPECT_THAT(other_pool.error().message, HasSubstr("pool node2"));
}

TEST_F(PrepareTest, AfterARebootPrepareRecreatesEverythingAndGivesTheSameAnswer) {
  Use("workstation");
  auto first = Prepare(Claim({{"gpu", "gpu-0000-01-00-0"}}));
  ASSERT_TRUE(first.ok()) << first.error().message;
  Reboot("workstation");
  ASSERT_TRUE(Recorded(kUid).has_value());
  ASSERT_NE(Recorded(kUid)->boot_id, preparer_->checkpoint().boot_id())
      << "written before the reboot";
  ASSERT_TRUE(preparer_->Recover().ok());
  EXPECT_EQ(Driver("0000:01:00.0"), "nvidia");
  auto again = Prepare(Claim({{"gpu", "gpu-0000-01-00-0"}}));
  ASSERT_TRUE(again.ok()) << again.error().message;
  EXPECT_EQ(again->front().cdi_device_ids, first->front().cdi_device_ids);
  EXPECT_EQ(Driver("0000:01:00.0"), "vfio-pci");
  EXPECT_EQ(CdiFiles().size(), 2u);
  ASSERT_TRUE(Unprepare().ok());
  EXPECT_EQ(Driver("0000:01:00.0"), "nvidia");
  EXPECT_EQ(Driver("0000:01:00.1"), "snd_hda_intel");
}

// A process crash loses nothing written (the page cache outlives it); a power loss reboots the
// node, which undoes all a record describes, so a record that reached the disk late or not at
// all changes nothing. Only a removal that came back would: a record holding a device for a
// claim nobody will unprepare. So one claim's prepare and unprepare make one sync, the
// directory's after the removal.
TEST_F(PrepareTest, APrepareAndUnprepareOfOneClaimSyncOnlyTheRemovalOfItsRecord) {
  std::mutex mu;
  std::vector<std::string> syncs;
  checkpoint_sync_.file = [&](int, const std::string& path) {
    std::lock_guard<std::mutex> lock(mu);
    syncs.push_back("file " + path);
    return Status::Ok();
  };
  checkpoint_sync_.directory = [&](const std::string& directory) {
    std::lock_guard<std::mutex> lock(mu);
    syncs.push_back("directory " + directory);
    return Status::Ok();
  };
  Use("workstation");
  ASSERT_TRUE(Prepare(Claim({{"gpu", "gpu-0000-01-00-0"}})).ok());
  ASSERT_TRUE(Unprepare().ok());
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_THAT(syncs, ElementsAre("directory " + DataDir() + "/claims"));
}

// A power loss loses the record writes that had not reached the disk, and reboots the node. Each
// record such a loss can leave, with the earlier boot's metadata file and CDI specs (a --cdi-dir
// on disk) still there: the restart leaves the node clean, and the kubelet's next prepare of the
// claim succeeds. (A PrepareCompleted record of the earlier boot:
// AfterARebootPrepareRecreatesEverythingAndGivesTheSameAnswer and
// UnprepareAfterARebootWithoutRepreparingRestoresNothingAndDropsTheClaim.)
TEST_F(PrepareTest, EachRecordAPowerLossCanLeaveEndsInACleanNodeThatPreparesTheClaimAgain) {
  struct Loss {
    std::string what;
    // Leaves the record at `path` as the loss did, from the texts written (started, completed).
    std::function<void(const std::string& path, const std::string& started,
                       const std::string& completed)>
        leave;
  };
  const auto cut = [](const std::string& text) { return text.substr(0, text.size() / 2); };
  const std::vector<Loss> losses = {
      {"no record", [](const std::string& path, auto&, auto&) { fs::remove(path); }},
      {"an empty record", [](const std::string& path, auto&, auto&) { std::ofstream(path) << ""; }},
      {"a record cut short",
       [&](const std::string& path, auto&, const std::string& completed) {
         std::ofstream(path) << cut(completed);
       }},
      {"the PrepareStarted record", [](const std::string& path, const std::string& started,
                                       auto&) { std::ofstream(path) << started; }},
      {"no record and a temporary file cut short",
       [&](const std::string& path, auto&, const std::string& completed) {
         fs::remove(path);
         const auto [dir, name] = SplitFilePath(path);
         std::ofstream(dir + "/" + TemporaryFilePrefix(name) + "7") << cut(completed);
       }},
  };
  for (const Loss& loss : losses) {
    SCOPED_TRACE("a power loss left " + loss.what);
    std::string started;
    step_hook_ = [&](const std::string& step) {
      if (step == "checkpoint:completed") started = Slurp(DataDir() + "/claims/" + kUid + ".json");
    };
    Use("workstation");
    ASSERT_TRUE(Prepare(Claim({{"gpu", "gpu-0000-01-00-0"}})).ok());
    step_hook_ = nullptr;
    const std::string record = DataDir() + "/claims/" + kUid + ".json";
    ASSERT_THAT(started, HasSubstr("PrepareStarted"));
    const std::string completed = Slurp(record);
    std::map<std::string, std::string> specs;
    for (const std::string& file : CdiFiles()) specs[file] = Slurp(CdiDir() + "/" + file);
    ASSERT_EQ(specs.size(), 2u);
    const std::string metadata = DataDir() + "/dra-device-metadata/" + kUid + "_gpu.json";
    ASSERT_TRUE(fs::exists(metadata));
    loss.leave(record, started, completed);

    Reboot("workstation");
    for (const auto& [file, text] : specs) std::ofstream(CdiDir() + "/" + file) << text;
    ASSERT_TRUE(preparer_->Recover().ok());
    EXPECT_EQ(Recorded(kUid), std::nullopt);
    EXPECT_THAT(CdiFiles(), ::testing::IsEmpty()) << "no record owns them";
    EXPECT_FALSE(fs::exists(metadata)) << "no record owns it";
    EXPECT_EQ(Driver("0000:01:00.0"), "nvidia");
    EXPECT_EQ(Driver("0000:01:00.1"), "snd_hda_intel");

    auto again = Prepare(Claim({{"gpu", "gpu-0000-01-00-0"}}));
    ASSERT_TRUE(again.ok()) << again.error().message;
    EXPECT_EQ(Driver("0000:01:00.0"), "vfio-pci");
    EXPECT_EQ(CdiFiles().size(), 2u);
    ASSERT_TRUE(Unprepare().ok());
    EXPECT_EQ(Driver("0000:01:00.0"), "nvidia");
    EXPECT_EQ(Driver("0000:01:00.1"), "snd_hda_intel");
    EXPECT_THAT(CdiFiles(), ::testing::IsEmpty());
    EXPECT_FALSE(fs::exists(metadata));
    // Only the copy of a record cut short is kept (moved aside, for a look by hand).
    std::vector<std::string> left;
    for (const auto& entry : fs::directory_iterator(DataDir() + "/claims")) {
      left.push_back(entry.path().filename().string());
    }
    if (loss.what == "a record cut short") {
      ASSERT_EQ(left.size(), 1u);
      EXPECT_THAT(left[0], HasSubstr(std::string(kUid) + ".json.corrupt-"));
    } else {
      EXPECT_THAT(left, ::testing::IsEmpty());
    }
  }
}

TEST_F(PrepareTest, UnprepareAfterARebootWithoutRepreparingRestoresNothingAndDropsTheClaim) {
  Use("workstation");
  ASSERT_TRUE(Prepare(Claim({{"gpu", "gpu-0000-01-00-0"}})).ok());
  Reboot("workstation");
  ASSERT_TRUE(Unprepare().ok());
  EXPECT_TRUE(kernel_->Writes().empty());
  EXPECT_EQ(Recorded(kUid), std::nullopt);
}

TEST_F(PrepareTest, TemplateClaimsGetTheirMetadataUnderThePodClaimName) {
  Use("sriov");
  auto claim = Claim({{"nic", "vf-0000-5e-02-0"}, {"nic", "vf-0000-5e-02-1"}}, kUid,
                     "virt-launcher-vm1-nic-x7k2p");
  claim.annotations["resource.kubernetes.io/pod-claim-name"] = "nic";
  auto prepared = Prepare(claim);
  ASSERT_TRUE(prepared.ok()) << prepared.error().message;
  ASSERT_EQ(prepared->size(), 2u);
  EXPECT_EQ((*prepared)[0].cdi_device_ids.size(), 2u) << "metadata ID on the first device";
  EXPECT_EQ((*prepared)[1].cdi_device_ids.size(), 1u);
  const json spec = CdiSpec(std::string("vfio.dra.io_metadata_") + kUid + "_nic.json");
  EXPECT_EQ(spec["devices"][0]["containerEdits"]["mounts"][0]["containerPath"],
            "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/nic/nic/"
            "vfio.dra.io-metadata.json");
  const json metadata =
      json::parse(Slurp(DataDir() + "/dra-device-metadata/" + kUid + "_nic.json"));
  EXPECT_EQ(metadata["podClaimName"], "nic");
  EXPECT_EQ(metadata["requests"][0]["devices"].size(), 2u);
  ASSERT_TRUE(Unprepare(kUid, "virt-launcher-vm1-nic-x7k2p").ok());
  EXPECT_TRUE(CdiFiles().empty());
}

TEST_F(PrepareTest, IommufdNodesAreAddedWhenAskedForAndPresent) {
  Use("workstation");
  auto legacy_only = Claim({{"gpu", "gpu-0000-01-00-0"}});
  AddConfig(legacy_only, {{"apiVersion", "vfio.dra.io/v1alpha1"},
                          {"kind", "VfioConfig"},
                          {"iommuInterface", "iommufd"}});
  auto refused = Prepare(legacy_only);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.error().message, HasSubstr("iommufd is not available"));
  EXPECT_EQ(Driver("0000:01:00.0"), "nvidia");

  // The node gains iommufd (misc device, dynamic minor).
  std::ofstream(node_->sysfs_root() + "/class/misc/iommu/dev", std::ios::trunc) << "10:123\n";
  fs::create_directories(node_->sysfs_root() + "/class/misc/iommu");
  std::ofstream(node_->sysfs_root() + "/class/misc/iommu/dev") << "10:123\n";
  ASSERT_EQ(::mknod((DevRoot() + "/iommu").c_str(), S_IFCHR | 0600, makedev(10, 123)), 0);
  auto both = Claim({{"gpu", "gpu-0000-01-00-0"}});
  AddConfig(
      both,
      {{"apiVersion", "vfio.dra.io/v1alpha1"}, {"kind", "VfioConfig"}, {"iommuInterface", "both"}});
  auto prepared = Prepare(both);
  ASSERT_TRUE(prepared.ok()) << prepared.error().message;
  const json spec = CdiSpec(std::string("vfio.dra.io-vfio_") + kUid + ".json");
  std::vector<std::string> paths;
  for (const json& n : spec["devices"][0]["containerEdits"]["deviceNodes"]) {
    paths.push_back(n["path"]);
  }
  EXPECT_THAT(paths, ElementsAre("/dev/vfio/10", "/dev/iommu", "/dev/vfio/devices/vfio0",
                                 "/dev/vfio/devices/vfio1"));
  ASSERT_TRUE(Unprepare().ok());
}

TEST_F(PrepareTest, BadOpaqueConfigIsAClaimErrorNamingTheField) {
  Use("workstation");
  auto claim = Claim({{"gpu", "gpu-0000-01-00-0"}});
  AddConfig(claim, {{"apiVersion", "vfio.dra.io/v1alpha1"}, {"kind", "VfioConfig"}, {"romBar", 1}});
  auto prepared = Prepare(claim);
  ASSERT_FALSE(prepared.ok());
  EXPECT_THAT(prepared.error().message, HasSubstr("unknown field \"romBar\""));
  EXPECT_THAT(prepared.error().message, HasSubstr("config[0]"));
  EXPECT_TRUE(kernel_->Writes().empty());

  auto other_driver = Claim({{"gpu", "gpu-0000-01-00-0"}});
  kube::DeviceAllocationConfiguration theirs;
  theirs.source = "FromClass";
  theirs.opaque = kube::OpaqueDeviceConfiguration{"gpu.other.io", {{"anything", true}}};
  other_driver.allocation->config.push_back(theirs);
  EXPECT_TRUE(Prepare(other_driver).ok()) << "other drivers' configs are not ours to read";
  ASSERT_TRUE(Unprepare().ok());
}

TEST_F(PrepareTest, RecoverRollsBackAPrepareLeftStartedAndRemovesOrphanSpecs) {
  Use("workstation");
  // A claim recorded as started, with its first function already bound, as a crash leaves it.
  prepare::ClaimRecord record;
  record.uid = kUid;
  record.namespace_ = "vms";
  record.name = "gpu-claim";
  record.functions = {{"0000:01:00.0", "nvidia", "", false, {}},
                      {"0000:01:00.1", "snd_hda_intel", "", false, {}}};
  record.cdi_files = {std::string("vfio.dra.io-vfio_") + kUid + ".json"};
  {
    auto boot = prepare::ReadBootId(node_->dir() + "/boot_id");
    ASSERT_TRUE(boot.ok());
    auto checkpoint = prepare::PrepareCheckpoint::Open(DataDir(), *boot);
    ASSERT_TRUE(checkpoint.ok());
    ASSERT_TRUE(checkpoint->Put(record).ok());
  }
  ASSERT_EQ(kernel_->Write(node_->sysfs_root() + "/bus/pci/devices/0000:01:00.0/driver_override",
                           "vfio-pci"),
            0);
  ASSERT_EQ(kernel_->Write(node_->sysfs_root() + "/bus/pci/drivers/nvidia/unbind", "0000:01:00.0"),
            0);
  ASSERT_EQ(kernel_->Write(node_->sysfs_root() + "/bus/pci/drivers/vfio-pci/bind", "0000:01:00.0"),
            0);
  std::ofstream(CdiDir() + "/vfio.dra.io-vfio_" + Uid(7) + ".json") << "{}";
  std::ofstream(CdiDir() + "/other.vendor-x_1.json") << "{}";
  Open();
  ASSERT_TRUE(preparer_->Recover().ok());
  EXPECT_EQ(Driver("0000:01:00.0"), "nvidia");
  EXPECT_EQ(Override("0000:01:00.0"), "(null)\n");
  EXPECT_EQ(Recorded(kUid), std::nullopt);
  EXPECT_THAT(CdiFiles(), ElementsAre("other.vendor-x_1.json"));
}

// KubeVirt metadata files of claims without a record (a lost checkpoint, or an unprepare by an
// older version that knew only the <uid>/<request>/ layout) go at start-up; a prepared claim's
// stay. When the checkpoint cannot be listed, nothing is swept: any file could be a claim's.
TEST_F(PrepareTest, RecoverRemovesMetadataFilesNoClaimOwnsUnlessTheCheckpointCannotBeListed) {
  Use("workstation");
  ASSERT_TRUE(Prepare(Claim({{"gpu", "gpu-0000-01-00-0"}})).ok());
  const std::string base = DataDir() + "/dra-device-metadata/";
  const std::string kept = base + kUid + "_gpu.json";
  ASSERT_TRUE(fs::exists(kept));
  std::ofstream(base + Uid(7) + "_gpu.json") << "{}\n";
  std::ofstream(base + "." + Uid(8) + "_nic.json.tmp-5") << "{";
  fs::create_directories(base + Uid(9) + "/gpu");
  std::ofstream(base + Uid(9) + "/gpu/metadata.json") << "{}\n";
  fs::create_directories(base + "vms_vm-gpu/gpu");  // the oldest layout: not a UID, kept

  // The claims directory replaced by a file once the preparer is open: the view is incomplete.
  Open();
  fs::rename(DataDir() + "/claims", DataDir() + "/claims.aside");
  std::ofstream(DataDir() + "/claims") << "";
  auto refused = preparer_->Recover();
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.error().message, HasSubstr("cannot list the prepare checkpoint directory"));
  EXPECT_TRUE(fs::exists(base + Uid(7) + "_gpu.json")) << "nothing swept without every record";
  EXPECT_FALSE(CdiFiles().empty());

  fs::remove(DataDir() + "/claims");
  fs::rename(DataDir() + "/claims.aside", DataDir() + "/claims");
  Open();
  ASSERT_TRUE(preparer_->Recover().ok());
  EXPECT_TRUE(fs::exists(kept)) << "the prepared claim's file stays";
  EXPECT_FALSE(fs::exists(base + Uid(7) + "_gpu.json"));
  EXPECT_FALSE(fs::exists(base + "." + Uid(8) + "_nic.json.tmp-5"));
  EXPECT_FALSE(fs::exists(base + Uid(9)));
  EXPECT_TRUE(fs::exists(base + "vms_vm-gpu"));
  ASSERT_TRUE(Unprepare().ok());
  EXPECT_FALSE(fs::exists(kept));
}

// Two claims never hold one device: after a reboot or a force-deleted pod the scheduler can
// allocate a device whose old claim is still prepared here; the first unprepare would otherwise
// pull it out of the second VM.
TEST_F(PrepareTest, ADeviceAnotherClaimHoldsIsRefusedNamingThatClaim) {
  Use("workstation");
  ASSERT_TRUE(Prepare(Claim({{"gpu", "gpu-0000-01-00-0"}})).ok());
  const size_t writes = kernel_->Writes().size();
  auto second = Prepare(Claim({{"gpu", "gpu-0000-01-00-0"}}, Uid(2), "other-claim"));
  ASSERT_FALSE(second.ok());
  EXPECT_THAT(second.error().message, HasSubstr("vms/other-claim"));
  EXPECT_THAT(second.error().message,
              HasSubstr("already prepared for claim vms/gpu-claim (uid " + std::string(kUid)));
  EXPECT_EQ(kernel_->Writes().size(), writes) << "the node is not touched";
  EXPECT_FALSE(Recorded(Uid(2)).has_value());
  ASSERT_TRUE(Unprepare(Uid(2), "other-claim").ok()) << "nothing to undo for the refused claim";
  EXPECT_EQ(Driver("0000:01:00.0"), "vfio-pci") << "the first claim keeps its device";
  ASSERT_TRUE(Unprepare().ok());
  auto now = Prepare(Claim({{"gpu", "gpu-0000-01-00-0"}}, Uid(2), "other-claim"));
  EXPECT_TRUE(now.ok()) << now.error().message;
  ASSERT_TRUE(Unprepare(Uid(2), "other-claim").ok());
}

TEST_F(PrepareTest, AnMdevAnotherClaimHoldsIsRefused) {
  Use("vgpu");
  ASSERT_TRUE(Prepare(Claim({{"vgpu", "mdev-0000-3b-00-0-nvidia-223-0"}})).ok());
  auto second = Prepare(Claim({{"vgpu", "mdev-0000-3b-00-0-nvidia-223-0"}}, Uid(2), "other"));
  ASSERT_FALSE(second.ok());
  EXPECT_THAT(second.error().message, HasSubstr("mdev"));
  EXPECT_THAT(second.error().message, HasSubstr("already prepared for claim vms/gpu-claim"));
  ASSERT_TRUE(Unprepare().ok());
}

// The kubelet's retry of a completed claim (and the second pod of a shared claim) gets the same
// answer from the record, even when the device is no longer published, and nothing is redone.
TEST_F(PrepareTest, RepreparingACompletedClaimNeedsNoPublicationAndRedoesNothing) {
  Use("workstation");
  auto first = Prepare(Claim({{"gpu", "gpu-0000-01-00-0"}}));
  ASSERT_TRUE(first.ok()) << first.error().message;
  published_.Set(slicepublisher::DesiredPool{});
  const size_t writes = kernel_->Writes().size();
  auto again = Prepare(Claim({{"gpu", "gpu-0000-01-00-0"}}));
  ASSERT_TRUE(again.ok()) << again.error().message;
  EXPECT_EQ(again->front().cdi_device_ids, first->front().cdi_device_ids);
  EXPECT_EQ(kernel_->Writes().size(), writes) << "no device work for a claim already prepared";
  // A claim allocated other devices under the same UID must be unprepared first.
  auto other = Prepare(Claim({{"gpu", "gpu-0000-02-00-0"}}));
  ASSERT_FALSE(other.ok());
  EXPECT_THAT(other.error().message, HasSubstr("allocated again while still prepared"));
  ASSERT_TRUE(Unprepare().ok());
  EXPECT_EQ(Driver("0000:01:00.0"), "nvidia");
}

// After a reboot the PCI addresses may name other devices (a card added or moved): a record of
// the earlier boot never touches a function that is not the recorded device.
TEST_F(PrepareTest, AfterARebootAnAddressThatNamesAnotherDeviceIsLeftAlone) {
  Use("workstation");
  ASSERT_TRUE(Prepare(Claim({{"gpu", "gpu-0000-01-00-0"}})).ok());
  Reboot("workstation");
  // The reboot re-enumerated the bus: 0000:01:00.0 is now an Intel device (its vendor file and
  // its modalias both say so).
  const std::string dir = node_->sysfs_root() + "/bus/pci/devices/0000:01:00.0/";
  std::ofstream(dir + "vendor", std::ios::trunc) << "0x8086\n";
  std::string modalias = *ReadFileToString(dir + "modalias");
  ASSERT_EQ(modalias.rfind("pci:v000010DE", 0), 0u) << modalias;
  modalias.replace(0, 13, "pci:v00008086");
  std::ofstream(dir + "modalias", std::ios::trunc) << modalias;
  auto again = Prepare(Claim({{"gpu", "gpu-0000-01-00-0"}}));
  ASSERT_FALSE(again.ok());
  EXPECT_THAT(again.error().message, HasSubstr("after a reboot, PCI 0000:01:00.0 is 8086:"));
  EXPECT_TRUE(kernel_->Writes().empty());
  ASSERT_TRUE(Unprepare().ok());
  for (const SimWrite& w : kernel_->Writes()) {
    EXPECT_EQ(w.path.find("0000:01:00.0"), std::string::npos) << w.path;
    EXPECT_EQ(w.value.find("0000:01:00.0"), std::string::npos) << w.path;
  }
  EXPECT_FALSE(Recorded(kUid).has_value());
}

// Two instances of a rolling update on one data dir: each reads the other's records under the
// lock, so B unprepares what A prepared, refuses what A holds, and recovers nothing A finished.
TEST_F(PrepareTest, TwoInstancesOnOneDataDirSeeEachOthersWork) {
  Use("workstation");
  std::unique_ptr<prepare::VfioDevicePreparer> instance_a = std::move(preparer_);
  Open();  // instance B
  ASSERT_TRUE(instance_a
                  ->Prepare(Claim({{"gpu", "gpu-0000-01-00-0"}}),
                            Claim({{"gpu", "gpu-0000-01-00-0"}}).allocation->results, Deadline())
                  .ok());
  ASSERT_TRUE(preparer_->Recover().ok());
  EXPECT_EQ(Driver("0000:01:00.0"), "vfio-pci") << "B's recovery leaves A's completed claim alone";
  auto clash = Prepare(Claim({{"gpu", "gpu-0000-01-00-0"}}, Uid(2), "b-claim"));
  ASSERT_FALSE(clash.ok());
  EXPECT_THAT(clash.error().message, HasSubstr("already prepared for claim vms/gpu-claim"));
  ASSERT_TRUE(Prepare(Claim({{"gpu", "gpu-0000-02-00-0"}}, Uid(2), "b-claim")).ok());
  instance_a.reset();  // A stops
  ASSERT_TRUE(Unprepare().ok());
  ASSERT_TRUE(Unprepare(Uid(2), "b-claim").ok());
  EXPECT_EQ(Driver("0000:01:00.0"), "nvidia");
  EXPECT_EQ(Driver("0000:01:00.1"), "snd_hda_intel");
  EXPECT_NE(Driver("0000:02:00.0"), "vfio-pci");
  EXPECT_TRUE(CdiFiles().empty());
  EXPECT_TRUE(preparer_->checkpoint().Load().claims.empty());
}

// When the kubelet's deadline has passed, nothing more is started: a claim whose turn comes too
// late is not touched at all; one that runs out of time midway keeps its record so the retry (or
// the unprepare) finishes the job, and is not rolled back behind the kubelet's back.
TEST_F(PrepareTest, AnExpiredDeadlineStartsNoDeviceWorkAndKeepsTheRecordForTheRetry) {
  Use("workstation");
  auto claim = Claim({{"gpu", "gpu-0000-01-00-0"}});
  const Deadline passed(std::chrono::steady_clock::now() - std::chrono::seconds(1));
  auto late = preparer_->Prepare(claim, claim.allocation->results, passed);
  ASSERT_FALSE(late.ok());
  EXPECT_EQ(late.error().kind, ErrorKind::kDeadlineExceeded);
  EXPECT_THAT(late.error().message, HasSubstr("not started"));
  EXPECT_FALSE(Recorded(kUid).has_value());
  EXPECT_TRUE(kernel_->Writes().empty());

  // The deadline passes while the record is being written (the hook waits it out). On a busy
  // machine a short deadline may pass before the prepare reaches that step: then it starts
  // nothing, as above, and the test tries again with a longer one, until the step is reached.
  auto reached = std::make_shared<std::atomic<bool>>(false);
  std::optional<decltype(preparer_->Prepare(claim, claim.allocation->results, passed))> midway;
  for (auto budget = std::chrono::milliseconds(50); !*reached; budget *= 2) {
    ASSERT_LT(budget, std::chrono::minutes(2)) << "the prepare never reached its checkpoint step";
    const Deadline soon = Deadline::After(budget);
    step_hook_ = [soon, reached](const std::string& step) {
      if (step != "checkpoint:started") return;
      *reached = true;
      while (!soon.Expired()) std::this_thread::yield();
    };
    Open();
    midway.emplace(preparer_->Prepare(claim, claim.allocation->results, soon));
    if (!*reached) {
      ASSERT_FALSE(midway->ok());
      ASSERT_FALSE(Recorded(kUid).has_value()) << "a prepare that did not start recorded nothing";
    }
  }
  ASSERT_FALSE(midway->ok());
  EXPECT_EQ(midway->error().kind, ErrorKind::kDeadlineExceeded);
  EXPECT_EQ(Driver("0000:01:00.0"), "nvidia");
  ASSERT_TRUE(Recorded(kUid).has_value());
  EXPECT_EQ(Recorded(kUid)->state, prepare::PrepareState::kPrepareStarted);
  step_hook_ = nullptr;
  Open();
  auto retry = Prepare(claim);
  ASSERT_TRUE(retry.ok()) << retry.error().message;
  EXPECT_EQ(Driver("0000:01:00.0"), "vfio-pci");
  Status late_undo = preparer_->Unprepare(prepare::ClaimRef{"vms", "gpu-claim", kUid}, passed);
  ASSERT_FALSE(late_undo.ok());
  EXPECT_EQ(Driver("0000:01:00.0"), "vfio-pci") << "nothing restored after the deadline";
  ASSERT_TRUE(Unprepare().ok());
  EXPECT_EQ(Driver("0000:01:00.0"), "nvidia");
}

// A record that cannot be read is never mistaken for "nothing prepared".
TEST_F(PrepareTest, AnUnreadableRecordFailsItsClaimAndNothingElse) {
  Use("workstation");
  ASSERT_TRUE(Prepare(Claim({{"gpu", "gpu-0000-02-00-0"}}, Uid(2), "fine")).ok());
  fs::create_directories(DataDir() + "/claims/" + kUid + ".json");  // reads fail (EISDIR)
  Status undone = Unprepare();
  ASSERT_FALSE(undone.ok());
  EXPECT_THAT(undone.error().message, HasSubstr(kUid));
  auto prepared = Prepare(Claim({{"gpu", "gpu-0000-01-00-0"}}));
  ASSERT_FALSE(prepared.ok());
  EXPECT_TRUE(Unprepare(Uid(2), "fine").ok()) << "other claims are unaffected";
  // A corrupt record is reported once, moved aside for a person, and not retried forever.
  fs::remove_all(DataDir() + "/claims/" + std::string(kUid) + ".json");
  std::ofstream(DataDir() + "/claims/" + std::string(kUid) + ".json") << "{garbage";
  Status corrupt = Unprepare();
  ASSERT_FALSE(corrupt.ok());
  EXPECT_THAT(corrupt.error().message, HasSubstr("checked and returned by hand"));
  EXPECT_TRUE(Unprepare().ok());
}

// A claim deleted and re-created under the same name is another claim (another UID): while both
// are prepared neither overwrites the other's KubeVirt metadata file, and unpreparing the old one
// leaves the new one's file alone. A directory of the earlier <namespace>_<name> layout goes only
// with the claim that wrote it.
TEST_F(PrepareTest, AClaimRecreatedUnderTheSameNameKeepsItsOwnMetadata) {
  Use("workstation");
  ASSERT_TRUE(Prepare(Claim({{"gpu", "gpu-0000-01-00-0"}}, kUid, "vm-gpu")).ok());
  ASSERT_TRUE(Prepare(Claim({{"gpu", "gpu-0000-02-00-0"}}, Uid(2), "vm-gpu")).ok());
  const std::string old_file = DataDir() + "/dra-device-metadata/" + kUid + "_gpu.json";
  const std::string new_file = DataDir() + "/dra-device-metadata/" + Uid(2) + "_gpu.json";
  EXPECT_EQ(json::parse(Slurp(old_file))["metadata"]["uid"], kUid);
  EXPECT_EQ(json::parse(Slurp(new_file))["metadata"]["uid"], Uid(2));
  // The earlier layout, as a previous version left it for the new claim: it must survive.
  const std::string legacy = DataDir() + "/dra-device-metadata/vms_vm-gpu/gpu";
  fs::create_directories(legacy);
  std::ofstream(legacy + "/metadata.json") << Slurp(new_file);
  ASSERT_TRUE(Unprepare(kUid, "vm-gpu").ok());
  EXPECT_FALSE(fs::exists(old_file));
  EXPECT_TRUE(fs::exists(new_file)) << "the re-created claim keeps its file";
  EXPECT_TRUE(fs::exists(legacy + "/metadata.json")) << "not the old claim's to remove";
  ASSERT_TRUE(Unprepare(Uid(2), "vm-gpu").ok());
  EXPECT_FALSE(fs::exists(new_file));
  EXPECT_FALSE(fs::exists(DataDir() + "/dra-device-metadata/vms_vm-gpu")) << "its own, removed";
}

// Holds the first call that reaches `step` until released (the other steps pass).
class StepGate {
 public:
  explicit StepGate(std::string step) : step_(std::move(step)) {}
  void Pass(const std::string& step) {
    std::unique_lock<std::mutex> lock(mu_);
    if (step != step_ || reached_) return;
    reached_ = true;
    changed_.notify_all();
    changed_.wait(lock, [this] { return released_; });
  }
  void AwaitReached() {
    std::unique_lock<std::mutex> lock(mu_);
    changed_.wait(lock, [this] { return reached_; });
  }
  void Release() {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
    changed_.notify_all();
  }

 private:
  const std::string step_;
  std::mutex mu_;
  std::condition_variable changed_;
  bool reached_ = false;
  bool released_ = false;
};

// Lets the gate's call go on and joins its thread when a test ends, also at a failed assertion.
struct ReleaseAndJoin {
  StepGate& gate;
  std::thread& thread;
  ~ReleaseAndJoin() {
    gate.Release();
    if (thread.joinable()) thread.join();
  }
};

// Claims on different devices no longer queue behind each other (32 VMs starting at once), while
// two calls never change one device together: a claim on a device another call is changing
// waits for it, an unprepare waits for the prepare in flight, and another instance's recovery
// leaves that prepare alone instead of rolling it back under its feet.
TEST_F(PrepareTest, ClaimsOnOtherDevicesGoOnWhileOneIsInFlightAndItsDeviceWaits) {
  using namespace std::chrono_literals;
  Use("workstation");
  StepGate gate("bind:0000:01:00.0");
  step_hook_ = [&gate](const std::string& step) { gate.Pass(step); };
  Open();
  prepare::VfioDevicePreparer* instance_a = preparer_.get();
  const auto claim_a = Claim({{"gpu", "gpu-0000-01-00-0"}});
  std::optional<Result<std::vector<PreparedDevice>>> a_result;
  std::thread in_flight(
      [&] { a_result.emplace(instance_a->Prepare(claim_a, claim_a.allocation->results, {})); });
  ReleaseAndJoin joiner{gate, in_flight};
  gate.AwaitReached();

  const auto claim_b = Claim({{"gpu", "gpu-0000-02-00-0"}}, Uid(2), "other-gpu");
  auto b = instance_a->Prepare(claim_b, claim_b.allocation->results, Deadline::After(120s));
  ASSERT_TRUE(b.ok()) << b.error().message;
  EXPECT_EQ(Driver("0000:02:00.0"), "vfio-pci") << "prepared while the other claim is in flight";

  const auto claim_c = Claim({{"gpu", "gpu-0000-01-00-0"}}, Uid(3), "same-gpu");
  auto c = instance_a->Prepare(claim_c, claim_c.allocation->results, Deadline::After(100ms));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.error().kind, ErrorKind::kDeadlineExceeded);
  EXPECT_THAT(c.error().message, HasSubstr("vms/same-gpu"));
  EXPECT_THAT(c.error().message, HasSubstr("device 0000:01:00.0, which another claim's call"));
  EXPECT_FALSE(Recorded(Uid(3)).has_value());

  Status early_undo =
      instance_a->Unprepare(prepare::ClaimRef{"vms", "gpu-claim", kUid}, Deadline::After(100ms));
  ASSERT_FALSE(early_undo.ok());
  EXPECT_EQ(early_undo.error().kind, ErrorKind::kDeadlineExceeded);
  ASSERT_TRUE(Recorded(kUid).has_value()) << "not undone under the prepare in flight";

  // A second instance starts (a rolling update) while the prepare is in flight.
  std::unique_ptr<prepare::VfioDevicePreparer> keep_a = std::move(preparer_);
  Open();
  const size_t writes = kernel_->Writes().size();
  ASSERT_TRUE(preparer_->Recover().ok());
  EXPECT_EQ(kernel_->Writes().size(), writes) << "recovery rolled back a prepare in flight";
  ASSERT_TRUE(Recorded(kUid).has_value());
  EXPECT_EQ(Recorded(kUid)->state, prepare::PrepareState::kPrepareStarted);

  gate.Release();
  in_flight.join();
  ASSERT_TRUE(a_result->ok()) << a_result->error().message;
  EXPECT_EQ(Driver("0000:01:00.0"), "vfio-pci");
  EXPECT_EQ(Driver("0000:01:00.1"), "vfio-pci");
  auto refused = Prepare(claim_c);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.error().message, HasSubstr("already prepared for claim vms/gpu-claim"));

  keep_a.reset();
  ASSERT_TRUE(Unprepare().ok());
  ASSERT_TRUE(Unprepare(Uid(2), "other-gpu").ok());
  EXPECT_EQ(Driver("0000:01:00.0"), "nvidia");
  EXPECT_EQ(Driver("0000:01:00.1"), "snd_hda_intel");
  EXPECT_TRUE(CdiFiles().empty());
  EXPECT_TRUE(preparer_->checkpoint().Load().claims.empty());
}

// A rolling update: instance B is preparing a claim (PrepareStarted on disk, its devices locked)
// when instance A starts. A's recovery sees the record in PrepareStarted; before it takes the
// record's device locks, B finishes the prepare and answers the kubelet. A must then leave the
// claim alone: undoing the copy it read first would pull the device from under a VM the kubelet
// believes prepared.
TEST_F(PrepareTest, RecoveryLeavesAPrepareThatTheOtherInstanceFinishedAfterRecoverySawIt) {
  Use("workstation");
  StepGate b_binding("bind:0000:01:00.0");
  StepGate a_recovering(std::string("recover:") + kUid);
  step_hook_ = [&](const std::string& step) {
    b_binding.Pass(step);
    a_recovering.Pass(step);
  };
  Open();
  std::unique_ptr<prepare::VfioDevicePreparer> instance_b = std::move(preparer_);
  Open();  // instance A, on the same data dir; it starts (and recovers) once B is binding
  const auto claim = Claim({{"gpu", "gpu-0000-01-00-0"}});
  std::optional<Result<std::vector<PreparedDevice>>> b_result;
  std::thread b_prepare(
      [&] { b_result.emplace(instance_b->Prepare(claim, claim.allocation->results, Deadline())); });
  std::optional<Status> a_result;
  std::thread a_recover;
  struct Joiner {
    StepGate& b_gate;
    StepGate& a_gate;
    std::thread& b;
    std::thread& a;
    ~Joiner() {
      b_gate.Release();
      a_gate.Release();
      if (b.joinable()) b.join();
      if (a.joinable()) a.join();
    }
  } joiner{b_binding, a_recovering, b_prepare, a_recover};
  b_binding.AwaitReached();
  ASSERT_EQ(Recorded(kUid)->state, prepare::PrepareState::kPrepareStarted);

  a_recover = std::thread([&] { a_result.emplace(preparer_->Recover()); });
  a_recovering.AwaitReached();  // A has seen the record in PrepareStarted

  b_binding.Release();
  b_prepare.join();
  ASSERT_TRUE(b_result->ok()) << b_result->error().message;
  ASSERT_EQ(Recorded(kUid)->state, prepare::PrepareState::kPrepareCompleted);
  const std::vector<std::string> specs = CdiFiles();
  const size_t writes = kernel_->Writes().size();

  a_recovering.Release();
  a_recover.join();
  ASSERT_TRUE(a_result->ok()) << a_result->error().message;
  EXPECT_EQ(kernel_->Writes().size(), writes) << "recovery touched the prepared devices";
  EXPECT_EQ(Driver("0000:01:00.0"), "vfio-pci");
  EXPECT_EQ(Driver("0000:01:00.1"), "vfio-pci");
  ASSERT_TRUE(Recorded(kUid).has_value()) << "recovery removed the completed record";
  EXPECT_EQ(Recorded(kUid)->state, prepare::PrepareState::kPrepareCompleted);
  EXPECT_EQ(CdiFiles(), specs) << "recovery removed the claim's CDI specs";

  instance_b.reset();
  ASSERT_TRUE(Unprepare().ok());
  EXPECT_EQ(Driver("0000:01:00.0"), "nvidia");
  EXPECT_EQ(Driver("0000:01:00.1"), "snd_hda_intel");
  EXPECT_TRUE(CdiFiles().empty());
}

// A record that cannot be read may hold any device: until it can be read or is moved aside, no
// prepare hands out a device, and the error names the record. (An unprepare of another claim
// goes on: it only gives back what its own record holds.)
TEST_F(PrepareTest, AnUnreadableRecordOfAnotherClaimRefusesEveryPrepare) {
  Use("workstation");
  const auto first = Claim({{"gpu", "gpu-0000-02-00-0"}}, Uid(2), "first");
  ASSERT_TRUE(Prepare(first).ok());
  // A directory where a record should be reads as an I/O error would (tests run as root, so
  // permission bits do not stop reads).
  const std::string unreadable = DataDir() + "/claims/" + Uid(9) + ".json";
  fs::create_directories(unreadable);
  const auto claim = Claim({{"gpu", "gpu-0000-01-00-0"}});
  const size_t writes = kernel_->Writes().size();
  auto refused = Prepare(claim);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.error().message, HasSubstr("claim uid " + Uid(9) + " cannot be used"));
  EXPECT_THAT(refused.error().message, HasSubstr(unreadable));
  EXPECT_EQ(kernel_->Writes().size(), writes);
  EXPECT_FALSE(Recorded(kUid).has_value());
  EXPECT_EQ(Driver("0000:01:00.0"), "nvidia");

  ASSERT_TRUE(Unprepare(Uid(2), "first").ok());
  fs::remove(unreadable);
  auto prepared = Prepare(claim);
  ASSERT_TRUE(prepared.ok()) << prepared.error().message;
  ASSERT_TRUE(Unprepare().ok());
}

// An instance of a version before parallel preparation takes serialize.lock exclusively for each
// call: while it works, this version starts nothing (and says what it waited for).
TEST_F(PrepareTest, AnEarlierVersionHoldingTheNodeLockIsWaitedFor) {
  using namespace std::chrono_literals;
  Use("workstation");
  auto earlier = FileLock::Acquire(DataDir() + "/serialize.lock", LockMode::kExclusive, Deadline(),
                                   "the test's node lock");
  ASSERT_TRUE(earlier.ok()) << earlier.error().message;
  const auto claim = Claim({{"gpu", "gpu-0000-02-00-0"}});
  auto waited = preparer_->Prepare(claim, claim.allocation->results, Deadline::After(100ms));
  ASSERT_FALSE(waited.ok());
  EXPECT_EQ(waited.error().kind, ErrorKind::kDeadlineExceeded);
  EXPECT_THAT(waited.error().message, HasSubstr("serialize.lock (an instance of an older version"));
  EXPECT_TRUE(kernel_->Writes().empty());
  EXPECT_FALSE(Recorded(kUid).has_value());
  { FileLock released = std::move(*earlier); }
  auto now = Prepare(claim);
  ASSERT_TRUE(now.ok()) << now.error().message;
  ASSERT_TRUE(Unprepare().ok());
}

// NVIDIA vGPU on SR-IOV VFs: prepare sets the type on the VF (no rebinding, no mdev) and hands out
// the VF's VFIO nodes; unprepare writes 0.
TEST_F(PrepareTest, AVgpuOnAVfIsSetConfirmedHandedOutAndClearedWithoutRebinding) {
  Use("vgpu-vf");
  const std::string vf = "0000:41:00.4";
  const std::string current =
      node_->sysfs_root() + "/bus/pci/devices/" + vf + "/nvidia/current_vgpu_type";
  auto prepared = Prepare(Claim({{"vgpu", "vgpu-0000-41-00-4-1415"}}));
  ASSERT_TRUE(prepared.ok()) << prepared.error().message;
  EXPECT_EQ(Slurp(current), "1415\n");
  EXPECT_EQ(Driver(vf), "nvidia") << "a vGPU VF stays on nvidia, its VFIO provider";
  EXPECT_EQ(Override(vf), "(null)\n");
  const json spec = CdiSpec(std::string("vfio.dra.io-vfio_") + kUid + ".json");
  EXPECT_EQ(spec["containerEdits"]["deviceNodes"][0]["path"], "/dev/vfio/vfio");
  EXPECT_EQ(spec["devices"][0]["containerEdits"]["deviceNodes"],
            json::parse(R"([{"path":"/dev/vfio/81","type":"c","major":241,"minor":81}])"));
  const json metadata =
      json::parse(Slurp(DataDir() + "/dra-device-metadata/" + kUid + "_vgpu.json"));
  const json& attributes = metadata["requests"][0]["devices"][0]["attributes"];
  EXPECT_EQ(attributes["resource.kubernetes.io/pciBusID"], json({{"string", vf}}));
  EXPECT_EQ(attributes["vgpuTypeID"], json({{"int", 1415}}));
  const auto record = Recorded(kUid);
  ASSERT_TRUE(record.has_value());
  EXPECT_TRUE(record->functions.empty());
  ASSERT_EQ(record->vgpus.size(), 1u);
  EXPECT_EQ(record->vgpus[0].address, vf);
  EXPECT_EQ(record->vgpus[0].type_id, 1415);
  EXPECT_TRUE(record->vgpus[0].created_by_us);
  EXPECT_EQ(record->vgpus[0].identity.vendor, "10de");
  // The health stream sees the vGPU in place.
  ASSERT_EQ(preparer_->Prepared()->size(), 1u);
  EXPECT_EQ(preparer_->Prepared()->front().vgpu_vf, vf);
  bool seen = false;
  for (const auto& status :
       prepare::CheckDeviceHealth(*sysfs_, published_.Current(), *preparer_->Prepared())) {
    if (status.device != "vgpu-0000-41-00-4-1415") continue;
    seen = true;
    EXPECT_TRUE(status.healthy) << status.message;
  }
  EXPECT_TRUE(seen);

  // The kubelet's retry: the same answer, nothing written again.
  const size_t writes = kernel_->Writes().size();
  auto again = Prepare(Claim({{"vgpu", "vgpu-0000-41-00-4-1415"}}));
  ASSERT_TRUE(again.ok()) << again.error().message;
  EXPECT_EQ(again->front().cdi_device_ids, prepared->front().cdi_device_ids);
  EXPECT_EQ(kernel_->Writes().size(), writes);

  ASSERT_TRUE(Unprepare().ok());
  EXPECT_EQ(Slurp(current), "0\n");
  EXPECT_EQ(Driver(vf), "nvidia");
  EXPECT_EQ(Recorded(kUid), std::nullopt);
  ExpectWritesConfinedTo({vf});
}

TEST_F(PrepareTest, UnprepareOfAVgpuAVmmStillHoldsFailsForThatClaimOnlyAndTheRetryFinishes) {
  Use("vgpu-vf");
  const auto current = [&](const std::string& vf) {
    return Slurp(node_->sysfs_root() + "/bus/pci/devices/" + vf + "/nvidia/current_vgpu_type");
  };
  ASSERT_TRUE(Prepare(Claim({{"vgpu", "vgpu-0000-41-00-4-1414"}}, Uid(1), "a")).ok());
  ASSERT_TRUE(Prepare(Claim({{"vgpu", "vgpu-0000-41-00-5-1414"}}, Uid(2), "b")).ok());
  kernel_->OpenVgpuVf("0000:41:00.4");
  Status held = Unprepare(Uid(1), "a");
  ASSERT_FALSE(held.ok());
  EXPECT_THAT(held.error().message, HasSubstr("0000:41:00.4"));
  EXPECT_THAT(held.error().message, HasSubstr("EBUSY"));
  EXPECT_EQ(current("0000:41:00.4"), "1414\n");
  EXPECT_TRUE(Recorded(Uid(1)).has_value()) << "kept for the retry";
  // The other claim is not affected.
  ASSERT_TRUE(Unprepare(Uid(2), "b").ok());
  EXPECT_EQ(current("0000:41:00.5"), "0\n");
  // The VMM lets go: the kubelet's retry finishes.
  kernel_->CloseVgpuVf("0000:41:00.4");
  ASSERT_TRUE(Unprepare(Uid(1), "a").ok());
  EXPECT_EQ(current("0000:41:00.4"), "0\n");
  EXPECT_EQ(Recorded(Uid(1)), std::nullopt);
}

TEST_F(PrepareTest, AVgpuTheVfHeldAtStartIsHandedOutAndLeftInPlace) {
  Use("vgpu-vf");
  const std::string current =
      node_->sysfs_root() + "/bus/pci/devices/0000:c1:00.4/nvidia/current_vgpu_type";
  auto prepared = Prepare(Claim({{"vgpu", "vgpu-0000-c1-00-4-1415"}}));
  ASSERT_TRUE(prepared.ok()) << prepared.error().message;
  ASSERT_EQ(Recorded(kUid)->vgpus.size(), 1u);
  EXPECT_FALSE(Recorded(kUid)->vgpus[0].created_by_us);
  ASSERT_TRUE(Unprepare().ok());
  EXPECT_EQ(Slurp(current), "1415\n") << "not made by vfio-dra: not removed";
  for (const SimWrite& w : kernel_->Writes())
    EXPECT_THAT(w.path, ::testing::Not(HasSubstr("vgpu")));
}

// Someone else (another tool, an admin, a VM outside Kubernetes) gives an offered VF a vGPU
// between publish and prepare. It is not vfio-dra's: the claim fails naming the VF, the type and
// the fix, and the VF keeps its vGPU, also through unprepare. Once it is cleared, the retry works.
TEST_F(PrepareTest, AVgpuSomeoneElseSetBetweenPublishAndPrepareIsRefusedAndLeftAlone) {
  Use("vgpu-vf");
  const std::string vf = "0000:41:00.4";
  const std::string current =
      node_->sysfs_root() + "/bus/pci/devices/" + vf + "/nvidia/current_vgpu_type";
  for (const char* device : {"vgpu-0000-41-00-4-1415", "vgpu-0000-41-00-4-1414"}) {
    ASSERT_EQ(kernel_->Write(current, "1415"), 0);
    const size_t writes = kernel_->Writes().size();
    auto refused = Prepare(Claim({{"vgpu", device}}));
    ASSERT_FALSE(refused.ok()) << device;
    EXPECT_EQ(refused.error().kind, ErrorKind::kFailedPrecondition);
    EXPECT_THAT(refused.error().message, HasSubstr("claim vms/gpu-claim"));
    EXPECT_THAT(refused.error().message,
                HasSubstr("VF 0000:41:00.4 already holds vGPU type 1415 that vfio-dra did not "
                          "create for this claim"));
    EXPECT_THAT(refused.error().message, HasSubstr("echo 0 > " + current));
    EXPECT_THAT(refused.error().message, HasSubstr("deny: [{address: \"0000:41:00.4\"}]"));
    EXPECT_EQ(kernel_->Writes().size(), writes) << device;
    EXPECT_EQ(Slurp(current), "1415\n");
    EXPECT_EQ(Recorded(kUid), std::nullopt);
    ASSERT_TRUE(Unprepare().ok());
    EXPECT_EQ(Slurp(current), "1415\n");
    ASSERT_EQ(kernel_->Write(current, "0"), 0);
  }
  auto prepared = Prepare(Claim({{"vgpu", "vgpu-0000-41-00-4-1414"}}));
  ASSERT_TRUE(prepared.ok()) << prepared.error().message;
  EXPECT_EQ(Slurp(current), "1414\n");
  ASSERT_TRUE(Unprepare().ok());
  EXPECT_EQ(Slurp(current), "0\n");
}

// Killed after the type was written, before PrepareCompleted. The VF is republished meanwhile as
// holding the vGPU (the same name, no counters), so only the claim's record says the vGPU is the
// claim's own: the retry finishes the prepare without writing again, and unprepare destroys it.
TEST_F(PrepareTest, AKillAfterTheVgpuTypeIsSetIsFinishedByTheRetryAsTheClaimsOwn) {
  Use("vgpu-vf");
  const std::string current =
      node_->sysfs_root() + "/bus/pci/devices/0000:41:00.4/nvidia/current_vgpu_type";
  const auto claim = Claim({{"vgpu", "vgpu-0000-41-00-4-1415"}});
  struct Crash {};
  step_hook_ = [](const std::string& step) {
    if (step == "cdi:write") throw Crash{};
  };
  Open();
  EXPECT_THROW((void)Prepare(claim), Crash);
  EXPECT_EQ(Slurp(current), "1415\n");
  ASSERT_TRUE(Recorded(kUid).has_value());
  EXPECT_EQ(Recorded(kUid)->state, prepare::PrepareState::kPrepareStarted);
  ASSERT_TRUE(published_.Find("node1", "vgpu-0000-41-00-4-1415").has_value());
  Publish();
  ASSERT_TRUE(published_.Find("node1", "vgpu-0000-41-00-4-1415")->consumes_counters.empty());

  step_hook_ = nullptr;
  Open();  // the other instance, which gets the kubelet's retry
  const size_t writes = kernel_->Writes().size();
  auto prepared = Prepare(claim);
  ASSERT_TRUE(prepared.ok()) << prepared.error().message;
  const std::vector<SimWrite> all = kernel_->Writes();
  for (size_t i = writes; i < all.size(); ++i) {
    EXPECT_THAT(all[i].path, ::testing::Not(HasSubstr("vgpu"))) << "written again";
  }
  const auto record = Recorded(kUid);
  ASSERT_TRUE(record.has_value());
  EXPECT_EQ(record->state, prepare::PrepareState::kPrepareCompleted);
  ASSERT_EQ(record->vgpus.size(), 1u);
  EXPECT_TRUE(record->vgpus[0].created_by_us);
  ASSERT_TRUE(Unprepare().ok());
  EXPECT_EQ(Slurp(current), "0\n");
}

// A vGPU published as it was (not made by vfio-dra) that is gone or changed at prepare is not
// made anew: vfio-dra would then own a vGPU the claim was not allocated as one it makes.
TEST_F(PrepareTest, AHeldVgpuThatChangedSincePublishIsNotMadeAnew) {
  Use("vgpu-vf");
  const std::string current =
      node_->sysfs_root() + "/bus/pci/devices/0000:c1:00.4/nvidia/current_vgpu_type";
  ASSERT_EQ(kernel_->Write(current, "0"), 0);
  const size_t writes = kernel_->Writes().size();
  auto refused = Prepare(Claim({{"vgpu", "vgpu-0000-c1-00-4-1415"}}));
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.error().message, HasSubstr("0000:c1:00.4"));
  EXPECT_THAT(refused.error().message, HasSubstr("now holds none"));
  EXPECT_EQ(kernel_->Writes().size(), writes);
  EXPECT_EQ(Slurp(current), "0\n");
  EXPECT_EQ(Recorded(kUid), std::nullopt);
}

// Two claims for different types on one idle GPU can both be allocated (the PF runs one type at
// a time, which no counter can say); the second fails with a clear per-claim error and leaves
// nothing behind.
TEST_F(PrepareTest, ASecondTypeOnAGpuRunningAnotherFailsClearlyAndLeavesNothing) {
  Use("vgpu-vf");
  ASSERT_TRUE(Prepare(Claim({{"vgpu", "vgpu-0000-41-00-4-1414"}}, Uid(1), "a")).ok());
  auto refused = Prepare(Claim({{"vgpu", "vgpu-0000-41-00-5-1416"}}, Uid(2), "b"));
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.error().message, HasSubstr("ENODEV"));
  EXPECT_THAT(refused.error().message, HasSubstr("vgpuType"));
  EXPECT_EQ(Slurp(node_->sysfs_root() + "/bus/pci/devices/0000:41:00.5/nvidia/current_vgpu_type"),
            "0\n");
  EXPECT_EQ(Recorded(Uid(2)), std::nullopt);
}

TEST_F(PrepareTest, AVgpuVfAnotherClaimHoldsIsRefused) {
  Use("vgpu-vf");
  ASSERT_TRUE(Prepare(Claim({{"vgpu", "vgpu-0000-41-00-4-1414"}}, Uid(1), "a")).ok());
  auto refused = Prepare(Claim({{"vgpu", "vgpu-0000-41-00-4-1415"}}, Uid(2), "b"));
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.error().message, HasSubstr("is already prepared for"));
}

// After a reboot the vGPU is gone and the record is of another boot: prepare sets it again, but
// only on the same device.
TEST_F(PrepareTest, AfterARebootAVgpuIsSetAgainOnlyOnTheSameDevice) {
  Use("vgpu-vf");
  const std::string current =
      node_->sysfs_root() + "/bus/pci/devices/0000:41:00.4/nvidia/current_vgpu_type";
  ASSERT_TRUE(Prepare(Claim({{"vgpu", "vgpu-0000-41-00-4-1416"}})).ok());
  Reboot("vgpu-vf");
  EXPECT_EQ(Slurp(current), "0\n");
  auto again = Prepare(Claim({{"vgpu", "vgpu-0000-41-00-4-1416"}}));
  ASSERT_TRUE(again.ok()) << again.error().message;
  EXPECT_EQ(Slurp(current), "1416\n");

  Reboot("vgpu-vf");
  WriteBootId("boot-3");  // Reboot names every boot after the first "boot-2"
  Open();
  // The address now names another device.
  std::ofstream(node_->sysfs_root() + "/bus/pci/devices/0000:41:00.4/device") << "0x2335\n";
  std::ofstream(node_->sysfs_root() + "/bus/pci/devices/0000:41:00.4/modalias")
      << "pci:v000010DEd00002335sv000010DEsd00002335bc03sc02i00\n";
  auto refused = Prepare(Claim({{"vgpu", "vgpu-0000-41-00-4-1416"}}));
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.error().message, HasSubstr("not the device"));
  EXPECT_EQ(Slurp(current), "0\n");
}

// Issue 53 item 1: a vGPU whose VF is gone (its PF's sriov_numvfs lowered) went with it. Unprepare
// takes that as done, as it does for a function that is gone: the record and the CDI specs go,
// and the device, kept published (lost) while the claim held it, leaves the slices.
TEST_F(PrepareTest, AVgpuWhoseVfIsGoneIsUnpreparedAndLeavesTheSlices) {
  Use("vgpu-vf");
  const std::string vf = "0000:41:00.4";
  const std::string device = "vgpu-0000-41-00-4-1415";
  ASSERT_TRUE(Prepare(Claim({{"vgpu", device}})).ok());
  ASSERT_FALSE(CdiFiles().empty());
  ASSERT_EQ(kernel_->Write(node_->sysfs_root() + "/bus/pci/devices/0000:41:00.0/sriov_numvfs", "0"),
            0);
  ASSERT_FALSE(fs::exists(node_->sysfs_root() + "/bus/pci/devices/" + vf));
  PublishWithTaints();
  const auto lost = published_.Find("node1", device);
  ASSERT_TRUE(lost.has_value()) << "kept published while the claim holds it";
  ASSERT_EQ(lost->taints.size(), 1u);
  EXPECT_EQ(lost->taints[0].key, "vfio.dra.io/lost");

  Status undone = Unprepare();
  ASSERT_TRUE(undone.ok()) << undone.error().message;
  EXPECT_EQ(Recorded(kUid), std::nullopt);
  EXPECT_TRUE(CdiFiles().empty());
  EXPECT_FALSE(fs::exists(DataDir() + "/dra-device-metadata/" + kUid + "_vgpu.json"));
  EXPECT_TRUE(preparer_->Prepared()->empty());
  PublishWithTaints();
  EXPECT_FALSE(published_.Find("node1", device).has_value());
  // The kubelet's retry finds nothing left to do.
  EXPECT_TRUE(Unprepare().ok());
}

// Issue 53 item 1, at start: a prepare killed after it set the vGPU type, whose VF is gone before
// the daemon starts again, is rolled back by recovery (before: every start failed the same way and
// the record stayed).
TEST_F(PrepareTest, APrepareStartedVgpuWhoseVfIsGoneIsRolledBackAtStart) {
  Use("vgpu-vf");
  struct Crash {};
  step_hook_ = [](const std::string& step) {
    if (step == "checkpoint:completed") throw Crash{};
  };
  Open();
  EXPECT_THROW((void)Prepare(Claim({{"vgpu", "vgpu-0000-41-00-4-1415"}})), Crash);
  ASSERT_TRUE(Recorded(kUid).has_value());
  ASSERT_EQ(Recorded(kUid)->state, prepare::PrepareState::kPrepareStarted);
  ASSERT_FALSE(CdiFiles().empty());
  ASSERT_EQ(kernel_->Write(node_->sysfs_root() + "/bus/pci/devices/0000:41:00.0/sriov_numvfs", "0"),
            0);

  step_hook_ = nullptr;
  Open();
  Status recovered = preparer_->Recover();
  ASSERT_TRUE(recovered.ok()) << recovered.error().message;
  EXPECT_EQ(Recorded(kUid), std::nullopt);
  EXPECT_TRUE(CdiFiles().empty());
  EXPECT_FALSE(fs::exists(DataDir() + "/dra-device-metadata/" + kUid + "_vgpu.json"));
}

// Issue 53 item 3: two vGPUs of one GPU are never changed at once, also when one of the calls is
// an unprepare. While the unprepare of a vGPU on VF 41:00.4 is about to write its 0, a prepare of
// another type on VF 41:00.5 of the same GPU waits for it (the GPU still runs the first type, so
// going on would fail with ENODEV); once the unprepare is done, the prepare finds the GPU idle.
TEST_F(PrepareTest, AnUnprepareOfAVgpuAndAPrepareOnAnotherVfOfItsGpuNeverOverlap) {
  using namespace std::chrono_literals;
  Use("vgpu-vf");
  const auto current = [&](const std::string& vf) {
    return Slurp(node_->sysfs_root() + "/bus/pci/devices/" + vf + "/nvidia/current_vgpu_type");
  };
  StepGate removing("vgpu-remove:0000:41:00.4");
  step_hook_ = [&removing](const std::string& step) { removing.Pass(step); };
  Open();
  ASSERT_TRUE(Prepare(Claim({{"vgpu", "vgpu-0000-41-00-4-1414"}}, Uid(1), "a")).ok());
  std::optional<Status> undone;
  std::thread unprepare([&] { undone.emplace(Unprepare(Uid(1), "a")); });
  ReleaseAndJoin joiner{removing, unprepare};
  removing.AwaitReached();
  ASSERT_EQ(current("0000:41:00.4"), "1414\n");

  const auto claim_b = Claim({{"vgpu", "vgpu-0000-41-00-5-1416"}}, Uid(2), "b");
  auto waited = preparer_->Prepare(claim_b, claim_b.allocation->results, Deadline::After(200ms));
  ASSERT_FALSE(waited.ok());
  EXPECT_EQ(waited.error().kind, ErrorKind::kDeadlineExceeded) << waited.error().message;
  EXPECT_THAT(waited.error().message, HasSubstr("device 0000:41:00.0, which another claim's call"));
  EXPECT_EQ(current("0000:41:00.5"), "0\n");
  EXPECT_EQ(Recorded(Uid(2)), std::nullopt);

  removing.Release();
  unprepare.join();
  ASSERT_TRUE(undone->ok()) << undone->error().message;
  EXPECT_EQ(current("0000:41:00.4"), "0\n");
  auto prepared = Prepare(claim_b);
  ASSERT_TRUE(prepared.ok()) << prepared.error().message;
  EXPECT_EQ(current("0000:41:00.5"), "1416\n");
}

// Issue 53 item 4: a prepared claim prepared again (the kubelet's retry, a shared claim) is
// replayed from its record; if the VF's IOMMU group was renumbered since (VFs re-created, a card
// added), the recorded group would name another device's /dev/vfio node in the CDI spec. The
// group is read again and the replay refused, naming both.
TEST_F(PrepareTest, AReplayWhoseIommuGroupWasRenumberedIsRefused) {
  Use("vgpu-vf");
  const auto claim = Claim({{"vgpu", "vgpu-0000-41-00-4-1415"}});
  ASSERT_TRUE(Prepare(claim).ok());
  const std::string devices = node_->sysfs_root() + "/bus/pci/devices/";
  const fs::path link = devices + "0000:41:00.4/iommu_group";
  const fs::path recorded = fs::read_symlink(link);
  const fs::path other = fs::read_symlink(devices + "0000:41:00.5/iommu_group");
  ASSERT_NE(recorded.filename(), other.filename());
  fs::remove(link);
  fs::create_symlink(other, link);
  const size_t writes = kernel_->Writes().size();
  auto refused = Prepare(claim);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().kind, ErrorKind::kFailedPrecondition);
  EXPECT_THAT(refused.error().message,
              HasSubstr("PCI 0000:41:00.4 is now in IOMMU group " + other.filename().string() +
                        ", not group " + recorded.filename().string()));
  EXPECT_EQ(kernel_->Writes().size(), writes);
}

// Issue 53 item 8: the health stream keeps a prepared device's own problem (its vGPU is gone) and
// the reason of the taint the device carries (fatal PCIe errors on its VF), both.
TEST_F(PrepareTest, TheHealthOfATaintedPreparedDeviceSaysItsOwnProblemAndTheTaintsReason) {
  Use("vgpu-vf");
  const std::string device = "vgpu-0000-41-00-4-1415";
  ASSERT_TRUE(Prepare(Claim({{"vgpu", device}})).ok());
  const std::string vf_dir = node_->sysfs_root() + "/bus/pci/devices/0000:41:00.4";
  std::ofstream(vf_dir + "/aer_dev_fatal")
      << "Undefined 0\nDLP 1\nSDES 0\nTLP 0\nTOTAL_ERR_FATAL 1\n";
  ASSERT_EQ(kernel_->Write(vf_dir + "/nvidia/current_vgpu_type", "0"), 0);
  PublishWithTaints();
  ASSERT_TRUE(published_.Find("node1", device).has_value());
  ASSERT_FALSE(published_.Find("node1", device)->taints.empty());
  std::optional<prepare::DeviceHealthStatus> health;
  for (const auto& status :
       prepare::CheckDeviceHealth(*sysfs_, published_.Current(), *preparer_->Prepared())) {
    if (status.device == device) health = status;
  }
  ASSERT_TRUE(health.has_value());
  EXPECT_FALSE(health->healthy);
  EXPECT_THAT(health->message,
              HasSubstr("vGPU 1415 on VF 0000:41:00.4 prepared for claim vms/gpu-claim is gone"));
  EXPECT_THAT(health->message, HasSubstr("aer_dev_fatal"));
}

}  // namespace
}  // namespace vfio_dra::testing
