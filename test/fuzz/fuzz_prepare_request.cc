// The gRPC prepare/unprepare handlers fed arbitrary claims: the request's namespace, name and UID,
// and the claim the API returns for it (UID, allocation results with any request, driver, pool
// and device strings, opaque configs), all from the fuzzer. Behind them is the real
// VfioDevicePreparer on a realistic node with the simulated kernel, so hostile values travel as
// far as they can. Every prepare is followed by an unprepare of the same claims, which must leave
// the node as it was.
#include <fuzzer/FuzzedDataProvider.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "discovery/admin_policy.h"
#include "discovery/node_scan.h"
#include "plugin/dra_grpc_service.h"
#include "plugin/node_service.h"
#include "prepare/vfio_device_preparer.h"
#include "simulated_kernel.h"
#include "slicepublisher/slice_builder.h"
#include "sysfs_fixture.h"

namespace {

using namespace vfio_dra;

const std::vector<std::string> kDevices = {"gpu-0000-01-00-0", "vf-0000-5e-02-1",
                                           "mdev-0000-3b-00-0-nvidia-222-0",
                                           "hostdev-0000-06-00-0"};

// Claims by namespace/name, filled from the input before each call.
class FuzzedClaims final : public plugin::ClaimSource {
 public:
  Result<kube::ResourceClaim> Get(const std::string& ns, const std::string& name,
                                  Deadline /*deadline*/) override {
    auto it = claims_.find(ns + "/" + name);
    if (it == claims_.end()) return MakeError(ErrorKind::kNotFound, ns + "/" + name + " not found");
    return it->second;
  }
  std::map<std::string, kube::ResourceClaim> claims_;
};

struct Harness {
  std::string dir;
  std::unique_ptr<sysfs::SysfsReader> sysfs;
  std::unique_ptr<testing::SimulatedKernel> kernel;
  slicepublisher::PublishedDevices published;
  std::unique_ptr<prepare::VfioDevicePreparer> preparer;
  FuzzedClaims claims;
  std::unique_ptr<plugin::DraNodeService> node;
  std::unique_ptr<plugin::DraGrpcService<plugin::DraV1Api>> v1;
};

Harness& TheHarness() {
  static Harness* h = [] {
    auto* harness = new Harness;
    char tmpl[] = "/tmp/vfio-dra-fuzz-prepare-XXXXXX";
    harness->dir = mkdtemp(tmpl);
    const std::string root = harness->dir + "/sys";
    testing::BuildFixture("vm-host", root);
    for (const char* sub : {"/dev", "/cdi", "/data"}) {
      std::filesystem::create_directories(harness->dir + sub);
    }
    std::ofstream(harness->dir + "/boot_id") << "fuzz\n";
    harness->sysfs = std::make_unique<sysfs::SysfsReader>(root);
    harness->kernel = std::make_unique<testing::SimulatedKernel>(root, harness->dir + "/dev");
    discovery::AdminPolicy policy;
    auto parsed = discovery::ParseAdminPolicy(
        "version: v1\nselect:\n  - kind: hostdev\n    address: \"0000:06:00.0\"\n", "fuzz");
    if (parsed.ok()) policy = *parsed;
    auto scan = discovery::ScanNode(*harness->sysfs, nullptr, policy);
    slicepublisher::MdevTypeMaxima capacity;
    capacity.Observe(scan->inventory);
    harness->published.Set(slicepublisher::BuildDesiredPool(
        *scan, {"node1", slicepublisher::CounterLayout::kOwnSlice}, capacity));
    prepare::PreparerOptions options;
    options.driver_name = "vfio.dra.io";
    options.node_name = "node1";
    options.plugin_data_dir = harness->dir + "/data";
    options.cdi_dir = harness->dir + "/cdi";
    options.dev_root = harness->dir + "/dev";
    options.boot_id_file = harness->dir + "/boot_id";
    auto preparer = prepare::VfioDevicePreparer::Open(options, *harness->sysfs, *harness->kernel,
                                                      harness->published, Logger::Discard());
    if (!preparer.ok()) std::abort();
    harness->preparer = std::move(*preparer);
    harness->node = std::make_unique<plugin::DraNodeService>(
        "vfio.dra.io", harness->claims, *harness->preparer, nullptr, Logger::Discard());
    harness->v1 = std::make_unique<plugin::DraGrpcService<plugin::DraV1Api>>(*harness->node,
                                                                             Logger::Discard());
    return harness;
  }();
  return *h;
}

std::string Pick(FuzzedDataProvider& in, const std::vector<std::string>& usual) {
  if (in.ConsumeBool()) return usual[in.ConsumeIntegralInRange<size_t>(0, usual.size() - 1)];
  return in.ConsumeRandomLengthString(300);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Harness& h = TheHarness();
  FuzzedDataProvider in(data, size);
  h.claims.claims_.clear();
  k8s::io::kubelet::pkg::apis::dra::v1::NodePrepareResourcesRequest prepare;
  k8s::io::kubelet::pkg::apis::dra::v1::NodeUnprepareResourcesRequest unprepare;
  const int count = in.ConsumeIntegralInRange(0, 4);
  for (int i = 0; i < count; ++i) {
    const std::string ns = Pick(in, {"vms", "default"});
    const std::string name = Pick(in, {"vm-a", "vm-b"});
    const std::string uid =
        Pick(in, {"11111111-0000-4000-8000-00000000000" + std::to_string(i), ""});
    auto* claim = prepare.add_claims();
    claim->set_namespace_(ns);
    claim->set_name(name);
    claim->set_uid(uid);
    *unprepare.add_claims() = *claim;

    kube::ResourceClaim api;
    api.namespace_ = ns;
    api.name = name;
    api.uid = in.ConsumeBool() ? uid : in.ConsumeRandomLengthString(40);
    api.generation = 1;
    if (in.ConsumeBool()) {
      api.allocation.emplace();
      const int results = in.ConsumeIntegralInRange(0, 3);
      for (int r = 0; r < results; ++r) {
        kube::DeviceRequestAllocationResult result;
        result.request = Pick(in, {"gpu", "nic", "gpu/big", "disk"});
        result.driver = Pick(in, {"vfio.dra.io", "gpu.example.com"});
        result.pool = Pick(in, {"node1", "node2"});
        result.device = Pick(in, kDevices);
        result.admin_access = in.ConsumeIntegralInRange(0, 15) == 0;
        api.allocation->results.push_back(result);
      }
      if (in.ConsumeBool()) {
        kube::DeviceAllocationConfiguration config;
        config.source = "FromClaim";
        const auto params = nlohmann::json::parse(in.ConsumeRandomLengthString(200), nullptr,
                                                  /*allow_exceptions=*/false);
        config.opaque = kube::OpaqueDeviceConfiguration{
            "vfio.dra.io", params.is_discarded() ? nlohmann::json::object() : params};
        api.allocation->config.push_back(config);
      }
    }
    if (in.ConsumeIntegralInRange(0, 7) != 0) h.claims.claims_[ns + "/" + name] = api;
  }
  k8s::io::kubelet::pkg::apis::dra::v1::NodePrepareResourcesResponse prepared;
  const plugin::DetachedCallContext context;
  (void)h.v1->NodePrepareResources(context, &prepare, &prepared);
  k8s::io::kubelet::pkg::apis::dra::v1::NodeUnprepareResourcesResponse unprepared;
  (void)h.v1->NodeUnprepareResources(context, &unprepare, &unprepared);
  // Whatever was prepared has been undone: nothing may stay bound or recorded.
  for (const auto& [uid, record] : h.preparer->checkpoint().Load().claims) {
    bool asked = false;
    for (const auto& c : unprepare.claims()) asked = asked || c.uid() == uid;
    if (asked) std::abort();  // an unprepare of a prepared claim left its entry behind
  }
  return 0;
}
