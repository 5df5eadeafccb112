#!/usr/bin/env python3
"""The fleet benchmark (hack/fleet.sh): what N live plugins and up to 1,000 nodes of vfio-dra
slices cost the real API server, and how fast the real scheduler places VM pods on them.

  benchmark.py --build-dir BUILD --work-dir DIR [--live 100] [--pods 5000] [--idle 300]
               [--json FILE]

Phases, on one control plane (docs/benchmarks.md says what each figure means):
 1. start-up: N live plugins started at once; time until all their slices are on the server and
    the requests each made until then (the audit log, by the pod its token is bound to);
 2. 500 nodes (the rest published): etcd's size and the API server's memory per node;
 3. idle: the plugins' requests per node and hour beyond their watches, over --idle seconds;
 4. 1,000 nodes, then the API server restarted with the N plugins watching: LISTs and WATCHes
    per instance after the restart, when they came, time until all are back, slices rewritten;
 5. the real scheduler: --pods VM pods (a whole GPU, an mdev vGPU of a type, a vGPU on a VF, a
    VF) on 1,000 and then 500 nodes, and the same on the same devices published without counters.
"""

import datetime
import json
import os
import re
import statistics
import sys
import threading
import time
import urllib.request
import ssl

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(os.path.dirname(HERE), "cluster")]

import capacity  # noqa: E402
import workload  # noqa: E402
from control_plane import wait_for  # noqa: E402
import fleet as fleet_module  # noqa: E402
from fleet import Fleet  # noqa: E402
from run import SOURCE_DIR, kube_binaries  # noqa: E402


def log(message):
    print(f"{datetime.datetime.now():%H:%M:%S} {message}", flush=True)


def rss_mib(process):
    with open(f"/proc/{process.proc.pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def etcd_bytes(fleet):
    port = fleet.cluster.etcd_port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        text = r.read().decode()
    m = re.search(r"^etcd_mvcc_db_total_size_in_use_in_bytes (\S+)$", text, re.M)
    return float(m.group(1))


HEAP_IN_USE = re.compile(r"^go_memstats_heap_inuse_bytes (\S+)$", re.M)


def footprint(fleet):
    """etcd's database in use; the API server's resident memory and its Go heap in use. Taken
    after a quiet minute, so that the heap figure is mostly what the server keeps (its watch
    cache of every object) rather than garbage of the burst that wrote them."""
    time.sleep(60)  # the quiet minute itself: the Go collector runs at least every 2 minutes
    heap = float(HEAP_IN_USE.search(fleet.cluster.metrics_text()).group(1))
    return {"etcd_bytes": etcd_bytes(fleet), "apiserver_heap_bytes": heap,
            "apiserver_rss_mib": rss_mib(fleet.cluster.processes["kube-apiserver"])}


def per_node_cost(before, after, nodes):
    def kib(key, scale=1):
        return round((after[key] - before[key]) * scale / nodes / 1024, 1)
    return {"etcd_kib_per_node": kib("etcd_bytes"),
            "apiserver_heap_kib_per_node": kib("apiserver_heap_bytes"),
            "apiserver_rss_kib_per_node": kib("apiserver_rss_mib", 1024 * 1024)}


RESPONSE_SIZES = re.compile(
    r'^apiserver_response_sizes_bytes_sum\{([^}]*)\} (\S+)$', re.M)


def response_bytes(fleet):
    """Bytes the API server answered to non-watch requests for DRA objects, from its metrics."""
    total = 0.0
    for labels, value in RESPONSE_SIZES.findall(fleet.cluster.metrics_text()):
        if 'group="resource.k8s.io"' in labels and 'verb="WATCH"' not in labels:
            total += float(value)
    return total


def phase_startup(fleet, live):
    fleet.prepare_live()
    start = time.time()
    fleet.launch_live()
    wait_for(f"{live} live plugins' slices on the server",
             lambda: len(fleet.live_published()) == live, 900)
    seconds = time.time() - start
    requests = fleet.plugin_requests(since=start)
    per_pod = {}
    for _, pod, verb, resource, code, _ in requests:
        per_pod.setdefault(pod, []).append(f"{verb} {resource}")
    counts = sorted(len(v) for v in per_pod.values())
    fleet.register_live(start_kubelets=False)
    return {"instances": live, "seconds_to_all_slices": round(seconds, 1),
            "requests_per_instance_median": statistics.median(counts) if counts else 0,
            "requests_per_instance_max": max(counts) if counts else 0,
            "instances_seen": len(per_pod)}


def phase_idle(fleet, seconds):
    bytes_before = response_bytes(fleet)
    start = time.time()
    time.sleep(seconds)  # the measurement window itself, not a wait for an event
    end = time.time()
    requests = fleet.plugin_requests(since=start, until=end)
    non_watch = [r for r in requests if r[2] != "watch"]
    watches = [r for r in requests if r[2] == "watch"]
    hours = (end - start) / 3600
    n = len(fleet.live)
    return {"window_seconds": round(end - start),
            "requests_per_node_hour": round(len(non_watch) / n / hours, 2),
            "watch_requests_per_node_hour": round(len(watches) / n / hours, 2),
            "bytes_per_node_hour": round((response_bytes(fleet) - bytes_before) / n / hours),
            "verbs": sorted({f"{r[2]} {r[3]}" for r in non_watch})}


def phase_restart(fleet):
    """Times are from the moment the old server has exited: the new one answers some requests
    before its /readyz does, and the plugins reconnect as soon as it answers."""
    fleet.cluster.processes["kube-apiserver"].stop()
    down_at = time.time()
    fleet.cluster.start_apiserver()
    ready_at = time.time()
    pods = fleet.pod_to_node()

    def all_back():
        seen = {r[1] for r in fleet.plugin_requests(since=down_at)
                if r[2] == "watch" and r[3] == "resourceslices" and r[4] == 200}
        return len(seen & set(pods)) == len(pods)
    wait_for("every plugin watching its slices again", all_back, 300)
    back_at = time.time()
    # A settling window after the last came back: late LISTs or rewrites would show in it.
    time.sleep(30)  # the window in which nothing may happen, not a wait for an event
    requests = fleet.plugin_requests(since=down_at)
    lists, watches, writes, first_watch = {}, {}, [], {}
    for t, pod, verb, resource, code, _ in requests:
        if resource != "resourceslices":
            continue
        if verb == "list":
            lists.setdefault(pod, []).append(t - down_at)
        elif verb == "watch":
            watches[pod] = watches.get(pod, 0) + 1
            if code == 200:
                first_watch.setdefault(pod, t - down_at)
        elif verb in ("create", "update", "patch", "delete", "deletecollection"):
            writes.append((pod, verb))
    list_times = sorted(t for v in lists.values() for t in v)
    back = sorted(first_watch.values())
    return {"ready_seconds": round(ready_at - down_at, 1),
            "lists_per_instance_max": max((len(v) for v in lists.values()), default=0),
            "lists_total": len(list_times),
            "watches_per_instance_max": max(watches.values(), default=0),
            "list_spread_seconds": [round(list_times[0], 1), round(
                statistics.median(list_times), 1), round(list_times[-1], 1)] if list_times
            else [],
            "all_back_seconds": round(max(first_watch.values(), default=back_at - down_at), 1),
            "back_seconds_p50_max": [round(statistics.median(back), 1), round(back[-1], 1)]
            if back else [],
            "slice_writes": len(writes)}


def demand_for(slices, pods):
    """pods spread over the templates in proportion to what the slices admit."""
    admits = {t: capacity.admits(slices, t) for t in capacity.MATCH}
    total = sum(admits.values())
    if pods > total:
        raise SystemExit(f"{pods} pods do not fit: the slices admit {admits}")
    counts = {t: admits[t] * pods // total for t in admits}
    largest = max(admits, key=admits.get)
    counts[largest] += pods - sum(counts.values())
    return counts, admits


def profile_scheduler(fleet, seconds, path):
    port = fleet.cluster.ports["kube-scheduler"]
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    request = urllib.request.Request(
        f"https://127.0.0.1:{port}/debug/pprof/profile?seconds={seconds}")
    request.add_header("Authorization", f"Bearer {fleet.cluster.tokens['admin']}")
    with urllib.request.urlopen(request, context=ctx, timeout=seconds + 60) as r:
        with open(path, "wb") as f:
            f.write(r.read())


def phase_schedule(fleet, pods, label, profile_path=None):
    slices = workload.complete_pools(fleet.all_slices())
    counts, admits = demand_for(slices, pods)
    log(f"scheduling {pods} pods {label}: {counts} (the slices admit {admits})")
    profiler = None
    if profile_path:
        profiler = threading.Thread(target=profile_scheduler,
                                    args=(fleet, 20, profile_path), daemon=True)
        profiler.start()
    figures, pending = workload.run_pods(fleet, counts, stall_seconds=60, label=label)
    if profiler:
        profiler.join()
    problems = workload.allocation_problems(workload.list_claims(fleet),
                                            workload.complete_pools(fleet.all_slices()))
    figures.update(label=label, pending=len(pending), allocation_problems=problems[:5],
                   problem_count=len(problems),
                   fill=round(pods / sum(admits.values()), 2))
    log(f"{label}: {workload.summary(figures)}")
    workload.delete_all_pods(fleet)
    return figures


def table(results):
    rows = []
    s, i, r = results.get("startup"), results.get("idle"), results.get("restart")
    if s:
        rows.append(("start-up", f"{s['instances']} instances: all slices on the server in "
                     f"{s['seconds_to_all_slices']} s; requests per instance median "
                     f"{s['requests_per_instance_median']}, max {s['requests_per_instance_max']}"))
    if i:
        rows.append(("idle", f"{i['requests_per_node_hour']} requests/node/h beyond the watch "
                     f"({i['verbs'] or 'none'}), {i['watch_requests_per_node_hour']} watch "
                     f"re-opens/node/h, {i['bytes_per_node_hour']} bytes/node/h, over "
                     f"{i['window_seconds']} s"))
    if r:
        rows.append(("API server restart", f"at {results['nodes_at_restart']} nodes: LISTs per "
                     f"instance max {r['lists_per_instance_max']} ({r['lists_total']} in all, at "
                     f"{r['list_spread_seconds']} s min/median/max), WATCHes per instance max "
                     f"{r['watches_per_instance_max']}, all back {r['all_back_seconds']} s after "
                     f"the old server exited (its successor ready after {r['ready_seconds']} s), "
                     f"{r['slice_writes']} slices rewritten"))
    for key, cost in results["cost"].items():
        rows.append((f"cost at {key}", f"etcd {cost['etcd_kib_per_node']} KiB/node, API "
                     f"server heap in use {cost['apiserver_heap_kib_per_node']} KiB/node, "
                     f"RSS {cost['apiserver_rss_kib_per_node']} KiB/node"))
    for f in results["schedule"]:
        rows.append((f"scheduler {f['label']}", f"{f['throughput_avg']} pods/s (average of "
                     f"1 s samples), {f['scheduled']}/{f['pods']} scheduled in "
                     f"{f['schedule_seconds']} s, fill {f['fill']}, claim allocation p50 "
                     f"{f['claim_p50_ms']} ms p99 {f['claim_p99_ms']} ms, "
                     f"{f['problem_count']} allocations the counters forbid"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"| {k.ljust(width)} | {v} |" for k, v in rows)


def main():
    parser = fleet_module.argument_parser(live=100)
    parser.add_argument("--pods", type=int, default=5000)
    parser.add_argument("--nodes", type=int, default=1000, help="the fleet's size; half of it "
                        "is the smaller fleet")
    parser.add_argument("--idle", type=int, default=300)
    parser.add_argument("--json")
    parser.add_argument("--mdev-types", choices=("all", "one"), default="all",
                        help="mdev nodes offer every type their GPUs can create, or one")
    parser.add_argument("--no-schedule", action="store_true",
                        help="only start-up, cost, idle and the API server restart")
    parser.add_argument("--schedule-only", action="store_true",
                        help="only the scheduler's runs (no idle, restart or cost phases)")
    args = parser.parse_args()
    bin_dir = kube_binaries(args.release)
    fleet_module.fresh_work_dir(args.work_dir)
    kinds = fleet_module.ONE_MDEV_TYPE if args.mdev_types == "one" else fleet_module.KINDS
    fleet = Fleet(bin_dir, args.build_dir, args.work_dir, SOURCE_DIR, args.release, args.live,
                  kinds)
    results = {"live": args.live, "cost": {}, "schedule": [], "mdev_types": args.mdev_types}
    try:
        fleet.start()
        log("control plane up")
        half, full = args.nodes // 2, args.nodes
        if args.live:
            results["startup"] = phase_startup(fleet, args.live)
            log(f"start-up: {results['startup']}")
        if args.schedule_only:
            fleet.publish(args.live, full)
        else:
            base = footprint(fleet)
            fleet.publish(args.live, half)
            results["cost"][f"{half} nodes"] = per_node_cost(base, footprint(fleet),
                                                             half - args.live)
            log(f"{half} nodes: {results['cost']}")
            results["idle"] = phase_idle(fleet, args.idle)
            log(f"idle: {results['idle']}")
            base = footprint(fleet)
            fleet.publish(half, full)
            results["cost"][f"{full} nodes"] = per_node_cost(base, footprint(fleet),
                                                             full - half)
            results["nodes_at_restart"] = full
            results["restart"] = phase_restart(fleet)
            log(f"restart: {results['restart']}")
        if args.no_schedule:
            return finish(fleet, results, args)
        profile = os.path.join(args.work_dir, f"scheduler-{full}-counters.pprof")
        results["schedule"].append(phase_schedule(fleet, args.pods, f"{full} nodes, counters",
                                                  profile))
        fleet.unpublish([n for n in fleet.published if int(n.split("-")[1]) >= half])
        results["schedule"].append(phase_schedule(fleet, args.pods, f"{half} nodes, counters"))
        # The control: the same devices without counters, the live plugins stopped so that
        # nothing republishes them.
        for node in fleet.live.values():
            node.plugin.stop()
        fleet.replace_slices(list(fleet.live) + fleet.published, counters=False)
        results["schedule"].append(phase_schedule(fleet, args.pods,
                                                  f"{half} nodes, no counters (control)"))
        fleet.publish(half, full, counters=False)
        results["schedule"].append(phase_schedule(fleet, args.pods,
                                                  f"{full} nodes, no counters (control)"))
    except BaseException:
        fleet.stop(keep_files=True)
        raise
    return finish(fleet, results, args)


def finish(fleet, results, args):
    fleet.stop(keep_files=True)
    print(table(results), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
