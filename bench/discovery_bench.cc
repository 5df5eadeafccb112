// Discovery benchmark: full scan (inventory + selection) of fake nodes with 100, 1,000 and
// 5,000 PCI functions (target: 1,000 functions in at most 20 ms), and the idle daemon's periodic
// change probe of the same nodes.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>

#include "discovery/change_probe.h"
#include "discovery/node_scan.h"
#include "sysfs_fixture.h"

namespace {

// A fixture tree, built once per size: building one costs far more than scanning it. It lives in
// /tmp (VFIO_DRA_BENCH_SHM=1 puts it on /dev/shm instead).
class LargeNode {
 public:
  explicit LargeNode(int functions) {
    std::string tmpl =
        std::getenv("VFIO_DRA_BENCH_SHM") != nullptr && std::filesystem::is_directory("/dev/shm")
            ? "/dev/shm/vfio-dra-bench-XXXXXX"
            : "/tmp/vfio-dra-bench-XXXXXX";
    dir_ = mkdtemp(tmpl.data());
    vfio_dra::testing::BuildLargeNode(dir_ + "/sys", functions);
    vfio_dra::testing::WritePciIds(dir_ + "/pci.ids");
  }
  ~LargeNode() { std::filesystem::remove_all(dir_); }
  std::string sysfs() const { return dir_ + "/sys"; }
  std::string pci_ids() const { return dir_ + "/pci.ids"; }

 private:
  std::string dir_;
};

const LargeNode& NodeOfSize(int functions) {
  static std::map<int, std::unique_ptr<LargeNode>> nodes;
  auto& node = nodes[functions];
  if (!node) node = std::make_unique<LargeNode>(functions);
  return *node;
}

void BM_DiscoverNode(benchmark::State& state) {
  const LargeNode& node = NodeOfSize(static_cast<int>(state.range(0)));
  vfio_dra::sysfs::SysfsReader sysfs(node.sysfs());
  auto names = vfio_dra::discovery::PciNames::Open({node.sysfs(), node.pci_ids(), false});
  vfio_dra::discovery::AdminPolicy policy;
  size_t published = 0;
  for (auto _ : state) {
    auto scan = vfio_dra::discovery::ScanNode(sysfs, names.ok() ? names->get() : nullptr, policy);
    published = scan->selection.devices.size();
    benchmark::DoNotOptimize(scan);
  }
  state.counters["functions"] = static_cast<double>(state.range(0));
  state.counters["published"] = static_cast<double>(published);
}
BENCHMARK(BM_DiscoverNode)->Arg(100)->Arg(1000)->Arg(5000)->Unit(benchmark::kMillisecond);

// The periodic check of an idle node: the function list is unchanged, so no group link is read.
void BM_ProbeIdleNode(benchmark::State& state) {
  const LargeNode& node = NodeOfSize(static_cast<int>(state.range(0)));
  vfio_dra::sysfs::SysfsReader sysfs(node.sysfs());
  vfio_dra::discovery::ChangeProbe probe(sysfs);
  probe.Probe();
  for (auto _ : state) benchmark::DoNotOptimize(probe.Probe());
  state.counters["functions"] = static_cast<double>(state.range(0));
}
BENCHMARK(BM_ProbeIdleNode)->Arg(1000)->Arg(3000)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
