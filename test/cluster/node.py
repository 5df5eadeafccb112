"""A test node against the real control plane: its Node object, the plugin, and a kubelet.

The node's devices are a simulated sysfs tree (make-fixture), and the plugin is the shipped
command line over the simulated kernel (vfio-dra-sim-daemon), because this machine's real devices
must never be touched. The plugin authenticates exactly as the DaemonSet's pod does on a node: as
the vfio-dra-plugin ServiceAccount, with a TokenRequest bound to the DaemonSet's own Pod object on
this node, so the API server's RBAC and the node-scoped admission policies judge every write.

These nodes are fixture trees on this machine, where no kubelet may run (the real kubelet runs
in the QEMU node, test/real-node), so KubeletStandIn plays its part with the node's own
credentials (system:node:<name>): it registers the Node and renews its Lease, watches
the pods bound to the node, calls NodePrepareResources (through kubelet-sim, the project's
kubelet simulator) once a pod's claims are allocated and reserved for it, and on a pod's deletion
calls NodeUnprepareResources and then deletes the pod, as the kubelet's DRA manager and pod
worker do. It starts no containers.
"""

import datetime
import http.client
import json
import os
import shutil
import ssl
import tempfile
import subprocess
import threading
import urllib.error
import urllib.parse
import urllib.request

from control_plane import ClusterError, Fatal, Process, free_port, wait_for


# The tests' own requests, told apart from the plugin's in the audit log.
TEST_USER_AGENT = "vfio-dra-cluster-test"


def now_rfc3339(micro=False):
    t = datetime.datetime.now(datetime.timezone.utc)
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ" if micro else "%Y-%m-%dT%H:%M:%SZ")


class Rest:
    """JSON over HTTPS to the API server with one identity's bearer token (Python's stdlib)."""

    def __init__(self, server, ca_file, token):
        url = urllib.parse.urlparse(server)
        self.host, self.port = url.hostname, url.port
        self.ctx = ssl.create_default_context(cafile=ca_file)
        self.token = token

    def _connection(self, timeout):
        return http.client.HTTPSConnection(self.host, self.port, context=self.ctx, timeout=timeout)

    def request(self, method, path, body=None, content_type="application/json", timeout=30):
        conn = self._connection(timeout)
        try:
            headers = {"Authorization": f"Bearer {self.token}", "Accept": "application/json",
                       "User-Agent": TEST_USER_AGENT}
            data = None
            if body is not None:
                data = json.dumps(body).encode()
                headers["Content-Type"] = content_type
            conn.request(method, path, body=data, headers=headers)
            response = conn.getresponse()
            text = response.read().decode()
            return response.status, (json.loads(text) if text.startswith("{") else text)
        finally:
            conn.close()

    def watch(self, path, resource_version, timeout=300):
        """Yields watch events until the server ends the stream or the connection drops."""
        sep = "&" if "?" in path else "?"
        conn = self._connection(timeout)
        try:
            conn.request("GET", f"{path}{sep}watch=true&resourceVersion={resource_version}"
                         f"&timeoutSeconds={timeout - 10}",
                         headers={"Authorization": f"Bearer {self.token}",
                                  "User-Agent": TEST_USER_AGENT})
            response = conn.getresponse()
            if response.status != 200:
                raise ClusterError(f"watch {path}: HTTP {response.status}: "
                                   f"{response.read()[:300]!r}")
            while True:
                line = response.readline()
                if not line:
                    return
                yield json.loads(line)
        finally:
            conn.close()


class KubeletStandIn:
    def __init__(self, node, kubelet_sim, registrar_dir, log):
        self.node = node
        self.kubelet_sim = kubelet_sim
        self.registrar_dir = registrar_dir
        self.log = log
        self.rest = node.rest
        self.stop_event = threading.Event()
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.prepared = {}     # pod uid -> {"claims": [...], "response": {...}}
        self.unprepared = {}   # pod uid -> response
        self.errors = []       # every failed call, for the tests to assert on
        self.calls = []        # ("prepare"|"unprepare", pod uid, [claims]) in order
        self.pending = {}      # pod uid -> newest version not yet acted on
        self.held = set()      # names of pods whose prepare waits for release()
        self.held_unprepare = set()  # names of pods whose unprepare waits for release()
        self.work = threading.Condition(self.lock)
        self.threads = []

    # ---- the node's own objects ----

    def register_node(self, labels):
        name = self.node.name
        status, body = self.rest.request("POST", "/api/v1/nodes", {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name,
                                                  "kubernetes.io/os": "linux", **labels}}})
        if status not in (201, 409):
            raise ClusterError(f"creating Node {name} as system:node:{name}: {status} {body}")
        self._node_status()
        self._renew_lease(create=True)

    def _node_status(self):
        t = now_rfc3339()
        resources = {"cpu": "8", "memory": "16Gi", "pods": "110"}
        status, body = self.rest.request(
            "PATCH", f"/api/v1/nodes/{self.node.name}/status",
            {"status": {"capacity": resources, "allocatable": resources,
                        "conditions": [{"type": "Ready", "status": "True",
                                        "reason": "KubeletReady",
                                        "message": "vfio-dra test node (kubelet stand-in)",
                                        "lastHeartbeatTime": t, "lastTransitionTime": t}]}},
            content_type="application/strategic-merge-patch+json")
        if status != 200:
            raise ClusterError(f"Node {self.node.name} status: {status} {body}")

    def _renew_lease(self, create=False):
        path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{self.node.name}"
        spec = {"holderIdentity": self.node.name, "leaseDurationSeconds": 40,
                "renewTime": now_rfc3339(micro=True)}
        if create:
            status, body = self.rest.request(
                "POST", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
                {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                 "metadata": {"name": self.node.name}, "spec": spec})
            if status in (201, 409):
                return
        status, body = self.rest.request("PATCH", path, {"spec": spec},
                                         content_type="application/merge-patch+json")
        if status != 200:
            self.log(f"lease renewal for {self.node.name}: {status} {body}")

    def _heartbeat(self):
        # The node lifecycle controller taints a node whose Lease is not renewed within 40 s.
        while not self.stop_event.wait(10):
            try:
                self._renew_lease()
            except OSError as error:  # the API server may be restarting
                self.log(f"lease renewal: {error}")

    # ---- pods ----

    def _claims_of(self, pod):
        """(namespace, name, uid) of the pod's claims once all are allocated and reserved for it,
        else None (the scheduler has not finished with them yet)."""
        ns = pod["metadata"]["namespace"]
        statuses = {s["name"]: s.get("resourceClaimName")
                    for s in pod.get("status", {}).get("resourceClaimStatuses", [])}
        claims = []
        for entry in pod["spec"].get("resourceClaims", []):
            name = entry.get("resourceClaimName") or statuses.get(entry["name"])
            if not name:
                return None
            status, claim = self.rest.request(
                "GET", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}")
            if status != 200:
                return None
            reserved = [r.get("uid") for r in claim.get("status", {}).get("reservedFor", [])]
            if not claim.get("status", {}).get("allocation") or pod["metadata"]["uid"] not in reserved:
                return None
            claims.append((ns, name, claim["metadata"]["uid"]))
        return claims

    def _call(self, verb, pod_uid, claims):
        args = [self.kubelet_sim, verb, "--registrar-dir", self.registrar_dir]
        for ns, name, uid in claims:
            args += ["--claim", f"{ns}/{name}/{uid}"]
        result = subprocess.run(args, capture_output=True, text=True, timeout=120)
        with self.lock:
            self.calls.append((verb, pod_uid, claims))
        if result.returncode != 0:
            return None, f"kubelet-sim {verb} failed: {result.stderr.strip()}"
        response = json.loads(result.stdout)
        errors = [f"{uid}: {c['error']}" for uid, c in response.get("claims", {}).items()
                  if c.get("error")]
        return response, "; ".join(errors)

    def _sync_pod(self, pod):
        uid = pod["metadata"]["uid"]
        if pod["metadata"].get("deletionTimestamp"):
            return self._terminate(pod)
        if not pod["spec"].get("resourceClaims"):
            return True
        with self.lock:
            if uid in self.prepared:
                return True
            if pod["metadata"]["name"] in self.held:
                return False
        claims = self._claims_of(pod)
        if claims is None:
            return False
        response, error = self._call("prepare", uid, claims)
        with self.lock:
            if error:
                return self._failed("NodePrepareResources", pod, error)
            self.prepared[uid] = {"claims": claims, "response": response}
            self.changed.notify_all()
        return True

    def _failed(self, call, pod, error):
        """Records a failed call (lock held); the pod is tried again, as the kubelet does."""
        self.errors.append((call, pod["metadata"]["uid"], error))
        self.log(f"{call} for pod {pod['metadata']['name']}: {error}")
        self.changed.notify_all()
        return False

    def _terminate(self, pod):
        uid = pod["metadata"]["uid"]
        with self.lock:
            entry = self.prepared.get(uid)
            if entry is not None and pod["metadata"]["name"] in self.held_unprepare:
                return False
        if entry is not None:
            response, error = self._call("unprepare", uid, entry["claims"])
            with self.lock:
                if error:
                    return self._failed("NodeUnprepareResources", pod, error)
                del self.prepared[uid]
                self.unprepared[uid] = response
                self.changed.notify_all()
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        status, body = self.rest.request(
            "DELETE", f"/api/v1/namespaces/{ns}/pods/{name}",
            {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0,
             "preconditions": {"uid": uid}})
        if status not in (200, 404, 409):
            self.log(f"deleting pod {ns}/{name}: {status} {body}")
            return False
        return True

    def _watch_pods(self):
        """Lists and watches the node's pods into self.pending; the worker acts on them."""
        path = ("/api/v1/pods?fieldSelector=" +
                urllib.parse.quote(f"spec.nodeName={self.node.name}"))
        while not self.stop_event.is_set():
            try:
                status, listing = self.rest.request("GET", path)
                if status != 200:
                    raise ClusterError(f"listing pods: {status} {listing}")
                with self.lock:
                    for pod in listing["items"]:
                        self.pending[pod["metadata"]["uid"]] = pod
                    self.work.notify_all()
                for event in self.rest.watch(path, listing["metadata"]["resourceVersion"]):
                    if self.stop_event.is_set() or event["type"] == "ERROR":
                        break
                    pod = event["object"]
                    if event["type"] == "DELETED":
                        # Deleted without the kubelet's part (forced): unprepare what was prepared.
                        pod["metadata"].setdefault("deletionTimestamp", now_rfc3339())
                    with self.lock:
                        self.pending[pod["metadata"]["uid"]] = pod
                        self.work.notify_all()
            except (OSError, ClusterError, http.client.HTTPException, ValueError) as error:
                # The API server restarts in some tests: list and watch again.
                self.log(f"pod watch: {error}")
                self.stop_event.wait(0.5)

    def _worker(self):
        """Acts on pending pods one at a time, as the kubelet's pod worker does; a pod whose
        claims are not yet allocated and reserved is tried again after a short back-off."""
        while not self.stop_event.is_set():
            with self.lock:
                self.work.wait_for(lambda: self.pending or self.stop_event.is_set(), 0.5)
                batch = dict(self.pending)
            for uid, pod in batch.items():
                try:
                    done = self._sync_pod(pod)
                except (OSError, ClusterError, http.client.HTTPException) as error:
                    self.log(f"pod {pod['metadata'].get('name')}: {error}")
                    done = False
                with self.lock:
                    if done and self.pending.get(uid) is pod:
                        del self.pending[uid]
            if batch:
                self.stop_event.wait(0.2)

    def register_plugin(self):
        result = subprocess.run([self.kubelet_sim, "register", "--registrar-dir",
                                 self.registrar_dir], capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            raise ClusterError(f"registering the plugin on {self.node.name}: {result.stderr}")
        self.log(f"registered the plugin: {result.stdout.strip()}")

    def hold(self, pod_name):
        """Tests: do not prepare this pod's claims until release() (to order other writes)."""
        with self.lock:
            self.held.add(pod_name)

    def hold_unprepare(self, pod_name):
        """Tests: a kubelet that has not yet unprepared this pod's claims (down, or slow) when the
        pod is gone from the API server: its devices stay prepared until release()."""
        with self.lock:
            self.held_unprepare.add(pod_name)

    def release(self, pod_name):
        with self.lock:
            self.held.discard(pod_name)
            self.held_unprepare.discard(pod_name)
            self.work.notify_all()

    def start(self, labels):
        self.register_node(labels)
        for target in (self._heartbeat, self._watch_pods, self._worker):
            thread = threading.Thread(target=target, daemon=True)
            thread.start()
            self.threads.append(thread)

    def stop(self):
        self.stop_event.set()

    def _wait_in(self, table, what, pod_uid, timeout):
        with self.lock:
            if not self.changed.wait_for(lambda: pod_uid in table, timeout):
                raise ClusterError(f"pod {pod_uid} was not {what} within {timeout} s; "
                                   f"errors: {self.errors}")
            return table[pod_uid]

    def wait_prepared(self, pod_uid, timeout=120):
        return self._wait_in(self.prepared, "prepared", pod_uid, timeout)

    def wait_unprepared(self, pod_uid, timeout=120):
        return self._wait_in(self.unprepared, "unprepared", pod_uid, timeout)

class Node:
    """One test node: a fixture tree, its Node object, the plugin and the kubelet stand-in."""

    def __init__(self, cluster, name, fixture, build_dir, run_dir):
        self.cluster = cluster
        self.name = name
        self.fixture = fixture
        self.build = build_dir
        self.dir = os.path.join(run_dir, name)
        self.rest = Rest(cluster.server, cluster.ca_file, cluster.tokens[f"node-{name}"])
        self.plugin = None
        self.log_path = os.path.join(self.dir, "kubelet-standin.log")
        os.makedirs(self.dir, exist_ok=True)
        # The kubelet's directories hold unix sockets, whose paths must stay under 108 bytes:
        # they live in a short directory of their own, linked from the node's.
        self.socket_root = tempfile.mkdtemp(prefix="vdc-", dir="/tmp")
        os.symlink(self.socket_root, os.path.join(self.dir, "kubelet"))
        self.registrar_dir = os.path.join(self.socket_root, "plugins_registry")
        self.data_dir = os.path.join(self.socket_root, "plugins", "vfio.dra.io")
        self.cdi_dir = os.path.join(self.dir, "cdi")
        for d in (self.registrar_dir, self.data_dir, self.cdi_dir, os.path.join(self.dir, "dev")):
            os.makedirs(d, exist_ok=True)
        subprocess.run([os.path.join(build_dir, "test", "make-fixture"), fixture,
                        self.dir], check=True, capture_output=True)
        self.kubelet = KubeletStandIn(self, os.path.join(build_dir, "test", "kubelet-sim"),
                                      self.registrar_dir, self._log)

    def _log(self, message):
        with open(self.log_path, "a") as f:
            f.write(f"{now_rfc3339(micro=True)} {message}\n")

    def register(self):
        self.kubelet.start({"vfio-dra.io/enabled": "true"})

    def plugin_pod(self, timeout=120):
        """The DaemonSet's pod for this node, once the scheduler has bound it."""
        def bound():
            pods = self.cluster.get_json("pods", "-n", "vfio-dra", "-l",
                                         "app.kubernetes.io/name=vfio-dra-plugin",
                                         "--field-selector", f"spec.nodeName={self.name}")
            return pods["items"][0] if pods["items"] else None
        return wait_for(f"the vfio-dra-plugin DaemonSet pod on {self.name}", bound, timeout,
                        on_timeout=self.cluster.logs_tail)

    def plugin_token(self, pod):
        """What the kubelet mounts into the DaemonSet's pod: a token bound to that Pod."""
        result = self.cluster.kubectl(
            "create", "token", "vfio-dra-plugin", "-n", "vfio-dra", "--bound-object-kind", "Pod",
            "--bound-object-name", pod["metadata"]["name"],
            "--bound-object-uid", pod["metadata"]["uid"], "--duration", "2h")
        path = os.path.join(self.dir, "token")
        with open(path, "w") as f:
            f.write(result.stdout.strip())
        return path

    def start_plugin(self, extra_args=(), env=None):
        pod = self.plugin_pod()
        self.launch_plugin(pod, self.plugin_token(pod), extra_args, env)
        # The kubelet's plugin watcher registers a plugin as soon as its socket appears.
        self.kubelet.register_plugin()
        self.report_ready(pod, self.metrics_port)
        return self.plugin

    def launch_plugin(self, pod, token_file, extra_args=(), env=None):
        """Starts the plugin process as the DaemonSet's pod `pod` with its token; no waiting."""
        kubeconfig = self.cluster.kubeconfig(None, token_file=token_file)
        metrics_port = self.metrics_port = free_port()
        admin_policy = os.path.join(self.dir, "policy.yaml")
        if not os.path.exists(admin_policy):
            with open(admin_policy, "w") as f:
                f.write("version: v1\n")
        args = [os.path.join(self.build, "test", "vfio-dra-sim-daemon"), "serve",
                "--node-name", self.name, "--pod-uid", pod["metadata"]["uid"],
                "--kubeconfig", kubeconfig, "--registrar-dir", self.registrar_dir,
                "--plugin-data-dir", self.data_dir, "--cdi-dir", self.cdi_dir,
                "--sysfs-root", os.path.join(self.dir, "sys"),
                "--dev-root", os.path.join(self.dir, "dev"),
                "--pci-ids", os.path.join(self.dir, "pci.ids"),
                "--config", admin_policy,
                # Several plugins run on this one machine: each its own metrics port.
                "--metrics-address", f"127.0.0.1:{metrics_port}", *extra_args]
        self.plugin = Process(f"plugin-{self.name}", args, os.path.join(self.dir, "plugin.log"),
                              env={**os.environ, **(env or {})})
        return self.plugin

    def report_ready(self, pod, metrics_port):
        """What the kubelet reports once the container's readiness probe (/healthz) passes: the
        DaemonSet's pod Running and Ready, so the DaemonSet controller sees it available."""
        def healthy():
            if not self.plugin.alive():
                raise Fatal(f"the plugin on {self.name} exited\n{self.plugin.tail()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/healthz",
                                            timeout=5) as response:
                    return response.status == 200
            except (OSError, urllib.error.URLError):
                return False
        wait_for(f"the plugin on {self.name} to answer /healthz with 200", healthy, 120)
        t = now_rfc3339()
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        status, body = self.rest.request(
            "PATCH", f"/api/v1/namespaces/{ns}/pods/{name}/status",
            {"status": {"phase": "Running", "startTime": t,
                        "conditions": [{"type": c, "status": "True", "lastTransitionTime": t}
                                       for c in ("Initialized", "PodScheduled",
                                                 "ContainersReady", "Ready")],
                        "containerStatuses": [{
                            "name": "plugin", "ready": True, "started": True, "restartCount": 0,
                            "image": pod["spec"]["containers"][0]["image"], "imageID": "",
                            "state": {"running": {"startedAt": t}}}]}},
            content_type="application/merge-patch+json")
        if status != 200:
            raise ClusterError(f"reporting pod {ns}/{name} Ready as system:node:{self.name}: "
                               f"{status} {body}")

    def stop(self, keep_files=True):
        self.kubelet.stop()
        if self.plugin:
            self.plugin.stop()
        if not keep_files:
            shutil.rmtree(self.socket_root, ignore_errors=True)

    def slices(self):
        items = self.cluster.get_json("resourceslices", "--field-selector",
                                      f"spec.nodeName={self.name}")["items"]
        return [s for s in items if s["spec"]["driver"] == "vfio.dra.io"]
