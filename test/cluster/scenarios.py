"""The cluster tests' scenarios (test/cluster/README.md). Each gets a running control plane with
deploy/daemonset applied as shipped, adds its nodes, and asserts what the real components decide:
the API server's validation, RBAC and admission, the scheduler's allocation, the controller
manager's claims. Names map to ctest tests cluster_<release>_<scenario>."""

import copy
import datetime
import json
import os
import re
import shutil
import subprocess

import yaml

from control_plane import ClusterError, Fatal, wait_for
from kubevirt import KubevirtAdmission
from kubevirt import vmi as kubevirt_vmi
from node import TEST_USER_AGENT, Node, Rest

DRIVER = "vfio.dra.io"
RESOURCE = "/apis/resource.k8s.io/v1"


class Environment:
    def __init__(self, cluster, build_dir, work_dir, source_dir, release, helm=None,
                 kubevirt=None):
        self.cluster = cluster
        self.helm = helm
        self.kubevirt = kubevirt
        self.build = build_dir
        self.dir = work_dir
        self.source = source_dir
        self.release = release
        self.nodes = []

    def kubectl(self, *args, **kwargs):
        return self.cluster.kubectl(*args, **kwargs)

    def apply_objects(self, objects, namespace="default"):
        text = "\n".join(json.dumps(o) for o in objects)
        return self.kubectl("apply", "-n", namespace, "-f", "-", input=text)

    def install(self):
        """kubectl apply -k deploy/daemonset, as the README tells an admin to install."""
        result = self.kubectl("apply", "-k", os.path.join(self.source, "deploy", "daemonset"))
        if "Warning" in result.stderr:
            raise ClusterError(f"kubectl apply -k deploy/daemonset warned:\n{result.stderr}")
        return result

    def add_node(self, name, fixture, start_plugin=True):
        node = Node(self.cluster, name, fixture, self.build, self.dir)
        self.nodes.append(node)
        node.register()
        if start_plugin:
            node.start_plugin()
        return node

    def expected_slices(self, node):
        """What the plugin publishes for the node's devices, rendered offline by the same code
        (`vfio-dra-plugin slices`)."""
        minor = self.release
        result = subprocess.run(
            [os.path.join(self.build, "src", "vfio-dra-plugin"), "slices", "--sysfs-root",
             os.path.join(node.dir, "sys"), "--node-name", node.name, "--kubernetes-version",
             minor, "--pci-ids", os.path.join(node.dir, "pci.ids"), "--plugin-data-dir",
             node.data_dir, "--config", os.path.join(node.dir, "policy.yaml"), "-o", "json"],
            capture_output=True, text=True)
        if result.returncode != 0:
            raise ClusterError(f"vfio-dra-plugin slices for {node.name}: {result.stderr}")
        data = json.loads(result.stdout)
        return data["items"] if isinstance(data, dict) and "items" in data else data

    def wait_slices_match(self, node, timeout=180):
        """Waits until the server holds exactly the node's expected slices, every field the
        plugin sent present with the value sent (nothing dropped by the server)."""
        expected = self.expected_slices(node)
        last = {}

        def matches():
            if node.plugin and not node.plugin.alive():
                raise PluginExited(f"the plugin on {node.name} exited with "
                                   f"{node.plugin.proc.returncode}\n{node.plugin.tail()}")
            actual = node.slices()
            last["diff"] = slice_differences(expected, actual)
            return not last["diff"]

        wait_for(f"{node.name}'s slices on the API server to match what the plugin sends",
                 matches, timeout, on_timeout=lambda: "\n".join(last.get("diff", [])[:20]))
        return node.slices()


class PluginExited(Fatal):
    pass


# ---- comparing slices ----

def missing_fields(sent, stored, path=""):
    """Fields of `sent` that `stored` lacks or holds with another value."""
    if isinstance(sent, dict):
        if not isinstance(stored, dict):
            return [f"{path}: sent an object, stored {stored!r}"]
        out = []
        for key, value in sent.items():
            if key not in stored:
                out.append(f"{path}.{key}: sent {json.dumps(value)[:120]}, dropped by the server")
            else:
                out += missing_fields(value, stored[key], f"{path}.{key}")
        return out
    if isinstance(sent, list):
        if not isinstance(stored, list) or len(sent) != len(stored):
            return [f"{path}: sent {len(sent)} entries, stored {json.dumps(stored)[:120]}"]
        out = []
        for i, (a, b) in enumerate(zip(sent, stored)):
            out += missing_fields(a, b, f"{path}[{i}]")
        return out
    return [] if sent == stored else [f"{path}: sent {sent!r}, stored {stored!r}"]


def slice_key(s):
    spec = s["spec"]
    return (tuple(sorted(d["name"] for d in spec.get("devices", []))),
            tuple(sorted(c["name"] for c in spec.get("sharedCounters", []))))


def slice_differences(expected, actual):
    by_key = {slice_key(s): s for s in actual}
    out = []
    if len(expected) != len(actual):
        out.append(f"expected {len(expected)} slices, the server holds {len(actual)}")
    for s in expected:
        stored = by_key.get(slice_key(s))
        if stored is None:
            out.append(f"no slice on the server holds devices {slice_key(s)[0][:5]}... "
                       f"counter sets {slice_key(s)[1]}")
            continue
        spec = copy.deepcopy(s["spec"])
        spec.get("pool", {}).pop("generation", None)  # moves on with every republish
        out += missing_fields(spec, stored["spec"], f"slice {stored['metadata']['name']} .spec")
        for key in ("labels", "annotations"):
            out += missing_fields(s.get("metadata", {}).get(key, {}),
                                  stored["metadata"].get(key, {}), f".metadata.{key}")
    return out


def devices_by_type(slices):
    out = {}
    for s in slices:
        for d in s["spec"].get("devices", []):
            kind = d.get("attributes", {}).get("type", {}).get("string")
            out.setdefault(kind, []).append(d)
    return out


# ---- pods and claims ----

def claim_template(name, device_class, selectors=(), count=None):
    request = {"deviceClassName": device_class}
    if selectors:
        request["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    if count:
        request["allocationMode"] = "ExactCount"
        request["count"] = count
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name},
            "spec": {"spec": {"devices": {"requests": [{"name": "dev", "exactly": request}]}}}}


def pod_with_claim(name, template, node=None, claim=None):
    """A pod with one claim "dev": made from `template`, or the named ResourceClaim `claim`."""
    source = {"resourceClaimName": claim} if claim else {"resourceClaimTemplateName": template}
    spec = {"containers": [{"name": "vm", "image": "registry.k8s.io/pause:3.10",
                            "resources": {"claims": [{"name": "dev"}]}}],
            "resourceClaims": [{"name": "dev", **source}],
            "terminationGracePeriodSeconds": 1}
    if node:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def get_pod(env, name, namespace="default"):
    return env.cluster.get_json("pod", name, "-n", namespace)


def pod_claim(env, pod, namespace="default"):
    named = pod["spec"].get("resourceClaims", [{}])[0].get("resourceClaimName")
    statuses = pod.get("status", {}).get("resourceClaimStatuses", [])
    if not named and not statuses:
        return None
    return env.cluster.get_json("resourceclaim", named or statuses[0]["resourceClaimName"], "-n",
                                namespace)


def wait_scheduled(env, name, timeout=120):
    def scheduled():
        pod = get_pod(env, name)
        return pod if pod["spec"].get("nodeName") else None
    return wait_for(f"pod {name} to be scheduled", scheduled, timeout,
                    on_timeout=lambda: json.dumps(get_pod(env, name).get("status"), indent=1))


def wait_unschedulable(env, name, timeout=120):
    def unschedulable():
        pod = get_pod(env, name)
        for c in pod.get("status", {}).get("conditions", []):
            if c["type"] == "PodScheduled" and c["status"] == "False" and \
                    c.get("reason") == "Unschedulable":
                return c
        return None
    return wait_for(f"the scheduler to report pod {name} unschedulable", unschedulable, timeout)


def expect_pending(env, *pods):
    """Each pod stays Pending because the scheduler cannot allocate its claims."""
    for name in pods:
        condition = wait_unschedulable(env, name)
        if "cannot allocate all claims" not in condition.get("message", ""):
            raise ClusterError(f"pod {name} is Pending for another reason: {condition}")
        print(f"pod {name} stays Pending: {condition['message']}")


def allocated_devices(claim):
    return [(r["driver"], r["pool"], r["device"])
            for r in claim["status"]["allocation"]["devices"]["results"]]


def delete_pod_and_wait_gone(env, node, name):
    pod = get_pod(env, name)
    env.kubectl("delete", "pod", name, "--wait=false")
    with node.kubelet.lock:
        was_prepared = pod["metadata"]["uid"] in node.kubelet.prepared
    if was_prepared:
        node.kubelet.wait_unprepared(pod["metadata"]["uid"])
    wait_for(f"pod {name} to be gone", lambda: env.kubectl(
        "get", "pod", name, check=False).returncode != 0, 120)


# ---- scenarios ----

def scenario_install(env):
    """Item 1: the manifests as shipped, the admission policies' type checking, the examples."""
    env.install()
    for policy in ("vfio-dra-own-node-slices", "vfio-dra-own-node-claim-status"):
        def checked():
            p = env.cluster.get_json("validatingadmissionpolicy", policy)
            status = p.get("status", {})
            if status.get("observedGeneration") != p["metadata"]["generation"]:
                return None
            return status
        status = wait_for(f"type checking of ValidatingAdmissionPolicy {policy}", checked, 60)
        warnings = status.get("typeChecking", {}).get("expressionWarnings", [])
        if warnings:
            raise ClusterError(f"ValidatingAdmissionPolicy {policy}: type checking warned: "
                               f"{json.dumps(warnings, indent=1)}")
        for condition in status.get("conditions", []):
            if condition.get("status") != "True":
                raise ClusterError(f"ValidatingAdmissionPolicy {policy}: {condition}")
    classes = {c["metadata"]["name"] for c in env.cluster.get_json("deviceclasses")["items"]}
    for name in ("gpu.vfio.dra.io", "mdev.vfio.dra.io", "vf.vfio.dra.io", "hostdev.vfio.dra.io",
                 "vgpu.vfio.dra.io"):
        if name not in classes:
            raise ClusterError(f"DeviceClass {name} missing after kubectl apply -k")
    check_examples(env)


# The KubeVirt feature gates the examples say they need (each example's header comment).
EXAMPLE_GATES = ["GPUsWithDRA", "HostDevicesWithDRA", "NetworkDevicesWithDRA"]


def dry_run_example(env, path):
    """kubectl apply --dry-run=server of one example: (accepted lines, refused lines)."""
    result = env.kubectl("apply", "--dry-run=server", "-f", path, check=False)
    accepted, refused = [], []
    for line in (result.stderr + result.stdout).splitlines():
        if not line.strip():
            continue
        if re.search(r"(created|configured|unchanged) \(server dry run\)", line):
            accepted.append(line.strip())
        else:
            refused.append(line.strip())
    return accepted, refused


def check_examples(env):
    """Every object of every example is accepted: the resource.k8s.io ones by the API server, the
    VirtualMachineInstances by KubeVirt's CRD schema and its admission checks (test/cluster/
    kubevirt.py); and KubeVirt refuses what it must, so the check can fail."""
    if not env.kubevirt:
        raise ClusterError("no KubeVirt tools (run.py --kubevirt, from hack/kubevirt-binary.sh)")
    kubevirt = KubevirtAdmission(env.cluster, env.kubevirt)
    kubevirt.install_crd()
    examples = os.path.join(env.source, "deploy", "daemonset", "examples")
    names = sorted(os.listdir(examples))
    try:
        # The SR-IOV example needs NetworkDevicesWithDRA, as it says: without it KubeVirt refuses
        # its VMI and nothing else.
        kubevirt.start([g for g in EXAMPLE_GATES if g != "NetworkDevicesWithDRA"])
        accepted, refused = dry_run_example(env, os.path.join(examples, "sriov-network.yaml"))
        if len(refused) != 1 or "NetworkDevicesWithDRA" not in refused[0] or \
                any(line.startswith("virtualmachineinstance") for line in accepted):
            raise ClusterError("without NetworkDevicesWithDRA, KubeVirt should refuse only the "
                               f"SR-IOV example's VMI, naming the gate; refused: {refused}")
        print(f"without NetworkDevicesWithDRA: {refused[0]}")
        kubevirt.start(EXAMPLE_GATES)
        checked = []
        for name in names:
            accepted, refused = dry_run_example(env, os.path.join(examples, name))
            if refused:
                raise ClusterError(f"example {name} was not accepted: " + "\n".join(refused))
            if not any(line.startswith("virtualmachineinstance.kubevirt.io/") for line in accepted):
                raise ClusterError(f"example {name}: no VirtualMachineInstance was judged: {accepted}")
            checked += [f"{name}: {line}" for line in accepted]
        print("examples accepted by the API server and KubeVirt:\n  " + "\n  ".join(checked))
        if not any("resourceclaimtemplate" in k for k in checked):
            raise ClusterError("no example ResourceClaimTemplate was checked")
        # KubeVirt's schema refuses a misspelled field (kubectl asks for strict validation).
        typo = kubevirt_vmi("typo", gpus=[{"name": "gpu", "claimName": "c", "requestName": "r",
                                           "claimname": "c"}],
                            resource_claims=[{"name": "c", "resourceClaimTemplateName": "t"}])
        result = kubevirt.dry_run(typo)
        if result.returncode == 0 or "claimname" not in result.stderr:
            raise ClusterError("a VMI with the unknown field gpus[].claimname was not refused by "
                               f"KubeVirt's schema: {result.stderr}{result.stdout}")
        print(f"KubeVirt's schema refuses an unknown field: {result.stderr.strip()}")
    finally:
        kubevirt.stop()


# A vGPU node with live instances (86 devices with counters: more than 64), a DGX-like node, SR-IOV
# NICs, a VM host with an mdev parent, NVIDIA vGPUs on SR-IOV VFs, and a node with more devices
# than one slice may hold.
SLICE_FIXTURES = [("vgpu-node", "vgpu-busy"), ("dgx-node", "datacenter"),
                  ("sriov-node", "sriov"), ("vm-host", "vm-host"), ("vgpu-vf-node", "vgpu-vf"),
                  ("big-node", "large-400")]


def scenario_slices(env):
    """Item 2: on each fixture node, every slice is accepted and stored with every field sent."""
    env.install()
    for name, fixture in SLICE_FIXTURES:
        env.add_node(name, fixture)
    report = []
    for node in env.nodes:
        slices = env.wait_slices_match(node)
        devices = sum(len(s["spec"].get("devices", [])) for s in slices)
        counters = sum(len(s["spec"].get("sharedCounters", [])) for s in slices)
        for s in slices:
            n = len(s["spec"].get("devices", []))
            # 1.34's alpha layout keeps counters beside the devices; from 1.35 they have their own.
            separate = tuple(int(x) for x in env.release.split(".")) >= (1, 35)
            if separate and s["spec"].get("devices") and s["spec"].get("sharedCounters"):
                raise ClusterError(f"slice {s['metadata']['name']} mixes devices and counters")
            # From 1.35, 64 devices when any uses counters or taints; 128 otherwise (and on 1.34).
            limit = 64 if separate and any(d.get("consumesCounters") or d.get("taints")
                                           for d in s["spec"].get("devices", [])) else 128
            if n > limit:
                raise ClusterError(f"slice {s['metadata']['name']} has {n} > {limit} devices")
        report.append(f"{node.name} ({node.fixture}): {len(slices)} slices, {devices} devices, "
                      f"{counters} counter sets")
    print("\n".join(report))
    for name, least in (("vgpu-node", 65), ("big-node", 129)):
        node = next(n for n in env.nodes if n.name == name)
        if sum(len(s["spec"].get("devices", [])) for s in node.slices()) < least:
            raise ClusterError(f"{name} publishes fewer than {least} devices: the slice limits "
                               "are not exercised")


def wait_prepared_devices(env, node, pod_name):
    pod = get_pod(env, pod_name)
    entry = node.kubelet.wait_prepared(pod["metadata"]["uid"])
    claim = pod_claim(env, get_pod(env, pod_name))
    devices = allocated_devices(claim)
    answer = entry["response"]["claims"][claim["metadata"]["uid"]]
    prepared = [(DRIVER, d["pool_name"], d["device_name"]) for d in answer.get("devices", [])]
    if sorted(prepared) != sorted(devices) or not all(
            d.get("cdi_device_ids") for d in answer["devices"]):
        raise ClusterError(f"pod {pod_name}: allocated {devices}, the plugin prepared "
                           f"{json.dumps(answer)}")
    return devices


def device_attribute(slices, name, attribute, domain=DRIVER):
    for s in slices:
        for d in s["spec"].get("devices", []):
            if d["name"] == name:
                key = attribute if "/" in attribute else f"{domain}/{attribute}"
                value = d.get("attributes", {}).get(key) or d.get("attributes", {}).get(attribute)
                return None if value is None else next(iter(value.values()))
    raise ClusterError(f"device {name} is in none of the slices")


def scenario_allocation(env):
    """Item 3: the real scheduler allocates from the published slices through the shipped
    DeviceClasses, the examples' templates and the KEP-4815 counters."""
    env.install()
    # A vGPU host without live instances (so it is also allocatable whole) and another GPU.
    node = env.add_node("node1", "vm-host")
    slices = env.wait_slices_match(node)
    by_type = devices_by_type(slices)
    gpus, mdevs = by_type.get("gpu", []), by_type.get("mdev", [])
    parents = {device_attribute(slices, m["name"], "parentPciAddress") for m in mdevs}
    host = next(g for g in gpus
                if device_attribute(slices, g["name"], "resource.kubernetes.io/pciBusID")
                in parents)
    host_bdf = device_attribute(slices, host["name"], "resource.kubernetes.io/pciBusID")
    print(f"{len(gpus)} GPUs, {len(mdevs)} vGPUs; vGPU host {host['name']} ({host_bdf})")
    attr = 'device.attributes["vfio.dra.io"]'
    env.apply_objects([
        claim_template("vgpu-on-host", "mdev.vfio.dra.io",
                       [f'{attr}.parentPciAddress == "{host_bdf}"']),
        claim_template("whole-host", "gpu.vfio.dra.io",
                       [f'device.attributes["resource.kubernetes.io"].pciBusID == "{host_bdf}"']),
        claim_template("any-gpu", "gpu.vfio.dra.io"),
        claim_template("too-many", "gpu.vfio.dra.io", count=len(gpus) + 1),
        # The class selects only its own kind: a gpu-class claim for anything else stays Pending.
        claim_template("gpu-not-gpu", "gpu.vfio.dra.io", [f'{attr}.type != "gpu"']),
        claim_template("mdev-not-mdev", "mdev.vfio.dra.io", [f'{attr}.type != "mdev"']),
    ])
    # The examples' own templates, as shipped.
    examples = os.path.join(env.source, "deploy", "daemonset", "examples")
    for name in ("gpu-passthrough.yaml", "vgpu.yaml"):
        with open(os.path.join(examples, name)) as f:
            templates = [d for d in yaml.safe_load_all(f)
                         if d and d.get("kind") == "ResourceClaimTemplate"]
        env.apply_objects(templates)

    # A claim of the GPU class gets a GPU of the node.
    env.apply_objects([pod_with_claim("gpu", "any-gpu")])
    wait_scheduled(env, "gpu")
    (_, pool, device), = wait_prepared_devices(env, node, "gpu")
    if pool != "node1" or device not in {g["name"] for g in gpus}:
        raise ClusterError(f"the GPU claim got {pool}/{device}, not a GPU of node1")
    print(f"GPU claim allocated and prepared: {device}")
    delete_pod_and_wait_gone(env, node, "gpu")

    # The vGPU host whole: while it is held, none of its vGPUs.
    env.apply_objects([pod_with_claim("whole", "whole-host")])
    wait_scheduled(env, "whole")
    (_, _, device), = wait_prepared_devices(env, node, "whole")
    if device != host["name"]:
        raise ClusterError(f"the whole-GPU claim got {device}, not {host['name']}")
    env.apply_objects([pod_with_claim("vgpu", "vgpu-on-host")])
    expect_pending(env, "vgpu")
    delete_pod_and_wait_gone(env, node, "whole")

    # Once the GPU is released, the vGPU claim gets an mdev of it; now the whole GPU waits.
    wait_scheduled(env, "vgpu", timeout=180)
    (_, pool, device), = wait_prepared_devices(env, node, "vgpu")
    if device not in {m["name"] for m in mdevs} or \
            device_attribute(slices, device, "parentPciAddress") != host_bdf:
        raise ClusterError(f"the vGPU claim got {pool}/{device}, not a vGPU of {host_bdf}")
    print(f"vGPU claim allocated and prepared: {device}")
    env.apply_objects([pod_with_claim("whole-again", "whole-host"),
                       pod_with_claim("many", "too-many"),
                       pod_with_claim("gpu-not-gpu", "gpu-not-gpu"),
                       pod_with_claim("mdev-not-mdev", "mdev-not-mdev")])
    expect_pending(env, "whole-again", "many", "gpu-not-gpu", "mdev-not-mdev")

    # The vGPU goes: once unprepared and its claim released, the whole GPU is allocatable.
    delete_pod_and_wait_gone(env, node, "vgpu")
    wait_scheduled(env, "whole-again", timeout=180)
    (_, _, device), = wait_prepared_devices(env, node, "whole-again")
    if device != host["name"]:
        raise ClusterError(f"the whole-GPU claim got {device}, not {host['name']}")
    print(f"whole GPU allocated after the vGPU was released: {device}")
    for name in ("whole-again", "many", "gpu-not-gpu", "mdev-not-mdev"):
        delete_pod_and_wait_gone(env, node, name)

    # The examples select what the README says: an NVIDIA GPU, a vGPU of type nvidia-222.
    for pod, template, check in (
            ("example-gpu", "nvidia-gpu",
             lambda d: device_attribute(slices, d, "vendorID") == "10de"),
            ("example-vgpu", "vgpu-nvidia-222",
             lambda d: device_attribute(slices, d, "mdevType") == "nvidia-222")):
        env.apply_objects([pod_with_claim(pod, template)])
        wait_scheduled(env, pod, timeout=180)
        (_, _, device), = wait_prepared_devices(env, node, pod)
        if not check(device):
            raise ClusterError(f"example {pod} got {device}, which its README line excludes")
        print(f"example {pod}: {device}")
        delete_pod_and_wait_gone(env, node, pod)
    if node.kubelet.errors:
        raise ClusterError(f"kubelet calls failed: {node.kubelet.errors}")


def vm_pod_with_vf(name, mac, node=None):
    """A virt-launcher-like pod: a VF claim and KubeVirt's kubevirt.io/dra-networks MAC."""
    pod = pod_with_claim(name, "vf", node)
    pod["metadata"]["annotations"] = {"kubevirt.io/dra-networks": json.dumps(
        [{"claimName": "dev", "requestName": "dev", "mac": mac}])}
    return pod


def scenario_vgpu_vf(env):
    """NVIDIA vGPUs on SR-IOV VFs through the real scheduler, created at prepare: the policy pins
    H100-40C on an idle H100 with 4 VFs, of which the GPU holds 2. The GPU's counter set admits
    two claims; the third pod stays Pending with the scheduler's reason instead of failing on the
    node, and is allocated once one of the two is gone. The vGPUs that come to exist keep their
    names and consumption. The class selects only this kind."""
    env.install()
    gpu = "0000:41:00.0"
    node = env.add_node("node1", "vgpu-vf", start_plugin=False)
    with open(os.path.join(node.dir, "policy.yaml"), "w") as f:
        f.write(f'version: v1\nselect:\n  - {{kind: vgpu, pf: "{gpu}", vgpuType: "NVIDIA H100-40C"}}\n')
    node.start_plugin()
    slices = env.wait_slices_match(node)
    vgpus = devices_by_type(slices).get("vgpu", [])
    offered = [d for d in vgpus if d.get("consumesCounters")]
    sets = {c["name"]: c["counters"]["capacity"]["value"]
            for s in slices for c in s["spec"].get("sharedCounters", [])}
    print(f"{len(vgpus)} vGPU devices ({len(offered)} offered); counter sets {sets}")
    if len(offered) != 2 or sets != {"vgpu-gpu-0000-41-00-0": "2"}:
        raise ClusterError(f"expected 2 offered 40C on {gpu} bounded by one counter set of 2: "
                           f"{[d['name'] for d in offered]}, {sets}")
    attr = 'device.attributes["vfio.dra.io"]'
    env.apply_objects([
        claim_template("vgpu-40c", "vgpu.vfio.dra.io",
                       [f'{attr}.vgpuTypeName == "NVIDIA H100-40C"',
                        f'{attr}.parentPciAddress == "{gpu}"']),
        claim_template("vgpu-not-vgpu", "vgpu.vfio.dra.io", [f'{attr}.type != "vgpu"']),
    ])
    env.apply_objects([pod_with_claim("first", "vgpu-40c"), pod_with_claim("second", "vgpu-40c")])
    got = []
    for pod in ("first", "second"):
        wait_scheduled(env, pod)
        (_, _, device), = wait_prepared_devices(env, node, pod)
        got.append(device)
    if len(set(got)) != 2:
        raise ClusterError(f"two claims got {got}")
    print(f"the GPU's count of 40C allocated and prepared: {got}")
    env.apply_objects([pod_with_claim("third", "vgpu-40c"),
                       pod_with_claim("not-vgpu", "vgpu-not-vgpu")])
    expect_pending(env, "third", "not-vgpu")
    # Both vGPUs exist now: the same devices, each still consuming 1 of the GPU's 2.
    after = env.wait_slices_match(node)
    held = {d["name"]: d.get("consumesCounters") for d in devices_by_type(after).get("vgpu", [])
            if d["name"] in got}
    if held != {d["name"]: d.get("consumesCounters") for d in offered}:
        raise ClusterError(f"the allocated devices changed when their vGPUs came to exist: {held}")
    delete_pod_and_wait_gone(env, node, "first")
    wait_scheduled(env, "third", timeout=180)
    wait_prepared_devices(env, node, "third")
    print("the third claim was allocated once the first was gone")
    if node.kubelet.errors:
        raise ClusterError(f"kubelet calls failed: {node.kubelet.errors}")


def example_claims(env, name):
    """The resource.k8s.io objects of deploy/daemonset/examples/`name`, as shipped."""
    with open(os.path.join(env.source, "deploy", "daemonset", "examples", name)) as f:
        return [d for d in yaml.safe_load_all(f)
                if d and d.get("apiVersion", "").startswith("resource.k8s.io/")]


def scenario_hostdev_vf(env):
    """The DeviceClasses hostdev.vfio.dra.io and vf.vfio.dra.io and the examples that use them,
    as shipped, through the real scheduler on a vm-host node whose NVMe drive 0000:04:00.0 is
    opted in (its twin 0000:06:00.0 is not): hostdev-nvme.yaml's named claim gets the drive and
    sriov-network.yaml's template a VF of the Intel PF 0000:5e:00.0 (with the pod's KubeVirt MAC),
    both prepared. Each class's claim for anything but its kind, a host device the policy did not
    opt in and a VF of a vendor the node lacks stay Pending with the scheduler's reason."""
    env.install()
    node = env.add_node("node1", "vm-host", start_plugin=False)
    with open(os.path.join(node.dir, "policy.yaml"), "w") as f:
        f.write('version: v1\nselect:\n  - {kind: hostdev, address: "0000:04:00.0"}\n')
    node.start_plugin(seed_vf_settings(node))
    slices = env.wait_slices_match(node)
    attr = 'device.attributes["vfio.dra.io"]'
    env.apply_objects(example_claims(env, "hostdev-nvme.yaml") +
                      example_claims(env, "sriov-network.yaml") + [
        claim_template("hostdev-not-hostdev", "hostdev.vfio.dra.io", [f'{attr}.type != "hostdev"']),
        claim_template("vf-not-vf", "vf.vfio.dra.io", [f'{attr}.type != "vf"']),
        claim_template("nvme-not-opted-in", "hostdev.vfio.dra.io",
                       on_bus_id("0000:06:00.0")),
        claim_template("mellanox-vf", "vf.vfio.dra.io", [f'{attr}.vendorID == "15b3"'])])

    env.apply_objects([pod_with_claim("vm-with-nvme", None, claim="nvme-drive")])
    wait_scheduled(env, "vm-with-nvme")
    (_, pool, device), = wait_prepared_devices(env, node, "vm-with-nvme")
    if (pool, device) != ("node1", "hostdev-0000-04-00-0"):
        raise ClusterError(f"the hostdev-nvme example's claim got {pool}/{device}, not the "
                           "opted-in drive node1/hostdev-0000-04-00-0")
    print(f"hostdev-nvme.yaml's claim allocated and prepared: {device}")

    pod = pod_with_claim("vm-with-vf", "intel-vf")
    pod["metadata"]["annotations"] = {"kubevirt.io/dra-networks": json.dumps(
        [{"claimName": "dev", "requestName": "vf", "mac": "02:00:00:00:be:ef"}])}
    env.apply_objects([pod])
    wait_scheduled(env, "vm-with-vf")
    (_, pool, device), = wait_prepared_devices(env, node, "vm-with-vf")
    if device_attribute(slices, device, "type") != "vf" or \
            device_attribute(slices, device, "pfPciAddress") != "0000:5e:00.0":
        raise ClusterError(f"the sriov-network example's claim got {pool}/{device}, not a VF of "
                           "0000:5e:00.0")
    # The example's VfioConfig (VLAN 100, spoof checking) and the pod's MAC, set through the PF.
    bdf = device_attribute(slices, device, "resource.kubernetes.io/pciBusID")
    pf_dir = function_path(node, "0000:5e:00.0")
    index = next(n[len("virtfn"):] for n in os.listdir(pf_dir) if n.startswith("virtfn") and
                 os.path.basename(os.path.realpath(os.path.join(pf_dir, n))) == bdf)
    with open(os.path.join(node.dir, "vfnet", "0000:5e:00.0", f"vf{index}.json")) as f:
        settings = json.load(f)
    wanted = ("02:00:00:00:be:ef", 100, True)
    if (settings["mac"], settings["vlan"], settings["spoofchk"]) != wanted:
        raise ClusterError(f"VF {bdf} (vf{index}) after prepare: {settings}, not the example's "
                           "VLAN 100 with spoof checking and the pod's MAC")
    print(f"sriov-network.yaml's template allocated and prepared: {device}, VF settings {settings}")

    negatives = ["hostdev-not-hostdev", "vf-not-vf", "nvme-not-opted-in", "mellanox-vf"]
    env.apply_objects([pod_with_claim(name, name) for name in negatives])
    expect_pending(env, *negatives)
    for name in ["vm-with-nvme", "vm-with-vf"] + negatives:
        delete_pod_and_wait_gone(env, node, name)
    if node.kubelet.errors:
        raise ClusterError(f"kubelet calls failed: {node.kubelet.errors}")


def scenario_helm(env):
    """The Helm chart on the real control plane: `helm install` gives a plugin that publishes;
    `helm upgrade` with a new image rolls the DaemonSet with a surge pod (the old one stays until
    the new one is available, maxUnavailable 0); `helm uninstall` removes everything it made."""
    if not env.helm:
        raise ClusterError("no helm binary (run.py --helm, from hack/helm-binary.sh)")
    chart = os.path.join(env.source, "deploy", "helm", "vfio-dra")

    def helm(*args):
        result = subprocess.run([env.helm, *args, "--kubeconfig", env.cluster.admin_kubeconfig],
                                capture_output=True, text=True)
        if result.returncode != 0:
            raise ClusterError(f"helm {' '.join(args)} failed:\n{result.stderr}{result.stdout}")
        return result.stdout

    print(helm("install", "vfio-dra", chart).splitlines()[0])
    made = {(o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"])
            for o in yaml.safe_load_all(helm("get", "manifest", "vfio-dra")) if o}
    node = add_sriov_node(env, "node1")
    print(f"installed {len(made)} objects; node1's plugin published "
          f"{sum(len(s['spec'].get('devices', [])) for s in node.slices())} devices")
    old = node.plugin_pod()
    helm("upgrade", "vfio-dra", chart, "--set", "image.tag=0.1.1")

    def pods():
        items = env.cluster.get_json("pods", "-n", "vfio-dra", "--field-selector",
                                     "spec.nodeName=node1")["items"]
        return {p["metadata"]["name"]: p["spec"]["containers"][0]["image"] for p in items
                if not p["metadata"].get("deletionTimestamp")}
    surged = wait_for("the DaemonSet's surge pod with the new image", lambda: (
        lambda now: now if len(now) == 2 and "vfio-dra-plugin:0.1.1" in now.values() else None)(
            pods()), 120)
    if surged.get(old["metadata"]["name"]) != "vfio-dra-plugin:0.1.0":
        raise ClusterError(f"the old pod did not stay while the new one is not available: {surged}")
    print(f"helm upgrade rolled with a surge pod: {surged}")
    helm("uninstall", "vfio-dra")

    def gone():
        left = []
        for kind, namespace, name in made:
            args = ["get", kind, name] + (["-n", namespace] if namespace else [])
            if env.kubectl(*args, check=False).returncode == 0:
                left.append((kind, namespace, name))
        return not left or None
    wait_for("every object the chart made to be gone after helm uninstall", gone, 180)
    print(f"helm uninstall removed all {len(made)} objects, the namespace with its pods")


def seed_vf_settings(node):
    """The simulated PF driver's VF settings (vfio::MakeFileVfNetwork): the sriov fixture's PF
    0000:5e:00.0 with 8 VFs as a fresh PF has them."""
    vfnet = os.path.join(node.dir, "vfnet")
    pf = os.path.join(vfnet, "0000:5e:00.0")
    os.makedirs(pf, exist_ok=True)
    with open(os.path.join(pf, "netdev"), "w") as f:
        f.write("ens5f0\n")
    for i in range(8):
        with open(os.path.join(pf, f"vf{i}.json"), "w") as f:
            f.write('{"mac":"00:00:00:00:00:00","vlan":0,"qos":0,"spoofchk":true,"trust":false}')
    return ["--simulated-vf-network-dir", vfnet]


def add_sriov_node(env, name):
    node = env.add_node(name, "sriov", start_plugin=False)
    node.start_plugin(seed_vf_settings(node))
    env.wait_slices_match(node)
    return node


def scenario_vf_status(env):
    """Item 5: the Ready condition and network data the plugin applies to an SR-IOV VF claim's
    status.devices, merged by server-side apply with what another field manager set there."""
    env.install()
    node = add_sriov_node(env, "node1")
    env.apply_objects([claim_template("vf", "vf.vfio.dra.io")])
    pod = vm_pod_with_vf("virt-launcher-vm", "02:00:00:00:be:ef")
    # The kubelet stand-in holds this pod's prepare until the other manager has written.
    node.kubelet.hold("virt-launcher-vm")
    env.apply_objects([pod])
    wait_scheduled(env, "virt-launcher-vm")
    claim = pod_claim(env, get_pod(env, "virt-launcher-vm"))
    name = claim["metadata"]["name"]
    (_, pool, device), = allocated_devices(claim)
    # Another field manager (a network status controller, say) reports on the same device first.
    # The API server admits status.devices entries only for allocated devices.
    other = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": name, "namespace": "default"},
             "status": {"devices": [{"driver": DRIVER, "pool": pool, "device": device,
                                     "conditions": [{"type": "NetworkAttached", "status": "True",
                                                     "reason": "Attached", "message": "",
                                                     "lastTransitionTime": "2026-01-01T00:00:00Z"}]}]}}
    env.kubectl("apply", "--server-side", "--subresource=status", "--field-manager=network-status",
                "-f", "-", input=json.dumps(other))
    node.kubelet.release("virt-launcher-vm")
    wait_prepared_devices(env, node, "virt-launcher-vm")

    def written():
        c = env.cluster.get_json("resourceclaim", name)
        entries = c.get("status", {}).get("devices", [])
        return c if any(e.get("networkData") for e in entries) else None
    stored = wait_for("the plugin's status.devices entry", written, 120)
    print("status.devices:", json.dumps(stored["status"]["devices"], indent=1))
    entries = stored["status"]["devices"]
    if len(entries) != 1:
        raise ClusterError(f"expected one entry for {pool}/{device}: {entries}")
    ours = entries[0]
    if (ours["driver"], ours["pool"], ours["device"]) != (DRIVER, pool, device):
        raise ClusterError(f"status entry names {ours}, allocated {pool}/{device}")
    conditions = {c["type"]: c for c in ours.get("conditions", [])}
    if conditions.get("Ready", {}).get("status") != "True":
        raise ClusterError(f"no Ready=True condition in {ours}")
    if "NetworkAttached" not in conditions:
        raise ClusterError(f"the other field manager's condition is gone: {ours}")
    if ours.get("networkData", {}).get("hardwareAddress") != "02:00:00:00:be:ef":
        raise ClusterError(f"networkData is not the pod's MAC: {ours}")
    managed = env.cluster.get_json("resourceclaim", name, "--show-managed-fields")
    managers = {m["manager"] for m in managed["metadata"].get("managedFields", [])
                if m.get("subresource") == "status"}
    if not {"network-status", DRIVER} <= managers:
        raise ClusterError(f"status field managers on the claim: {managers}")
    print(f"status written by {sorted(managers)}")


def audit_events(env, user):
    events = []
    with open(os.path.join(env.cluster.dir, "audit.log")) as f:
        for line in f:
            event = json.loads(line)
            if event.get("user", {}).get("username") == user:
                events.append(event)
    return events


PLUGIN_USER = "system:serviceaccount:vfio-dra:vfio-dra-plugin"


def scenario_ownership(env):
    """Item 4: with its own token the plugin writes only what is its own, and the shipped RBAC
    is exactly enough for what it needs."""
    env.install()
    node1 = add_sriov_node(env, "node1")
    node2 = add_sriov_node(env, "node2")
    token = open(os.path.join(node1.dir, "token")).read().strip()
    plugin = Rest(env.cluster.server, env.cluster.ca_file, token)
    # A slice for another node: refused.
    theirs = node2.slices()[0]
    forged = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
              "metadata": {"generateName": "forged-"},
              "spec": {**theirs["spec"], "pool": {**theirs["spec"]["pool"], "name": "forged"}}}
    status, body = plugin.request("POST", f"{RESOURCE}/resourceslices", forged)
    # A ValidatingAdmissionPolicy's denial is 422 (Invalid) with the policy's message.
    if status not in (403, 422) or \
            "may only change ResourceSlices of its own node" not in str(body):
        raise ClusterError(f"node1's plugin creating a slice for node2: {status} {body}")
    status, body = plugin.request("DELETE", f"{RESOURCE}/resourceslices/{theirs['metadata']['name']}")
    if status not in (403, 422) or "of its own node" not in str(body):
        raise ClusterError(f"node1's plugin deleting node2's slice: {status} {body}")
    print(f"slice writes for node2 refused: {status} {body['message']}")
    # A claim allocated on node2: node1's plugin may not write its status.
    env.apply_objects([claim_template("vf", "vf.vfio.dra.io")])
    env.apply_objects([vm_pod_with_vf("on-node2", "02:00:00:00:00:02", node="node2")])
    wait_scheduled(env, "on-node2")
    wait_prepared_devices(env, node2, "on-node2")
    claim = pod_claim(env, get_pod(env, "on-node2"))
    result = claim["status"]["allocation"]["devices"]["results"][0]
    patch = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": claim["metadata"]["name"], "namespace": "default"},
             "status": {"devices": [{"driver": DRIVER, "pool": result["pool"],
                                     "device": result["device"],
                                     "networkData": {"hardwareAddress": "02:00:00:00:66:66"}}]}}
    status, body = plugin.request(
        "PATCH", f"{RESOURCE}/namespaces/default/resourceclaims/{claim['metadata']['name']}"
        "/status?fieldManager=forger&force=true", patch, content_type="application/apply-patch+yaml")
    # Refused by the server's own check (1.36+: resourceclaims/driver with associated-node: verbs,
    # which holds only for claims allocated to the token's node) or, before that, by the shipped
    # admission policy.
    if status not in (403, 422) or ("allocated to its node" not in str(body) and
                                    "arbitrary-node:patch" not in str(body)):
        raise ClusterError(f"node1's plugin writing the status of a claim on node2: {status} {body}")
    print(f"refused as it should be: {status} {body.get('message') if isinstance(body, dict) else body}")
    # The plugin's own work on node1 needs no more than the shipped RBAC: no 403 for it.
    env.apply_objects([vm_pod_with_vf("on-node1", "02:00:00:00:00:01", node="node1")])
    wait_scheduled(env, "on-node1")
    wait_prepared_devices(env, node1, "on-node1")
    own = pod_claim(env, get_pod(env, "on-node1"))
    wait_for("node1's plugin's status write", lambda: any(
        e["driver"] == DRIVER for e in env.cluster.get_json(
            "resourceclaim", own["metadata"]["name"]).get("status", {}).get("devices", [])), 120)
    delete_pod_and_wait_gone(env, node1, "on-node1")
    # Every refusal of the plugin's own requests (the forgeries above were the test's, with the
    # plugin's token but the test's user agent).
    unexpected = [e for e in audit_events(env, PLUGIN_USER)
                  if e.get("responseStatus", {}).get("code") in (401, 403, 422) and
                  e["stage"] == "ResponseComplete" and
                  not e.get("userAgent", "").startswith(TEST_USER_AGENT)]
    if unexpected:
        raise ClusterError("the plugin was refused writes it needs: " + json.dumps(
            [(e["verb"], e.get("objectRef"), e.get("responseStatus")) for e in unexpected])[:2000])
    for n in (node1, node2):
        log = open(os.path.join(n.dir, "plugin.log"), errors="replace").read()
        # A status code on its own: "403" also occurs inside UUIDs (…-403b-…).
        refusals = [line for line in log.splitlines()
                    if re.search(r"\b403\b|forbidden", line, re.IGNORECASE)]
        if refusals:
            raise ClusterError(f"the plugin on {n.name} logged a refusal:\n" +
                               "\n".join(refusals)[:2000])


def scenario_slices_true(env):
    """Item 6: the slices stay true against the real server: deleted slices come back, an API
    server restart is survived without a burst of LISTs, device changes show."""
    env.install()
    node = env.add_node("node1", "sriov", start_plugin=False)
    node.start_plugin(["--rescan-interval", "1"])
    slices = env.wait_slices_match(node)
    victim = slices[0]["metadata"]["name"]
    env.kubectl("delete", "resourceslice", victim)
    env.wait_slices_match(node)
    print(f"slice {victim} deleted by hand: re-created")
    env.kubectl("delete", "resourceslices", "--field-selector", "spec.nodeName=node1")
    env.wait_slices_match(node)
    print("all of the node's slices deleted: converged again")

    def requests(verb):
        return [e for e in audit_events(env, PLUGIN_USER)
                if e["verb"] == verb and e["stage"] in ("ResponseComplete", "ResponseStarted")
                and e.get("objectRef", {}).get("resource") == "resourceslices"]
    lists_before, watches_before = len(requests("list")), len(requests("watch"))
    env.cluster.restart_apiserver()
    env.kubectl("delete", "resourceslice", node.slices()[0]["metadata"]["name"])
    env.wait_slices_match(node)
    lists_after = len(requests("list")) - lists_before
    watches_after = len(requests("watch")) - watches_before
    print(f"API server restarted: slices converged, {lists_after} LIST and {watches_after} WATCH "
          "requests for slices by the plugin after the restart")
    if watches_after < 1:
        raise ClusterError("the plugin did not watch its slices again after the restart")
    if lists_after > 4:
        raise ClusterError(f"{lists_after} LIST requests after one API server restart")
    # A VF disappears from the node (hot-unplug) and comes back.
    sys_dir = os.path.join(node.dir, "sys")
    vfs = devices_by_type(node.slices()).get("vf", [])
    bdf = device_attribute(node.slices(), vfs[-1]["name"], "resource.kubernetes.io/pciBusID")
    link = os.path.join(sys_dir, "bus", "pci", "devices", bdf)
    target = os.readlink(link)
    os.unlink(link)
    wait_for(f"{vfs[-1]['name']} to leave the slices", lambda: vfs[-1]["name"] not in
             {d["name"] for s in node.slices() for d in s["spec"].get("devices", [])}, 120)
    os.symlink(target, link)
    env.wait_slices_match(node)
    print(f"{bdf} removed and added back: the slices followed")


# ---- device taints ----

AER_FATAL_BITS = ("Undefined", "DLP", "SDES", "TLP", "FCP", "CmpltTO", "CmpltAbrt", "UnxCmplt",
                  "RxOF", "MalfTLP", "ECRC", "UnsupReq", "ACSViol", "UncorrIntErr", "BlockedTLP",
                  "AtomicOpBlocked", "TLPBlockedErr", "PoisonTLPBlocked")


def write_aer_fatal(node, bdf, total):
    """What the kernel's AER driver shows in a function's aer_dev_fatal after `total` fatal
    errors: one "<name> <count>" line per error bit, then TOTAL_ERR_FATAL. Written to a new file
    and renamed over the old one, so the plugin never reads half of it."""
    path = os.path.join(node.dir, "sys", "bus", "pci", "devices", bdf, "aer_dev_fatal")
    lines = [f"{name} {total if name == 'MalfTLP' else 0}" for name in AER_FATAL_BITS]
    lines.append(f"TOTAL_ERR_FATAL {total}")
    with open(path + ".new", "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(path + ".new", path)
    return path


def now_seconds():
    return int(datetime.datetime.now(datetime.timezone.utc).timestamp())


def rfc3339_seconds(text):
    return int(datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(
        tzinfo=datetime.timezone.utc).timestamp())


def device_taints(node, name):
    for s in node.slices():
        for d in s["spec"].get("devices", []):
            if d["name"] == name:
                return d.get("taints", [])
    raise ClusterError(f"device {name} is in none of {node.name}'s slices")


def pod_events(env, name):
    events = env.cluster.get_json("events", "--field-selector",
                                  f"involvedObject.kind=Pod,involvedObject.name={name}")["items"]
    return [(e.get("reason"), e.get("message")) for e in events]


def scenario_taints(env):
    """Device taints (KEP-5055) through the real API server and scheduler: fatal AER errors
    counted on a GPU's function taint it <driver>/unhealthy=aer-fatal:NoSchedule in the slice as
    stored; a claim for exactly that GPU stays unallocated, and one that tolerates the taint is
    allocated and prepared (the taint is the only reason); once the count is back to 0 the taint
    is gone and the waiting claim is allocated. Nothing restarts the plugin or sends a uevent:
    its periodic check must notice the counter change on its own."""
    env.install()
    node = env.add_node("node1", "vm-host", start_plugin=False)
    # The kernel shows aer_dev_fatal from a function's enumeration on, for every function with the
    # AER capability (the fixture has none): the GPUs get theirs, with no error, before the plugin
    # starts, and the probe reads the counters of the functions that had them when it listed them.
    devices = os.path.join(node.dir, "sys", "bus", "pci", "devices")
    for bdf in sorted(os.listdir(devices)):
        with open(os.path.join(devices, bdf, "class")) as f:
            if f.read().strip().startswith("0x03"):
                write_aer_fatal(node, bdf, 0)
    # The probe checks every second instead of every 30 (the default).
    node.start_plugin(["--rescan-interval", "1"])
    slices = env.wait_slices_match(node)
    by_type = devices_by_type(slices)
    parents = {device_attribute(slices, m["name"], "parentPciAddress")
               for m in by_type.get("mdev", [])}
    gpu = next(g for g in by_type.get("gpu", [])
               if device_attribute(slices, g["name"], "resource.kubernetes.io/pciBusID")
               not in parents)
    name = gpu["name"]
    bdf = device_attribute(slices, name, "resource.kubernetes.io/pciBusID")
    if gpu.get("taints"):
        raise ClusterError(f"{name} is tainted before any error: {gpu['taints']}")
    key = f"{DRIVER}/unhealthy"

    # (1) A fatal PCIe error counted on the GPU: the plugin taints it; the server stores the taint.
    before = now_seconds()
    path = write_aer_fatal(node, bdf, 1)
    print(f"wrote TOTAL_ERR_FATAL 1 to {os.path.relpath(path, node.dir)} ({name})")

    def tainted():
        if not node.plugin.alive():
            raise PluginExited(f"the plugin exited\n{node.plugin.tail()}")
        ours = [t for t in device_taints(node, name) if t.get("key") == key]
        return ours[0] if ours else None
    taint = wait_for(
        f"{name}'s slice to carry the {key} taint (if it never comes, the plugin did not rescan "
        "after aer_dev_fatal changed: the change probe does not read it)", tainted, 150,
        on_timeout=lambda: f"taints of {name}: {device_taints(node, name)}")
    if (taint.get("value"), taint.get("effect")) != ("aer-fatal", "NoSchedule"):
        raise ClusterError(f"{name}'s taint is {taint}, not {key}=aer-fatal:NoSchedule")
    added = taint.get("timeAdded")
    if not added or not before - 5 <= rfc3339_seconds(added) <= now_seconds() + 5:
        raise ClusterError(f"{name}'s taint has timeAdded {added!r}, not the time it appeared")
    print(f"the server stores {name}'s taint: {json.dumps(taint)}")

    on_gpu = [f'device.attributes["resource.kubernetes.io"].pciBusID == "{bdf}"']
    tolerant = claim_template("tolerant", "gpu.vfio.dra.io", on_gpu)
    tolerant["spec"]["spec"]["devices"]["requests"][0]["exactly"]["tolerations"] = [
        {"key": key, "operator": "Exists", "effect": "NoSchedule"}]
    env.apply_objects([claim_template("untolerant", "gpu.vfio.dra.io", on_gpu), tolerant])
    stored = env.cluster.get_json("resourceclaimtemplate", "tolerant")
    if not stored["spec"]["spec"]["devices"]["requests"][0]["exactly"].get("tolerations"):
        raise ClusterError(f"the server dropped the request's tolerations: {stored['spec']}")

    # (2) A claim for exactly that GPU, without a toleration: the scheduler cannot allocate it.
    env.apply_objects([pod_with_claim("untolerant", "untolerant")])
    expect_pending(env, "untolerant")
    waiting = pod_claim(env, get_pod(env, "untolerant"))
    if waiting is None or waiting.get("status", {}).get("allocation"):
        raise ClusterError(f"the untolerating claim: {waiting and waiting.get('status')}")
    events = [e for e in pod_events(env, "untolerant") if e[0] == "FailedScheduling"]
    if not events or not any("cannot allocate all claims" in (m or "") for _, m in events):
        raise ClusterError(f"no FailedScheduling event for the claim: {pod_events(env, 'untolerant')}")
    print(f"pod untolerant's events: {events}")

    # (3) The same request tolerating the taint: allocated that GPU and prepared, so the taint
    # alone kept the other one out.
    env.apply_objects([pod_with_claim("tolerant", "tolerant")])
    wait_scheduled(env, "tolerant")
    (_, pool, device), = wait_prepared_devices(env, node, "tolerant")
    if (pool, device) != ("node1", name):
        raise ClusterError(f"the tolerating claim got {pool}/{device}, not node1/{name}")
    claim = pod_claim(env, get_pod(env, "tolerant"))
    result = claim["status"]["allocation"]["devices"]["results"][0]
    print(f"the tolerating claim was allocated {name} and prepared; allocation result: "
          f"{json.dumps(result)}")
    # From 1.37 (DRADeviceTaints GA) the allocation records the tolerations it relied on.
    if tuple(int(x) for x in env.release.split(".")) >= (1, 37) and \
            not any(t.get("key") == key for t in result.get("tolerations", [])):
        raise ClusterError(f"the allocation does not record the toleration: {result}")
    delete_pod_and_wait_gone(env, node, "tolerant")
    wait_for("the tolerating pod's claim to be released", lambda: not any(
        c["metadata"]["name"].startswith("tolerant-")
        for c in env.cluster.get_json("resourceclaims")["items"]), 120)
    # The GPU is free but still tainted: the untolerating pod still waits.
    pod = get_pod(env, "untolerant")
    if pod["spec"].get("nodeName") or pod_claim(env, pod).get("status", {}).get("allocation"):
        raise ClusterError("the untolerating claim was allocated the tainted GPU")

    # (4) The count back to 0: the taint goes, and the waiting claim gets the GPU.
    write_aer_fatal(node, bdf, 0)
    print(f"wrote TOTAL_ERR_FATAL 0 to {os.path.relpath(path, node.dir)}")
    wait_for(f"the {key} taint to leave {name}'s slice",
             lambda: tainted() is None, 150,
             on_timeout=lambda: f"taints of {name}: {device_taints(node, name)}")
    print(f"{name}'s taint is gone from the slice")
    wait_scheduled(env, "untolerant", timeout=300)
    (_, _, device), = wait_prepared_devices(env, node, "untolerant")
    if device != name:
        raise ClusterError(f"the untolerating claim got {device}, not {name}")
    print(f"the untolerating claim was allocated {name} once the taint was gone")
    # Released, the GPU is published as before the error: the slices match the offline render.
    delete_pod_and_wait_gone(env, node, "untolerant")
    env.wait_slices_match(node)
    if node.kubelet.errors:
        raise ClusterError(f"kubelet calls failed: {node.kubelet.errors}")


# ---- each taint cause, through the real API server and scheduler ----

def function_path(node, bdf):
    return os.path.realpath(os.path.join(node.dir, "sys", "bus", "pci", "devices", bdf))


def relink(link, target):
    """Points `link` at `target` with a relative path, as sysfs's links are."""
    if os.path.lexists(link):
        os.unlink(link)
    os.symlink(os.path.relpath(target, os.path.dirname(link)), link)


def hot_add_function(node, like, bdf, group):
    """A PCI function hot-added beside `like` (its attributes, on its driver) into IOMMU group
    `group`: linked into its group and driver first and listed on the bus last, so that no scan
    sees it without its group."""
    sys_dir = os.path.join(node.dir, "sys")
    source = function_path(node, like)
    target = os.path.join(os.path.dirname(source), bdf)
    shutil.copytree(source, target, symlinks=True)
    group_dir = os.path.join(sys_dir, "kernel", "iommu_groups", group)
    relink(os.path.join(target, "iommu_group"), group_dir)
    relink(os.path.join(group_dir, "devices", bdf), target)
    relink(os.path.join(os.path.realpath(os.path.join(target, "driver")), bdf), target)
    relink(os.path.join(sys_dir, "bus", "pci", "devices", bdf), target)


def hot_remove_function(node, bdf):
    """The kernel's removal of a function: gone from the bus, its group and its driver."""
    target = function_path(node, bdf)
    os.unlink(os.path.join(node.dir, "sys", "bus", "pci", "devices", bdf))
    for entry in (os.path.join(os.path.realpath(os.path.join(target, "iommu_group")), "devices",
                               bdf),
                  os.path.join(os.path.realpath(os.path.join(target, "driver")), bdf)):
        if os.path.lexists(entry):
            os.unlink(entry)


def bind_outside(node, bdf, driver):
    """Someone (not vfio-dra) unbinds the function and binds it to `driver`."""
    target = function_path(node, bdf)
    old = os.path.realpath(os.path.join(target, "driver"))
    os.unlink(os.path.join(old, bdf))
    new = os.path.join(node.dir, "sys", "bus", "pci", "drivers", driver)
    os.makedirs(new, exist_ok=True)
    relink(os.path.join(new, bdf), target)
    relink(os.path.join(target, "driver"), new)


def wait_taint(node, name, key, timeout=150):
    """The taint with `key` on device `name` in the slices as the server stores them."""
    def tainted():
        if not node.plugin.alive():
            raise PluginExited(f"the plugin exited\n{node.plugin.tail()}")
        ours = [t for t in device_taints(node, name) if t.get("key") == key]
        return ours[0] if ours else None
    taint = wait_for(f"{name}'s slice to carry the {key} taint", tainted, timeout,
                     on_timeout=lambda: f"taints of {name}: {device_taints(node, name)}")
    print(f"the server stores {name}'s taint: {json.dumps(taint)}")
    return taint


def expect_taint(taint, name, key, value, effect):
    if (taint.get("key"), taint.get("value"), taint.get("effect")) != (key, value, effect):
        raise ClusterError(f"{name}'s taint is {taint}, not {key}={value}:{effect}")


def tolerating(template, key):
    template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["tolerations"] = [
        {"key": key, "operator": "Exists", "effect": "NoSchedule"}]
    return template


def judge_tainted(env, node, tag, device_class, selectors, key, device):
    """The real scheduler and a NoSchedule-tainted `device`: a claim for exactly it stays Pending
    with the scheduler's DRA reason, and the same claim tolerating `key` is allocated it, so the
    taint alone kept the first out. The tolerating pod is not prepared (the plugin refuses a
    device it tainted; the scheduler's judgement is what is checked). Both pods are deleted."""
    untolerant, tolerant = f"{tag}-untolerant", f"{tag}-tolerant"
    env.apply_objects([claim_template(untolerant, device_class, selectors),
                       tolerating(claim_template(tolerant, device_class, selectors), key)])
    node.kubelet.hold(tolerant)
    env.apply_objects([pod_with_claim(untolerant, untolerant)])
    expect_pending(env, untolerant)
    env.apply_objects([pod_with_claim(tolerant, tolerant)])
    wait_scheduled(env, tolerant)
    (_, pool, got), = allocated_devices(pod_claim(env, get_pod(env, tolerant)))
    if (pool, got) != (node.name, device):
        raise ClusterError(f"the claim tolerating {key} got {pool}/{got}, not {node.name}/{device}")
    pod = get_pod(env, untolerant)
    if pod["spec"].get("nodeName") or pod_claim(env, pod).get("status", {}).get("allocation"):
        raise ClusterError(f"the claim not tolerating {key} was allocated the tainted {device}")
    print(f"{tag}: the claim tolerating {key} was allocated {device}, the other stays Pending")
    for name in (untolerant, tolerant):
        delete_pod_and_wait_gone(env, node, name)


def force_delete_unprepared(env, node, name):
    """The pod is deleted by force while the kubelet has not unprepared its claim (held): the
    claim is released on the API server, its device stays prepared on the node."""
    claim = pod_claim(env, get_pod(env, name))["metadata"]["name"]
    node.kubelet.hold_unprepare(name)
    env.kubectl("delete", "pod", name, "--grace-period=0", "--force")

    def released():
        result = env.kubectl("get", "resourceclaim", claim, "-o", "json", check=False)
        return result.returncode != 0 or not json.loads(result.stdout).get(
            "status", {}).get("allocation")
    wait_for(f"pod {name}'s claim {claim} to be released", released, 120)


def pod_on(env, node, name, template, device):
    env.apply_objects([pod_with_claim(name, template)])
    wait_scheduled(env, name)
    (_, _, got), = wait_prepared_devices(env, node, name)
    if got != device:
        raise ClusterError(f"pod {name} got {got}, not {device}")


def on_bus_id(bdf):
    return [f'device.attributes["resource.kubernetes.io"].pciBusID == "{bdf}"']


def scenario_taint_causes(env):
    """Each cause of a taint other than aer-fatal (the taints scenario) reaches the real API
    server in the slice and the real scheduler judges it, on a vm-host node whose NVMe drive
    0000:04:00.0 is opted in: group-unsafe (a host function hot-added into the GPU's IOMMU group),
    driver-changed (a prepared NVMe bound to another driver outside vfio-dra), lost (a prepared
    GPU hot-removed) each keep a device out (NoSchedule), and a PF's link going down taints its
    VFs degraded with effect None (1.35+), which the scheduler allocates anyway. A device held by
    a prepared claim is tainted only while held: its pod is deleted by force while the kubelet
    has not unprepared it, so that the API server sees the device free and the taint is the one
    thing that keeps it out."""
    env.install()
    node = env.add_node("node1", "vm-host", start_plugin=False)
    nvme, gpu, pf, vf = "0000:04:00.0", "0000:01:00.0", "0000:5e:00.0", "0000:5e:02.0"
    with open(os.path.join(node.dir, "policy.yaml"), "w") as f:
        f.write(f'version: v1\nselect:\n  - {{kind: hostdev, address: "{nvme}"}}\n')
    node.start_plugin(["--rescan-interval", "1"])
    env.wait_slices_match(node)
    gpu_dev, nvme_dev, vf_dev = "gpu-0000-01-00-0", "hostdev-0000-04-00-0", "vf-0000-5e-02-0"
    for name in (gpu_dev, nvme_dev, vf_dev):
        if device_taints(node, name):
            raise ClusterError(f"{name} is tainted before anything happened")

    # group-unsafe: a function the host uses (an NVMe drive on nvme) joins the GPU's group.
    group = os.path.basename(os.path.realpath(os.path.join(function_path(node, gpu),
                                                           "iommu_group")))
    hot_add_function(node, "0000:06:00.0", "0000:07:00.0", group)
    key = f"{DRIVER}/group-unsafe"
    expect_taint(wait_taint(node, gpu_dev, key), gpu_dev, key, "host-function-in-group",
                 "NoSchedule")
    judge_tainted(env, node, "group-unsafe", "gpu.vfio.dra.io", on_bus_id(gpu), key, gpu_dev)
    hot_remove_function(node, "0000:07:00.0")
    wait_for(f"the {key} taint to leave {gpu_dev}", lambda: not device_taints(node, gpu_dev), 150)

    # driver-changed: the NVMe, prepared for a claim, is bound to another driver.
    env.apply_objects([claim_template("nvme", "hostdev.vfio.dra.io", on_bus_id(nvme)),
                       claim_template("gpu", "gpu.vfio.dra.io", on_bus_id(gpu))])
    pod_on(env, node, "nvme-holder", "nvme", nvme_dev)
    bind_outside(node, nvme, "uio_pci_generic")
    key = f"{DRIVER}/unhealthy"
    expect_taint(wait_taint(node, nvme_dev, key), nvme_dev, key, "driver-changed", "NoSchedule")
    force_delete_unprepared(env, node, "nvme-holder")
    judge_tainted(env, node, "driver-changed", "hostdev.vfio.dra.io", on_bus_id(nvme), key,
                  nvme_dev)

    # lost: the GPU (both functions of the card), prepared for a claim, is hot-removed.
    pod_on(env, node, "gpu-holder", "gpu", gpu_dev)
    for bdf in (gpu, "0000:01:00.1"):
        hot_remove_function(node, bdf)
    key = f"{DRIVER}/lost"
    expect_taint(wait_taint(node, gpu_dev, key), gpu_dev, key, "removed", "NoSchedule")
    force_delete_unprepared(env, node, "gpu-holder")
    judge_tainted(env, node, "lost", "gpu.vfio.dra.io", on_bus_id(gpu), key, gpu_dev)

    # Effect None: the PF's link goes down. Its VFs are tainted degraded, and allocated anyway.
    netdev, = os.listdir(os.path.join(function_path(node, pf), "net"))
    with open(os.path.join(function_path(node, pf), "net", netdev, "operstate"), "w") as f:
        f.write("down\n")
    key = f"{DRIVER}/degraded"
    env.apply_objects([claim_template("degraded-vf", "vf.vfio.dra.io", on_bus_id(vf))])
    node.kubelet.hold("degraded-vf")
    if tuple(int(x) for x in env.release.split(".")) < (1, 35):
        # The server takes effect None from 1.35: before, the plugin leaves such taints out. The
        # scan that drops a VF removed after the link went down has seen the link down.
        hot_remove_function(node, "0000:5e:02.3")
        wait_for("vf-0000-5e-02-3 to leave the slices", lambda: "vf-0000-5e-02-3" not in {
            d["name"] for s in node.slices() for d in s["spec"].get("devices", [])}, 150)
        env.apply_objects([pod_with_claim("degraded-vf", "degraded-vf")])
        wait_scheduled(env, "degraded-vf")
        if device_taints(node, vf_dev):
            raise ClusterError(f"{vf_dev} has taints on {env.release}: "
                               f"{device_taints(node, vf_dev)}")
        print(f"{vf_dev} allocated; {env.release} takes no effect None, none published")
        return
    expect_taint(wait_taint(node, vf_dev, key), vf_dev, key, "pf-link-down", "None")
    env.apply_objects([pod_with_claim("degraded-vf", "degraded-vf")])
    wait_scheduled(env, "degraded-vf")
    (_, _, got), = allocated_devices(pod_claim(env, get_pod(env, "degraded-vf")))
    if got != vf_dev:
        raise ClusterError(f"the claim for {vf_dev} got {got}")
    print(f"{vf_dev}, tainted {key}=pf-link-down:None, was allocated without a toleration")


SCENARIOS = {
    "install": scenario_install,
    "slices": scenario_slices,
    "allocation": scenario_allocation,
    "vf-status": scenario_vf_status,
    "ownership": scenario_ownership,
    "slices-true": scenario_slices_true,
    "vgpu-vf": scenario_vgpu_vf,
    "helm": scenario_helm,
    "taints": scenario_taints,
    "taint-causes": scenario_taint_causes,
    "hostdev-vf": scenario_hostdev_vf,
}


def node_names(scenario):
    if scenario == "slices":
        return [n for n, _ in SLICE_FIXTURES]
    return ["node1", "node2"]
