// The slice reconciler against the fake API server over loopback HTTP. The fake, not a real
// server: these tests inject conflicts, dropped watches, 410s, 5xx and writes of other clients at
// chosen moments; the reconciler against a real API server (deletions, a restart) is in
// test/cluster (scenario slices-true).
#include "slicepublisher/slice_reconciler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>

#include "discovery/admin_policy.h"
#include "discovery/node_scan.h"
#include "fake_apiserver.h"
#include "kube/client_config.h"
#include "kube/httplib_transport.h"
#include "slicepublisher/device_attributes.h"
#include "slicepublisher/device_names.h"
#include "slicepublisher/mdev_type_maxima.h"
#include "sysfs_fixture.h"

namespace vfio_dra::slicepublisher {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using vfio_dra::testing::FakeApiServer;
using vfio_dra::testing::FakeApiServerOptions;

constexpr auto kWait = std::chrono::seconds(20);

class SliceReconcilerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/vfio-dra-rec-XXXXXX";
    dir_ = mkdtemp(tmpl);
    vfio_dra::testing::WritePciIds(dir_ + "/pci.ids");
  }
  void TearDown() override {
    reconciler_.reset();
    client_.reset();
    transport_.reset();
    tokens_.reset();
    if (server_) server_->Stop();
    std::filesystem::remove_all(dir_);
  }
  void StartServer(FakeApiServerOptions options = {}) {
    server_ = std::make_unique<FakeApiServer>(std::move(options));
    ASSERT_TRUE(server_->Start());
    server_->PutNode("node-1", "node-uid-1");
  }
  std::shared_ptr<const discovery::NodeScan> Scan(const std::string& fixture,
                                                  const discovery::AdminPolicy& policy = {}) {
    const std::string root = dir_ + "/" + fixture;
    if (!std::filesystem::exists(root)) vfio_dra::testing::BuildFixture(fixture, root);
    sysfs::SysfsReader sysfs(root);
    auto names = discovery::PciNames::Open({root, dir_ + "/pci.ids", false});
    return discovery::ScanNode(sysfs, names.ok() ? names->get() : nullptr, policy);
  }
  void StartReconciler(const std::string& fixture, const std::string& maxima_path = "") {
    StartReconcilerOn(*Scan(fixture), maxima_path);
  }
  void StartReconcilerOn(const discovery::NodeScan& scan, const std::string& maxima_path = "",
                         Logger log = Logger::Discard()) {
    auto config = kube::LoadKubeconfigFile(server_->WriteKubeconfig(dir_));
    ASSERT_TRUE(config.ok());
    transport_ = std::move(*kube::HttplibTransport::Create(*config, "test"));
    tokens_ = std::make_unique<kube::TokenSource>("", "", RealClock());
    kube::ApiClientOptions api_options;
    api_options.qps = 0;
    api_options.max_retries = 1;
    api_options.initial_backoff = std::chrono::milliseconds(10);
    client_ = std::make_unique<kube::ApiClient>(*transport_, *tokens_, RealClock(),
                                                Logger::Discard(), api_options);
    ReconcilerOptions options;
    options.driver = "vfio.dra.io";
    options.node_name = "node-1";
    options.initial_backoff = std::chrono::milliseconds(50);
    options.max_backoff = std::chrono::seconds(2);
    options.watch_timeout = std::chrono::seconds(5);
    options.mdev_maxima_path = maxima_path;
    if (adjust_options_) adjust_options_(options);
    reconciler_ = std::make_unique<SliceReconciler>(*client_, options, std::move(log));
    reconciler_->SetScan(scan);
    reconciler_->Start();
  }
  // Waits until the reconciler is in sync and the server holds `slices` slices of the pool.
  bool Converged(size_t slices) {
    const auto deadline = std::chrono::steady_clock::now() + kWait;
    while (std::chrono::steady_clock::now() < deadline) {
      if (reconciler_->WaitInSync(std::chrono::seconds(1)) && server_->Slices().size() == slices) {
        return true;
      }
    }
    return false;
  }

  std::string dir_;
  std::unique_ptr<FakeApiServer> server_;
  std::unique_ptr<kube::HttplibTransport> transport_;
  std::unique_ptr<kube::TokenSource> tokens_;
  std::unique_ptr<kube::ApiClient> client_;
  std::unique_ptr<SliceReconciler> reconciler_;
  // Applied to the options of each reconciler StartReconcilerOn makes.
  std::function<void(ReconcilerOptions&)> adjust_options_;
};

TEST_F(SliceReconcilerTest, PublishesTheNodeAndANoChangeResyncWritesNothing) {
  StartServer();
  StartReconciler("vgpu");
  ASSERT_TRUE(Converged(3));
  for (const json& slice : server_->Slices()) {
    EXPECT_EQ(slice["spec"]["driver"], "vfio.dra.io");
    EXPECT_EQ(slice["spec"]["nodeName"], "node-1");
    EXPECT_EQ(slice["spec"]["pool"]["name"], "node-1");
    EXPECT_EQ(slice["spec"]["pool"]["generation"], 1);
    EXPECT_EQ(slice["spec"]["pool"]["resourceSliceCount"], 3);
    EXPECT_EQ(slice["metadata"]["name"].get<std::string>().rfind("node-1-vfio.dra.io-", 0), 0u);
    EXPECT_EQ(slice["metadata"]["ownerReferences"][0]["uid"], "node-uid-1");
    EXPECT_EQ(slice["metadata"]["ownerReferences"][0]["kind"], "Node");
  }
  const size_t writes = server_->SliceWrites();
  EXPECT_EQ(writes, 3u);
  reconciler_->Resync();
  ASSERT_TRUE(reconciler_->WaitInSync(kWait));
  reconciler_->SetScan(*Scan("vgpu"));  // the same node again
  ASSERT_TRUE(reconciler_->WaitInSync(kWait));
  EXPECT_EQ(server_->SliceWrites(), writes);
  // Repacking the kept scan (once the node settles) changes nothing the slices are built from.
  reconciler_->Compact();
  reconciler_->Resync();
  ASSERT_TRUE(reconciler_->WaitInSync(kWait));
  EXPECT_EQ(server_->SliceWrites(), writes);
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The taints of `device` as the server's slices hold it; null when no slice lists it.
json ServerTaints(const std::vector<json>& slices, const std::string& device) {
  for (const json& slice : slices) {
    for (const json& d : slice["spec"].value("devices", json::array())) {
      if (d.value("name", "") == device) return d.value("taints", json::array());
    }
  }
  return nullptr;
}

// Issue 53 item 5: a restarted daemon (a new reconciler with nothing published yet) finds the
// taint an earlier instance published on the server and keeps its time, so the slice is not
// rewritten: a restart neither resets when the device went bad nor costs a write per slice.
TEST_F(SliceReconcilerTest, ARestartedReconcilerKeepsAStandingTaintsTimeAndWritesNothing) {
  StartServer();
  discovery::NodeScan scan = *Scan("workstation");
  ASSERT_FALSE(scan.selection.devices.empty());
  const std::string gpu = scan.selection.devices.front().address;
  scan.inventory.functions.at(gpu).aer_fatal_errors = 3;
  auto first = std::make_unique<PublishedDevices>();
  adjust_options_ = [&](ReconcilerOptions& options) {
    options.published = first.get();
    options.unix_now = [] { return int64_t{1'700'000'000}; };
  };
  StartReconcilerOn(scan);
  ASSERT_TRUE(reconciler_->WaitInSync(kWait));
  const std::string device = PciDeviceName(scan.selection.devices.front().kind, gpu);
  const json before = ServerTaints(server_->Slices(), device);
  ASSERT_TRUE(before.is_array() && before.size() == 1) << before.dump();
  EXPECT_EQ(before[0]["timeAdded"], "2023-11-14T22:13:20Z");
  reconciler_.reset();
  const size_t writes = server_->SliceWrites();

  auto second = std::make_unique<PublishedDevices>();
  adjust_options_ = [&](ReconcilerOptions& options) {
    options.published = second.get();
    options.unix_now = [] { return int64_t{1'700'000'000 + 3600}; };
  };
  StartReconcilerOn(scan);
  ASSERT_TRUE(reconciler_->WaitInSync(kWait));
  EXPECT_EQ(server_->SliceWrites(), writes) << "a restart rewrote a slice";
  EXPECT_EQ(ServerTaints(server_->Slices(), device), before);
  const std::optional<SliceDevice> published = second->Find("node-1", device);
  ASSERT_TRUE(published.has_value());
  ASSERT_EQ(published->taints.size(), 1u);
  EXPECT_EQ(published->taints[0].time_added, "2023-11-14T22:13:20Z");
  reconciler_.reset();
}

// Issue 53 items 5 and 6 together: a claim holds a vGPU on a VF when the daemon restarts under a
// policy that no longer offers vGPUs. The new reconciler has published nothing yet; it keeps the
// held device from the server's slices as it was, consuming from its VF's counter set, and that
// set stays published beside it.
TEST_F(SliceReconcilerTest, ARestartedReconcilerKeepsAHeldDeviceAndItsCounterSetFromTheServer) {
  StartServer();
  // 40C (1415) pinned on the idle H100: one type per GPU, offered with the GPU's counter set.
  auto pinned = discovery::ParseAdminPolicy(
      "select:\n  - {kind: vgpu, pf: \"0000:41:00.0\", vgpuType: \"1415\"}\n", "policy");
  ASSERT_TRUE(pinned.ok()) << pinned.error().message;
  const std::shared_ptr<const discovery::NodeScan> offered = Scan("vgpu-vf", *pinned);
  auto first = std::make_unique<PublishedDevices>();
  adjust_options_ = [&](ReconcilerOptions& options) { options.published = first.get(); };
  StartReconcilerOn(*offered);
  ASSERT_TRUE(reconciler_->WaitInSync(kWait));
  const std::string vf = offered->inventory.Find("0000:41:00.0")->sriov_pf->vfs.at(0);
  const std::string device = VgpuDeviceName(vf, 1415);
  const std::optional<SliceDevice> before = first->Find("node-1", device);
  ASSERT_TRUE(before.has_value());
  ASSERT_EQ(before->consumes_counters.size(), 1u);
  const std::string set = before->consumes_counters[0].counter_set;
  reconciler_.reset();

  auto policy = discovery::ParseAdminPolicy("version: v1\nkinds:\n  vgpu: false\n", "policy");
  ASSERT_TRUE(policy.ok()) << policy.error().message;
  sysfs::SysfsReader sysfs(dir_ + "/vgpu-vf");
  const auto without_vgpus = discovery::ScanNode(sysfs, nullptr, *policy);
  auto second = std::make_unique<PublishedDevices>();
  adjust_options_ = [&](ReconcilerOptions& options) {
    options.published = second.get();
    options.held_devices = [&] { return std::set<std::string>{device}; };
  };
  StartReconcilerOn(*without_vgpus);
  ASSERT_TRUE(reconciler_->WaitInSync(kWait));
  EXPECT_EQ(second->Find("node-1", device), before) << "the held vGPU changed or went";
  bool set_published = false;
  for (const json& slice : server_->Slices()) {
    for (const json& counters : slice["spec"].value("sharedCounters", json::array())) {
      set_published |= counters.value("name", "") == set;
    }
  }
  EXPECT_TRUE(set_published) << set;
  reconciler_.reset();
}

TEST_F(SliceReconcilerTest, WhatAnEmptyParentShowsIsKeptForTheNextStart) {
  StartServer();
  const std::string path = dir_ + "/" + kMdevTypeMaximaFile;
  StartReconciler("mtty", path);  // the parent holds no instance: its maxima are exact
  ASSERT_TRUE(reconciler_->WaitInSync(kWait));
  const json kept = json::parse(ReadAll(path));
  EXPECT_EQ(kept["kind"], "MdevTypeMaxima");
  EXPECT_EQ(kept["version"], kMdevTypeMaximaVersion);
  EXPECT_EQ(kept["parents"]["mtty"]["types"]["mtty-1"]["max"], 24);
  EXPECT_EQ(kept["parents"]["mtty"]["types"]["mtty-1"]["seenEmpty"], true);
  EXPECT_EQ(kept["parents"]["mtty"]["types"]["mtty-2"]["max"], 12);
}

TEST_F(SliceReconcilerTest, AMalformedMaximaFileIsSetAsideAndTheNodeStillPublishes) {
  StartServer();
  const std::string path = dir_ + "/" + kMdevTypeMaximaFile;
  {
    std::ofstream out(path);
    out << "{\"kind\": \"MdevTypeMaxima\", \"version\": 1, \"parents\": [";  // cut off
  }
  StartReconciler("mtty", path);
  ASSERT_TRUE(reconciler_->WaitInSync(kWait));
  EXPECT_FALSE(server_->Slices().empty());
  EXPECT_THAT(ReadAll(path + ".bad"), HasSubstr("\"parents\": ["));  // kept for the admin
  EXPECT_EQ(json::parse(ReadAll(path))["parents"]["mtty"]["types"]["mtty-2"]["max"], 12);
}

TEST_F(SliceReconcilerTest, ADeletedSliceIsRecreatedWithinTwoSeconds) {
  StartServer();
  StartReconciler("workstation");
  ASSERT_TRUE(Converged(1));
  const std::string name = server_->Slices()[0]["metadata"]["name"];
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(server_->RemoveSlice(name));
  // Wait on the server, not on WaitInSync: the re-creating sync may finish before a
  // WaitInSync call begins, and that call would then wait for a sync that never comes.
  ASSERT_TRUE(server_->WaitForSlices([](const auto& slices) { return slices.size() == 1; }, kWait));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  EXPECT_EQ(server_->Slices()[0]["spec"]["devices"].size(), 2u);
}

// A slice deleted without the watch saying so (a missed event) stays in the reconciler's view:
// the update it then sends is answered 404. The reconciler re-reads the slice, forgets it when it
// is gone, and creates it again, instead of updating a slice that no longer exists for ever.
TEST_F(SliceReconcilerTest, ASliceDeletedBehindTheWatchIsCreatedAgain) {
  StartServer();
  StartReconciler("workstation");
  ASSERT_TRUE(Converged(1));
  const std::string name = server_->Slices()[0]["metadata"]["name"];
  ASSERT_TRUE(server_->RemoveSliceUnwatched(name));
  reconciler_->SetScan(*Scan("sriov"));  // the one slice changes: an update of the deleted one
  ASSERT_TRUE(server_->WaitForSlices([](const auto& slices) { return slices.size() == 1; }, kWait));
  ASSERT_TRUE(Converged(1));
  EXPECT_NE(server_->Slices()[0]["metadata"]["name"], name);
  EXPECT_EQ(server_->Slices()[0]["spec"]["devices"].size(), 8u);
}

TEST_F(SliceReconcilerTest, AKubeletRestartWipeIsRepaired) {
  StartServer();
  StartReconciler("sriov");
  ASSERT_TRUE(Converged(1));
  EXPECT_EQ(server_->DeleteSlicesWhere("spec.nodeName=node-1"), 1u);
  ASSERT_TRUE(Converged(1));
  EXPECT_EQ(server_->Slices()[0]["spec"]["devices"].size(), 8u);
}

TEST_F(SliceReconcilerTest, AConflictingUpdateIsRetried) {
  StartServer();
  StartReconciler("workstation");
  ASSERT_TRUE(Converged(1));
  server_->FailNext(2, 409, 0, "/apis/resource.k8s.io/v1/resourceslices/");
  reconciler_->SetScan(*Scan("sriov"));  // the one slice changes: an update, as upstream, in place
  ASSERT_TRUE(Converged(1));
  const json slice = server_->Slices()[0];
  EXPECT_EQ(slice["spec"]["devices"].size(), 8u);
  EXPECT_EQ(slice["spec"]["pool"]["generation"], 1);  // one changed slice keeps the generation
  EXPECT_GE(reconciler_->Stats().conflicts, 1u);
}

TEST_F(SliceReconcilerTest, NewSlicesBumpTheGenerationOfTheWholePool) {
  StartServer();
  StartReconciler("workstation");
  ASSERT_TRUE(Converged(1));
  reconciler_->SetScan(*Scan("vgpu"));
  ASSERT_TRUE(Converged(3));
  for (const json& slice : server_->Slices()) {
    EXPECT_EQ(slice["spec"]["pool"]["generation"], 2);
    EXPECT_EQ(slice["spec"]["pool"]["resourceSliceCount"], 3);
  }
}

TEST_F(SliceReconcilerTest, AServerWithoutV1GetsTheV1beta1Shape) {
  FakeApiServerOptions options;
  options.served_versions = {"v1beta1"};
  options.minor_version = "32";
  StartServer(options);
  StartReconciler("workstation");
  ASSERT_TRUE(Converged(1));
  EXPECT_EQ(reconciler_->Stats().profile.api_version, "v1beta1");
  EXPECT_GE(server_->CountRequests("POST", "/apis/resource.k8s.io/v1beta1/resourceslices"), 1u);
  EXPECT_EQ(server_->CountRequests("POST", "/apis/resource.k8s.io/v1/"), 0u);
  EXPECT_EQ(server_->Slices()[0]["spec"]["devices"].size(), 2u);
}

// A 1.38 server serves resource.k8s.io/v1 only (v1beta1 slices are removed, not just off). The
// profile comes from discovery, is said in one log line, and nothing asks for another version.
// The fake stands in for the server: it serves exactly v1 and says 1.38.
TEST_F(SliceReconcilerTest, AServerServingOnlyV1IsNeverAskedForV1beta1) {
  FakeApiServerOptions options;
  options.served_versions = {"v1"};
  options.minor_version = "38";
  StartServer(options);
  ::testing::internal::CaptureStderr();
  StartReconcilerOn(*Scan("vgpu"), "", Logger::ToStderr(0));
  const bool converged = Converged(3);
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(converged);
  EXPECT_EQ(reconciler_->Stats().profile.api_version, "v1");
  EXPECT_EQ(reconciler_->Stats().profile.kubernetes_minor, 38);
  size_t profile_lines = 0;
  for (size_t at = log.find("API server profile"); at != std::string::npos;
       at = log.find("API server profile", at + 1)) {
    ++profile_lines;
  }
  EXPECT_EQ(profile_lines, 1u) << log;
  EXPECT_NE(log.find("resource.k8s.io/v1"), std::string::npos) << log;
  for (const testing::RecordedRequest& request : server_->Requests()) {
    EXPECT_EQ(request.path.find("/v1beta"), std::string::npos)
        << request.method << " " << request.path;
  }
}

TEST_F(SliceReconcilerTest, Kubernetes134GetsCountersInTheDeviceSlice) {
  FakeApiServerOptions options;
  options.minor_version = "34";
  StartServer(options);
  StartReconciler("vgpu");
  ASSERT_TRUE(Converged(1));
  const json slice = server_->Slices()[0];
  EXPECT_EQ(slice["spec"]["sharedCounters"].size(), 1u);
  EXPECT_GE(slice["spec"]["devices"].size(), 2u);
}

TEST_F(SliceReconcilerTest, AServerThatDropsCountersGetsTheFallbackWithoutALoop) {
  FakeApiServerOptions options;
  options.partitionable_devices = false;
  StartServer(options);
  StartReconciler("vgpu");
  ASSERT_TRUE(Converged(1));
  const json slice = server_->Slices()[0];
  EXPECT_FALSE(slice["spec"].contains("sharedCounters"));
  EXPECT_EQ(slice["spec"]["devices"].size(), 2u);  // the T4 and its existing instance
  EXPECT_TRUE(reconciler_->Stats().profile.counters_dropped);
  const size_t writes = server_->SliceWrites();
  for (int i = 0; i < 3; ++i) {
    reconciler_->Resync();
    ASSERT_TRUE(reconciler_->WaitInSync(kWait));
  }
  EXPECT_EQ(server_->SliceWrites(), writes);
}

// The watch can lag the writes' answers: here every event is held until the reconciler has
// converged (the counters' slice created and deleted, the devices' slice created and updated),
// then let through one at a time. Each is the late echo of a write of ours, not someone else's
// change: none may put a stale slice back in the cache, to be rewritten (before, each did, with
// a stale resourceVersion: a conflict and a second write; the test above failed ~1% that way).
TEST_F(SliceReconcilerTest, LateEchoesOfOurOwnWritesAreNotRewritten) {
  struct Gate {
    std::mutex mu;
    std::condition_variable cv;
    size_t allowed = 0;
    size_t sent = 0;
  };
  auto gate = std::make_shared<Gate>();
  auto allow = [gate](size_t n) {
    std::lock_guard<std::mutex> lock(gate->mu);
    gate->allowed = n;
    gate->cv.notify_all();
  };
  // Open at the end however the test ends, or the server's watch thread would wait for ever.
  std::shared_ptr<void> open_at_exit(nullptr, [&](void*) { allow(SIZE_MAX); });
  FakeApiServerOptions options;
  options.partitionable_devices = false;
  options.hold_watch_event = [gate] {
    std::unique_lock<std::mutex> lock(gate->mu);
    gate->cv.wait(lock, [&] { return gate->sent < gate->allowed; });
    ++gate->sent;
  };
  StartServer(options);
  StartReconciler("vgpu");
  ASSERT_TRUE(Converged(1));
  ASSERT_TRUE(reconciler_->Stats().profile.counters_dropped);
  const size_t writes = server_->SliceWrites();
  const size_t events = server_->SliceEvents();
  ASSERT_GE(events, 4u);
  for (size_t i = 1; i <= events; ++i) {
    allow(i);
    ASSERT_TRUE(reconciler_->WaitForWatchEvents(i, kWait)) << "event " << i;
    ASSERT_TRUE(reconciler_->WaitInSync(kWait));
    EXPECT_EQ(server_->SliceWrites(), writes) << "after the echo of event " << i;
  }
  EXPECT_EQ(reconciler_->Stats().conflicts, 0u);
}

// A server that drops a field other than the counters (here an attribute, as a feature gate that
// is off would) stores something else than was sent: the stored form is adopted, not rewritten
// at every sync.
TEST_F(SliceReconcilerTest, AFieldTheServerDropsIsAdoptedWithoutALoop) {
  auto dropped = std::make_shared<std::atomic<int>>(0);
  FakeApiServerOptions options;
  options.alter_stored_slice = [dropped](json& slice) {
    if (!slice["spec"].contains("devices")) return;
    for (json& device : slice["spec"]["devices"]) {
      if (device.contains("attributes") &&
          device["attributes"].erase(attribute::kProductName) > 0) {
        ++*dropped;
      }
    }
  };
  StartServer(std::move(options));
  StartReconciler("workstation");
  ASSERT_TRUE(Converged(1));
  ASSERT_GT(dropped->load(), 0);  // the server did store something else than was sent
  // A named copy: the range of a range-for over a part of a temporary outlives the temporary.
  const std::vector<json> slices = server_->Slices();
  ASSERT_EQ(slices.size(), 1u);
  for (const json& device : slices[0]["spec"]["devices"]) {
    EXPECT_FALSE(device["attributes"].contains(attribute::kProductName)) << device;
  }
  EXPECT_EQ(reconciler_->Stats().creates, 1u);
  EXPECT_EQ(reconciler_->Stats().updates, 0u);
  const size_t writes = server_->SliceWrites();
  for (int i = 0; i < 3; ++i) {
    reconciler_->Resync();
    ASSERT_TRUE(reconciler_->WaitInSync(kWait));
  }
  reconciler_->SetScan(*Scan("workstation"));
  ASSERT_TRUE(reconciler_->WaitInSync(kWait));
  EXPECT_EQ(reconciler_->Stats().updates, 0u);
  EXPECT_EQ(server_->SliceWrites(), writes);
  EXPECT_EQ(reconciler_->Stats().adopted_forms, 1u);
  // The node changes: the old content's adoption can never match again and is forgotten, so
  // adoptions do not pile up over the daemon's life (one per slice whose stored form differs).
  const int dropped_before = dropped->load();
  reconciler_->SetScan(*Scan("vgpu"));
  ASSERT_TRUE(reconciler_->WaitInSync(kWait));
  ASSERT_GT(dropped->load(), dropped_before) << "the new content lost a field on the server too";
  size_t with_devices = 0;  // the slices the server altered; counter-set slices have no devices
  for (const json& slice : server_->Slices()) {
    with_devices += slice["spec"].contains("devices") && !slice["spec"]["devices"].empty() ? 1 : 0;
  }
  EXPECT_EQ(reconciler_->Stats().adopted_forms, with_devices);
}

// A slice of node-1's pool with an attribute of a value type this plugin does not know (as a newer
// release might store); its pool fields are those the plugin writes for a pool of one slice.
json UnreadableSlice(const std::string& name) {
  json device = {{"name", "gpu-0000-3b-00-0"},
                 {"attributes", {{"future", {{"list", json::array({1})}}}}}};
  return {{"metadata", {{"name", name}}},
          {"spec",
           {{"driver", "vfio.dra.io"},
            {"nodeName", "node-1"},
            {"pool", {{"name", "node-1"}, {"generation", 1}, {"resourceSliceCount", 1}}},
            {"devices", json::array({device})}}}};
}

bool Readable(const json& slice) { return SliceContentFromJson(slice).ok(); }

// The one line of `log` that holds `message`, or "".
std::string LogLine(const std::string& log, const std::string& message) {
  const size_t at = log.find(message);
  if (at == std::string::npos) return "";
  const size_t newline = log.rfind('\n', at);
  const size_t begin = newline == std::string::npos ? 0 : newline + 1;
  const size_t end = log.find('\n', at);
  return log.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
}

// The listed slice cannot be read. Taken as empty, it would equal the empty pool the node wants
// and stay on the server as it is; it must be rewritten, and the warning must say which and why.
TEST_F(SliceReconcilerTest, AnUnreadableSliceOfAnEmptyPoolIsRewritten) {
  StartServer();
  ASSERT_FALSE(Readable(server_->PutSlice(UnreadableSlice("node-1-vfio.dra.io-old"))));
  ::testing::internal::CaptureStderr();
  StartReconcilerOn(discovery::NodeScan{}, "", Logger::ToStderr(0));
  const bool rewritten = server_->WaitForSlices(
      [](const auto& slices) { return slices.size() == 1 && Readable(slices[0]); }, kWait);
  const bool in_sync = reconciler_->WaitInSync(kWait);
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(rewritten);
  ASSERT_TRUE(in_sync);
  const json slice = server_->Slices()[0];
  EXPECT_EQ(slice["metadata"]["name"], "node-1-vfio.dra.io-old");  // updated in place
  EXPECT_TRUE(slice["spec"]["devices"].empty());
  const ReconcilerStats stats = reconciler_->Stats();
  EXPECT_EQ(stats.updates, 1u);
  EXPECT_EQ(stats.creates, 0u);
  EXPECT_EQ(stats.deletes, 0u);
  const std::string warning = LogLine(log, "unreadable ResourceSlice");
  EXPECT_THAT(warning, HasSubstr("slice=node-1-vfio.dra.io-old")) << log;
  EXPECT_THAT(warning, HasSubstr("attribute future has no value")) << log;
  const size_t writes = server_->SliceWrites();
  reconciler_->Resync();
  ASSERT_TRUE(reconciler_->WaitInSync(kWait));
  EXPECT_EQ(server_->SliceWrites(), writes);
}

// Someone else rewrites the published slice into a form the plugin cannot read: the watch event
// must not be dropped (the cache would keep the old, readable slice), and the slice is rewritten.
TEST_F(SliceReconcilerTest, AnUnreadableSliceWrittenBySomeoneElseIsRewritten) {
  StartServer();
  StartReconciler("workstation");
  ASSERT_TRUE(Converged(1));
  json slice = server_->Slices()[0];
  const std::string name = slice["metadata"]["name"];
  slice["spec"]["devices"][0]["attributes"]["future"] = {{"list", json::array({1})}};
  ASSERT_FALSE(Readable(server_->PutSlice(slice)));
  ASSERT_TRUE(server_->WaitForSlices(
      [](const auto& slices) { return slices.size() == 1 && Readable(slices[0]); }, kWait));
  ASSERT_TRUE(reconciler_->WaitInSync(kWait));
  const json repaired = server_->Slices()[0];
  EXPECT_EQ(repaired["metadata"]["name"], name);
  EXPECT_EQ(repaired["spec"]["devices"].size(), 2u);
  EXPECT_EQ(reconciler_->Stats().updates, 1u);
  EXPECT_EQ(reconciler_->Stats().creates, 1u);
}

// Someone else adds a slice the plugin cannot read to the node's empty pool: it offers no device
// names to match, so it is obsolete and deleted, and the pool's own slice gets a new generation.
TEST_F(SliceReconcilerTest, AnUnreadableSliceAddedToAnEmptyPoolIsDeleted) {
  StartServer();
  StartReconcilerOn(discovery::NodeScan{});
  ASSERT_TRUE(Converged(1));
  const std::string name = server_->Slices()[0]["metadata"]["name"];
  server_->PutSlice(UnreadableSlice("node-1-vfio.dra.io-foreign"));
  ASSERT_TRUE(server_->WaitForSlices(
      [&](const auto& slices) {
        return slices.size() == 1 && slices[0]["metadata"]["name"] == name;
      },
      kWait));
  ASSERT_TRUE(reconciler_->WaitInSync(kWait));
  const json kept = server_->Slices()[0];
  EXPECT_TRUE(kept["spec"]["devices"].empty());
  EXPECT_EQ(kept["spec"]["pool"]["generation"], 2);
  EXPECT_EQ(reconciler_->Stats().deletes, 1u);
}

TEST_F(SliceReconcilerTest, AfterTheServerRestartsItListsOnlyOnceTheServerIsReady) {
  // A restarted API server answers before it is ready, and until then its authorizer refuses
  // every request (a fleet of plugins would LIST into it, be refused, and LIST again; the fleet
  // benchmark saw 45 of 145 LISTs refused): the resumed watch is refused, and /readyz answers 503
  // meanwhile. The reconciler waits for a 200 there, then lists once.
  StartServer();
  const int port = server_->port();
  StartReconciler("workstation");
  ASSERT_TRUE(Converged(1));
  server_->Stop();
  server_->ClearRequests();
  server_->FailNext(1, 403, 0, "/apis/resource.k8s.io/v1/resourceslices");
  server_->FailNext(3, 503, 0, "/readyz");
  ASSERT_TRUE(server_->Start(port));
  const auto is_list = [](const vfio_dra::testing::RecordedRequest& r) {
    return r.method == "GET" && r.path.ends_with("/resourceslices") &&
           r.query.find("watch=1") == std::string::npos;
  };
  ASSERT_TRUE(server_->WaitForRequests(
      [&](const std::vector<vfio_dra::testing::RecordedRequest>& requests) {
        return std::any_of(requests.begin(), requests.end(), is_list);
      },
      kWait));
  ASSERT_TRUE(reconciler_->WaitInSync(kWait));
  int refused = 0;
  int lists = 0;
  bool ready = false;
  for (const auto& r : server_->Requests()) {
    if (r.path == "/readyz") {
      if (r.injected) {
        ++refused;
      } else {
        ready = true;
      }
    }
    if (is_list(r)) {
      EXPECT_TRUE(ready) << "a LIST before /readyz answered 200";
      ++lists;
    }
  }
  EXPECT_EQ(refused, 3);
  EXPECT_EQ(lists, 1);
}

TEST_F(SliceReconcilerTest, AnApiServerDownForThirtySecondsConvergesAfterwards) {
  StartServer();
  const int port = server_->port();
  server_->Stop();
  StartReconciler("workstation");
  // Let the reconciler fail against the dead server for 30 s: each failed sync is counted.
  const auto down_until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < down_until) {
    reconciler_->WaitInSync(std::chrono::milliseconds(500));
  }
  EXPECT_FALSE(reconciler_->Stats().in_sync);
  ASSERT_TRUE(server_->Start(port));
  server_->PutNode("node-1", "node-uid-1");
  ASSERT_TRUE(Converged(1));
  EXPECT_EQ(server_->Slices()[0]["spec"]["devices"].size(), 2u);
}

}  // namespace
}  // namespace vfio_dra::slicepublisher
