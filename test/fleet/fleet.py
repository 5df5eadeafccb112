"""A fleet of vfio-dra nodes against one real control plane (test/fleet/README.md).

Two sorts of node, which the scheduler cannot tell apart:
- live: the shipped plugin (vfio-dra-sim-daemon over a fixture tree) as the DaemonSet's pod on
  that node, with a token bound to that pod, under the shipped RBAC and admission policies, its
  own data, CDI and socket directories (test/cluster/node.py);
- published: a Node object and the slices `vfio-dra-plugin slices -o json` renders for the same
  fixture kind, written by the admin.

The control plane is test/cluster's, with what a fleet without kubelets needs: no
node-lifecycle controller and no TaintNodesByCondition admission (no kubelet renews a Lease or
reports a condition for a published node, so both would taint every node), client rates as a
500-node cluster sets them (the defaults, 20 and 50 queries/s, would measure the controller
manager's and the scheduler's client throttles instead of the scheduler), and an audit log of
the plugin's requests only.
"""

import argparse
import concurrent.futures
import copy
import datetime
import http.client
import json
import os
import shutil
import subprocess
import sys
import threading
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "cluster"))

from control_plane import ClusterError, ControlPlane, wait_for  # noqa: E402
from node import Node, Rest  # noqa: E402

DRIVER = "vfio.dra.io"
RESOURCE = "/apis/resource.k8s.io/v1"
PLUGIN_USER = "system:serviceaccount:vfio-dra:vfio-dra-plugin"
POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
NAMESPACE = "fleet"

# Audited: the plugin's requests only, without bodies (who asked what, when).
PLUGIN_AUDIT_POLICY = f"""apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Metadata
    users: ["{PLUGIN_USER}"]
  - level: None
"""

FLEET_ARGS = {
    "kube-apiserver": ["--disable-admission-plugins=TaintNodesByCondition",
                       "--max-requests-inflight=800", "--max-mutating-requests-inflight=400"],
    "kube-controller-manager": ["--controllers=*,-node-lifecycle-controller",
                                "--kube-api-qps=5000", "--kube-api-burst=5000"],
    "kube-scheduler": ["--kube-api-qps=5000", "--kube-api-burst=5000"],
}

VGPU_VF_POLICY = """version: v1
vgpuLayouts:
  - match: {address: "0000:41:00.0"}
    vgpuType: "NVIDIA H100-20C"
    count: max
    create: onDemand
"""


class Kind:
    """A node kind: its fixture, its admin policy, and what is done to its tree before use."""

    def __init__(self, name, fixture, policy="version: v1\n", aer_fatal=()):
        self.name, self.fixture, self.policy, self.aer_fatal = name, fixture, policy, aer_fatal

    def prepare_tree(self, node_dir):
        with open(os.path.join(node_dir, "policy.yaml"), "w") as f:
            f.write(self.policy)
        # The kernel shows aer_dev_fatal from a function's enumeration on for every function with
        # the AER capability (the fixtures have none): the GPUs get theirs, as the AER driver
        # counts, one fatal error on those in aer_fatal and none on the others. The plugin's
        # probe reads the counters of the functions that had them when it listed them.
        devices = os.path.join(node_dir, "sys", "bus", "pci", "devices")
        for bdf in sorted(os.listdir(devices)):
            with open(os.path.join(devices, bdf, "class")) as f:
                if not f.read().strip().startswith("0x03"):
                    continue
            count = 1 if bdf in self.aer_fatal else 0
            with open(os.path.join(devices, bdf, "aer_dev_fatal"), "w") as f:
                f.write(f"MalfTLP {count}\nTOTAL_ERR_FATAL {count}\n")


MDEV_ONE_TYPE_POLICY = """version: v1
select:
  - {kind: mdev, mdevType: "nvidia-222"}
"""

KINDS = {
    # Eight GPUs with their audio functions; one has counted a fatal PCIe error, so it is
    # published with a NoSchedule taint the scheduler must honour.
    "passthrough": Kind("passthrough", "datacenter", aer_fatal=("0000:1b:00.0",)),
    # Three GPUs with mdev vGPUs, live instances among them, a counter set per GPU.
    "mdev": Kind("mdev", "vgpu-busy"),
    # NVIDIA vGPUs on SR-IOV VFs: one H100 offers 20C created at prepare under a counter set of 4,
    # the other runs a 40C made before.
    "vgpu-vf": Kind("vgpu-vf", "vgpu-vf", VGPU_VF_POLICY),
    "sriov": Kind("sriov", "sriov"),
}
# The layout the benchmark compares: mdev nodes offering one type (the admin's select entry, as a
# farm that runs one vGPU size per GPU model sets it) instead of every type the GPUs can create.
ONE_MDEV_TYPE = dict(KINDS, mdev=Kind("mdev", "vgpu-busy", MDEV_ONE_TYPE_POLICY))
# The fleet's mix, per ten nodes.
MIX = ["passthrough"] * 5 + ["mdev"] * 2 + ["vgpu-vf"] + ["sriov"] * 2

# The VM pods' claims: a whole GPU, a vGPU of a type (mdev and on a VF), a VF.
ATTR = 'device.attributes["vfio.dra.io"]'
TEMPLATES = {
    "gpu": ("gpu.vfio.dra.io", []),
    "mdev": ("mdev.vfio.dra.io", [f'{ATTR}.mdevType == "nvidia-222"']),
    "vgpu": ("vgpu.vfio.dra.io", [f'{ATTR}.vgpuTypeName == "NVIDIA H100-20C"']),
    "vf": ("vf.vfio.dra.io", []),
}


def kind_of(index, kinds=None):
    return (kinds or KINDS)[MIX[index % len(MIX)]]


def node_name(index):
    return f"fleet-{index:04d}"


def claim_template(name):
    device_class, selectors = TEMPLATES[name]
    request = {"deviceClassName": device_class}
    if selectors:
        request["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"spec": {"devices": {"requests": [{"name": "dev", "exactly": request}]}}}}


def vm_pod(name, template):
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"fleet": template}},
            "spec": {"containers": [{"name": "vm", "image": "registry.k8s.io/pause:3.10",
                                     "resources": {"claims": [{"name": "dev"}]}}],
                     "resourceClaims": [{"name": "dev", "resourceClaimTemplateName": template}],
                     "terminationGracePeriodSeconds": 0}}


def without_counters(slices):
    """The control: the same devices and taints, no counter sets, nothing consumed."""
    out = []
    for s in slices:
        if not s["spec"].get("devices"):
            continue  # a slice of counter sets only
        s = copy.deepcopy(s)
        s["spec"].pop("sharedCounters", None)
        for d in s["spec"]["devices"]:
            d.pop("consumesCounters", None)
        out.append(s)
    for s in out:
        s["spec"]["pool"]["resourceSliceCount"] = len(out)
    return out


class Renderer:
    """What the plugin publishes for each kind, rendered offline once, then named per node."""

    def __init__(self, build_dir, work_dir, release):
        self.build, self.dir, self.release = build_dir, work_dir, release
        self.templates = {}
        self.lock = threading.Lock()  # the publishing threads render a kind once between them

    def slices(self, kind, name, counters=True):
        with self.lock:
            if kind.name not in self.templates:
                self.templates[kind.name] = self._render(kind)
            items = self.templates[kind.name]
        text = json.dumps(items if counters else without_counters(items))
        return json.loads(text.replace("rendered-node-name", name))

    def _render(self, kind):
        node_dir = os.path.join(self.dir, "render", kind.name)
        shutil.rmtree(node_dir, ignore_errors=True)
        os.makedirs(node_dir)
        subprocess.run([os.path.join(self.build, "test", "make-fixture"), kind.fixture,
                        node_dir], check=True, capture_output=True)
        kind.prepare_tree(node_dir)
        result = subprocess.run(
            [os.path.join(self.build, "src", "vfio-dra-plugin"), "slices", "--sysfs-root",
             os.path.join(node_dir, "sys"), "--node-name", "rendered-node-name",
             "--kubernetes-version", self.release, "--pci-ids",
             os.path.join(node_dir, "pci.ids"), "--plugin-data-dir",
             os.path.join(node_dir, "data"), "--config", os.path.join(node_dir, "policy.yaml"),
             "-o", "json"], capture_output=True, text=True)
        if result.returncode != 0:
            raise ClusterError(f"vfio-dra-plugin slices for kind {kind.name}: {result.stderr}")
        return json.loads(result.stdout)["items"]


class Connections:
    """One keep-alive HTTPS connection per thread, for many small admin requests."""

    def __init__(self, cluster):
        url = urllib.parse.urlparse(cluster.server)
        self.host, self.port = url.hostname, url.port
        self.rest = Rest(cluster.server, cluster.ca_file, cluster.tokens["admin"])
        self.local = threading.local()

    def request(self, method, path, body=None, content_type="application/json"):
        """One request on this thread's connection; a dropped keep-alive connection is opened
        again, up to three attempts."""
        headers = {"Authorization": f"Bearer {self.rest.token}", "Accept": "application/json",
                   "User-Agent": "vfio-dra-fleet"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        for attempt in (1, 2, 3):
            if getattr(self.local, "conn", None) is None:
                self.local.conn = http.client.HTTPSConnection(
                    self.host, self.port, context=self.rest.ctx, timeout=60)
            try:
                self.local.conn.request(method, path, body=data, headers=headers)
                response = self.local.conn.getresponse()
                text = response.read().decode()
                return response.status, (json.loads(text) if text.startswith("{") else text)
            except (OSError, http.client.HTTPException):
                self.local.conn.close()
                self.local.conn = None
                if attempt == 3:
                    raise

    def must(self, method, path, body=None, ok=(200, 201), content_type="application/json"):
        status, answer = self.request(method, path, body, content_type)
        if status not in ok:
            raise ClusterError(f"{method} {path}: HTTP {status}: {str(answer)[:400]}")
        return answer


class Fleet:
    def __init__(self, bin_dir, build_dir, work_dir, source_dir, release, live_count,
                 kinds=None):
        self.build, self.dir, self.source, self.release = build_dir, work_dir, source_dir, release
        self.live_names = [node_name(i) for i in range(live_count)]
        self.cluster = ControlPlane(bin_dir, os.path.join(work_dir, "control-plane"), release,
                                    extra_args=FLEET_ARGS, audit_policy=PLUGIN_AUDIT_POLICY)
        self.renderer = Renderer(build_dir, work_dir, release)
        self.kinds = kinds or KINDS
        self.live = {}        # name -> Node
        self.published = []   # names of published nodes, in index order
        self.api = None
        self.pool = concurrent.futures.ThreadPoolExecutor(8)

    # ---- the control plane ----

    def start(self):
        self.cluster.start(node_names=self.live_names)
        self.api = Connections(self.cluster)
        result = self.cluster.kubectl("apply", "-k",
                                      os.path.join(self.source, "deploy", "daemonset"))
        if "Warning" in result.stderr:
            raise ClusterError(f"kubectl apply -k deploy/daemonset warned:\n{result.stderr}")
        self.api.must("POST", "/api/v1/namespaces", {
            "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        wait_for("the fleet namespace's default ServiceAccount", lambda: self.api.request(
            "GET", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/default")[0] == 200, 120)
        for name in TEMPLATES:
            self.api.must("POST", f"{RESOURCE}/namespaces/{NAMESPACE}/resourceclaimtemplates",
                          claim_template(name))

    def stop(self, keep_files=False):
        for node in self.live.values():
            node.stop(keep_files=keep_files)
        self.cluster.stop()
        self.pool.shutdown(wait=False, cancel_futures=True)

    def parallel(self, fn, items):
        """fn over items on the pool; the first failure is raised."""
        for future in [self.pool.submit(fn, item) for item in items]:
            future.result()

    # ---- live nodes ----

    def prepare_live(self, extra_args=()):
        """Fixture trees, Node objects, the DaemonSet's pods bound and their tokens: everything
        up to starting the plugins, which launch_live() does at once for all."""
        for i, name in enumerate(self.live_names):
            kind = kind_of(i, self.kinds)
            node = Node(self.cluster, name, kind.fixture, self.build, self.dir)
            kind.prepare_tree(node.dir)
            node.kind = kind
            node.kubelet.register_node({"vfio-dra.io/enabled": "true", "fleet/kind": kind.name})
            self.live[name] = node
        self.plugin_args = list(extra_args)
        pods = wait_for(f"the DaemonSet's {len(self.live)} pods bound", self._plugin_pods, 300)
        for name, node in self.live.items():
            node.pod = pods[name]
            node.token_file = node.plugin_token(pods[name])

    def _plugin_pods(self):
        pods = self.cluster.get_json("pods", "-n", "vfio-dra", "-l",
                                     "app.kubernetes.io/name=vfio-dra-plugin")["items"]
        by_node = {p["spec"].get("nodeName"): p for p in pods}
        return by_node if all(n in by_node for n in self.live) else None

    def launch_live(self, names=None):
        for name in names or self.live:
            node = self.live[name]
            node.launch_plugin(node.pod, node.token_file, self.plugin_args)

    def register_live(self, start_kubelets=True):
        """The kubelet's part: plugin registration, the pods Ready; then, if asked, the
        stand-in prepares and unprepares the claims of pods bound to the node."""
        def one(node):
            node.kubelet.register_plugin()
            node.report_ready(node.pod, node.metrics_port)
        self.parallel(one, self.live.values())
        if start_kubelets:
            for node in self.live.values():
                node.kubelet.start({"vfio-dra.io/enabled": "true", "fleet/kind": node.kind.name})

    def expected_live_slices(self, name):
        node = self.live[name]
        return self.renderer.slices(node.kind, name)

    def slices_of(self, name):
        answer = self.api.must("GET", f"{RESOURCE}/resourceslices?fieldSelector=" +
                               urllib.parse.quote(f"spec.nodeName={name}"))
        return [s for s in answer["items"] if s["spec"]["driver"] == DRIVER]

    def all_slices(self):
        return self.api.must("GET", f"{RESOURCE}/resourceslices")["items"]

    def live_published(self):
        """Names of live nodes whose slices are all on the server, as rendered offline."""
        counts = {}
        for s in self.all_slices():
            node = s["spec"].get("nodeName")
            if node in self.live:
                counts.setdefault(node, set()).add(
                    tuple(sorted(d["name"] for d in s["spec"].get("devices", []))))
        done = []
        for name in self.live:
            want = {tuple(sorted(d["name"] for d in s["spec"].get("devices", [])))
                    for s in self.expected_live_slices(name)}
            if counts.get(name) == want:
                done.append(name)
        return done

    # ---- published nodes ----

    def node_object(self, name, kind):
        return {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name,
                                                      "kubernetes.io/os": "linux",
                                                      "fleet/kind": kind.name}}}

    def _publish_one(self, index, counters):
        name, kind = node_name(index), kind_of(index, self.kinds)
        status, answer = self.api.request("POST", "/api/v1/nodes", self.node_object(name, kind))
        if status not in (201, 409):
            raise ClusterError(f"creating Node {name}: {status} {str(answer)[:300]}")
        resources = {"cpu": "64", "memory": "512Gi", "pods": "110"}
        self.api.must("PATCH", f"/api/v1/nodes/{name}/status",
                      {"status": {"capacity": resources, "allocatable": resources,
                                  "conditions": [{"type": "Ready", "status": "True",
                                                  "reason": "KubeletReady",
                                                  "message": "fleet node without a kubelet"}]}},
                      content_type="application/merge-patch+json")
        for s in self.renderer.slices(kind, name, counters):
            self.api.must("POST", f"{RESOURCE}/resourceslices", s)

    def publish(self, first, last, counters=True):
        """Published nodes with indexes [first, last): Node objects and their slices."""
        indexes = range(first, last)
        self.parallel(lambda i: self._publish_one(i, counters), indexes)
        self.published += [node_name(i) for i in indexes]

    def unpublish(self, names):
        def one(name):
            self.api.must("DELETE", f"{RESOURCE}/resourceslices?fieldSelector=" +
                          urllib.parse.quote(f"spec.nodeName={name}"))
            self.api.must("DELETE", f"/api/v1/nodes/{name}", ok=(200, 404))
        self.parallel(one, names)
        self.published = [n for n in self.published if n not in set(names)]

    def replace_slices(self, names, counters):
        """The admin republishes these nodes' slices with or without counters."""
        def one(name):
            self.api.must("DELETE", f"{RESOURCE}/resourceslices?fieldSelector=" +
                          urllib.parse.quote(f"spec.nodeName={name}"))
            index = int(name.split("-")[1])
            for s in self.renderer.slices(kind_of(index, self.kinds), name, counters):
                self.api.must("POST", f"{RESOURCE}/resourceslices", s)
        self.parallel(one, names)

    # ---- the audit log: the plugin's requests, per instance ----

    def plugin_requests(self, since=0.0, until=None):
        """(time, pod name, verb, resource, code, uri) of the plugin's audited requests."""
        out = []
        path = os.path.join(self.cluster.dir, "audit.log")
        with open(path) as f:
            for line in f:
                event = json.loads(line)
                # A watch is logged when its response starts (it completes only when it ends);
                # every other request when it completes.
                wanted = "ResponseStarted" if event.get("verb") == "watch" else "ResponseComplete"
                if event.get("stage") != wanted:
                    continue
                user = event.get("user", {})
                if user.get("username") != PLUGIN_USER:
                    continue
                t = rfc3339_micro(event["requestReceivedTimestamp"])
                if t < since or (until is not None and t > until):
                    continue
                pod = (user.get("extra", {}).get(POD_NAME_EXTRA) or ["?"])[0]
                ref = event.get("objectRef", {})
                out.append((t, pod, event["verb"], ref.get("resource", ""),
                            event.get("responseStatus", {}).get("code"), event["requestURI"]))
        return out

    def pod_to_node(self):
        return {node.pod["metadata"]["name"]: name for name, node in self.live.items()}


def rfc3339_micro(text):
    return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(
        tzinfo=datetime.timezone.utc).timestamp()


def argument_parser(live):
    """The options the smoke and the benchmark share; `live`: the default number of plugins."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--release", default="1.37")
    parser.add_argument("--build-dir", required=True)
    parser.add_argument("--work-dir", required=True, help="emptied first")
    parser.add_argument("--live", type=int, default=live, help="plugins that run")
    return parser


def fresh_work_dir(path):
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
