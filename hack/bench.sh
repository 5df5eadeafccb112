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
# The node's files live where the plugin data dir would (an ext4 disk here), not on tmpfs. This
# disk's inode allocation gets dearer for minutes after files are deleted (a run churns thousands),
# so each run starts after the dirty data is written and the disk has rested; five runs, and the
# median ratio is the figure (rested runs of one build spread by a tenth either way, and three
# left the verdict to one run).
rest() { sync; sleep "${PREPARE_BENCH_REST_SECONDS:-90}"; }
for run in 1 2 3 4 5; do
  rest
  "$BUILD_DIR/bench/prepare_bench" --rounds 20 --dir "${PREPARE_BENCH_DIR:-/tmp}" \
    >"$OUT/prepare$run.json"
done
# Start to registered, and the idle daemon with about 1,000 published devices (3,000 functions of
# the large synthetic node) over a minute that includes two periodic rescans.
"$BUILD_DIR/bench/daemon_bench" --starts 15 --idle-seconds "${IDLE_SECONDS:-60}" --functions 3000 \
  >"$OUT/daemon.json"
# A diagnostic, on a rested disk too: the daemon with fsync and fdatasync made no-ops (the floor
# keeps them), to show what its work besides durability costs.
rest
"$BUILD_DIR/bench/prepare_bench" --rounds 20 --dir "${PREPARE_BENCH_DIR:-/tmp}" --daemon-fsync off \
  >"$OUT/prepare-nofsync.json"
# Another: the fake API server's idle connections polled every 10 ms, as the packaged cpp-httplib
# does (prepare_bench stretches that poll by default; see bench/keepalive_poll_preload.cc), the
# conditions of the benchmarks before 2026-11-27's second half. Three runs, the median ratio.
for run in 1 2 3; do
  rest
  "$BUILD_DIR/bench/prepare_bench" --rounds 20 --dir "${PREPARE_BENCH_DIR:-/tmp}" \
    --apiserver-keepalive-poll packaged >"$OUT/prepare-polled$run.json"
done
# Sections other commands write (the real node's, the fleet's) follow the marker line and are
# kept as they are.
MARKER='<!-- Below: sections written by other commands (see each); hack/bench.sh keeps them. -->'
awk -v m="$MARKER" 'found || $0 == m { found = 1; print }' docs/benchmarks.md >"$OUT/kept.md"
python3 - "$OUT" <<'PY' >"$OUT/generated.md"
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
row("Idle change probe, 3000 PCI functions", d["BM_ProbeIdleNode/3000"], None,
    "the periodic check of an idle node (function list, each driver's bindings, mdev types); a "
    "full scan runs only when it changes, on uevents and every 10 minutes")
s = medians("slices.json")
per_device = {}
for n in (10, 100, 1000, 5000):
    b = s[f"BM_BuildAndValidate/{n}"]
    ms = b["real_time"] if b["time_unit"] == "ms" else b["real_time"] / 1000.0
    per_device[n] = ms * 1000.0 / n
    row(f"Build and validate slices, {n} devices", b, 10 if n == 1000 else None,
        f"{per_device[n]:.2f} us per device")
growth = per_device[5000] / per_device[100]
rows.append(f"| Slice build growth: time per device at 5,000 vs 100 devices | {growth:.2f}x | "
            f"linear (<= 2x) | {'met' if growth <= 2 else 'MISSED'} | |")
for n in (100, 1000, 5000):
    row(f"Publish from nothing to the fake API server, {n} devices",
        s[f"BM_PublishFromNothing/{n}/iterations:5"], 300 if n == 1000 else None,
        "client rate limit off")
def ratio_of(q):
    return q["prepare_32_pods"]["p99_ms"] / q["floor_32_pods"]["p99_ms"]
runs = [json.load(open(os.path.join(out, f"prepare{run}.json"))) for run in (1, 2, 3, 4, 5)]
p = sorted(runs, key=ratio_of)[2]  # the run with the median ratio gives the rows below
def prow(what, key, target_ms=None, note=""):
    b = p[key]
    verdict = "" if target_ms is None else ("met" if b["p99_ms"] <= target_ms else "MISSED")
    target = "" if target_ms is None else f"p99 <= {target_ms} ms"
    rows.append(f"| {what} | p50 {b['p50_ms']:.2f} ms, p99 {b['p99_ms']:.2f} ms "
                f"({b['samples']} calls) | {target} | {verdict} | {note} |")
prow("NodePrepareResources, one-device claim, 1 pod at a time", "prepare_1_pod", None,
     "gRPC socket, fake API server over TLS (connections kept alive, idle ones not polled), "
     "simulated kernel")
prow("NodePrepareResources, one-device claims, 8 pods at once", "prepare_8_pods", None,
     "each claim its own IOMMU group: prepared in parallel")
prow("NodePrepareResources, one-device claims, 32 pods at once", "prepare_32_pods", 5,
     "each claim its own IOMMU group: prepared in parallel")
prow("NodePrepareResources, one-device claims, 128 pods at once", "prepare_128_pods", None,
     "each claim its own IOMMU group: prepared in parallel")
prow("Floor: one claim GET over TLS, 2 durable checkpoint writes, 3 atomic writes, 1 at a time",
     "floor_1_pod", None, "done directly by the benchmark, rounds interleaved with the prepares")
prow("Floor: the same, 32 at once", "floor_32_pods", None,
     "directory fsyncs group-committed as the daemon does")
rows.append(f"| CPU per claim, 32 at once: daemon to prepare / to unprepare; kubelet side and "
            f"API server; floor | {p['daemon_cpu_ms_per_prepare_32_pods']:.2f} / "
            f"{p['daemon_cpu_ms_per_unprepare_32_pods']:.2f} ms; "
            f"{p['client_cpu_ms_per_prepare_32_pods']:.2f} ms; "
            f"{p['floor_cpu_ms_per_claim_32_pods']:.2f} ms |  |  | utime+stime over the 32-pod rounds "
            "divided by the claims: of the daemon (with the simulated kernel's work for each bind), "
            "of the benchmark process while the daemon prepares (the kubelet's side of the calls, "
            "the fake API server), and of the benchmark doing the floor's work; the two cores are "
            "busy through a round of 32, so the prepare p99 follows the sum |")
ratio = ratio_of(p)
def run_text(q):
    return (f"{ratio_of(q):.2f}x ({q['prepare_32_pods']['p99_ms']:.1f} / "
            f"{q['floor_32_pods']['p99_ms']:.1f} ms; CPU per claim: daemon "
            f"{q['daemon_cpu_ms_per_prepare_32_pods']:.2f}, floor "
            f"{q['floor_cpu_ms_per_claim_32_pods']:.2f} ms)")
each = "; ".join(run_text(q) for q in runs)
rows.append(f"| Prepare p99 at 32 pods at once, against the floor's p99: the median of five runs | "
            f"{ratio:.2f}x | <= 1.5x | {'met' if ratio <= 1.5 else 'MISSED'} | each run against "
            "its own floor, on a rested disk; the rows above are the median run's |")
rows.append(f"| The five runs | {each} |  |  | in the order run |")
q = json.load(open(os.path.join(out, "prepare-nofsync.json")))
rows.append("| Diagnostic: the same ratio with the daemon's fsync and fdatasync made no-ops (the "
            f"floor keeps them) | {run_text(q)} |  |  | prepare_bench --daemon-fsync off "
            "(LD_PRELOAD), on a rested disk: what the daemon's work besides durability "
            "costs against the floor |")
polled = [json.load(open(os.path.join(out, f"prepare-polled{run}.json"))) for run in (1, 2, 3)]
rows.append("| Diagnostic: the same ratio with the fake API server polling its idle connections "
            f"every 10 ms, as packaged: the median of three runs | "
            f"{ratio_of(sorted(polled, key=ratio_of)[1]):.2f}x |  |  | prepare_bench "
            "--apiserver-keepalive-poll packaged, on a rested disk; the runs: "
            + "; ".join(run_text(q) for q in polled) + "; kubelet side and API server per claim: "
            + ", ".join(f"{q['client_cpu_ms_per_prepare_32_pods']:.2f}" for q in polled)
            + " ms |")
dm = json.load(open(os.path.join(out, "daemon.json")))
for key, what in (("start_to_registered_vm_host", "Start to registered with the kubelet, vm-host node"),
                  ("start_to_registered_large",
                   f"Start to registered, node with {dm['idle']['published_devices']} devices")):
    b = dm[key]
    target = 100 if key.endswith("vm_host") else None
    verdict = "" if target is None else ("met" if b["p50_ms"] <= target else "MISSED")
    rows.append(f"| {what} | p50 {b['p50_ms']:.1f} ms, max {b['max_ms']:.1f} ms "
                f"({b['samples']} starts) | {'<= 100 ms' if target else ''} | {verdict} | "
                "process start to NotifyRegistrationStatus done; sockets before the first scan |")
idle = dm["idle"]
rows.append(f"| Idle RSS, {idle['published_devices']} published devices | "
            f"{idle['rss_mib']:.1f} MiB (peak {idle['peak_rss_mib']:.1f} MiB) | <= 20 MiB | "
            f"{'met' if idle['rss_mib'] <= 20 else 'MISSED'} | /proc VmRSS after publishing: "
            f"{idle['rss_anon_mib']:.1f} MiB heap and stacks, {idle['rss_file_mib']:.1f} MiB "
            "mapped code of the binary (gRPC C++, Abseil, protobuf's lite runtime, yaml-cpp, fmt "
            "and spdlog linked in) and its shared libraries (OpenSSL, the C++ runtime, "
            "cpp-httplib, zlib, libmnl, libpci, libudev); the daemon talks TLS with a bearer token to the API server, as on a "
            "node; per mapping below |")
rows.append(f"| Idle CPU, {idle['published_devices']} published devices | "
            f"{idle['cpu_percent_of_a_core']:.3f}% of a core over {idle['window_s']:.0f} s | "
            f"< 0.1% | {'met' if idle['cpu_percent_of_a_core'] < 0.1 else 'MISSED'} | "
            "on-CPU time of every thread (schedstat, what the cgroup and kubectl top count); "
            f"{idle['cpu_percent_of_a_core_ticks']:.3f}% in utime+stime clock ticks; includes the "
            "30 s change probes |")
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
prepare_text = (
    "Prepare is CPU-bound on this 2-core machine while the floor mostly waits for the disk: "
    "through a round of 32 both cores are busy, so the prepare p99 follows the CPU per claim of "
    "the daemon and of the kubelet's side times 32 over two cores, plus the fsync waits of the "
    "last claims, and the floor's p99 follows its fsync waits. The ratio moves with the disk's "
    "state as much as with the daemon: this machine's ext4 has no journal, and every create "
    "walks past the inodes freed in the last minutes (a run deletes thousands), so each run "
    "starts after a sync and a 90 s rest. Even so, rested runs of one build spread widely (the "
    "five runs above), and the ratio moves with the balance of the two sides' CPU per claim, "
    "which drifts with the disk's state. The median of five is the figure. Benchmarks of the "
    "same prepare path gave medians of 1.64x and 1.50x (of three) before 2026-11-27, and 1.49x "
    "and 1.55x (bcee118, ef4c009) on 2026-11-27. Two benchmarks of 91abc77 run back to back on "
    "2026-11-27 gave 1.45x (runs 1.45x, 1.45x, 1.39x, 1.79x, 1.43x) and 1.52x (runs 1.28x, "
    "1.52x, 1.39x, 1.55x, 1.60x). The benchmark of 744222f gave 1.53x (its five runs, 1.17x to "
    "1.91x) and, in the same hour, 1.35x in the three runs of the diagnostic row. So until then "
    "the target was met in some benchmarks and missed in others, by less than the spread "
    "between them: the ratio sat at about 1.35 to 1.65x, and to hold in every benchmark the "
    "daemon needed about a tenth less CPU per prepare. A p99 of 640 calls (20 rounds of 32) is "
    "decided by the slowest one or two rounds of each side, which is much of the spread between "
    "runs. The benchmark of 170c451 (2026-11-27), after the steps in the next paragraph, gave "
    "1.32x, its five runs 1.10x to 1.45x, with the daemon's CPU per prepare at 1.03 to 1.14 ms "
    "in four of them (1.30 to 1.69 ms in the benchmark of 744222f).\n\n"
    "Three changes of 2026-11-27 (after 6863fc9) took the daemon's CPU per prepare at 32 at "
    "once on tmpfs from 0.86 to 0.74 ms, measured in ten alternating pairs of 20-round runs "
    "against 6863fc9 (p99 22.7 -> 20.4 ms; the kubelet side unchanged at 0.29 to 0.30 ms); the "
    "first and the third alone gave 0.89 -> 0.81 ms in ten pairs. Every prepare's overlap check "
    "listed the claims directory and stat'ed every record (6.5% of the daemon's samples in a "
    "profile of prepare_bench on tmpfs); the checkpoint now keeps an index of its records "
    "current with the directory's inotify events, which the kernel queues inside the rename or "
    "unlink that makes a change, so the other instance's writes are seen as before, and it reads "
    "everything when the events cannot be trusted (first read, queue overflow, directory "
    "replaced): 3.4% after. The checkpoint records (written twice per prepare), the two CDI "
    "specs and KubeVirt's metadata file are written member by member (base/json_writer.h) "
    "instead of through nlohmann::json's tree, which with its dump was about a tenth of the "
    "daemon's samples in the prepare path. And the simulated kernel no longer lists "
    "/sys/class/vfio-dev on every bind to find the lowest free vfio-dev number (3.5%; the "
    "kernel's IDA does not): the number is claimed by making its class link, from a hint of the "
    "lowest one freed.\n\n"
    "Since f78516d the fake API server's idle connections wait for their next request without "
    "polling. It runs in the benchmark's process on the packaged cpp-httplib (0.11), which waits "
    "between two requests on a kept-alive connection by polling it every 10 ms and sleeping 1 ms "
    "after each empty poll: about 180 wakeups a second for each idle connection, and the "
    "benchmark keeps about 96 (the daemon's and the floor's). An API server blocks until the next "
    "request. Over one 20-round run on tmpfs the benchmark process made 104,774 context switches "
    "in 5.6 s of CPU with the polling and 40,994 in 3.7 s without; the kubelet side and API "
    "server per prepared claim went from 0.61 to 0.30 ms, and the daemon's CPU per prepare from "
    "1.30 to 0.98 ms (its threads preempted less). prepare_bench now preloads "
    "bench/keepalive_poll_preload.cc, which stretches exactly that poll to one second; the "
    "diagnostic row measures with the polling as packaged. On the disk the change did not lower "
    "the ratio: the five runs above gave a median of 1.53x and the three with the polling 1.35x, "
    "each within the other's spread. In eight short alternating runs before this benchmark (a "
    "30 s rest, not 90), the stretched runs gave 0.79x, 1.38x, 0.74x and 1.39x and the polled "
    "ones 1.65x, 1.58x, 1.43x and 1.53x, the two lowest where the floor's own p99 was high (79 "
    "and 65 ms against about 36); this benchmark does not repeat that. The stretch stays because "
    "it is what a node's API server does, not because of the figure it gives.\n\n"
    "Since 874a0a9 a unary answer leaves the daemon in one send (its headers, message and "
    "trailers, with the other answers ready at the same moment), after one hand-over from the "
    "handler to the gRPC server's I/O thread instead of two. Over one 20-round run on tmpfs "
    "the daemon's sendto calls went from 5,075 to 1,199, its writes from 42,897 to 40,402 and "
    "its context switches from 28,917 to 27,967, and the kubelet side's recvmsg calls from "
    "3,975 to 3,203; the daemon's CPU per prepare moved within the spread of alternating runs "
    "(tmpfs, five pairs). A profile of prepare_bench at a4a4b74 (tmpfs, DWARF stacks) gave the "
    "same picture as the one below: the simulated kernel 21% of the daemon's samples, futex "
    "waits and wakes 12% (two thirds of them the hand-overs to and from the device-operation "
    "threads), malloc and free 13%, reading the checkpoint for the overlap check 4.8%.\n\n"
    "Where the daemon's CPU goes, from a profile of prepare_bench on tmpfs (perf with DWARF "
    "stacks, 40 rounds, at 963ba5d, before the changes named at the end of this paragraph): the "
    "simulated kernel's work for each bind and unbind, a fifth; the scheduler, a sixth (some 17 "
    "context switches per prepare and unprepare: the gRPC hand-over to a handler thread, the two "
    "hand-overs to the device-operation threads, the claim read's wait for the API server, the "
    "fsync waits); malloc and free, an eighth (about 1,000 allocations per prepare, a fifth of "
    "them the JSON trees of the two checkpoint records); JSON building and writing, a tenth; the "
    "claim's read over TLS, a tenth. On ext4 two kernel costs come on top: the fsyncs (15% of "
    "the daemon's CPU; each one exits to the hypervisor for the virtio disk) and inode "
    "allocation (8% in a rested run, 15% after minutes of runs: journal-less ext4 skips every "
    "inode freed in the last minutes, one buffer lookup each). No one item was the tenth that "
    "would give the ratio a margin; three of them together were (the three changes of "
    "2026-11-27 above: the "
    "checkpoint read for the overlap check, since kept current by change events rather than "
    "cached, which another instance's writes could have made stale; the JSON trees; the "
    "simulated kernel's listing). Tried "
    "and measured without a change that holds: jemalloc and tcmalloc in place of glibc malloc "
    "(they took about a tenth and a sixth off the daemon's CPU per prepare, but the idle daemon "
    "held 22.1 and 41.6 MiB, 24.6 MiB with tcmalloc's aggressive decommit, against a budget of "
    "16), two or four malloc arenas, a larger malloc thread-cache size limit, and at most 4 or 8 "
    "prepares at once (each within the spread of alternating runs). Since feea4d9 the "
    "benchmark's PF has a network interface, as a node's does, read through the simulated PF "
    "driver: before, every prepare took the daemon's failure path for the VF's MAC (a listing of "
    "the PF's 150-entry sysfs directory for a child's net/, and a warning in the log per "
    "prepare), 3.7% of the daemon's CPU; the simulated kernel no longer throws and catches an "
    "exception to parse a VF's missing sriov_numvfs on every bind.\n\n"
    "Since 943a733 and 3a11a8c the benchmark reads claims over TLS, as a node does, for the "
    "daemon and the floor alike, on connections both keep. The API client used to keep eight "
    "idle connections, so each burst of 32 prepares opened 24 new ones, a TLS handshake each: "
    "on tmpfs that was 1.3 ms of the daemon's CPU per prepare against 1.0 ms with the "
    "connections kept, and a p99 at 32 at once of about 44 ms against 27 ms. It now keeps up "
    "to 64 and closes those idle for 90 s. The fake API server also closed every connection "
    "after five requests (cpp-httplib's default; no API server does), which made one claim "
    "read in five reconnect. The rounds compared run on connections warmed by one round of "
    "32; the first round of 128 opens 96 more, which its row includes. What the ratio gained "
    "since 1.84x at the last stop is mostly the floor's own claim read now being paid over "
    "TLS: on ext4 the daemon's CPU per prepare in rested runs of this build (1.4 to 2.0 ms) "
    "is not below the last stop's over plain HTTP (1.22 to 1.30 ms), while the floor's rose "
    "from 0.70 to 0.8 to 1.3 ms; TLS adds about 0.1 ms per claim read to each side, and the "
    "disk's state the rest.\n\n"
    "Per claim on tmpfs the daemon spends about 1.0 ms (0.98 ms in a run with the fake "
    "server's polling stretched; gRPC, the claim's read over TLS, planning, two checkpoint "
    "records, the CDI and metadata files, two hand-overs to the device-operation threads, and "
    "the simulated kernel's work for each bind, about a fifth of it) and about 0.5 ms more on "
    "ext4; the floor about 0.4 to 0.45 ms on tmpfs and about 0.5 ms more on ext4. Durability is a small part of the gap (the diagnostic row: the daemon's "
    "fsync and fdatasync made no-ops, the floor keeping its own).\n\n"
    "Steps of 2026-11-26 before these, each measured on tmpfs in alternating runs against the "
    "build before it, took the daemon's CPU per prepare from about 1.55 to 0.82 ms: records, "
    "CDI specs and metadata files built with emplace and moves instead of copies, one record "
    "copy fewer per checkpoint write, records stat'ed relative to their open directory, no "
    "std::filesystem::path per atomic write, the overlap check without a set and two maps per "
    "other record, planning without the reads that take the kernel's device lock, a 64-deep "
    "malloc thread cache (src/cmd/malloc_tuning.h; a deeper one, 128, saves a little more CPU "
    "but adds about 0.65 MiB to the idle RSS, over its budget), waiters woken after the lock "
    "is released, no sockets opened for a PF without a netdev, a bind or restore as one "
    "operation on the device-operation thread instead of four hand-overs, the simulated "
    "kernel on plain system calls, and no seeding of the retry backoff's generator on "
    "success."
)
footprint_text = (
    "Most of the idle RSS is fixed by the libraries: pages of the binary, of the C and C++ "
    "runtimes and of OpenSSL touched at start-up and by the API client's TLS; the table by "
    "mapping above lists them. Measured apart on this machine: a C++ program holds 3.2 MiB; "
    "OpenSSL's initialisation (OPENSSL_init_ssl) or its first digest through a provider adds "
    "about 2 MiB of libcrypto pages. Two earlier steps took the idle daemon from 25.4 to 17.1 "
    "MiB (over plain http, before the benchmark spoke TLS): the kubelet-facing gRPC server "
    "became the plugin's own on nghttp2 (gRPC C++'s core, Abseil and upb were 3.4 MiB of the "
    "binary's resident pages and nine threads; 25.4 -> 21.6 MiB), and the API client moved "
    "from libcurl to cpp-httplib, which the metrics endpoint links already (Debian's libcurl "
    "loads some twenty libraries a node never uses: GnuTLS, p11-kit, Kerberos, LDAP, RTMP, "
    "SSH; 21.6 -> 17.1 MiB; 45 shared libraries -> 21). The live heap of the idle daemon "
    "(heaptrack, the process killed while idle, at 47932eb) is 4.1 MiB: 1.6 MiB under the TLS "
    "connections (OpenSSL 3's caches, filled by the first handshake, and each connection's "
    "state), the rest the published-device index, the part of the last scan the slice builder "
    "reads and the reconciler's digests; [heap] and [anon] hold more, pages that live and "
    "freed chunks of the first publish share, and thread stacks. Once the node settles the "
    "published devices are repacked and free pages returned (malloc_trim); the peak is the "
    "first publish. Until f2afbf7 every API client with a kubeconfig CA also loaded the "
    "system's CA bundle into its store (cpp-httplib adds it unless given a CA path): some 140 "
    "certificates parsed and kept (about 1.7 MiB of idle RSS in one A/B run), and a trust the "
    "kubeconfig did not ask for. What is left of the heap at idle (malloc_info) is about 2.8 "
    "MiB in use spread over pages of the first publish's 25 MiB peak, so the heap holds 5 to "
    "6 MiB. With one malloc arena instead of two the idle daemon is about 1.1 MiB smaller "
    "(three runs each: 17.9 against 19.1 MiB). Three steps of 2026-11-26 took it from 18.2 to "
    "15.3 MiB (daemon_bench, 1,000 devices, TLS): yaml-cpp from its archive and fmt and "
    "spdlog as headers instead of three shared libraries (file-backed RSS 12.4 -> 11.8 MiB; a "
    "shared library costs the pages its relocations and the kernel's fault-around touch, not "
    "only the code called); libmnl instead of libnl-route and libnl-3 for the VF network "
    "settings (-0.5 MiB); and the published devices packed in one buffer (PackedDeviceTable) "
    "instead of a map of SliceDevices, which heaptrack showed as the largest live item, 1.1 "
    "MiB of small allocations (heap 4.8 -> 3.0 MiB). The figure sat at the budget (15.9 and "
    "16.1 MiB in two benchmarks of one build on 2026-11-27) until 3c011a0: the heap was "
    "trimmed once after the node settled, and what the idle daemon freed afterwards (a "
    "watch's events, a reconnect's TLS state, the probe's reads) stayed resident. It is now "
    "trimmed at every quiet 30 s check (daemon_bench: 16.05 -> 15.6 MiB, [heap] 3.6 -> 3.2 "
    "MiB) for 0.01 to 0.015% of a core (0.032% before; 0.040 to 0.047% in four runs after), "
    "most of it in the slice-sync thread (7.6 to 10.9 ms a minute before, 15 to 16 after), "
    "whose periodic work reuses pages each trim has returned. The binary's pages are resident "
    "almost whole (2.8 MiB; its code is 2.7 MiB): start-up runs code in some 45 places spread "
    "across it (perf's page-fault events), and the kernel maps the 64 KiB around each fault "
    "(fault-around), so each module's start-up code brings its neighbours in. Packing its "
    "relocations (-z pack-relative-relocs) changed nothing measurable for that reason; "
    "ordering the functions by first use (a linker ordering file, which needs gold or lld) is "
    "what would shrink it."
)
why = {
    "Idle RSS": "The figure is at its budget; what it is made of and the steps that took it "
    "there are under Idle footprint above.",
    "32 pods at once": "A p99 of 5 ms for 32 pods at once is below what the disk alone allows: "
    "the floor row (the writes a prepare must make, with no device work at all) is 15 to 40 ms at "
    "32 at once. The ratio to the floor is the figure to watch.",
    "Idle CPU": "What remains is the 30 s change probe (a few ms on 3,000 functions) and, once "
    "after a change, the repacking and return of memory; the gRPC server sleeps in poll() with no "
    "timeout, so a node with no kubelet calls costs it nothing. The table of CPU by thread below "
    "shows which. The figure is a few milliseconds a minute and depends on what falls into the "
    "window and on the machine's other load.",
    "Discovery of a node with 1000": "Discovery reads about ten sysfs files per function; the "
    "figure varies between runs around the target on this machine. On 2026-11-26 this machine "
    "ran everything slower (the floor, start-up and discovery too); the benchmarks of 50109bf "
    "and of this build, run side by side that day, gave the same discovery (19-24 ms at 1,000 "
    "functions) and slice build (2.8-3.4 ms at 1,000 devices) figures.",
    "Slice build growth": "Building 5,000 devices is sensitive to this machine's memory "
    "bandwidth: on 2026-11-25 the benchmark built from an earlier commit (fe3755c) gave the same "
    "20-27 ms in the same session that an earlier run had measured at 11 ms. Compare builds side "
    "by side in one session before reading a change into it.",
}
by_mapping = sorted(dm.get("idle_rss_by_mapping_kib", {}).items(), key=lambda kv: -kv[1])
if by_mapping:
    print(f"\n## Idle RSS by mapping\n\nWhat the idle daemon above holds resident, from "
          f"/proc/<pid>/smaps: [heap] and [anon] (thread stacks, malloc arenas, the .bss of the "
          f"binary and its libraries) are its own memory; the rest are pages of the binary and "
          f"of each shared library it touched.\n")
    print("| Mapping | KiB |\n|---|---|")
    for name, kib in by_mapping[:15]:
        print(f"| {name} | {kib} |")
    rest = by_mapping[15:]
    print(f"| {len(rest)} other mappings | {sum(kib for _, kib in rest)} |")
else:
    print("\n## Idle RSS by mapping\n\nNot available: daemon_bench could not read the idle "
          "daemon's /proc/<pid>/smaps (its stderr says why).")
by_thread = sorted(dm.get("idle_cpu_us_by_thread", {}).items(), key=lambda kv: -kv[1])
if by_thread:
    print(f"\n## Idle CPU by thread\n\nOn-CPU time of the idle daemon's threads over the "
          f"{idle['window_s']:.0f} s window above, by thread name (threads of one name summed).\n")
    print("| Thread | ms |\n|---|---|")
    for name, us in by_thread:
        print(f"| {name} | {us / 1000:.1f} |")
print("\n## Idle footprint\n")
print(footprint_text)
print("\n## Prepare against the floor\n")
print(prepare_text)
notes = [text for key, text in why.items() if any(key in r and "MISSED" in r for r in rows)]
if notes:
    print("\n## Why targets are missed\n")
    for text in notes:
        print(f"- {text}")
PY
cat "$OUT/generated.md" >docs/benchmarks.md
if [ -s "$OUT/kept.md" ]; then printf '\n' >>docs/benchmarks.md; cat "$OUT/kept.md" >>docs/benchmarks.md; fi
cat docs/benchmarks.md
