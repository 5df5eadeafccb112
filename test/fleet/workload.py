"""VM pods through the real scheduler, measured as scheduler_perf measures them, and what the
scheduler allocated, checked against the slices.

Throughput: the scheduler's own count of scheduled pods (scheduler_schedule_attempts_total,
result="scheduled") sampled every second from the first pod's creation until the last pod is
scheduled; the figure is the average of the per-second samples, as scheduler_perf's
SchedulingThroughput "Average" is (test/integration/scheduler_perf, throughputSampleInterval 1 s).
Claim allocation latency: from the claim's ADDED event on a watch to the first event that carries
its allocation, both seen by the same watch.
"""

import json
import random
import re
import threading
import time

from control_plane import ClusterError, wait_for
from fleet import DRIVER, NAMESPACE, RESOURCE, vm_pod
from node import Rest

SCHEDULED = re.compile(
    r'^scheduler_schedule_attempts_total\{[^}]*result="scheduled"[^}]*\} (\S+)$', re.M)


def scheduled_total(cluster):
    return sum(float(v) for v in SCHEDULED.findall(cluster.metrics_text("kube-scheduler")))


def percentile(values, p):
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


class ClaimWatch(threading.Thread):
    """Watches the fleet namespace's claims: when each was first seen and first allocated."""

    def __init__(self, cluster, resource_version):
        super().__init__(daemon=True)
        self.rest = Rest(cluster.server, cluster.ca_file, cluster.tokens["admin"])
        self.rv = resource_version
        self.added, self.allocated = {}, {}
        self.stop_event = threading.Event()
        self.error = None

    def run(self):
        path = f"{RESOURCE}/namespaces/{NAMESPACE}/resourceclaims?allowWatchBookmarks=true"
        while not self.stop_event.is_set():
            try:
                for event in self.rest.watch(path, self.rv, timeout=600):
                    now = time.monotonic()
                    obj = event["object"]
                    if event["type"] == "ERROR":
                        raise ClusterError(f"claim watch: {obj}")
                    self.rv = obj["metadata"]["resourceVersion"]
                    if event["type"] == "BOOKMARK":
                        continue
                    uid = obj["metadata"]["uid"]
                    self.added.setdefault(uid, now)
                    if obj.get("status", {}).get("allocation"):
                        self.allocated.setdefault(uid, now)
                    if self.stop_event.is_set():
                        return
            except Exception as error:  # recorded: the run reports it
                self.error = error
                return

    def latencies(self):
        return [self.allocated[u] - self.added[u] for u in self.allocated if u in self.added]


def run_pods(fleet, counts, seed=1, stall_seconds=60, label=""):
    """Creates the pods of `counts` ({template: n}) as fast as the API server takes them,
    interleaved, and measures until every pod is scheduled or none was for stall_seconds.
    Returns the figures and the pods that stayed unscheduled."""
    cluster, api = fleet.cluster, fleet.api
    names = [(f"{t}-{i}", t) for t, n in counts.items() for i in range(n)]
    random.Random(seed).shuffle(names)
    claims = api.must("GET", f"{RESOURCE}/namespaces/{NAMESPACE}/resourceclaims")
    watch = ClaimWatch(cluster, claims["metadata"]["resourceVersion"])
    watch.start()
    base = scheduled_total(cluster)
    samples, done = [], threading.Event()

    def sampler():
        last = base
        while not done.wait(1.0):
            now = scheduled_total(cluster)
            samples.append(now - last)
            last = now

    sampling = threading.Thread(target=sampler, daemon=True)
    started = time.monotonic()
    sampling.start()
    fleet.parallel(lambda item: api.must(
        "POST", f"/api/v1/namespaces/{NAMESPACE}/pods", vm_pod(*item)), names)
    created = time.monotonic()
    progress = {"count": 0, "at": time.monotonic()}

    def all_scheduled():
        count = scheduled_total(cluster) - base
        if count > progress["count"]:
            progress.update(count=count, at=time.monotonic())
        if count >= len(names):
            return True
        if time.monotonic() - progress["at"] > stall_seconds:
            return "stalled"
        return False

    outcome = wait_for(f"{len(names)} pods scheduled {label}", all_scheduled, 3600)
    finished = time.monotonic()
    done.set()
    sampling.join()
    # The last partial sample: what was scheduled since the last full second.
    while samples and samples[-1] == 0:
        samples.pop()
    pods = api.must("GET", f"/api/v1/namespaces/{NAMESPACE}/pods")["items"]
    pending = [p for p in pods if not p["spec"].get("nodeName")]
    wait_for("every scheduled pod's claim allocated on the watch",
             lambda: len(watch.allocated) >= len(pods) - len(pending) or watch.error, 120)
    watch.stop_event.set()
    if watch.error:
        raise ClusterError(f"the claim watch failed: {watch.error}")
    lat = watch.latencies()
    return {
        "pods": len(names), "scheduled": len(pods) - len(pending), "outcome": outcome,
        "create_seconds": round(created - started, 1),
        "schedule_seconds": round(finished - started, 1),
        "throughput_avg": round(sum(samples) / len(samples), 1) if samples else 0.0,
        "throughput_overall": round((len(pods) - len(pending)) / (finished - started), 1),
        "claim_p50_ms": round(percentile(lat, 50) * 1000), "claim_p99_ms":
            round(percentile(lat, 99) * 1000),
        "samples": samples,
    }, pending


def delete_all_pods(fleet, timeout=900):
    """Deletes the fleet's VM pods at once (no kubelet waits on the published nodes) and waits
    until the resourceclaim controller has deleted their claims; the stand-ins of live nodes
    unprepare what they prepared."""
    api = fleet.api
    # A busy server answers a deletion of thousands of pods with 504 after its request timeout
    # (60 s) and goes on deleting: the request is made again, for what is left, until it is
    # answered in time.
    for _ in range(10):
        try:
            status, answer = api.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods",
                                         {"apiVersion": "v1", "kind": "DeleteOptions",
                                          "gracePeriodSeconds": 0})
        except OSError:  # the client's 60 s ran out first: the same as the server's 504
            continue
        if status == 200:
            break
        if status != 504:
            raise ClusterError(f"DELETE the fleet's pods: HTTP {status}: {str(answer)[:400]}")
    else:
        raise ClusterError("DELETE the fleet's pods timed out (504) ten times")

    def gone():
        pods = api.must("GET", f"/api/v1/namespaces/{NAMESPACE}/pods?limit=1")["items"]
        claims = api.must("GET", f"{RESOURCE}/namespaces/{NAMESPACE}/resourceclaims?limit=1")
        return not pods and not claims["items"]
    wait_for("the fleet's pods and their claims gone", gone, timeout)


# ---- what was allocated, against the slices ----

def device_index(slices):
    """(pool, device) -> the device, and (pool, counter set) -> its capacities."""
    devices, sets = {}, {}
    for s in slices:
        if s["spec"]["driver"] != DRIVER:
            continue
        pool = s["spec"]["pool"]["name"]
        for d in s["spec"].get("devices", []):
            devices[(pool, d["name"])] = d
        for c in s["spec"].get("sharedCounters", []):
            sets[(pool, c["name"])] = {k: int(v["value"]) for k, v in c["counters"].items()}
    return devices, sets


def attribute(device, name):
    value = device.get("attributes", {}).get(name)
    return None if value is None else next(iter(value.values()))


def allocation_problems(claims, slices):
    """Every way the allocations contradict the slices: a device twice, a whole GPU beside one of
    its vGPUs, a counter set over its capacity, a device no slice holds."""
    devices, sets = device_index(slices)
    problems, owner, used = [], {}, {}
    gpus, children = {}, {}
    for claim in claims:
        allocation = claim.get("status", {}).get("allocation")
        if not allocation:
            continue
        who = f"{claim['metadata']['namespace']}/{claim['metadata']['name']}"
        for r in allocation["devices"]["results"]:
            key = (r["pool"], r["device"])
            if key in owner:
                problems.append(f"{key} allocated to {owner[key]} and {who}")
            owner[key] = who
            device = devices.get(key)
            if device is None:
                problems.append(f"{who} holds {key}, which no slice publishes")
                continue
            for use in device.get("consumesCounters", []):
                for counter, value in use["counters"].items():
                    k = (r["pool"], use["counterSet"], counter)
                    used[k] = used.get(k, 0) + int(value["value"])
            kind = attribute(device, "type")
            if kind == "gpu":
                gpus[(r["pool"], attribute(device, "resource.kubernetes.io/pciBusID"))] = key
            elif kind in ("mdev", "vgpu"):
                children.setdefault((r["pool"], attribute(device, "parentPciAddress")),
                                    []).append(key)
    for (pool, bdf), key in gpus.items():
        if (pool, bdf) in children:
            problems.append(f"whole GPU {key} allocated beside its vGPUs {children[(pool, bdf)]}")
    for (pool, counter_set, counter), total in used.items():
        capacity = sets.get((pool, counter_set), {}).get(counter)
        if capacity is None:
            problems.append(f"{pool}: devices consume {counter_set}/{counter}, which no slice "
                            "publishes")
        elif total > capacity:
            problems.append(f"{pool}: {counter_set}/{counter} over-committed: {total} of "
                            f"{capacity}")
    return problems


def complete_pools(slices):
    """The slices of every pool at its newest generation, or None while a pool is incomplete
    (fewer slices than resourceSliceCount: a republish under way), as the scheduler sees it."""
    newest = {}
    for s in slices:
        if s["spec"]["driver"] != DRIVER:
            continue
        pool = s["spec"]["pool"]
        current = newest.get(pool["name"])
        if current is None or pool["generation"] > current[0]:
            newest[pool["name"]] = (pool["generation"], [])
        if pool["generation"] == newest[pool["name"]][0]:
            newest[pool["name"]][1].append(s)
    out = []
    for name, (_, items) in newest.items():
        if len(items) != items[0]["spec"]["pool"]["resourceSliceCount"]:
            return None
        out += items
    return out


def allocated(claims):
    """The (pool, device) of every allocated device."""
    out = set()
    for claim in claims:
        allocation = claim.get("status", {}).get("allocation")
        for r in (allocation or {}).get("devices", {}).get("results", []):
            out.add((r["pool"], r["device"]))
    return out


def list_claims(fleet):
    return fleet.api.must("GET", f"{RESOURCE}/namespaces/{NAMESPACE}/resourceclaims")["items"]


def pending_reasons(fleet, pods):
    """name -> the PodScheduled condition's message of each pod."""
    out = {}
    for pod in pods:
        name = pod["metadata"]["name"]
        current = fleet.api.must("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}")
        out[name] = next((c.get("message", "") for c in current.get("status", {}).get(
            "conditions", []) if c["type"] == "PodScheduled"), "")
    return out


def summary(figures):
    return json.dumps({k: v for k, v in figures.items() if k != "samples"})
