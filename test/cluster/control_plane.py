"""A real Kubernetes control plane on loopback, for the cluster tests.

etcd, kube-apiserver, kube-controller-manager and kube-scheduler as built by
hack/kube-binaries.sh, each its own process with its own log file in the run's directory. The
API server has its own CA and serving certificate, a service-account issuer and signing key,
Node,RBAC authorization and NodeRestriction, so what it accepts from the plugin is what a
production server accepts. Every component authenticates with a static token of its own identity
(the controller manager and the scheduler as system:kube-controller-manager and
system:kube-scheduler, the bootstrap RBAC's users; the controller manager with
--use-service-account-credentials, so its resourceclaim controller runs under its own RBAC).

Readiness is polled (/readyz, /healthz), never slept for; stop() ends the processes by PID.
"""

import json
import os
import random
import shutil
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request

# Feature gates and API versions per release. Beta features are on by default from 1.36 on; on
# 1.34 the partitionable-devices (KEP-4815 counters) and device-taint features are alpha and off,
# so they are turned on as a cluster that runs vfio-dra's vGPU support must have them.
RELEASE_SETTINGS = {
    "1.37": {
        "feature_gates": "",
        "runtime_config": "resource.k8s.io/v1beta1=true,resource.k8s.io/v1beta2=true",
    },
    "1.34": {
        "feature_gates": "DRAPartitionableDevices=true,DRADeviceTaints=true",
        # DeviceTaintRule is v1alpha3 only in 1.34; with DRADeviceTaints the controller
        # manager's taint eviction controller waits for it, and with it every informer.
        "runtime_config": "resource.k8s.io/v1beta1=true,resource.k8s.io/v1beta2=true,"
                          "resource.k8s.io/v1alpha3=true",
    },
}

# Audited, without bodies: everything the plugin's ServiceAccount asks (to find any refusal) and
# all DRA requests (to count the plugin's LISTs and writes).
AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Metadata
    users: ["system:serviceaccount:vfio-dra:vfio-dra-plugin"]
  - level: Metadata
    resources:
      - group: resource.k8s.io
        resources: ["resourceslices", "resourceclaims", "resourceclaims/status"]
  - level: None
"""


class ClusterError(Exception):
    pass


class Fatal(ClusterError):
    """A failure waiting cannot mend (a process exited): wait_for raises it at once."""


def _ephemeral_range():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(v) for v in f.read().split())
            return low, high
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def free_port():
    """A loopback port nothing listens on, from below the kernel's ephemeral range.

    A port the kernel hands out for bind(0) comes from the same range as every outgoing
    connection's source port, so between this call and the component's own bind any test's
    connection could take it (an etcd once failed so with "address already in use"). Below the
    range, only another listener chosen the same way can, which is what the random pick and the
    caller's retry (start_etcd) are for.
    """
    low, _ = _ephemeral_range()
    first = 10000 if low > 12000 else 1024
    for _ in range(200):
        port = random.randrange(first, low)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise ClusterError(f"no free loopback port in {first}-{low - 1} after 200 tries")


def wait_for(what, predicate, timeout, on_timeout=None):
    """Polls predicate until it returns a truthy value; raises ClusterError naming `what`."""
    deadline = time.monotonic() + timeout
    delay = 0.05
    last_error = None
    while True:
        try:
            value = predicate()
            if value:
                return value
        except Fatal:
            raise
        except Exception as error:  # the predicate's own failure is the reason to report
            last_error = error
        if time.monotonic() > deadline:
            detail = f" (last error: {last_error})" if last_error else ""
            if on_timeout:
                detail += "\n" + on_timeout()
            raise ClusterError(f"timed out after {timeout} s waiting for {what}{detail}")
        time.sleep(delay)
        delay = min(delay * 2, 0.5)


def run(args, **kwargs):
    return subprocess.run(args, check=True, capture_output=True, text=True, **kwargs)


def openssl(*args, cwd):
    try:
        run(["openssl", *args], cwd=cwd)
    except subprocess.CalledProcessError as error:
        raise ClusterError(f"openssl {' '.join(args)} failed: {error.stderr}") from error


class Process:
    def __init__(self, name, args, log_path, env=None):
        self.name = name
        self.args = args
        self.log_path = log_path
        self.log = open(log_path, "ab")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)

    def alive(self):
        return self.proc.poll() is None

    def tail(self, lines=30):
        try:
            with open(self.log_path, "rb") as f:
                text = f.read().decode(errors="replace").splitlines()
        except OSError:
            return ""
        return f"--- last lines of {self.log_path} ---\n" + "\n".join(text[-lines:])

    def stop(self, timeout=30):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


class ControlPlane:
    """extra_args: more flags per component name (the fleet benchmark's client rates and its
    nodes without kubelets); audit_policy: the audit policy's text instead of AUDIT_POLICY."""

    def __init__(self, bin_dir, run_dir, release, extra_args=None, audit_policy=AUDIT_POLICY):
        if release not in RELEASE_SETTINGS:
            raise ClusterError(f"no settings for Kubernetes {release} in control_plane.py")
        self.bin = bin_dir
        self.dir = run_dir
        self.release = release
        self.settings = RELEASE_SETTINGS[release]
        self.extra_args = extra_args or {}
        self.audit_policy = audit_policy
        self.pki = os.path.join(run_dir, "pki")
        self.processes = {}
        self.tokens = {}
        self.ports = {}
        self.api_port = None
        self.server = None

    # ---- certificates and identities ----

    def _make_pki(self):
        os.makedirs(self.pki, exist_ok=True)
        p = self.pki
        openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
                "-subj", "/CN=vfio-dra-test-ca", cwd=p)
        openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                "-nodes", "-keyout", "apiserver.key", "-out", "apiserver.csr",
                "-subj", "/CN=kube-apiserver", cwd=p)
        with open(os.path.join(p, "san.ext"), "w") as f:
            # 10.0.0.1: the `kubernetes` Service's ClusterIP, which pods connect to; 10.0.2.100:
            # where the real node in the VM reaches this server (test/real-node).
            f.write("subjectAltName=IP:127.0.0.1,IP:10.0.0.1,IP:10.0.2.100,DNS:localhost,"
                    "DNS:kubernetes.default.svc\n"
                    "extendedKeyUsage=serverAuth\n")
        openssl("x509", "-req", "-in", "apiserver.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                "-CAcreateserial", "-out", "apiserver.crt", "-days", "2", "-extfile", "san.ext",
                cwd=p)
        openssl("genrsa", "-out", "sa.key", "2048", cwd=p)
        openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=p)
        self.ca_file = os.path.join(p, "ca.crt")

    def _make_tokens(self, node_names):
        identities = [("admin", "admin", "system:masters"),
                      ("kcm", "system:kube-controller-manager", ""),
                      ("scheduler", "system:kube-scheduler", "")]
        identities += [(f"node-{n}", f"system:node:{n}", "system:nodes") for n in node_names]
        lines = []
        for i, (key, user, groups) in enumerate(identities):
            token = os.urandom(16).hex()
            self.tokens[key] = token
            lines.append(f'{token},{user},{1000 + i},"{groups}"')
        path = os.path.join(self.pki, "tokens.csv")
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        os.chmod(path, 0o600)
        return path

    def kubeconfig(self, key, token_file=None):
        """Writes (once) and returns a kubeconfig for identity `key`, or for a token file."""
        if token_file is None:
            path = os.path.join(self.dir, f"{key}.kubeconfig")
        else:  # beside the token: one per node, however many run at once
            path = token_file + ".kubeconfig"
        user = {"tokenFile": token_file} if token_file else {"token": self.tokens[key]}
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "test",
            "clusters": [{"name": "test", "cluster": {"server": self.server,
                                                        "certificate-authority": self.ca_file}}],
            "users": [{"name": "user", "user": user}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "user"}}],
        }
        with open(path, "w") as f:
            json.dump(config, f)  # JSON is YAML: every kubeconfig reader takes it
        return path

    # ---- processes ----

    def _start(self, name, args):
        args = [*args, *self.extra_args.get(name, ())]
        self.processes[name] = Process(name, args, os.path.join(self.dir, f"{name}.log"))
        return self.processes[name]

    def _wait_https(self, name, port, path, token=None, timeout=180):
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        if token is None and name == "kube-apiserver":
            ctx = ssl.create_default_context(cafile=self.ca_file)
        proc = self.processes[name]

        def ready():
            if not proc.alive():
                raise Fatal(f"{name} exited with {proc.proc.returncode}\n{proc.tail()}")
            request = urllib.request.Request(f"https://127.0.0.1:{port}{path}")
            if token:
                request.add_header("Authorization", f"Bearer {token}")
            try:
                with urllib.request.urlopen(request, context=ctx, timeout=5) as response:
                    return response.status == 200
            except (urllib.error.URLError, ConnectionError, OSError):
                return False

        try:
            wait_for(f"{name} {path} on port {port}", ready, timeout, on_timeout=proc.tail)
        except ClusterError as error:
            if not proc.alive():
                raise ClusterError(f"{name} exited with {proc.proc.returncode}\n"
                                   f"{proc.tail()}") from error
            raise

    def start_etcd(self, attempts=3):
        for attempt in range(attempts):
            try:
                self._start_etcd_once()
                return
            except Fatal as error:
                # Another run's component took a port between free_port() and etcd's bind: new
                # ports mend it. Any other exit is the failure to report.
                if "address already in use" not in str(error) or attempt + 1 == attempts:
                    raise
                self.processes.pop("etcd").stop()
                # A data directory that names the old peer URL would outvote the new flags.
                shutil.rmtree(os.path.join(self.dir, "etcd"), ignore_errors=True)

    def _start_etcd_once(self):
        self.etcd_port, peer = free_port(), free_port()
        self._start("etcd", [
            os.path.join(self.bin, "etcd"), "--data-dir", os.path.join(self.dir, "etcd"),
            "--listen-client-urls", f"http://127.0.0.1:{self.etcd_port}",
            "--advertise-client-urls", f"http://127.0.0.1:{self.etcd_port}",
            "--listen-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-cluster", f"default=http://127.0.0.1:{peer}",
            "--unsafe-no-fsync", "--log-level", "warn"])
        proc = self.processes["etcd"]

        def healthy():
            if not proc.alive():
                raise Fatal(f"etcd exited\n{proc.tail()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.etcd_port}/health",
                                            timeout=5) as r:
                    return json.load(r).get("health") == "true"
            except (urllib.error.URLError, ConnectionError, OSError):
                return False

        wait_for("etcd /health", healthy, 120, on_timeout=proc.tail)

    def start_apiserver(self):
        if self.api_port is None:
            self.api_port = free_port()
            self.server = f"https://127.0.0.1:{self.api_port}"
        audit_policy = os.path.join(self.dir, "audit-policy.yaml")
        with open(audit_policy, "w") as f:
            f.write(self.audit_policy)
        args = [
            os.path.join(self.bin, "kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
            f"--secure-port={self.api_port}",
            f"--tls-cert-file={self.pki}/apiserver.crt",
            f"--tls-private-key-file={self.pki}/apiserver.key",
            f"--client-ca-file={self.ca_file}",
            # The front-proxy CA the controller manager and scheduler look up for delegated
            # authentication (no aggregated API servers here; without it they log errors).
            f"--requestheader-client-ca-file={self.ca_file}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--token-auth-file={self.pki}/tokens.csv",
            "--authorization-mode=Node,RBAC",
            # As every production cluster (kubeadm) runs it: the DaemonSet is privileged.
            "--allow-privileged=true",
            "--enable-admission-plugins=NodeRestriction",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-signing-key-file={self.pki}/sa.key",
            f"--service-account-key-file={self.pki}/sa.pub",
            "--service-cluster-ip-range=10.0.0.0/24",
            # No Endpoints for the kubernetes Service: its address would be loopback, which the
            # API refuses; nothing in the tests reaches the server through the Service.
            "--endpoint-reconciler-type=none",
            f"--runtime-config={self.settings['runtime_config']}",
            f"--audit-log-path={self.dir}/audit.log", f"--audit-policy-file={audit_policy}",
            "--audit-log-format=json", "--audit-log-mode=blocking",
        ]
        if self.settings["feature_gates"]:
            args.append(f"--feature-gates={self.settings['feature_gates']}")
        self._start("kube-apiserver", args)
        self._wait_https("kube-apiserver", self.api_port, "/readyz", self.tokens["admin"], 300)

    def start_controllers(self):
        kcm_port, sched_port = free_port(), free_port()
        self.ports.update({"kube-controller-manager": kcm_port, "kube-scheduler": sched_port})
        gates = ([f"--feature-gates={self.settings['feature_gates']}"]
                 if self.settings["feature_gates"] else [])
        kcm_config = self.kubeconfig("kcm")
        self._start("kube-controller-manager", [
            os.path.join(self.bin, "kube-controller-manager"), f"--kubeconfig={kcm_config}",
            f"--authentication-kubeconfig={kcm_config}", f"--authorization-kubeconfig={kcm_config}",
            "--use-service-account-credentials",
            f"--service-account-private-key-file={self.pki}/sa.key",
            f"--root-ca-file={self.ca_file}", "--bind-address=127.0.0.1",
            f"--secure-port={kcm_port}", "--leader-elect=false", "--controllers=*",
            f"--cert-dir={self.dir}/kcm-certs", *gates])
        sched_config = self.kubeconfig("scheduler")
        self._start("kube-scheduler", [
            os.path.join(self.bin, "kube-scheduler"), f"--kubeconfig={sched_config}",
            f"--authentication-kubeconfig={sched_config}",
            f"--authorization-kubeconfig={sched_config}", "--bind-address=127.0.0.1",
            f"--secure-port={sched_port}", "--leader-elect=false",
            f"--cert-dir={self.dir}/scheduler-certs", *gates])
        self._wait_https("kube-controller-manager", kcm_port, "/healthz")
        self._wait_https("kube-scheduler", sched_port, "/healthz")

    def start(self, node_names=("node1",)):
        os.makedirs(self.dir, exist_ok=True)
        self._make_pki()
        self._make_tokens(node_names)
        self.start_etcd()
        self.start_apiserver()
        self.admin_kubeconfig = self.kubeconfig("admin")
        self.start_controllers()
        # Pods need their namespace's default ServiceAccount, which a controller creates.
        wait_for("the default ServiceAccount", lambda: self.kubectl(
            "get", "serviceaccount", "default", "-n", "default", check=False).returncode == 0, 120)

    def restart_apiserver(self):
        self.processes["kube-apiserver"].stop()
        self.start_apiserver()

    def stop(self):
        order = ("kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd")
        # Helpers a scenario started beside the control plane (a webhook) go first.
        for name in [n for n in self.processes if n not in order] + list(order):
            if name in self.processes:
                self.processes[name].stop()

    def logs_tail(self):
        return "\n".join(p.tail(60) for p in self.processes.values())

    # ---- clients ----

    def kubectl(self, *args, kubeconfig=None, check=True, input=None):
        result = subprocess.run(
            [os.path.join(self.bin, "kubectl"), f"--kubeconfig={kubeconfig or self.admin_kubeconfig}",
             *args], capture_output=True, text=True, input=input)
        if check and result.returncode != 0:
            raise ClusterError(f"kubectl {' '.join(args)} failed ({result.returncode}):\n"
                               f"{result.stderr}{result.stdout}")
        return result

    def get_json(self, *args, kubeconfig=None):
        return json.loads(self.kubectl("get", *args, "-o", "json", kubeconfig=kubeconfig).stdout)

    def metrics_text(self, component="kube-apiserver"):
        """The component's /metrics, read with the admin identity."""
        port = self.api_port if component == "kube-apiserver" else self.ports[component]
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        request = urllib.request.Request(f"https://127.0.0.1:{port}/metrics")
        request.add_header("Authorization", f"Bearer {self.tokens['admin']}")
        with urllib.request.urlopen(request, context=ctx, timeout=30) as response:
            return response.read().decode()

    def version(self):
        return json.loads(self.kubectl("version", "-o", "json").stdout)["serverVersion"]
