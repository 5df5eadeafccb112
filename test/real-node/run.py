#!/usr/bin/env python3
"""The real node: the real kubelet, containerd 2 and runc in the VM node call vfio-dra, deployed
as its DaemonSet from its image, and a container gets the prepared devices through CDI.

  run.py --release 1.37 --build-dir BUILD --work-dir DIR SCENARIO

On this machine: the real control plane (test/cluster/control_plane.py) on loopback. In the VM
node (test/e2e-vm/run-vm.sh, Debian's kernel under TCG with an emulated IOMMU): guest-node.sh
starts containerd and the kubelet, which registers the node with its own credentials through
QEMU's user network (it forwards only the API server's port). Nothing runs on this machine but
the control plane and QEMU: no kubelet, no container runtime, no write to its /sys.

Everything is judged through the API server, as a user would see it: the Node, the DaemonSet's
pod, the slices, the claims and pods; and what the containers saw, from files they write into the
VM's results directory (a hostPath volume), which this machine reads.
"""

import argparse
import datetime
import json
import os
import signal
import shutil
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(SOURCE_DIR, "test", "cluster"))

from control_plane import ClusterError, ControlPlane, Fatal, wait_for  # noqa: E402

NODE = "vm-node"
TEST_IMAGE = "vfio-dra.test/node-test:1"
SANDBOX_IMAGE = "registry.k8s.io/pause:3.10.1"
PLUGIN_IMAGE = "vfio-dra-plugin:0.1.0"
# The guest's devices (run-vm.sh): the "GPU" (QEMU VGA with its HDA companion in IOMMU group)
# and the e1000e alone in its group, the one a hostdev claim gets.
GPU = "0000:01:00.0"
POLICY = """version: v1
select:
  - kind: hostdev
    address: ["0000:02:00.0"]
"""


def tool_output(args, what):
    result = subprocess.run(args, stdout=subprocess.PIPE, text=True)
    if result.returncode != 0:
        raise ClusterError(f"{what} failed (exit {result.returncode}); its reason is printed above")
    return result.stdout.strip().splitlines()[-1]


class Checks:
    """Prints each check, and keeps it with the scenario's other findings in <work-dir>/report.txt
    (CTest shows the output of failed tests only; the timings are wanted from every run)."""

    def __init__(self, report_path):
        self.failed = 0
        self.report_path = report_path

    def note(self, text):
        print(text, flush=True)
        with open(self.report_path, "a") as f:
            f.write(text + "\n")

    def __call__(self, condition, what, detail=""):
        self.note(f"{'ok  ' if condition else 'FAIL'} {what}{': ' + str(detail) if detail else ''}")
        if not condition:
            self.failed += 1
        return condition


class RealNode:
    """The VM node: its configuration (made here), QEMU, and what it reports back."""

    def __init__(self, cluster, args, kube_bin, runtime_bin, images):
        self.cluster = cluster
        self.build = os.path.abspath(args.build_dir)
        self.dir = os.path.join(os.path.abspath(args.work_dir), "node")
        self.out = os.path.join(os.path.abspath(args.work_dir), "vm")
        self.kube_bin = kube_bin
        self.runtime_bin = runtime_bin
        self.images = images
        self.qemu = None
        # QEMU's lifetime (run-vm.sh's timeout): a scenario's 40 minutes, or what the caller asks
        # (a soak of an hour needs more).
        self.lifetime = int(getattr(args, "vm_seconds", 0) or 2400)
        # Whether the kubelet may exit unasked (guest-node.sh starts it again 10 s later, as
        # systemd would): faults that cross, as the soak's do, make a kubelet that starts while
        # containerd restarts exit, as on any node. Elsewhere an exit is a failure.
        self.kubelet_may_exit = False

    def write_config(self):
        os.makedirs(self.dir, exist_ok=True)
        os.makedirs(os.path.join(self.out, "results"), exist_ok=True)
        with open(self.cluster.ca_file) as f:
            ca = f.read()
        ca_path = os.path.join(self.dir, "ca.crt")
        with open(ca_path, "w") as f:
            f.write(ca)
        kubeconfig = {
            "apiVersion": "v1", "kind": "Config", "current-context": "node",
            "clusters": [{"name": "test", "cluster": {"server": "https://10.0.2.100:6443",
                                                        "certificate-authority": ca_path}}],
            "users": [{"name": "node", "user": {"token": self.cluster.tokens[f"node-{NODE}"]}}],
            "contexts": [{"name": "node", "context": {"cluster": "test", "user": "node"}}],
        }
        with open(os.path.join(self.dir, "kubelet.kubeconfig"), "w") as f:
            json.dump(kubeconfig, f)
        kubelet = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "containerRuntimeEndpoint": "unix:///run/containerd/containerd.sock",
            "cgroupDriver": "cgroupfs", "failSwapOn": False,
            # The API server cannot reach the guest: nothing needs the kubelet's own endpoint.
            "address": "127.0.0.1", "readOnlyPort": 0, "healthzBindAddress": "127.0.0.1",
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True}},
            "authorization": {"mode": "Webhook"},
            "evictionHard": {"memory.available": "50Mi", "nodefs.available": "1%",
                             "imagefs.available": "1%"},
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "serializeImagePulls": False, "fileCheckFrequency": "5s",
            "nodeStatusUpdateFrequency": "5s", "syncFrequency": "10s",
            "clusterDNS": [], "resolvConf": "/etc/resolv.conf",
        }
        with open(os.path.join(self.dir, "kubelet.yaml"), "w") as f:
            json.dump(kubelet, f)
        with open(os.path.join(self.dir, "containerd.toml"), "w") as f:
            f.write(f"""version = 3
root = "/var/lib/containerd"
state = "/run/containerd"
[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = '{SANDBOX_IMAGE}'
[plugins.'io.containerd.cri.v1.runtime']
  enable_cdi = true
  cdi_spec_dirs = ['/etc/cdi', '/var/run/cdi']
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
  BinaryName = '{self.runtime_bin}/runc'
[plugins.'io.containerd.cri.v1.runtime'.cni]
  bin_dirs = ['/usr/lib/cni']
  conf_dir = '/etc/cni/net.d'
""")
        conflist = {"cniVersion": "1.0.0", "name": "pods", "plugins": [
            {"type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": True,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.88.0.0/16"}]],
                      "routes": [{"dst": "0.0.0.0/0"}]}},
            {"type": "portmap", "capabilities": {"portMappings": True}}]}
        with open(os.path.join(self.dir, "10-pods.conflist"), "w") as f:
            json.dump(conflist, f)
        # The plugin's AppArmor profile, which guest-node.sh loads as a node's provisioning would.
        os.makedirs(os.path.join(self.dir, "apparmor"), exist_ok=True)
        shutil.copy(os.path.join(SOURCE_DIR, "deploy", "apparmor", "vfio-dra-plugin"),
                    os.path.join(self.dir, "apparmor", "vfio-dra-plugin"))
        with open(os.path.join(self.out, "node.env"), "w") as f:
            f.write(f"NODE_DIR={self.dir}\nKUBE_BIN={self.kube_bin}\n"
                    f"RUNTIME_BIN={self.runtime_bin}\nIMAGES='{' '.join(self.images)}'\n")

    def boot(self):
        env = {**os.environ, "VFIO_DRA_VM_API_PORT": str(self.cluster.api_port),
               "VFIO_DRA_VM_ROOT": "overlay", "VFIO_DRA_VM_MEMORY": "3072",
               "VFIO_DRA_E2E_VM_TIMEOUT": str(self.lifetime), "BUILD_DIR": self.build}
        for name in ("stop", "node-ready", "node-failed", "exit-code", "kubelet-exits"):
            if os.path.exists(os.path.join(self.out, name)):
                os.remove(os.path.join(self.out, name))
        self.qemu_log = open(os.path.join(os.path.dirname(self.out), "run-vm.log"), "w")
        self.qemu = subprocess.Popen(
            [os.path.join(SOURCE_DIR, "test", "e2e-vm", "run-vm.sh"), self.out,
             os.path.join(HERE, "guest-node.sh"), "real-node"],
            env=env, stdout=self.qemu_log, stderr=subprocess.STDOUT)

    def check_alive(self):
        failed = os.path.join(self.out, "node-failed")
        if os.path.exists(failed):
            with open(failed) as f:
                raise Fatal(f"the VM node failed: {f.read().strip()}\n{self.guest_log()}")
        if self.qemu is not None and self.qemu.poll() is not None:
            raise Fatal(f"the VM exited ({self.qemu.returncode})\n{self.guest_log()}")
        exits = self.kubelet_exits()
        if exits and not self.kubelet_may_exit:
            raise Fatal(f"the kubelet exited unasked: {exits[-1]}\n{self.guest_log()}")

    def kubelet_exits(self):
        """The kubelet's unasked exits so far, one line each (guest-node.sh started it again)."""
        try:
            with open(os.path.join(self.out, "kubelet-exits"), errors="replace") as f:
                return f.read().splitlines()
        except FileNotFoundError:
            return []

    def guest_log(self, lines=40):
        parts = []
        for name in ("guest.log", "console.log", "logs/kubelet.log", "logs/containerd.log"):
            path = os.path.join(self.out, name)
            if os.path.exists(path):
                with open(path, errors="replace") as f:
                    text = f.read().splitlines()[-lines:]
                parts.append(f"--- last lines of {path} ---\n" + "\n".join(text))
        return "\n".join(parts)

    def run(self, name, script, timeout=120):
        """Runs `script` (bash) as root on the node, as an admin on it would; returns its output,
        and raises when it exits non-zero."""
        cmd = os.path.join(self.out, "cmd")
        os.makedirs(cmd, exist_ok=True)
        path = os.path.join(cmd, f"{name}.sh")
        for suffix in (".out", ".rc"):
            if os.path.exists(path[:-3] + suffix):
                os.remove(path[:-3] + suffix)
        with open(path + ".tmp", "w") as f:
            f.write(script)
        os.rename(path + ".tmp", path)  # never seen half written

        def finished():
            self.check_alive()
            return os.path.exists(path[:-3] + ".rc")
        wait_for(f"the node to run {name}", finished, timeout, on_timeout=self.guest_log)
        with open(path[:-3] + ".rc") as f:
            rc = int(f.read().strip() or "1")
        with open(path[:-3] + ".out", errors="replace") as f:
            output = f.read()
        if rc != 0:
            raise ClusterError(f"{name} on the node exited {rc}:\n{output}")
        return output

    def restart_kubelet(self):
        flag = os.path.join(self.out, "kubelet-restarted")
        if os.path.exists(flag):
            os.remove(flag)
        open(os.path.join(self.out, "restart-kubelet"), "w").close()
        wait_for("the node to restart its kubelet", lambda: (self.check_alive(),
                                                             os.path.exists(flag))[1], 120,
                 on_timeout=self.guest_log)

    def stop(self):
        if self.qemu is None:
            return
        open(os.path.join(self.out, "stop"), "w").close()
        try:
            self.qemu.wait(180)
        except subprocess.TimeoutExpired:
            # A hung node never reads the stop file. run-vm.sh runs QEMU under `timeout`, which
            # makes a process group of its own with QEMU: killing run-vm.sh alone would leave QEMU
            # on both cores until the node's lifetime ran out (a retried bring-up did).
            for child in subprocess.run(["pgrep", "-P", str(self.qemu.pid)], capture_output=True,
                                        text=True).stdout.split():
                try:
                    os.killpg(int(child), signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass  # not a group's leader: not `timeout`
            self.qemu.kill()
            self.qemu.wait()
        self.qemu_log.close()
        self.qemu = None


def wait_node_ready(cluster, node, timeout=600):
    def ready():
        node.check_alive()
        result = cluster.kubectl("get", "node", NODE, "-o", "json", check=False)
        if result.returncode != 0:
            return None
        obj = json.loads(result.stdout)
        for c in obj.get("status", {}).get("conditions", []):
            if c["type"] == "Ready" and c["status"] == "True":
                return obj
        return None
    return wait_for(f"Node {NODE} to be Ready", ready, timeout, on_timeout=node.guest_log)


def plugin_pod(cluster):
    pods = cluster.get_json("pods", "-n", "vfio-dra", "-l", "app.kubernetes.io/name=vfio-dra-plugin",
                            "--field-selector", f"spec.nodeName={NODE}")
    return pods["items"][0] if pods["items"] else None


def pod_ready(pod):
    for c in (pod or {}).get("status", {}).get("conditions", []):
        if c["type"] == "Ready" and c["status"] == "True":
            return True
    return False


def wait_pod(cluster, node, name, predicate, what, timeout, namespace="default"):
    last = {}

    def check():
        node.check_alive()
        result = cluster.kubectl("get", "pod", name, "-n", namespace, "-o", "json", check=False)
        if result.returncode != 0:
            last["pod"] = result.stderr
            return None
        pod = json.loads(result.stdout)
        last["pod"] = json.dumps(pod.get("status"), indent=1)
        return pod if predicate(pod) else None
    return wait_for(f"pod {namespace}/{name} {what}", check, timeout,
                    on_timeout=lambda: last.get("pod", "") + "\n" + node.guest_log(20))


def claim_template(name, device_class):
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name},
            "spec": {"spec": {"devices": {"requests": [
                {"name": "dev", "exactly": {"deviceClassName": device_class}}]}}}}


def vmi(template):
    """The VirtualMachineInstance a VMM pod stands for: its claim as a DRA GPU (GPU and vGPU
    templates) or a DRA host device, as the examples write them."""
    devices = "hostDevices" if template == "nic" else "gpus"
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": "vm", "namespace": "default"},
            "spec": {"resourceClaims": [{"name": "dev", "resourceClaimTemplateName": template}],
                     "domain": {"devices": {devices: [
                         {"name": "dev", "claimName": "dev", "requestName": "dev"}]}}}}


def vmm_pod(name, template, hold=False):
    """What virt-launcher's pod looks like to the node: a container that gets the claim's devices
    and finds them as virt-launcher does; it reports what it found into the results directory.
    With `hold`, it then keeps its device's VFIO group open while it runs, as a running VMM does
    (vfio_holders() finds it from the node)."""
    # KubeVirt 1.9's virt-launcher code (kubevirt-vmi launcher-devices, hack/kubevirt-binary.sh)
    # reads the metadata file and makes the domain's <hostdev>; its last line names the device.
    script = (
        "exec >/results/$POD.txt 2>&1; "
        "meta=/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/dev/dev; "
        "for f in $meta/*-metadata.json; do echo metadata-file=$f; cat $f; echo; done; "
        "launched=$(/bin/kubevirt-vmi launcher-devices --vmi \"$VMI\"); "
        "echo launcher-exit=$?; echo \"$launched\"; "
        "dev=$(echo \"$launched\" | tail -n 1 | cut -d ' ' -f 3); echo device=$dev; "
        "/bin/vfio-check $dev; echo vfio-check-exit=$?; " +
        ("group=$(ls /dev/vfio | grep -v '^vfio$' | head -n 1); exec 3<>/dev/vfio/$group; "
         "echo holding=/dev/vfio/$group; " if hold else "") +
        "echo done; exec /bin/busybox sleep 100000")
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": NODE},
                     "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "vmm", "image": TEST_IMAGE,
                                     "imagePullPolicy": "Never",
                                     "command": ["/bin/sh", "-c", script],
                                     "env": [{"name": "POD", "value": name},
                                             {"name": "VMI", "value": json.dumps(vmi(template))}],
                                     "resources": {"claims": [{"name": "dev"}]},
                                     "volumeMounts": [{"name": "results",
                                                       "mountPath": "/results"}]}],
                     "resourceClaims": [{"name": "dev", "resourceClaimTemplateName": template}],
                     "volumes": [{"name": "results",
                                  "hostPath": {"path": "/run/out/results",
                                               "type": "Directory"}}]}}


def read_result(node, name, timeout=300):
    path = os.path.join(node.out, "results", f"{name}.txt")

    def done():
        node.check_alive()
        if not os.path.exists(path):
            return None
        with open(path) as f:
            text = f.read()
        return text if "\ndone\n" in text or text.startswith("done\n") else None
    return wait_for(f"{name}'s report in {path}", done, timeout, on_timeout=node.guest_log)


# What an admin looks at on the node: each function's driver, vfio-dra's CDI specs and files.
STATE_SCRIPT = """
for f in 0000:01:00.0 0000:01:00.1 0000:02:00.0; do
  d=$(readlink /sys/bus/pci/devices/$f/driver 2>/dev/null); echo "driver $f ${d##*/}"
done
for f in /var/run/cdi/*; do [ -e "$f" ] && echo "cdi $f $(cat "$f" | tr -d '\n')"; done
find /var/lib/kubelet/plugins/vfio.dra.io -type f | while read -r f; do
  echo "file $f $(head -c 4000 "$f" | tr -d '\n')"; done
exit 0
"""


def node_state(node, name):
    state = {"drivers": {}, "cdi": {}, "files": {}}
    for line in node.run(name, STATE_SCRIPT).splitlines():
        kind, _, rest = line.partition(" ")
        key, _, value = rest.partition(" ")
        if kind == "driver":
            state["drivers"][key] = value
        elif kind == "cdi":
            state["cdi"][key] = value
        elif kind == "file":
            state["files"][key] = value
    return state


def mentions(state, text):
    return sorted(p for group in ("cdi", "files") for p, v in state[group].items() if text in v)


def plugin_pods(cluster):
    return cluster.get_json("pods", "-n", "vfio-dra", "-l", "app.kubernetes.io/name=vfio-dra-plugin",
                            "--field-selector", f"spec.nodeName={NODE}")["items"]


def plugin_logs(node):
    """Every plugin pod's log on the node, each line prefixed with its file (named by the pod)."""
    return node.run("plugin-logs",
                    "grep -H . /var/log/pods/vfio-dra_vfio-dra-plugin-*/*/*.log; exit 0")


def running(pod):
    return pod.get("status", {}).get("phase") == "Running" and all(
        "running" in c.get("state", {}) for c in pod["status"].get("containerStatuses", []))


def resource_health(pod, claim):
    for status in pod.get("status", {}).get("containerStatuses", []):
        for resource in status.get("allocatedResourcesStatus") or []:
            if resource["name"] == f"claim:{claim}":
                return resource.get("resources") or []
    return []


def pod_claim_uid(cluster, pod):
    claim_name = pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
    return cluster.get_json("resourceclaim", claim_name)


def start_vmm_pod(cluster, node, name, template, check, device, hold=False):
    started = time.monotonic()
    cluster.kubectl("apply", "-f", "-", input=json.dumps(vmm_pod(name, template, hold)))
    scheduled = wait_pod(cluster, node, name, lambda p: p["spec"].get("nodeName"),
                         "to be scheduled", 300)
    scheduled_after = time.monotonic() - started
    pod = wait_pod(cluster, node, name, running, "to run", 600)
    elapsed = {"created": time.time() - (time.monotonic() - started),
               "scheduled": scheduled_after, "running": time.monotonic() - started}
    del scheduled
    claim = pod_claim_uid(cluster, pod)
    results = claim["status"]["allocation"]["devices"]["results"]
    check(len(results) == 1 and results[0]["device"] == device,
          f"the scheduler allocated {device} to {name}'s claim", results)
    return pod, claim, elapsed


def vfio_holders(node, group_node):
    """The node's processes that have `group_node` (/dev/vfio/N) open, by PID. Matched by device
    number: a container's descriptor reads as the path under its root (/merged/dev/vfio/N)."""
    script = (f"want=$(stat -c %t:%T {group_node}); "
              "for p in /proc/[0-9]*; do for f in $p/fd/*; do "
              "[ -c \"$f\" ] && [ \"$(stat -L -c %t:%T \"$f\" 2>/dev/null)\" = \"$want\" ] && "
              "echo ${p#/proc/}; done; done | sort -u; exit 0")
    return node.run("vfio-holders", script).split()


def log_stamp(line):
    """The container runtime's timestamp at the start of a pod log line (after grep -H's file)."""
    stamp = line.split(":", 1)[1].split()[0]
    when = datetime.datetime.strptime(stamp[:26].rstrip("Z"), "%Y-%m-%dT%H:%M:%S.%f")
    return when.replace(tzinfo=datetime.timezone.utc).timestamp()


def pod_of_log_line(line):
    """The plugin pod a plugin_logs() line came from (/var/log/pods/NS_NAME_UID/...)."""
    return line.split("/")[4].split("_")[1]


def delete_pod(cluster, node, name):
    cluster.kubectl("delete", "pod", name, "--wait=false")
    wait_for(f"pod {name} to be gone", lambda: (node.check_alive(), cluster.kubectl(
        "get", "pod", name, check=False).returncode != 0)[1], 300, on_timeout=node.guest_log)


# The plugin's process as the node's kernel sees it: its capabilities, no_new_privs, seccomp
# mode and AppArmor label (the main thread of the container's `vfio-dra-plugin serve`).
CONFINEMENT_SCRIPT = """
pid=$(pgrep -o -f '^/usr/bin/vfio-dra-plugin serve')
[ -n "$pid" ] || { echo "no plugin process"; exit 1; }
grep -E '^(CapEff|CapPrm|CapBnd|NoNewPrivs|Seccomp):' /proc/$pid/status
echo "AppArmor: $(cat /proc/$pid/attr/current)"
"""


def plugin_confinement(node, name):
    fields = {}
    for line in node.run(name, CONFINEMENT_SCRIPT).splitlines():
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    return fields


def apparmor_denials(node, profile):
    """The kernel's AppArmor denials of `profile` since the node booted (its audit messages)."""
    return node.run("apparmor-denials", f"dmesg | grep 'apparmor=\"DENIED\"' | "
                    f"grep 'profile=\"{profile}\"'; exit 0").splitlines()


def check_least_privilege(cluster, node, check):
    """The plugin runs as deploy/daemonset says (README, "Security"), enforced by the kernel."""
    pod = plugin_pod(cluster)
    context = pod["spec"]["containers"][0]["securityContext"]
    check(context.get("privileged") is False and not pod["spec"].get("hostPID") and
          not pod["spec"].get("hostNetwork"), "the plugin's pod is not privileged and has "
          "neither the host's PID nor its network namespace", context)
    seen = plugin_confinement(node, "confinement")
    check(seen.get("CapEff") == "0000000000000000" and seen.get("CapPrm") == "0000000000000000",
          "the plugin's process has no capability (effective and permitted sets empty)", seen)
    check(seen.get("NoNewPrivs") == "1", "no_new_privs is set (allowPrivilegeEscalation false)",
          seen)
    check(seen.get("Seccomp") == "2", "the runtime's seccomp filter is on (mode 2)", seen)
    check(seen.get("AppArmor") == "vfio-dra-plugin (enforce)",
          "the kernel enforces the AppArmor profile vfio-dra-plugin on it", seen)


def scenario_node(cluster, node, check):
    check_least_privilege(cluster, node, check)
    before = node_state(node, "state-before")
    print(f"the node's functions before any claim: {before['drivers']}", flush=True)

    # 1. A GPU for a VMM's pod: allocated, prepared, injected, and its metadata file mounted.
    cluster.kubectl("apply", "-f", "-", input=json.dumps(claim_template("gpu", "gpu.vfio.dra.io")))
    cluster.kubectl("apply", "-f", "-", input=json.dumps(claim_template("nic",
                                                                        "hostdev.vfio.dra.io")))
    pod, claim, elapsed = start_vmm_pod(cluster, node, "vmm-gpu", "gpu", check, "gpu-0000-01-00-0",
                                         hold=True)
    uid = claim["metadata"]["uid"]
    report = read_result(node, "vmm-gpu")
    print(report, flush=True)
    check("/dev/vfio/vfio char=1 major:minor=10:196 open=ok api=0" in report,
          "the container has /dev/vfio/vfio (10:196) and it opens (VFIO_GET_API_VERSION 0)")
    check("viable=1" in report, "the container opens the GPU's group and the kernel calls it "
          "viable (every function of the group on vfio-pci)")
    check("metadata-file=/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/"
          "dev/dev/vfio.dra.io-metadata.json" in report and
          f'"resource.kubernetes.io/pciBusID":{{"string":"{GPU}"}}' in report,
          "KubeVirt's metadata file is where virt-launcher looks and names the GPU's pciBusID")
    check("launcher-exit=0" in report and '<hostdev type="pci" managed="no">' in report and
          f"dra-gpu-dev pci {GPU}" in report,
          "KubeVirt 1.9's virt-launcher code reads it in the container and makes the domain's "
          "PCI <hostdev> for the GPU")
    check(f"device={GPU} fd=ok" in report and "dma-map=ok" in report,
          "as a VMM does: the group into a type1 container, the GPU's device fd from the group "
          "(named by virt-launcher's <hostdev>), a page mapped for DMA")
    check("vfio-check-exit=0" in report, "vfio-check passed")
    label = node.run("vmm-label", "cat /proc/$(pgrep -o -f 'sleep 100000')/attr/current")
    check(label.strip() == "cri-containerd.apparmor.d (enforce)", "the VMM's container runs "
          "under containerd's default AppArmor profile (AppArmor is on for every container)",
          label)
    during = node_state(node, "state-gpu")
    check(during["drivers"].get(GPU) == "vfio-pci" and
          during["drivers"].get("0000:01:00.1") == "vfio-pci",
          "the GPU and its audio companion (its whole IOMMU group) are on vfio-pci",
          during["drivers"])
    check(mentions(during, uid), "the claim has its CDI spec and checkpoint on the node",
          mentions(during, uid))
    # The container's nodes against the node's own: the same path and numbers (stat prints hex).
    seen = {}
    for line in report.splitlines():
        if line.startswith("/dev/vfio/") and "major:minor=" in line:
            seen[line.split()[0]] = line.split("major:minor=")[1].split()[0]
    host = {}
    for line in node.run("vfio-nodes", "stat -c '%n %t %T' /dev/vfio/*").splitlines():
        path, major, minor = line.split()
        host[path] = f"{int(major, 16)}:{int(minor, 16)}"
    check(len(seen) == 2 and all(host.get(p) == n for p, n in seen.items()),
          "the container's /dev/vfio nodes have the node's numbers", f"{seen} vs {host}")
    health = wait_for("the GPU's health in vmm-gpu's status", lambda: (
        node.check_alive(), resource_health(cluster.get_json("pod", "vmm-gpu"), "dev"))[1], 180,
        on_timeout=lambda: json.dumps(cluster.get_json("pod", "vmm-gpu")["status"], indent=1))
    check(len(health) == 1 and health[0].get("health") == "Healthy",
          "the pod's status shows the GPU Healthy, as the plugin streams it", health)
    logs = plugin_logs(node)
    check('"kubelet opened the device health stream" api=v1 ' in logs,
          "the kubelet 1.37 watches the plugin's health through DRAResourceHealth v1")
    prepared = [line for line in logs.splitlines() if "prepared claim" in line and uid in line]
    check(len(prepared) == 1, "the plugin's log has one prepare of the claim", prepared)
    if prepared:
        # The plugin's own timestamp (the guest's clock, which QEMU starts from this machine's).
        stamp = prepared[0].split(" info node ")[0].split()[-1]
        answered = datetime.datetime.strptime(stamp[:26].rstrip("Z"), "%Y-%m-%dT%H:%M:%S.%f")
        answered = answered.replace(tzinfo=datetime.timezone.utc).timestamp()
        prepare_ms = float(prepared[0].split(" ms=")[1].split()[0].strip('"'))
        check.note(f"TIMING vmm-gpu: created -> scheduled {elapsed['scheduled']:.1f} s, -> "
              f"NodePrepareResources answered {answered - elapsed['created']:.1f} s (the plugin's "
                   f"part {prepare_ms:.0f} ms), -> containers running {elapsed['running']:.1f} s")
    container_id = cluster.get_json("pod", "vmm-gpu")["status"]["containerStatuses"][0][
        "containerID"]

    # 1b. A mediated device (the mtty sample driver stands in for a vGPU): created at prepare,
    # named by its mdevUUID in the metadata file, assigned from its own group, removed after.
    cluster.kubectl("apply", "-f", "-", input=json.dumps(claim_template("vgpu",
                                                                        "mdev.vfio.dra.io")))
    cluster.kubectl("apply", "-f", "-", input=json.dumps(vmm_pod("vmm-mdev", "vgpu")))
    mdev_pod = wait_pod(cluster, node, "vmm-mdev", running, "to run", 600)
    mdev_claim = pod_claim_uid(cluster, mdev_pod)
    mdev_report = read_result(node, "vmm-mdev")
    uuid = next((line.split("=", 1)[1] for line in mdev_report.splitlines()
                 if line.startswith("device=") and " " not in line), "")
    check(len(uuid) == 36 and f'"mdevUUID":{{"string":"{uuid}"}}' in mdev_report,
          "KubeVirt's metadata file names the mediated device's mdevUUID", uuid)
    check("launcher-exit=0" in mdev_report and '<hostdev type="mdev"' in mdev_report and
          f"dra-gpu-dev mdev {uuid}" in mdev_report,
          "virt-launcher's code makes an mdev <hostdev> of it (a vGPU, not the parent's PCI "
          "address)")
    check(f"device={uuid} fd=ok" in mdev_report and "dma-map=ok" in mdev_report,
          "the container assigns the mediated device by its UUID as a VMM does")
    exists = f"test -e /sys/bus/mdev/devices/{uuid} && echo present || echo absent"
    check(node.run("mdev-present", exists).strip() == "present",
          "the mdev exists on the node while the pod runs")
    delete_pod(cluster, node, "vmm-mdev")
    check(node.run("mdev-gone", exists).strip() == "absent" and
          not mentions(node_state(node, "state-mdev-gone"), mdev_claim["metadata"]["uid"]),
          "after the pod the mdev is removed and nothing of its claim is left")

    # 2. The kubelet restarts while the VMM runs, once asked and once by exiting unasked (killed
    # here; one that starts while containerd restarts exits too, as the soak found), which the
    # node answers as systemd does, starting it again 10 s later: nothing happens to the pod or
    # its device, and the new kubelet starts pods.
    node.restart_kubelet()
    node.kubelet_may_exit = True
    pid_file = os.path.join(node.out, "kubelet.pid")
    with open(pid_file) as f:
        killed = f.read().strip()
    node.run("kill-kubelet", f"kill -9 {killed}")
    wait_for("the node to start its kubelet again after it exited", lambda: (
        node.check_alive(), len(node.kubelet_exits()) == 1 and
        open(pid_file).read().strip() not in ("", killed))[1], 120, on_timeout=node.guest_log)
    check("the kubelet exited (137)" in node.kubelet_exits()[0],
          "the node saw the kubelet's unasked exit and started it again", node.kubelet_exits())
    cluster.kubectl("apply", "-f", "-", input=json.dumps(vmm_pod("vmm-after-restart", "nic")))
    wait_pod(cluster, node, "vmm-after-restart", running, "to run after the kubelet's restart", 600)
    pod = cluster.get_json("pod", "vmm-gpu")
    check(running(pod) and pod["status"]["containerStatuses"][0]["containerID"] == container_id
          and pod["status"]["containerStatuses"][0]["restartCount"] == 0,
          "after the kubelet's two restarts vmm-gpu runs on, in the same container")
    check(node_state(node, "state-kubelet-restart")["drivers"].get(GPU) == "vfio-pci",
          "the GPU stays on vfio-pci across the kubelet's restarts")
    delete_pod(cluster, node, "vmm-after-restart")

    # 3. The plugin's pod is deleted while the VMM runs: the DaemonSet's next pod takes over.
    # Beside it lie the sockets a plugin pod leaves when it dies without stopping (killed, then
    # deleted before its container came back; the soak met four at once, each retried by the
    # kubelet): the next pod removes them once they are older than a live instance's instant
    # between its bind and its listen (30 s).
    dead = ["/var/lib/kubelet/plugins_registry/vfio.dra.io-dead-pod-reg.sock",
            "/var/lib/kubelet/plugins/vfio.dra.io/dra-dead-pod.sock"]
    node.run("dead-sockets", "python3 -c 'import socket, sys\n"
             "for p in sys.argv[1:]: socket.socket(socket.AF_UNIX).bind(p)' " + " ".join(dead) +
             "\nuntil (( $(date +%s) - $(stat -c %Z " + dead[0] + ") > 31 )); do sleep 1; done",
             timeout=120)
    old = plugin_pods(cluster)[0]["metadata"]["name"]
    cluster.kubectl("delete", "pod", "-n", "vfio-dra", old, "--wait=false")
    wait_for("a new plugin pod to be Ready", lambda: (node.check_alive(), [
        p for p in plugin_pods(cluster) if p["metadata"]["name"] != old and pod_ready(p)])[1],
        600, on_timeout=node.guest_log)
    left = node.run("dead-sockets-left", f"ls {' '.join(dead)} 2>/dev/null; true").split()
    removed = [line for line in plugin_logs(node).splitlines()
               if "died without stopping" in line and "dead-pod" in line]
    check(not left and len(removed) == 2, "the new plugin pod removed the sockets of a plugin pod "
          "that died without stopping", {"left": left, "logged": removed})
    state = node_state(node, "state-plugin-restart")
    check(state["drivers"].get(GPU) == "vfio-pci" and mentions(state, uid),
          "after the plugin's pod was replaced the GPU is still on vfio-pci and still the claim's")
    check(running(cluster.get_json("pod", "vmm-gpu")), "vmm-gpu runs on")

    # 4. A rolling update (maxSurge 1: two plugin pods for a while) while a new claim comes, and
    # while vmm-gpu's VMM holds its GPU's group open. minReadySeconds keeps the old pod until the
    # new claim is prepared, so the prepare happens with both pods running and registered however
    # fast the machine is; setting it back lets the rollout finish.
    group_node = "/dev/vfio/" + node.run(
        "gpu-group", f"basename $(readlink /sys/bus/pci/devices/{GPU}/iommu_group)").strip()
    holders = vfio_holders(node, group_node)
    check(len(holders) == 1 and f"holding={group_node}" in report,
          f"before the rollout vmm-gpu's VMM (one process) holds {group_node} open", holders)
    old_pods = wait_for("the replaced plugin pod to be gone (one plugin pod)", lambda: (
        node.check_alive(), [p["metadata"]["name"] for p in plugin_pods(cluster)])[1]
        if len(plugin_pods(cluster)) == 1 else None, 300, on_timeout=node.guest_log)
    cluster.kubectl("patch", "daemonset/vfio-dra-plugin", "-n", "vfio-dra", "--type=merge", "-p",
                    json.dumps({"spec": {"minReadySeconds": 3600, "template": {"metadata": {
                        "annotations": {"vfio-dra.io/rollout": "real-node"}}}}}))

    def both_ready():
        node.check_alive()
        ready = [p for p in plugin_pods(cluster) if pod_ready(p)]
        return ready if len(ready) == 2 else None
    both = wait_for("the DaemonSet's surge pod to be Ready beside the old one", both_ready, 300,
                    on_timeout=node.guest_log)
    new_pods = [p["metadata"]["name"] for p in both if p["metadata"]["name"] not in old_pods]
    check(len(old_pods) == 1 and len(new_pods) == 1, "the rollout runs a new plugin pod beside "
          "the old one", {"old": old_pods, "new": new_pods})
    _, nic_claim, _ = start_vmm_pod(cluster, node, "vmm-nic", "nic", check, "hostdev-0000-02-00-0")
    nic_uid = nic_claim["metadata"]["uid"]
    logs = plugin_logs(node).splitlines()
    preparers = [pod_of_log_line(line) for line in logs
                 if "prepared claim" in line and nic_uid in line]
    ready_now = sorted(p["metadata"]["name"] for p in plugin_pods(cluster) if pod_ready(p))
    check(len(preparers) == 1 and preparers[0] in old_pods + new_pods and
          ready_now == sorted(old_pods + new_pods),
          "vmm-nic's claim was prepared once, by one of the two plugin pods, while both ran",
          {"preparers": preparers, "ready": ready_now})
    check.note(f"vmm-nic's claim was prepared by {preparers} (old {old_pods}, new {new_pods})")
    cluster.kubectl("patch", "daemonset/vfio-dra-plugin", "-n", "vfio-dra", "--type=merge", "-p",
                    json.dumps({"spec": {"minReadySeconds": 0}}))
    cluster.kubectl("rollout", "status", "daemonset/vfio-dra-plugin", "-n", "vfio-dra",
                    "--timeout=600s")
    # rollout status returns once the new pod is available; the old one is still stopping.
    wait_for("the old plugin pod to be gone", lambda: (node.check_alive(), [
        p["metadata"]["name"] for p in plugin_pods(cluster)] == new_pods)[1], 300,
        on_timeout=node.guest_log)
    nic_report = read_result(node, "vmm-nic")
    check("viable=1" in nic_report and "dra-hostdevice-dev pci 0000:02:00.0" in nic_report and
          "device=0000:02:00.0 fd=ok" in nic_report,
          "vmm-nic, started during the update, has its device: virt-launcher's code makes a PCI "
          "<hostdev> of the host device and the container opens it")
    pod = cluster.get_json("pod", "vmm-gpu")
    check(running(pod) and pod["status"]["containerStatuses"][0]["containerID"] == container_id
          and pod["status"]["containerStatuses"][0]["restartCount"] == 0,
          "after the rollout vmm-gpu runs on, in the same container")
    state = node_state(node, "state-rollout")
    check(vfio_holders(node, group_node) == holders and state["drivers"].get(GPU) == "vfio-pci"
          and mentions(state, uid), f"after the rollout the same VMM process still holds "
          f"{group_node}, the GPU is on vfio-pci and still the claim's",
          {"holders": vfio_holders(node, group_node), "driver": state["drivers"].get(GPU)})

    # 5. A device that goes away under a running pod: the kubelet shows it Unhealthy with the
    # plugin's reason, and the server's slice keeps it, tainted, while the claim holds it.
    node.run("remove-nic", "echo 1 > /sys/bus/pci/devices/0000:02:00.0/remove")
    unhealthy = wait_for("vmm-nic's device to show Unhealthy in its status", lambda: (
        node.check_alive(), [r for r in resource_health(cluster.get_json("pod", "vmm-nic"), "dev")
                             if r.get("health") == "Unhealthy"])[1], 180,
        on_timeout=lambda: json.dumps(cluster.get_json("pod", "vmm-nic")["status"], indent=1))
    check(len(unhealthy) == 1 and
          unhealthy[0].get("message", "").count("PCI function 0000:02:00.0 is gone") == 1,
          "the pod's status shows the removed device Unhealthy, with the plugin's reason", unhealthy)

    def lost_taint():
        node.check_alive()
        for item in cluster.get_json("resourceslices")["items"]:
            if item["spec"].get("nodeName") != NODE:
                continue
            for device in item["spec"].get("devices", []):
                if device["name"] == "hostdev-0000-02-00-0":
                    return [t for t in device.get("taints", [])
                            if t["key"] == "vfio.dra.io/lost"] or None
        return None
    taints = wait_for("the lost taint on hostdev-0000-02-00-0 in the server's slice", lost_taint,
                      180, on_timeout=node.guest_log)
    check(len(taints) == 1 and taints[0].get("effect") == "NoSchedule" and
          taints[0].get("value") == "removed",
          "the server's slice keeps the removed device, tainted vfio.dra.io/lost=removed "
          "NoSchedule, while its claim is prepared", taints)
    delete_pod(cluster, node, "vmm-nic")
    node.run("rescan", "echo 1 > /sys/bus/pci/rescan")
    state = node_state(node, "state-nic-back")
    check(state["drivers"].get("0000:02:00.0") == before["drivers"].get("0000:02:00.0"),
          "after a rescan the NIC is back on its host driver", state["drivers"])
    check(not mentions(state, nic_uid), "nothing of vmm-nic's claim is left")
    untainted = wait_for("hostdev-0000-02-00-0 published again without the lost taint",
                         lambda: lost_taint() is None and any(
                             d["name"] == "hostdev-0000-02-00-0"
                             for i in cluster.get_json("resourceslices")["items"]
                             if i["spec"].get("nodeName") == NODE
                             for d in i["spec"].get("devices", [])), 180,
                         on_timeout=node.guest_log)
    check(untainted, "after the claim and the rescan the device is published untainted")

    # 6. Deleting the VMM's pod: the kubelet unprepares, the GPU goes back, nothing is left.
    delete_pod(cluster, node, "vmm-gpu")
    after = node_state(node, "state-after")
    check(after["drivers"].get(GPU) == before["drivers"].get(GPU) and
          after["drivers"].get("0000:01:00.1") == before["drivers"].get("0000:01:00.1"),
          "the GPU and its companion are back on the drivers they had", after["drivers"])
    check(not mentions(after, uid), "no CDI spec, metadata file or checkpoint entry of the claim",
          mentions(after, uid))
    # Everything above ran with the hardened pod: the profile denied it nothing it needed, and
    # nothing at all (a denial is a path the profile misses or the plugin should not touch).
    denials = apparmor_denials(node, "vfio-dra-plugin")
    check(not denials, "the kernel logged no AppArmor denial for vfio-dra-plugin",
          denials[:3])
    with open(os.path.join(node.out, "logs", "kubelet.log"), errors="replace") as f:
        watcher_errors = [line for line in f if "Error when handling create event" in line]
    check(not watcher_errors, "the kubelet's plugin watcher logged no error about the plugin's "
          "sockets", watcher_errors[:2])


def patch_plugin_template(cluster, ops):
    cluster.kubectl("patch", "daemonset/vfio-dra-plugin", "-n", "vfio-dra", "--type=json", "-p",
                    json.dumps(ops))


def only_new_plugin_pod(cluster, node, old_names, ready, what):
    """Waits for the rollout's new plugin pod (Ready, or running its container at least) and,
    when it is Ready, for the old one to be gone, so that the kubelet has only the new one."""
    def settled():
        node.check_alive()
        pods = plugin_pods(cluster)
        new = [p for p in pods if p["metadata"]["name"] not in old_names]
        if len(new) != 1:
            return None
        if ready:
            return new[0] if pod_ready(new[0]) and len(pods) == 1 else None
        return new[0] if new[0].get("status", {}).get("containerStatuses") else None
    return wait_for(what, settled, 600, on_timeout=node.guest_log)


def pod_events(cluster, name):
    return [e.get("message", "") for e in cluster.get_json(
        "events", "--field-selector", f"involvedObject.name={name}")["items"]]


def scenario_privileges(cluster, node, check):
    """Each write privilege of the hardened pod taken away, one at a time: the step that needs it
    fails, and the plugin says what is missing (README, "Security"). The pod holds no capability,
    so there is none to take away; what it holds are the AppArmor profile and the writable host
    paths."""
    check_least_privilege(cluster, node, check)
    cluster.kubectl("apply", "-f", "-", input=json.dumps(claim_template("gpu", "gpu.vfio.dra.io")))
    template = cluster.get_json("daemonset", "vfio-dra-plugin", "-n", "vfio-dra")["spec"][
        "template"]
    container = template["spec"]["containers"][0]
    mount_index = {m["name"]: i for i, m in enumerate(container["volumeMounts"])}
    base = "/spec/template/spec/containers/0"

    def read_only(volume):
        return [{"op": "add", "path": f"{base}/volumeMounts/{mount_index[volume]}/readOnly",
                 "value": True}]
    apparmor_default = [{"op": "replace", "path": f"{base}/securityContext/appArmorProfile",
                         "value": {"type": "RuntimeDefault"}}]
    gpu_before = node_state(node, "privileges-before")["drivers"].get(GPU)
    # (what is taken away, the patch, whether the pod still becomes Ready, what its log then
    # says, what a GPU claim's prepare then fails with (None: it never gets there)).
    missing_sysfs = "privilege missing: write access to /sys/"
    cases = [
        ("the host's /sys read-write", read_only("sys"), True,
         [missing_sysfs, "Read-only file system"], missing_sysfs),
        ("the AppArmor profile vfio-dra-plugin (RuntimeDefault instead)", apparmor_default, True,
         [missing_sysfs, "Permission denied"], missing_sysfs),
        ("/var/run/cdi read-write", read_only("cdi"), True, None, "/var/run/cdi"),
        ("the kubelet's plugin registry read-write", read_only("plugins-registry"), False,
         ["cannot listen on unix socket /var/lib/kubelet/plugins_registry/"], None),
        ("its data directory read-write", read_only("plugins"), False,
         ["/var/lib/kubelet/plugins/vfio.dra.io", "Read-only file system"], None),
    ]
    for number, (what, ops, ready, logged, refused) in enumerate(cases):
        old = [p["metadata"]["name"] for p in plugin_pods(cluster)]
        patch_plugin_template(cluster, ops)
        pod = only_new_plugin_pod(cluster, node, old, ready, f"the plugin pod without {what}")
        name = pod["metadata"]["name"]
        if logged:
            lines = wait_for(f"{name}'s log to say {logged}", lambda: (node.check_alive(), [
                line for line in plugin_logs(node).splitlines()
                if pod_of_log_line(line) == name and all(t in line for t in logged)])[1], 300,
                on_timeout=lambda: "\n".join(line for line in plugin_logs(node).splitlines()
                                             if pod_of_log_line(line) == name)[-3000:])
            check(bool(lines), f"without {what}, the plugin's log says what is missing",
                  lines[:1])
        if refused:
            vmm = f"vmm-denied-{number}"
            cluster.kubectl("apply", "-f", "-", input=json.dumps(vmm_pod(vmm, "gpu")))
            events = wait_for(f"{vmm}'s prepare to fail", lambda: (node.check_alive(), [
                m for m in pod_events(cluster, vmm) if refused in m])[1], 300,
                on_timeout=lambda: "\n".join(pod_events(cluster, vmm)) + node.guest_log(20))
            check(bool(events), f"without {what}, a GPU claim's prepare fails and the kubelet's "
                  f"event carries the plugin's reason ({refused!r})", events[:1])
            delete_pod(cluster, node, vmm)
            driver = node_state(node, f"privileges-{number}")["drivers"].get(GPU)
            check(driver == gpu_before, "the refused prepare left the GPU on its host driver",
                  driver)
        restore_shipped_plugin_pod(cluster, node, template, str(number))
    device_holders_cases(cluster, node, check, template, gpu_before)
    state = node_state(node, "privileges-after")
    check(state["drivers"].get(GPU) == gpu_before and not state["cdi"],
          "after every case the GPU is on its host driver and no CDI spec is left",
          {"driver": state["drivers"].get(GPU), "cdi": sorted(state["cdi"])})
    denials = apparmor_denials(node, "vfio-dra-plugin")
    check(not denials, "the kernel logged no AppArmor denial for vfio-dra-plugin", denials[:3])


# A VMM left behind by its pod: a process outside every pod (in the VMM container's mount
# namespace, for its /dev/vfio) that has assigned the GPU and holds it; its PID when it holds.
HOLDER_SCRIPT = """
for q in $(pgrep -f '^/bin/busybox sleep 100000'); do
  tr '\\0' '\\n' </proc/$q/environ 2>/dev/null | grep -qx 'POD={pod}' && p=$q
done
[ -n "$p" ] || {{ echo "no VMM process of {pod}"; exit 1; }}
rm -f /run/holder.out
setsid -f nsenter -t $p -m -r -- /bin/vfio-check {device} --hold </dev/null >/run/holder.out 2>&1
for i in $(seq 600); do grep -qx holding /run/holder.out && break; sleep 0.1; done
grep -qx holding /run/holder.out || {{ cat /run/holder.out; exit 1; }}
pgrep -f '^/bin/vfio-check {device} --hold'
"""


def device_holders_cases(cluster, node, check, template, gpu_before):
    """The deviceHolders feature (hostPID and SYS_PTRACE, deploy/features/device-holders): a VMM
    left behind holds the GPU, so the unprepare after its pod's deletion cannot give the GPU back
    and says who holds it. With the feature the plugin names the holder; with hostPID but without
    SYS_PTRACE it cannot read the holder's descriptors and says that CAP_SYS_PTRACE is missing.
    Once the holder exits the kernel finishes the unbind and the retried unprepare completes."""
    spec = "/spec/template/spec"
    host_pid = {"op": "add", "path": f"{spec}/hostPID", "value": True}
    # The server keeps no empty list: the shipped pod's `add: []` is not there to append to.
    ptrace = {"op": "add", "path": f"{spec}/containers/0/securityContext/capabilities/add",
              "value": ["SYS_PTRACE"]}
    cases = [("deviceHolders (hostPID and SYS_PTRACE)", [host_pid, ptrace], "held by pid {pid} ("),
             ("hostPID without SYS_PTRACE", [host_pid], "without CAP_SYS_PTRACE")]
    for number, (what, ops, want) in enumerate(cases):
        old = [p["metadata"]["name"] for p in plugin_pods(cluster)]
        patch_plugin_template(cluster, ops)
        plugin = only_new_plugin_pod(cluster, node, old, True, f"the plugin pod with {what}")
        name = plugin["metadata"]["name"]
        vmm = f"vmm-left-{number}"
        start_vmm_pod(cluster, node, vmm, "gpu", check, "gpu-0000-01-00-0")
        read_result(node, vmm)
        holder = node.run(f"holder-{number}", HOLDER_SCRIPT.format(pod=vmm, device=GPU)).split()
        check(len(holder) == 1, f"a process outside {vmm} holds {GPU}", holder)
        cluster.kubectl("delete", "pod", vmm, "--wait=false")
        text = want.format(pid=holder[0] if holder else "?")
        lines = wait_for(f"{name}'s log to say the GPU is held ({text!r})", lambda: (
            node.check_alive(), [line for line in plugin_logs(node).splitlines()
                                 if pod_of_log_line(line) == name and "in use" in line and
                                 text in line])[1], 300,
            on_timeout=lambda: "\n".join(line for line in plugin_logs(node).splitlines()
                                         if pod_of_log_line(line) == name)[-3000:])
        check(bool(lines), f"with {what}, the unprepare of a GPU a VMM left behind holds fails "
              f"saying {text!r}", lines[:1])
        check(cluster.kubectl("get", "pod", vmm, check=False).returncode == 0,
              f"{vmm} stays (Terminating) while its GPU cannot be given back")
        node.run(f"holder-{number}-exit", f"pkill -f '^/bin/vfio-check {GPU} --hold'; exit 0")
        wait_for(f"pod {vmm} to be gone once the holder exited", lambda: (
            node.check_alive(), cluster.kubectl("get", "pod", vmm, check=False).returncode != 0)[1],
            300, on_timeout=node.guest_log)
        driver = node_state(node, f"holders-{number}")["drivers"].get(GPU)
        check(driver == gpu_before, "then the retried unprepare gave the GPU back to its host "
              "driver", driver)
        restore_shipped_plugin_pod(cluster, node, template, f"h{number}")


def restore_shipped_plugin_pod(cluster, node, template, mark):
    """Back to the shipped pod template, as a new revision (marked `mark`) so that a new pod
    replaces the one of the case before."""
    old = [p["metadata"]["name"] for p in plugin_pods(cluster)]
    restored = json.loads(json.dumps(template))
    restored["metadata"].setdefault("annotations", {})["vfio-dra.io/restored"] = mark
    patch_plugin_template(cluster, [{"op": "replace", "path": "/spec/template",
                                     "value": restored}])
    only_new_plugin_pod(cluster, node, old, True, "the shipped plugin pod back")


SCENARIOS = {"node": scenario_node, "privileges": scenario_privileges}


def make_node(args):
    """The binaries and images (built or taken from the cache), a clean work directory, and the
    control plane and node made from them, neither started yet."""
    hack = os.path.join(SOURCE_DIR, "hack")
    kube_bin = tool_output([os.path.join(hack, "kube-binaries.sh"), args.release,
                            "--with-kubelet"], "hack/kube-binaries.sh")
    runtime_bin = tool_output([os.path.join(hack, "node-runtime-binaries.sh")],
                              "hack/node-runtime-binaries.sh")
    images_dir = tool_output([os.path.join(HERE, "images.sh")], "test/real-node/images.sh")
    shutil.rmtree(args.work_dir, ignore_errors=True)
    os.makedirs(args.work_dir)
    work = os.path.abspath(args.work_dir)
    plugin_oci = os.path.join(work, "plugin.oci.tar")
    tool_output([os.path.join(hack, "image.sh"), "--binary",
                 os.path.join(args.build_dir, "src", "vfio-dra-plugin"), "--output", plugin_oci],
                "hack/image.sh")
    plugin_archive = os.path.join(work, "plugin.docker.tar")
    subprocess.run(["skopeo", "copy", "--quiet", f"oci-archive:{plugin_oci}",
                    f"docker-archive:{plugin_archive}:{PLUGIN_IMAGE}"], check=True)
    images = [os.path.join(images_dir, "pause.tar"), os.path.join(images_dir, "test.tar"),
              plugin_archive]
    cluster = ControlPlane(kube_bin, os.path.join(work, "control-plane"), args.release)
    return cluster, RealNode(cluster, args, kube_bin, runtime_bin, images)


def bring_up(cluster, node, check):
    """Starts the control plane, deploys vfio-dra with POLICY, boots the node and waits for the
    plugin's pod on it to be Ready."""
    cluster.start(node_names=(NODE,))
    print(f"control plane up at {cluster.server}", flush=True)
    cluster.kubectl("apply", "-k", os.path.join(SOURCE_DIR, "deploy", "daemonset"))
    policy = {"apiVersion": "v1", "kind": "ConfigMap",
              "metadata": {"name": "vfio-dra-admin-policy", "namespace": "vfio-dra"},
              "data": {"policy.yaml": POLICY}}
    cluster.kubectl("apply", "-f", "-", input=json.dumps(policy))
    node.write_config()
    booted = time.monotonic()
    node.boot()
    wait_node_ready(cluster, node)
    check.note(f"TIMING Node {NODE} Ready {time.monotonic() - booted:.0f} s after QEMU started")
    wait_for("the vfio-dra DaemonSet pod on the node to be Ready", lambda: (
        node.check_alive(), pod_ready(plugin_pod(cluster)))[1], 600,
        on_timeout=lambda: json.dumps((plugin_pod(cluster) or {}).get("status"), indent=1) +
        "\n" + node.guest_log(20))
    print("the plugin's pod is Ready", flush=True)


def on_node(args, body, what):
    """Makes the control plane and the node, brings them up, runs body(cluster, node, check),
    and stops both; a failure is a failed check named what() and printed with the logs that
    explain it. Returns the checks."""
    # A SIGTERM (kill, timeout(1), a CI job stopped) ends the run as Ctrl-C does, through the
    # finally below: its default action skips it and leaves QEMU and the control plane running.
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    for attempt in (1, 2):
        cluster, node = make_node(args)
        check = Checks(os.path.join(os.path.abspath(args.work_dir), "report.txt"))
        try:
            try:
                bring_up(cluster, node, check)
            except Exception:
                # The emulated node's own kernel can hang under TCG before anything of ours runs
                # on it (both vCPUs in a soft lockup while the kubelet starts): that says nothing
                # of what is tested, so the node is booted once more. Any other failure counts.
                if attempt == 1 and guest_hung(node):
                    print("the node's kernel hung under TCG while coming up (soft lockup in its "
                          "console); booting a new node once", flush=True)
                    continue
                raise
            body(cluster, node, check)
        except Exception as error:  # report every failure with the logs that explain it
            check(False, f"{what()}: {error}")
            traceback.print_exc()
            print(cluster.logs_tail(), file=sys.stderr)
        finally:
            node.stop()
            print(node.guest_log(60), file=sys.stderr if check.failed else sys.stdout)
            cluster.stop()
        return check


def guest_hung(node):
    try:
        with open(os.path.join(node.out, "console.log"), errors="replace") as f:
            return "soft lockup" in f.read()
    except OSError:
        return False


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--release", default="1.37")
    parser.add_argument("--build-dir", required=True)
    parser.add_argument("--work-dir", required=True)
    parser.add_argument("scenario")
    args = parser.parse_args()
    scenario = SCENARIOS.get(args.scenario)
    if scenario is None:
        print(f"run.py: unknown scenario {args.scenario!r} (known: {', '.join(SCENARIOS)})",
              file=sys.stderr)
        return 2
    check = on_node(args, scenario, lambda: args.scenario)
    print(f"{check.failed} failed check(s)" if check.failed else "all checks passed", flush=True)
    return 1 if check.failed else 0


if __name__ == "__main__":
    sys.exit(main())
