#!/usr/bin/env python3
"""The Helm chart (deploy/helm/vfio-dra) without a cluster: `helm lint` is clean; `helm template`
with the default values renders exactly the objects of `kubectl kustomize deploy/daemonset` (one
source of truth, object by object); a values file with every option set renders as values.yaml
documents it; wrong values are refused by values.schema.json with a message naming them.

  helm_chart_test.py HELM KUBECTL
"""

import os
import subprocess
import sys
import tempfile

import yaml

SOURCE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHART = os.path.join(SOURCE, "deploy", "helm", "vfio-dra")

failures = []


def check(condition, what):
    if not condition:
        failures.append(what)
        print(f"FAIL {what}", file=sys.stderr)


def run(args, expect_ok=True):
    result = subprocess.run(args, capture_output=True, text=True)
    if expect_ok and result.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
    return result


def objects(text):
    out = {}
    for doc in yaml.safe_load_all(text):
        if not doc:
            continue
        key = (doc["kind"], doc["metadata"].get("namespace", ""), doc["metadata"]["name"])
        if key in out:
            raise SystemExit(f"{key} rendered twice")
        out[key] = doc
    return out


def whitespace_normalized(value):
    """Strings with each run of whitespace as one space: kustomize re-serializes folded (>-)
    scalars with more-indented lines (the CEL expressions) with an extra line break, which CEL
    reads the same; everything else must be equal."""
    if isinstance(value, dict):
        return {k: whitespace_normalized(v) for k, v in value.items()}
    if isinstance(value, list):
        return [whitespace_normalized(v) for v in value]
    if isinstance(value, str):
        return " ".join(value.split())
    return value


def template(helm, *args):
    return objects(run([helm, "template", "vfio-dra", CHART, *args]).stdout)


def main():
    helm, kubectl = sys.argv[1:3]

    lint = run([helm, "lint", "--strict", CHART], expect_ok=False)
    check(lint.returncode == 0 and "0 chart(s) failed" in lint.stdout,
          f"helm lint --strict is not clean:\n{lint.stdout}{lint.stderr}")

    # Defaults: the same objects as the kustomize manifests.
    chart = template(helm)
    kustomize = objects(run([kubectl, "kustomize", os.path.join(SOURCE, "deploy", "daemonset")])
                        .stdout)
    check(set(chart) == set(kustomize),
          f"objects differ: only in the chart {sorted(set(chart) - set(kustomize))}, only in "
          f"deploy/daemonset {sorted(set(kustomize) - set(chart))}")
    for key in sorted(set(chart) & set(kustomize)):
        check(whitespace_normalized(chart[key]) == whitespace_normalized(kustomize[key]),
              f"{key} differs from deploy/daemonset:\n"
              f"chart:     {chart[key]}\nkustomize: {kustomize[key]}")
    print(f"helm template with default values = kubectl kustomize deploy/daemonset "
          f"({len(chart)} objects)")

    # The optional features: each value renders what its kustomize component adds.
    for setting, components in (("sriovNetwork.enabled=true", ["sriov-network"]),
                                ("deviceHolders.enabled=true", ["device-holders"]),
                                ("sriovNetwork.enabled=true,deviceHolders.enabled=true",
                                 ["sriov-network", "device-holders"])):
        with tempfile.TemporaryDirectory() as overlay:
            with open(os.path.join(overlay, "kustomization.yaml"), "w") as f:
                yaml.safe_dump({
                    "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                    # kustomize takes only relative paths
                    "resources": [os.path.relpath(os.path.join(SOURCE, "deploy", "daemonset"),
                                                  overlay)],
                    "components": [os.path.relpath(os.path.join(SOURCE, "deploy", "features", c),
                                                   overlay) for c in components]}, f)
            with_feature = objects(run([kubectl, "kustomize", "--load-restrictor",
                                        "LoadRestrictionsNone", overlay]).stdout)
        featured = template(helm, "--set", setting)
        key = ("DaemonSet", "vfio-dra", "vfio-dra-plugin")
        check(featured[key] == with_feature[key],
              f"--set {setting} differs from deploy/features/{components}:\n"
              f"chart:     {featured[key]['spec']['template']['spec']}\n"
              f"kustomize: {with_feature[key]['spec']['template']['spec']}")
    print("each optional feature renders as its kustomize component")

    # Every option set.
    values = {
        "namespace": {"create": False, "name": "vms-infra"},
        "image": {"repository": "registry.example.com/vfio-dra/vfio-dra-plugin", "tag": "0.2.0",
                  "pullPolicy": "Always"},
        "imagePullSecrets": [{"name": "regcred"}],
        # Maps merge with the defaults; null drops a default key (values.yaml says so).
        "nodeSelector": {"gpu": "yes", "vfio-dra.io/enabled": None},
        "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "zone", "operator": "In", "values": ["a"]}]}]}}},
        "podAnnotations": {"example.com/team": "vms"},
        "priorityClassName": "",
        "resources": {"requests": {"cpu": "20m", "memory": "64Mi"}, "limits": None},
        "logLevel": 4, "healthInterval": 3, "unbindTimeout": 30, "metricsPort": 9090,
        "extraArgs": ["--rescan-interval=60"],
        "adminPolicy": "version: v1\nkinds: {hostdev: false}\n",
        "deviceClasses": {"gpu": True, "mdev": False, "vf": True, "hostdev": False, "vgpu": False},
        "admissionPolicies": False,
    }
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump(values, f)
        values_file = f.name
    try:
        rendered = template(helm, "-f", values_file)
    finally:
        os.unlink(values_file)
    kinds = {k[0] for k in rendered}
    check("Namespace" not in kinds, "namespace.create: false still renders the Namespace")
    check(not {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} & kinds,
          "admissionPolicies: false still renders the policies")
    classes = sorted(k[2] for k in rendered if k[0] == "DeviceClass")
    check(classes == ["gpu.vfio.dra.io", "vf.vfio.dra.io"], f"DeviceClasses {classes}")
    ds = rendered[("DaemonSet", "vms-infra", "vfio-dra-plugin")]
    pod = ds["spec"]["template"]
    container = pod["spec"]["containers"][0]
    check(container["image"] == "registry.example.com/vfio-dra/vfio-dra-plugin:0.2.0",
          f"image {container['image']}")
    check(container["imagePullPolicy"] == "Always", "pullPolicy")
    check(pod["spec"]["imagePullSecrets"] == [{"name": "regcred"}], "imagePullSecrets")
    check(pod["spec"]["nodeSelector"] == {"gpu": "yes"}, "nodeSelector")
    check(pod["spec"]["tolerations"] == values["tolerations"], "tolerations")
    check(pod["spec"]["affinity"] == values["affinity"], "affinity")
    check(pod["metadata"]["annotations"] == {"example.com/team": "vms"}, "podAnnotations")
    check("priorityClassName" not in pod["spec"], "an empty priorityClassName is left out")
    check(container["resources"] == {"requests": {"cpu": "20m", "memory": "64Mi"}}, "resources")
    args = container["args"]
    for flag in ("--v=4", "--health-interval=3", "--unbind-timeout=30",
                 "--metrics-address=:9090", "--rescan-interval=60"):
        check(flag in args, f"{flag} not in the DaemonSet's args {args}")
    check(container["ports"][0]["containerPort"] == 9090, "metrics port")
    config = rendered[("ConfigMap", "vms-infra", "vfio-dra-admin-policy")]
    check(config["data"]["policy.yaml"].strip() == values["adminPolicy"].strip(),
          f"admin policy {config['data']['policy.yaml']!r}")
    binding = rendered[("ClusterRoleBinding", "", "vfio-dra-plugin")]
    check(binding["subjects"][0]["namespace"] == "vms-infra", "the binding's namespace")
    print("a values file with every option set renders as documented")

    # Wrong values: refused, naming the value.
    for setting, needle in (("logLevel=loud", "logLevel"), ("image.pullPolicy=Sometimes",
                                                            "pullPolicy"),
                            ("imagee.tag=x", "imagee"), ("healthInterval=30", "healthInterval"),
                            ("extraArgs[0]=rescan", "extraArgs"),
                            ("namespace.name=Not_A_Name", "namespace")):
        result = run([helm, "template", "vfio-dra", CHART, "--set", setting], expect_ok=False)
        check(result.returncode != 0 and needle in result.stderr and "schema" in result.stderr,
              f"--set {setting} was not refused by the schema: {result.stderr.strip()[:300]}")
    print("wrong values are refused by values.schema.json")
    if failures:
        print(f"{len(failures)} problems", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
