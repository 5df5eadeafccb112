#!/usr/bin/env bash
# vfio-dra beside the Go reference DRA driver (issue 58): builds sigs.k8s.io/dra-example-driver's
# kubelet plugin from its Go module (test/peer/dra-example-driver-0.4, go.sum committed) through the
# Go module proxy, as hack/kube-binaries.sh builds the Kubernetes components, and runs it and
# vfio-dra (the real daemon on the simulated kernel) under the same fake API server and kubelet
# simulator (bench/peer_bench.cc), in alternating runs, at each device count. Prints one Markdown
# table: each figure's median over the runs for both, and the ratio vfio-dra / reference.
#   hack/bench-peer.sh [--runs N] [--idle-seconds S] [--rounds R] [--devices "8 1000"]
#                      [--json-out FILE]
# Test infrastructure only: nothing here ships. The reference publishes its GPUs in one slice;
# a 1.35+ server takes at most 128 devices a slice, so its build splits that slice at 128; and
# the fake API server reads JSON only, so its client sends JSON instead of protobuf (two changes
# to a copy of the module, made here at build time; nothing of it is committed).
# VFIO_DRA_BEFORE names another build of vfio-dra-sim-daemon (an earlier commit's): it then runs
# too, in the same alternation, as a third column.
# The binary is cached under ~/.cache/vfio-dra/dra-example-driver/VERSION/ (VFIO_DRA_KUBE_CACHE
# overrides the root); PEER_BENCH names a built bench/peer_bench (else hack/build.sh builds it).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
runs=3
idle_seconds=60
rounds=10
devices="8 1000"
json_out=
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs=$2 ;;
    --idle-seconds) idle_seconds=$2 ;;
    --rounds) rounds=$2 ;;
    --devices) devices=$2 ;;
    --json-out) json_out=$2 ;;
    *) echo "bench-peer.sh: unknown argument '$1' (see the header of $0)" >&2; exit 2 ;;
  esac
  shift 2
done

wrapper=$root/test/peer/dra-example-driver-0.4
script=bench-peer.sh
. "$root/hack/go-wrapper-env.sh"
version=$(pinned "$wrapper/go.mod" sigs.k8s.io/dra-example-driver)
if [ -z "$version" ]; then
  echo "bench-peer.sh: cannot read the pinned version from $wrapper/go.mod" >&2
  exit 1
fi
out=$cache/dra-example-driver/$version
stamp=$(cat "$wrapper/go.mod" "$wrapper/go.sum" "$0" "$root/hack/go-wrapper-env.sh" | sha256sum |
  cut -c1-16)
reference=$out/dra-example-kubeletplugin
if [ ! -x "$reference" ] || [ "$(cat "$out/.stamp" 2>/dev/null)" != "$stamp" ]; then
  mkdir -p "$out"
  rm -f "$out/.stamp"
  download_modules "$wrapper" "$out/download.log" "the side-by-side benchmark needs it"
  module_dir=$(cd "$wrapper" && go list -m -f '{{.Dir}}' sigs.k8s.io/dra-example-driver)
  # A copy of the module with two files changed, put in place of the module by a go.mod beside
  # the copy (go build -modfile; -overlay may not replace files of the module cache).
  rm -rf "$out/src"
  cp -r "$module_dir" "$out/src"
  chmod -R u+w "$out/src"
  # insert_before FILE ANCHOR TEXT: TEXT (awk-escaped lines) goes before the one line ANCHOR of
  # the module's FILE, in the copy.
  insert_before() {
    if [ "$(grep -cxF "$2" "$module_dir/$1")" != 1 ]; then
      echo "bench-peer.sh: $1 of sigs.k8s.io/dra-example-driver $version no longer has one line" \
        "'$2'; update the changes to the reference in $0" >&2
      exit 1
    fi
    awk -v anchor="$2" -v text="$3" '$0 == anchor { print text } { print }' "$module_dir/$1" \
      >"$out/src/$1"
  }
  # Its GPUs in slices of at most 128 devices (it makes one slice of them all), as a 1.35+
  # server takes them.
  insert_before internal/profiles/gpu/gpu.go '	resources := resourceslice.DriverResources{' \
    '\tvar split []resourceslice.Slice
\tfor _, s := range slices {
\t\tfor len(s.Devices) > 128 {
\t\t\tsplit = append(split, resourceslice.Slice{Devices: s.Devices[:128]})
\t\t\ts.Devices = s.Devices[128:]
\t\t}
\t\tsplit = append(split, s)
\t}
\tslices = split'
  # Request bodies in JSON: client-go sends built-in types as protobuf unless told otherwise,
  # and the fake API server reads JSON only (its answers are JSON either way).
  insert_before pkg/flags/kubeclient.go '	return csconfig, nil' \
    '\tcsconfig.ContentType = "application/json"'
  cp "$wrapper/go.mod" "$wrapper/go.sum" "$out/"
  echo "replace sigs.k8s.io/dra-example-driver => $out/src" >>"$out/go.mod"
  echo "bench-peer.sh: building the reference kubelet plugin $version into $out" >&2
  (cd "$wrapper" && CGO_ENABLED=0 nice -n 10 go build -modfile "$out/go.mod" -trimpath \
    -ldflags "-s -w" -o "$reference" sigs.k8s.io/dra-example-driver/cmd/dra-example-kubeletplugin)
  check_built "$out" dra-example-kubeletplugin
  echo "$stamp" >"$out/.stamp"
fi

bench=${PEER_BENCH:-}
if [ -z "$bench" ]; then
  (cd "$root" && VFIO_DRA_BUILD_TARGETS=peer_bench ./hack/build.sh >/dev/null)
  bench=$root/${BUILD_DIR:-build}/bench/peer_bench
fi
results=$(mktemp -d)
trap 'rm -rf "$results"' EXIT
plugins="vfio-dra reference"
[ -n "${VFIO_DRA_BEFORE:-}" ] && plugins="vfio-dra before reference"
reversed=$(echo "$plugins" | awk '{for (i = NF; i > 0; i--) printf "%s%s", $i, (i > 1 ? " " : "\n")}')
for run in $(seq 1 "$runs"); do
  i=0
  for n in $devices; do
    # Alternating: each device count's runs take the plugins in turn forwards and backwards, and
    # so do the device counts of one run.
    order=$plugins
    [ $(((run + i) % 2)) = 0 ] && order=$reversed
    i=$((i + 1))
    for plugin in $order; do
      load=$(cut -d' ' -f1-3 /proc/loadavg)
      binary=
      [ "$plugin" = before ] && binary=$VFIO_DRA_BEFORE
      PEER_BENCH_VFIO_DRA_BINARY=$binary "$bench" \
        --plugin "$([ "$plugin" = before ] && echo vfio-dra || echo "$plugin")" \
        --reference-binary "$reference" --devices "$n" --idle-seconds "$idle_seconds" \
        --rounds "$rounds" >"$results/$plugin-$n-$run.json"
      python3 -c 'import json,sys; p=sys.argv[1]; d=json.load(open(p)); d["loadavg_before"]=sys.argv[2]
d["plugin"]=sys.argv[3]; d["loadavg_after"]=open("/proc/loadavg").read().split()[:3]
json.dump(d, open(p, "w"))' "$results/$plugin-$n-$run.json" "$load" "$plugin"
    done
  done
done
python3 - "$results" "$runs" "$devices" "$json_out" <<'PY'
import json, os, statistics, sys
results, runs, devices, json_out = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4]
data = {}
for name in sorted(os.listdir(results)):
    d = json.load(open(os.path.join(results, name)))
    data.setdefault((d["plugin"], d["devices"]), []).append(d)
figures = [
    ("Start to published", "ms", lambda d: d["start_to_published_ms"]),
    ("Idle RSS", "MiB", lambda d: d["idle_rss_mib"]),
    ("Idle CPU (utime+stime)", "% of a core", lambda d: d["idle_cpu_percent_of_a_core"]),
    ("Idle CPU (threads' schedstat)", "% of a core",
     lambda d: d["idle_cpu_percent_of_a_core_schedstat"]),
    ("Prepare p50, one claim at a time", "ms", lambda d: d["prepare_1"]["p50_ms"]),
    ("Prepare p99, claims at once", "ms", lambda d: d["prepare_at_once"]["p99_ms"]),
    ("Plugin CPU per claim (prepare + unprepare)", "ms",
     lambda d: d["cpu_ms_per_claim_prepare_and_unprepare"]),
]
before = any(k[0] == "before" for k in data)
print("| Figure (median of %d runs) | Devices |%s vfio-dra | reference | vfio-dra / reference |" %
      (runs, " vfio-dra before |" if before else ""))
print("|---|---|%s---|---|---|" % ("---|" if before else ""))
for what, unit, get in figures:
    for n in devices:
        mine, theirs = data[("vfio-dra", int(n))], data[("reference", int(n))]
        a = statistics.median(get(d) for d in mine)
        b = statistics.median(get(d) for d in theirs)
        label = what
        if "at once" in what:
            label += " (%d)" % mine[0]["at_once"]
        fmt = "%.3f" if unit.startswith("%") else "%.1f" if unit != "ms" or a >= 10 else "%.2f"
        ratio = "%.2fx" % (a / b) if b > 0 else "n/a"
        earlier = ""
        if before:
            e = statistics.median(get(d) for d in data[("before", int(n))])
            earlier = " %s %s |" % (fmt % e, unit)
        print("| %s | %s |%s %s %s | %s %s | %s |" %
              (label, n, earlier, fmt % a, unit, fmt % b, unit, ratio))
loads = sorted(float(d["loadavg_before"].split()[0]) for v in data.values() for d in v)
print("\nLoad average (1 min) at the start of the runs: %.2f to %.2f (median %.2f); the machine "
      "was not quiet." % (loads[0], loads[-1], statistics.median(loads)))
failures = sum(d["failures"] for v in data.values() for d in v)
print("Published (plugin, devices asked: devices published; slices at the end of each run): " +
      ", ".join("%s %d: %d; %s" % (k[0], k[1], data[k][0]["published_devices"],
                                   "/".join(str(d["slices"]) for d in data[k]))
                for k in sorted(data)) + "; failed calls: %d" % failures)
if json_out:
    json.dump({"%s-%d" % k: v for k, v in data.items()}, open(json_out, "w"), indent=1)
sys.exit(1 if failures else 0)
PY
