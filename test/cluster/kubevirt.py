"""KubeVirt's judgement of VirtualMachineInstances on the real control plane, for the examples.

KubeVirt's VirtualMachineInstance CRD (the schema virt-operator installs) and a validating webhook
at virt-api's path that runs KubeVirt's own admission checks for what vfio-dra's users write
(feature gates, networks, DRA resource claims), both from the KubeVirt release pinned in
test/cluster/components/kubevirt-1.9 (hack/kubevirt-binary.sh). The webhook runs on this machine's
loopback with a certificate of the test cluster's CA; the API server calls it for every VMI
creation, dry runs included. What it does not run: virt-api's other checks (CPU, memory, disks,
and the like) and virt-controller, which need KubeVirt's images."""

import base64
import json
import os

from control_plane import ClusterError, Fatal, Process, free_port, openssl, wait_for

WEBHOOK = "vfio-dra-test-kubevirt-vmi"
CREATE_PATH = "/virtualmachineinstances-validate-create"


class KubevirtAdmission:
    def __init__(self, cluster, tool_dir):
        self.cluster = cluster
        self.tool = os.path.join(tool_dir, "kubevirt-vmi")
        self.crd = os.path.join(tool_dir, "vmi-crd.yaml")
        for path in (self.tool, self.crd):
            if not os.path.exists(path):
                raise ClusterError(f"{path} is missing: run hack/kubevirt-binary.sh")
        self.process = None
        self.dir = os.path.join(cluster.dir, "kubevirt")
        os.makedirs(self.dir, exist_ok=True)

    def install_crd(self):
        self.cluster.kubectl("apply", "--server-side", "-f", self.crd)
        def established():
            crd = self.cluster.get_json("crd", "virtualmachineinstances.kubevirt.io")
            return any(c["type"] == "Established" and c["status"] == "True"
                       for c in crd.get("status", {}).get("conditions") or [])
        wait_for("KubeVirt's VirtualMachineInstance CRD to be established", established, 60)

    def _certificate(self):
        key, csr, crt = (os.path.join(self.dir, n) for n in ("webhook.key", "webhook.csr",
                                                              "webhook.crt"))
        if os.path.exists(crt):
            return crt, key
        ext = os.path.join(self.dir, "san.ext")
        with open(ext, "w") as f:
            f.write("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
        openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                "-nodes", "-keyout", key, "-out", csr, "-subj", "/CN=kubevirt-vmi",
                cwd=self.dir)
        pki = self.cluster.pki
        openssl("x509", "-req", "-in", csr, "-CA", os.path.join(pki, "ca.crt"), "-CAkey",
                os.path.join(pki, "ca.key"), "-CAcreateserial", "-out", crt, "-days", "2",
                "-extfile", ext, cwd=self.dir)
        return crt, key

    def start(self, gates):
        """(Re)starts the webhook with a KubeVirt configuration enabling `gates`, registers it,
        and returns once the API server calls it: a VMI KubeVirt must refuse is refused."""
        self.stop()
        crt, key = self._certificate()
        port = free_port()
        log = os.path.join(self.dir, "webhook.log")
        self.process = Process("kubevirt-vmi",
                               [self.tool, "serve", "--listen", f"127.0.0.1:{port}", "--cert", crt,
                                "--key", key, "--feature-gates", ",".join(gates)], log)
        self.cluster.processes["kubevirt-vmi"] = self.process

        def serving():
            if not self.process.alive():
                raise Fatal(f"kubevirt-vmi exited\n{self.process.tail()}")
            with open(log, errors="replace") as f:
                return "serving https://" in f.read()
        wait_for("the KubeVirt VMI admission webhook to listen", serving, 60,
                 on_timeout=self.process.tail)
        with open(os.path.join(self.cluster.pki, "ca.crt"), "rb") as f:
            ca_bundle = base64.b64encode(f.read()).decode()
        config = {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": WEBHOOK},
            "webhooks": [{
                # virt-api's name and rule for VMI creation.
                "name": "virtualmachineinstances-create-validator.kubevirt.io",
                "clientConfig": {"url": f"https://127.0.0.1:{port}{CREATE_PATH}",
                                 "caBundle": ca_bundle},
                "rules": [{"operations": ["CREATE"], "apiGroups": ["kubevirt.io"],
                           "apiVersions": ["v1alpha3", "v1"],
                           "resources": ["virtualmachineinstances"]}],
                "failurePolicy": "Fail",
                "sideEffects": "None",
                "admissionReviewVersions": ["v1", "v1beta1"],
            }],
        }
        self.cluster.kubectl("apply", "-f", "-", input=json.dumps(config))
        # The API server's webhook configuration is eventually consistent: wait until this
        # webhook answers: a GPU naming a claim the VMI does not list is refused by KubeVirt's DRA
        # check, in its words (the CRD schema allows it).
        probe = vmi("webhook-probe", gpus=[{"name": "gpu", "claimName": "missing",
                                            "requestName": "gpu"}])

        last = []

        def refused():
            result = self.dry_run(probe)
            last[:] = [result.stderr + result.stdout]
            return result.returncode != 0 and \
                "vmi.spec.resourceClaims must specify all claims" in last[0]
        wait_for("the API server to call the KubeVirt VMI admission webhook", refused, 60,
                 on_timeout=lambda: f"last answer: {last}\n{self.process.tail()}")

    def dry_run(self, obj):
        return self.cluster.kubectl("create", "--dry-run=server", "-f", "-", check=False,
                                    input=json.dumps(obj))

    def stop(self):
        if self.process:
            self.process.stop()
            self.cluster.processes.pop("kubevirt-vmi", None)
            self.process = None


def vmi(name, gpus=(), resource_claims=()):
    """A VirtualMachineInstance with the given DRA GPUs and resource claims and nothing else of
    note."""
    spec = {"domain": {"devices": {"gpus": list(gpus)},
                       "resources": {"requests": {"memory": "1Gi"}}}}
    if resource_claims:
        spec["resourceClaims"] = list(resource_claims)
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": name, "namespace": "default"}, "spec": spec}
