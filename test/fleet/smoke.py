#!/usr/bin/env python3
"""The fleet smoke (CTest fleet_smoke): correctness at scale, asserted against the real
scheduler, controller manager and API server, with live plugins and published nodes.

  smoke.py --release 1.37 --build-dir BUILD --work-dir DIR [--live 20] [--nodes 200]

1. Every live plugin publishes what `vfio-dra-plugin slices` renders for its node.
2. VM pods for every template up to what the slices admit, and three more vGPU pods than they
   admit: every admitted pod is scheduled, the three stay Pending with the scheduler's DRA
   reason; no device is allocated twice, no whole GPU beside its vGPUs, no counter set over its
   capacity; the live nodes' stand-ins prepare every claim bound to them without an error.
3. Republished while claims are allocated (a fatal PCIe error taints an allocated GPU; a policy
   change that deselects allocated GPUs; an instance restarted; the VF count of a vGPU node's
   other GPU changed): no allocated device is dropped or changes what it consumes, and the
   allocations still fit the slices.
4. Every pod deleted: every claim unprepared and gone; the same demand is scheduled again in full
   (every counter set is whole again).
"""

import os
import shutil
import subprocess
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(os.path.dirname(HERE), "cluster")]

import capacity  # noqa: E402
import workload  # noqa: E402
import fleet as fleet_module  # noqa: E402
from fleet import Fleet  # noqa: E402
from control_plane import ClusterError, wait_for  # noqa: E402
from run import SOURCE_DIR, kube_binaries  # noqa: E402


def check(condition, message):
    if not condition:
        raise ClusterError(message)


def demand(slices, extra_vgpu=0):
    counts = {t: capacity.admits(slices, t) for t in capacity.MATCH}
    counts["vgpu"] += extra_vgpu
    return counts


def settled_slices(fleet):
    """Every pool complete at its newest generation (a republish finished)."""
    return wait_for("every pool complete", lambda: workload.complete_pools(fleet.all_slices()),
                    120)


def assert_allocations(fleet, label):
    problems = workload.allocation_problems(workload.list_claims(fleet), settled_slices(fleet))
    check(not problems, f"{label}: the allocations contradict the slices:\n" +
          "\n".join(problems[:20]))


def assert_live_prepared(fleet):
    """Every pod bound to a live node was prepared by its stand-in, without a failed call."""
    pods = fleet.api.must("GET", "/api/v1/namespaces/fleet/pods")["items"]
    for pod in pods:
        node = fleet.live.get(pod["spec"].get("nodeName"))
        if node is not None:
            node.kubelet.wait_prepared(pod["metadata"]["uid"], timeout=300)
    errors = [(n, e) for n, node in fleet.live.items() for e in node.kubelet.errors]
    check(not errors, f"kubelet calls failed: {errors[:5]}")
    return sum(1 for p in pods if p["spec"].get("nodeName") in fleet.live)


def device_states(fleet, keys):
    devices, _ = workload.device_index(settled_slices(fleet))
    return {k: (devices[k].get("consumesCounters") if k in devices else "DROPPED") for k in keys}


def republish(fleet):
    """The three republishes of item 3, each on a live node with allocated devices."""
    claims = workload.list_claims(fleet)
    held = workload.allocated(claims)
    before = device_states(fleet, held)
    live_held = {}
    for pool, device in held:
        if pool in fleet.live:
            live_held.setdefault(pool, []).append(device)
    passthrough = [n for n in fleet.live if fleet.live[n].kind.name == "passthrough" and
                   any(d.startswith("gpu-") for d in live_held.get(n, []))]
    check(len(passthrough) >= 2, f"need two live passthrough nodes with allocated GPUs: "
          f"{sorted(live_held)}")
    devices, _ = workload.device_index(settled_slices(fleet))

    # A fatal PCIe error counted on an allocated GPU: the plugin taints it, nothing else.
    first = fleet.live[passthrough[0]]
    gpu = next(d for d in live_held[first.name] if d.startswith("gpu-"))
    bdf = workload.attribute(devices[(first.name, gpu)], "resource.kubernetes.io/pciBusID")
    path = os.path.join(first.dir, "sys", "bus", "pci", "devices", bdf, "aer_dev_fatal")
    with open(path + ".new", "w") as f:
        f.write("MalfTLP 1\nTOTAL_ERR_FATAL 1\n")
    os.replace(path + ".new", path)

    def tainted():
        for s in fleet.slices_of(first.name):
            for d in s["spec"].get("devices", []):
                if d["name"] == gpu and d.get("taints"):
                    return True
        return False
    wait_for(f"the plugin on {first.name} to taint allocated {gpu}", tainted, 120)
    print(f"republish 1: {first.name}/{gpu} (allocated) tainted aer-fatal")

    # A policy change deselects every GPU but one free one; the instance restarts with it.
    second = fleet.live[passthrough[1]]
    free = sorted(workload.attribute(d, "resource.kubernetes.io/pciBusID")
                  for (pool, name), d in devices.items()
                  if pool == second.name and name.startswith("gpu-") and
                  name not in live_held[second.name])
    keep = free[0] if free else "0000:00:00.0"
    with open(os.path.join(second.dir, "policy.yaml"), "w") as f:
        f.write(f'version: v1\nselect:\n  - {{kind: gpu, address: "{keep}"}}\n')
    restart(fleet, second)
    print(f"republish 2: {second.name} restarted with a policy that selects only {keep}")

    # An instance restarted with nothing changed (a rolling update).
    # vGPU nodes first: their allocated devices came to exist at prepare.
    others = sorted((n for n in live_held if n not in (first.name, second.name)),
                    key=lambda n: fleet.live[n].kind.name not in ("mdev", "vgpu-vf"))
    if others:
        restart(fleet, fleet.live[others[0]])
        print(f"republish 3: {others[0]} restarted unchanged")
    # The VF count of a vGPU node's other GPU changes (2 -> 0 -> 4, as the kernel wants it done)
    # while its first GPU's vGPUs are allocated: the 40C made before goes with its VF.
    vgpu_node = next(fleet.live[n] for n in live_held if fleet.live[n].kind.name == "vgpu-vf")
    for count in ("0", "4"):
        sim_sysfs_write(fleet, vgpu_node, "bus/pci/devices/0000:c1:00.0/sriov_numvfs", count)

    def vf_gone():
        return all(d["name"] != "vgpu-0000-c1-00-4-1415" for s in fleet.slices_of(vgpu_node.name)
                   for d in s["spec"].get("devices", []))
    wait_for(f"the plugin on {vgpu_node.name} to republish after the VF count change", vf_gone,
             120)
    print(f"republish 4: {vgpu_node.name}'s 0000:c1:00.0 from 2 VFs to 4")
    wait_for("every live plugin's slices settled", lambda: settled(fleet, before), 120)
    after = device_states(fleet, held)
    changed = {k: (before[k], after[k]) for k in held if before[k] != after[k]}
    check(not changed, f"allocated devices dropped or changed by a republish: {changed}")
    assert_allocations(fleet, "after the republishes")
    print(f"{len(held)} allocated devices kept as they were through the republishes")


def sim_sysfs_write(fleet, node, path, value):
    """What `echo value > path` does on the node, through the simulated kernel."""
    result = subprocess.run([os.path.join(fleet.build, "test", "sim-sysfs-write"),
                             os.path.join(node.dir, "sys"), os.path.join(node.dir, "dev"), path,
                             value], capture_output=True, text=True)
    check(result.returncode == 0, f"on {node.name}: {result.stderr}")


def settled(fleet, before):
    return device_states(fleet, before.keys()) == before


def restart(fleet, node):
    node.plugin.stop()
    node.launch_plugin(node.pod, node.token_file, fleet.plugin_args)
    node.kubelet.register_plugin()


def run_smoke(fleet, live, nodes):
    fleet.start()
    # The periodic check every 2 s instead of 30: the taint below is seen without a uevent.
    fleet.prepare_live(["--rescan-interval", "2"])
    fleet.launch_live()
    wait_for(f"{live} live plugins' slices on the server", lambda: len(
        fleet.live_published()) == live, 300)
    fleet.register_live(start_kubelets=True)
    fleet.publish(live, nodes)
    slices = fleet.all_slices()
    counts = demand(slices, extra_vgpu=3)
    print(f"{nodes} nodes ({live} live), {len(slices)} slices; demand {counts}", flush=True)

    figures, pending = workload.run_pods(fleet, counts, stall_seconds=30, label="(smoke)")
    print(f"scheduled: {workload.summary(figures)}", flush=True)
    reasons = workload.pending_reasons(fleet, pending)
    check(sorted(p["metadata"]["labels"]["fleet"] for p in pending) == ["vgpu"] * 3,
          f"expected exactly the three vGPU pods beyond capacity Pending, got {reasons}")
    check(all("cannot allocate all claims" in m for m in reasons.values()),
          f"Pending for another reason than DRA: {reasons}")
    print(f"the three pods beyond capacity stay Pending: {next(iter(reasons.values()))}")
    prepared = assert_live_prepared(fleet)
    assert_allocations(fleet, "after scheduling and preparing")
    print(f"{prepared} claims on live nodes prepared by their plugins")

    republish(fleet)

    workload.delete_all_pods(fleet)
    for node in fleet.live.values():
        wait_for(f"every claim on {node.name} unprepared", lambda n=node: not n.kubelet.prepared,
                 300)
    errors = [(n, e) for n, node in fleet.live.items() for e in node.kubelet.errors]
    check(not errors, f"kubelet calls failed: {errors[:5]}")
    again = demand(fleet.all_slices())
    figures, pending = workload.run_pods(fleet, again, seed=2, stall_seconds=30,
                                         label="(again)")
    check(not pending, f"after every pod was deleted, {len(pending)} of the same demand "
          f"{again} stay Pending: {workload.pending_reasons(fleet, pending[:5])}")
    assert_live_prepared(fleet)
    assert_allocations(fleet, "the second fill")
    print(f"the same demand scheduled again in full: {workload.summary(figures)}")
    workload.delete_all_pods(fleet)


def main():
    parser = fleet_module.argument_parser(live=20)
    parser.add_argument("--nodes", type=int, default=200)
    args = parser.parse_args()
    bin_dir = kube_binaries(args.release)
    fleet_module.fresh_work_dir(args.work_dir)
    fleet = Fleet(bin_dir, args.build_dir, args.work_dir, SOURCE_DIR, args.release, args.live)
    failed = False
    try:
        run_smoke(fleet, args.live, args.nodes)
    except Exception as error:  # every failure reported with the logs that explain it
        failed = True
        print(f"FAIL fleet smoke: {error}", file=sys.stderr)
        traceback.print_exc()
        print(fleet.cluster.logs_tail(), file=sys.stderr)
        print(f"logs kept in {args.work_dir}", file=sys.stderr)
    finally:
        fleet.stop(keep_files=failed)
    if not failed:
        print(f"PASS fleet smoke: {args.nodes} nodes, {args.live} live")
        shutil.rmtree(args.work_dir, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
