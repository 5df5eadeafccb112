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
import json
import os
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
    def __init__(self):
        self.failed = 0

    def __call__(self, condition, what, detail=""):
        print(f"{'ok  ' if condition else 'FAIL'} {what}{': ' + str(detail) if detail else ''}",
              flush=True)
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
        with open(os.path.join(self.out, "node.env"), "w") as f:
            f.write(f"NODE_DIR={self.dir}\nKUBE_BIN={self.kube_bin}\n"
                    f"RUNTIME_BIN={self.runtime_bin}\nIMAGES='{' '.join(self.images)}'\n")

    def boot(self):
        env = {**os.environ, "VFIO_DRA_VM_API_PORT": str(self.cluster.api_port),
               "VFIO_DRA_VM_ROOT": "overlay", "VFIO_DRA_VM_MEMORY": "3072",
               "VFIO_DRA_E2E_VM_TIMEOUT": "2400", "BUILD_DIR": self.build}
        for name in ("stop", "node-ready", "node-failed", "exit-code"):
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

    def guest_log(self, lines=40):
        parts = []
        for name in ("guest.log", "console.log", "logs/kubelet.log", "logs/containerd.log"):
            path = os.path.join(self.out, name)
            if os.path.exists(path):
                with open(path, errors="replace") as f:
                    text = f.read().splitlines()[-lines:]
                parts.append(f"--- last lines of {path} ---\n" + "\n".join(text))
        return "\n".join(parts)

    def stop(self):
        if self.qemu is None:
            return
        open(os.path.join(self.out, "stop"), "w").close()
        try:
            self.qemu.wait(180)
        except subprocess.TimeoutExpired:
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


def vmm_pod(name, template):
    """What virt-launcher's pod looks like to the node: a container that gets the claim's devices
    and reads the metadata file; here it reports what it found into the results directory."""
    script = (
        "exec >/results/$POD.txt 2>&1; "
        "/bin/vfio-check; echo vfio-check-exit=$?; "
        "for f in /var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/*/*/*; do "
        "echo metadata-file=$f; cat $f; echo; done; "
        "echo done; exec /bin/busybox sleep 100000")
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": NODE},
                     "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "vmm", "image": TEST_IMAGE,
                                     "imagePullPolicy": "Never",
                                     "command": ["/bin/sh", "-c", script],
                                     "env": [{"name": "POD", "value": name}],
                                     "resources": {"claims": [{"name": "gpu"}]},
                                     "volumeMounts": [{"name": "results",
                                                       "mountPath": "/results"}]}],
                     "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
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


def scenario_gpu_pod(cluster, node, check):
    cluster.kubectl("apply", "-f", "-", input=json.dumps(claim_template("gpu", "gpu.vfio.dra.io")))
    started = time.monotonic()
    cluster.kubectl("apply", "-f", "-", input=json.dumps(vmm_pod("vmm-gpu", "gpu")))
    pod = wait_pod(cluster, node, "vmm-gpu", lambda p: p.get("status", {}).get("phase") ==
                   "Running", "to run", 600)
    running = time.monotonic() - started
    report = read_result(node, "vmm-gpu")
    print(report, flush=True)
    claim_name = pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
    claim = cluster.get_json("resourceclaim", claim_name)
    results = claim["status"]["allocation"]["devices"]["results"]
    check(len(results) == 1 and results[0]["device"] == "gpu-0000-01-00-0",
          "the scheduler allocated the GPU", results)
    check("/dev/vfio/vfio char=1" in report and "open=ok api=0" in report,
          "the container has /dev/vfio/vfio and it opens (VFIO_GET_API_VERSION 0)")
    check("viable=1" in report, "the container opens the GPU's group and the kernel calls it "
          "viable (every function of it on vfio-pci)")
    check("vfio-check-exit=0" in report, "vfio-check passed")
    check(f'"{GPU}"' in report and "resource.kubernetes.io/pciBusID" in report,
          "the KubeVirt metadata file names the GPU's pciBusID")
    print(f"pod created -> container running: {running:.1f} s", flush=True)

    cluster.kubectl("delete", "pod", "vmm-gpu", "--wait=false")
    wait_for("pod vmm-gpu to be gone", lambda: cluster.kubectl(
        "get", "pod", "vmm-gpu", check=False).returncode != 0, 300, on_timeout=node.guest_log)
    check(True, "deleting the pod: the kubelet finished it (the claim was unprepared)")


SCENARIOS = {"gpu-pod": scenario_gpu_pod}


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
    node = None
    check = Checks()
    try:
        cluster.start(node_names=(NODE,))
        print(f"control plane up at {cluster.server}", flush=True)
        cluster.kubectl("apply", "-k", os.path.join(SOURCE_DIR, "deploy", "daemonset"))
        policy = {"apiVersion": "v1", "kind": "ConfigMap",
                  "metadata": {"name": "vfio-dra-admin-policy", "namespace": "vfio-dra"},
                  "data": {"policy.yaml": POLICY}}
        cluster.kubectl("apply", "-f", "-", input=json.dumps(policy))
        node = RealNode(cluster, args, kube_bin, runtime_bin, images)
        node.write_config()
        booted = time.monotonic()
        node.boot()
        wait_node_ready(cluster, node)
        print(f"Node {NODE} Ready {time.monotonic() - booted:.0f} s after QEMU started",
              flush=True)
        wait_for("the vfio-dra DaemonSet pod on the node to be Ready", lambda: (
            node.check_alive(), pod_ready(plugin_pod(cluster)))[1], 600,
            on_timeout=lambda: json.dumps((plugin_pod(cluster) or {}).get("status"), indent=1) +
            "\n" + node.guest_log(20))
        print("the plugin's pod is Ready", flush=True)
        scenario(cluster, node, check)
    except Exception as error:  # report every failure with the logs that explain it
        check(False, f"{args.scenario}: {error}")
        traceback.print_exc()
        print(cluster.logs_tail(), file=sys.stderr)
    finally:
        if node is not None:
            node.stop()
            print(node.guest_log(60), file=sys.stderr if check.failed else sys.stdout)
        cluster.stop()
    print(f"{check.failed} failed check(s)" if check.failed else "all checks passed", flush=True)
    return 1 if check.failed else 0


if __name__ == "__main__":
    sys.exit(main())
