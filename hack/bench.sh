#!/usr/bin/env bash
# Builds and runs the benchmarks, prints a Markdown table of the figures against their targets,
# and writes it with the machine's description to docs/benchmarks.md.
set -euo pipefail
cd "$(dirname "$0")/.."
./hack/install-deps.sh
./hack/build.sh >/dev/null
BUILD_DIR=${BUILD_DIR:-build}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
"$BUILD_DIR/bench/discovery_bench" --benchmark_repetitions=5 --benchmark_report_aggregates_only=true \
  --benchmark_out="$OUT/discovery.json" --benchmark_out_format=json >/dev/null
"$BUILD_DIR/bench/slices_bench" --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
  --benchmark_out="$OUT/slices.json" --benchmark_out_format=json >/dev/null
# The node's files live where the plugin data dir would (an ext4 disk here), not on tmpfs.
"$BUILD_DIR/bench/prepare_bench" --rounds 20 --dir "${PREPARE_BENCH_DIR:-/tmp}" >"$OUT/prepare.json"
python3 - "$OUT" <<'PY' | tee docs/benchmarks.md
import json, os, platform, subprocess, sys
out = sys.argv[1]
def medians(name):
    data = json.load(open(os.path.join(out, name)))
    return {b["run_name"]: b for b in data["benchmarks"] if b.get("aggregate_name") == "median"}
rows = []
def row(what, bench, target_ms=None, note=""):
    ms = bench["real_time"] if bench["time_unit"] == "ms" else bench["real_time"] / 1000.0
    verdict = "" if target_ms is None else ("met" if ms <= target_ms else "MISSED")
    target = "" if target_ms is None else f"<= {target_ms} ms"
    rows.append(f"| {what} | {ms:.2f} ms | {target} | {verdict} | {note} |")
d = medians("discovery.json")
for n in (100, 1000, 5000):
    row(f"Discovery of a node with {n} PCI functions", d[f"BM_DiscoverNode/{n}"],
        20 if n == 1000 else None)
s = medians("slices.json")
for n in (10, 100, 1000, 5000):
    row(f"Build and validate slices, {n} devices", s[f"BM_BuildAndValidate/{n}"],
        10 if n == 1000 else None)
for n in (100, 1000, 5000):
    row(f"Publish from nothing to the fake API server, {n} devices",
        s[f"BM_PublishFromNothing/{n}/iterations:5"], 300 if n == 1000 else None,
        "client rate limit off")
p = json.load(open(os.path.join(out, "prepare.json")))
def prow(what, key, target_ms=None, note=""):
    b = p[key]
    verdict = "" if target_ms is None else ("met" if b["p99_ms"] <= target_ms else "MISSED")
    target = "" if target_ms is None else f"p99 <= {target_ms} ms"
    rows.append(f"| {what} | p50 {b['p50_ms']:.2f} ms, p99 {b['p99_ms']:.2f} ms "
                f"({b['samples']} calls) | {target} | {verdict} | {note} |")
prow("NodePrepareResources, one-device claim, 1 pod at a time", "prepare_1_pod", None,
     "gRPC socket, fake API server, simulated kernel")
prow("NodePrepareResources, one-device claims, 32 pods at once", "prepare_32_pods", 5,
     "device work is serialized per node")
prow("Floor: one claim GET + 5 atomic fsynced writes, 1 at a time", "floor_1_pod", None,
     "done directly by the benchmark")
prow("Floor: the same, 32 at once", "floor_32_pods", None, "done directly by the benchmark")
cpu = "unknown"
try:
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip(); break
except OSError:
    pass
mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
print("# Benchmarks\n")
print(f"Machine: {os.cpu_count()} cores ({cpu}), {mem:.0f} GiB, {platform.platform()}.")
print("Produced by `./hack/bench.sh`; times are medians of repeated runs (wall clock).\n")
print("| What | Median | Target | | Note |")
print("|---|---|---|---|---|")
print("\n".join(rows))
PY
