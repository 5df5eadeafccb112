#!/usr/bin/env bash
# Compares two builds in one run, alternating between them so that the machine's and the disk's
# drift falls on both alike: the idle daemon with about 1,000 published devices (RSS, CPU) and the
# prepare p99 at 32 pods at once against its floor. Prints a Markdown table.
#   hack/bench-compare.sh BEFORE_BUILD_DIR [AFTER_BUILD_DIR]   (after: build/)
# Build the "before" tree first, e.g. git worktree add ../before <rev> && ../before/hack/build.sh.
# RUNS (default 3) prepare runs per build, each after a sync and PREPARE_BENCH_REST_SECONDS (30).
set -euo pipefail
cd "$(dirname "$0")/.."
before=$1
after=${2:-build}
runs=${RUNS:-3}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
rest() { sync; sleep "${PREPARE_BENCH_REST_SECONDS:-30}"; }
for side in before after; do
  dir=${!side}
  "$dir/bench/daemon_bench" --starts 3 --idle-seconds "${IDLE_SECONDS:-60}" --functions 3000 \
    >"$out/$side-daemon.json"
done
for run in $(seq "$runs"); do
  for side in before after; do
    dir=${!side}
    rest
    "$dir/bench/prepare_bench" --rounds 20 --dir "${PREPARE_BENCH_DIR:-/tmp}" \
      >"$out/$side-prepare$run.json"
  done
done
python3 - "$out" "$runs" "$before" "$after" <<'EOF'
import json, statistics, sys
out, runs, before, after = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def load(name):
    with open(f"{out}/{name}") as f:
        return json.load(f)
def ratio(q):
    return q["prepare_32_pods"]["p99_ms"] / q["floor_32_pods"]["p99_ms"]
print(f"| | before ({before}) | after ({after}) |")
print("|---|---|---|")
d = {side: load(f"{side}-daemon.json")["idle"] for side in ("before", "after")}
print("| Idle RSS, published devices | " + " | ".join(
    f"{d[s]['rss_mib']:.1f} MiB (anon {d[s]['rss_anon_mib']:.1f}, file {d[s]['rss_file_mib']:.1f};"
    f" peak {d[s]['peak_rss_mib']:.1f}), {d[s]['published_devices']} devices"
    for s in ("before", "after")) + " |")
print("| Idle CPU | " + " | ".join(
    f"{d[s]['cpu_percent_of_a_core']:.3f}% of a core over {d[s]['window_s']:.0f} s"
    for s in ("before", "after")) + " |")
for s in ("before", "after"):
    threads = load(f"{s}-daemon.json").get("idle_cpu_us_by_thread", {})
    busy = ", ".join(f"{k} {v / 1000:.1f} ms" for k, v in sorted(threads.items(), key=lambda kv: -kv[1]) if v)
    d[s]["threads"] = busy or "none"
print("| Idle CPU by thread | " + " | ".join(d[s]["threads"] for s in ("before", "after")) + " |")
r = {s: [ratio(load(f"{s}-prepare{i}.json")) for i in range(1, runs + 1)] for s in ("before", "after")}
print(f"| Prepare p99 at 32 pods against the floor: median of {runs} | " + " | ".join(
    f"{statistics.median(r[s]):.2f}x (runs " + ", ".join(f"{x:.2f}x" for x in r[s]) + ")"
    for s in ("before", "after")) + " |")
cpu = {s: [load(f"{s}-prepare{i}.json")["daemon_cpu_ms_per_prepare_32_pods"] for i in range(1, runs + 1)]
       for s in ("before", "after")}
print(f"| Daemon CPU per prepare at 32, median | " + " | ".join(
    f"{statistics.median(cpu[s]):.2f} ms" for s in ("before", "after")) + " |")
EOF
