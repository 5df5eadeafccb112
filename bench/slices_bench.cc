// Slice benchmarks: building and validating the slices of nodes with 10 to 5,000 devices, and
// publishing a 1,000-device node from nothing to the fake API server on loopback (end to end:
// discovery of the server, node lookup, list, creates). Targets: build+validate of 1,000
// devices at most 10 ms; publish at most 300 ms.
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <filesystem>

#include "fake_apiserver.h"
#include "kube/client_config.h"
#include "kube/httplib_transport.h"
#include "slicepublisher/slice_builder.h"
#include "slicepublisher/slice_reconciler.h"
#include "slicepublisher/slice_validator.h"

namespace {

using namespace vfio_dra;

std::shared_ptr<const discovery::NodeScan> SyntheticNode(int devices) {
  auto scan = std::make_shared<discovery::NodeScan>();
  for (int i = 0; i < devices; ++i) {
    discovery::PciFunction fn;
    fn.address = fmt::format("0000:{:02x}:{:02x}.0", 1 + i / 32, i % 32);
    fn.vendor_id = 0x10de;
    fn.device_id = 0x2230;
    fn.class_code = 0x030000;
    fn.device_name = "GA102GL [RTX A6000]";
    fn.driver = "nvidia";
    fn.iommu_group = i;
    fn.numa_node = i % 2;
    fn.pcie_root = "pci0000:00";
    scan->inventory.functions[fn.address] = fn;
    scan->selection.devices.push_back({discovery::DeviceKind::kGpu, fn.address, {}, false});
  }
  return scan;
}

void BM_BuildAndValidate(benchmark::State& state) {
  auto scan = SyntheticNode(static_cast<int>(state.range(0)));
  slicepublisher::MdevTypeMaxima capacity;
  for (auto _ : state) {
    auto pool = slicepublisher::BuildDesiredPool(
        *scan, {"node-1", slicepublisher::CounterLayout::kOwnSlice}, capacity);
    Status status = slicepublisher::ValidatePool(
        pool, {35, "vfio.dra.io", "node-1", slicepublisher::CounterLayout::kOwnSlice});
    if (!status.ok()) state.SkipWithError(status.error().message.c_str());
    benchmark::DoNotOptimize(pool);
  }
  state.counters["devices"] = static_cast<double>(state.range(0));
}
BENCHMARK(BM_BuildAndValidate)
    ->Arg(10)
    ->Arg(100)
    ->Arg(1000)
    ->Arg(5000)
    ->Unit(benchmark::kMillisecond);

void BM_PublishFromNothing(benchmark::State& state) {
  auto scan = SyntheticNode(static_cast<int>(state.range(0)));
  for (auto _ : state) {
    state.PauseTiming();
    testing::FakeApiServer server;
    server.Start();
    server.PutNode("node-1", "uid-1");
    char tmpl[] = "/tmp/vfio-dra-bench-XXXXXX";
    const std::string dir = mkdtemp(tmpl);
    auto config = kube::LoadKubeconfigFile(server.WriteKubeconfig(dir));
    auto transport = kube::HttplibTransport::Create(*config, "bench");
    kube::TokenSource tokens("", "", RealClock());
    kube::ApiClientOptions api_options;
    api_options.qps = 0;  // measure the work, not the client-side rate limit
    kube::ApiClient api(**transport, tokens, RealClock(), Logger::Discard(), api_options);
    slicepublisher::ReconcilerOptions options;
    options.driver = "vfio.dra.io";
    options.node_name = "node-1";
    slicepublisher::SliceReconciler reconciler(api, options, Logger::Discard());
    const size_t expected = (static_cast<size_t>(state.range(0)) + 127) / 128;
    state.ResumeTiming();
    reconciler.SetScan(*scan);
    reconciler.Start();
    server.WaitForSlices([&](const auto& slices) { return slices.size() == expected; },
                         std::chrono::seconds(30));
    state.PauseTiming();
    reconciler.Stop();
    server.Stop();
    std::filesystem::remove_all(dir);
    state.ResumeTiming();
  }
  state.counters["devices"] = static_cast<double>(state.range(0));
}
BENCHMARK(BM_PublishFromNothing)
    ->Arg(100)
    ->Arg(1000)
    ->Arg(5000)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(5);

}  // namespace

BENCHMARK_MAIN();
