#!/usr/bin/env python3
"""Checks deploy/daemonset against the plugin it installs.

Usage: check_manifests.py [--self-test] REPO_ROOT PLUGIN_BINARY MAKE_FIXTURE_BINARY

- every YAML file parses, and every object has apiVersion, kind and metadata.name;
- kustomization.yaml lists exactly the install manifests, and they exist;
- every flag the DaemonSet passes exists in `serve --help`, the environment variables it sets are
  the ones the flags read, every path flag points into a mounted volume, and the admin policy in
  the ConfigMap is accepted by the plugin itself;
- every CEL selector names only attributes the plugin publishes (from `slices -o json` of the
  fixture nodes) and compares `type` only with kinds that exist;
- examples: claim and request names are consistent as KubeVirt's admitter demands, device
  classes exist, opaque configs are VfioConfig objects;
- the DaemonSet is the least-privilege pod (no privileged, no capability, seccomp and the
  AppArmor profile of deploy/apparmor, host paths read-only unless written);
- every --flag and deploy/ path the README names exists.
Prints every problem found, then exits 1 if there was any. --self-test instead breaks a copy of
the manifests in known ways, one at a time, and checks that each break is reported.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import yaml

DRIVER = "vfio.dra.io"
STD_DOMAIN = "resource.kubernetes.io"
problems = []


def problem(where, text):
    problems.append(f"{where}: {text}")


def load_all(root):
    """{relative path: [objects]} for every YAML file under deploy/. The Helm chart's templates
    are Go templates, not YAML: test/cluster/helm_chart_test.py renders them and holds them equal
    to deploy/daemonset, which is checked here."""
    docs = {}
    for dirpath, _, files in os.walk(os.path.join(root, "deploy")):
        if os.path.relpath(dirpath, root).startswith(os.path.join("deploy", "helm")):
            continue
        for name in sorted(files):
            if not name.endswith((".yaml", ".yml")):
                continue
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            try:
                with open(path, encoding="utf-8") as f:
                    docs[rel] = [d for d in yaml.safe_load_all(f) if d is not None]
            except yaml.YAMLError as e:
                problem(rel, f"does not parse: {e}")
    return docs


def check_objects(docs):
    for rel, objects in docs.items():
        if not objects:
            problem(rel, "holds no object")
        for i, obj in enumerate(objects):
            where = f"{rel}[{i}]"
            if not isinstance(obj, dict):
                problem(where, "is not a mapping")
                continue
            for key in ("apiVersion", "kind"):
                if not obj.get(key):
                    problem(where, f"has no {key}")
            if (obj.get("kind") not in ("Kustomization", "Component") and
                    not (obj.get("metadata") or {}).get("name")):
                problem(where, "has no metadata.name")


def check_kustomization(root, docs):
    rel = "deploy/daemonset/kustomization.yaml"
    if rel not in docs:
        problem(rel, "is missing")
        return
    listed = docs[rel][0].get("resources", [])
    present = sorted(os.path.basename(r) for r in docs
                     if os.path.dirname(r) == "deploy/daemonset" and not r.endswith(rel))
    for name in listed:
        if not os.path.exists(os.path.join(root, "deploy/daemonset", name)):
            problem(rel, f"lists {name}, which does not exist")
    for name in present:
        if name not in listed:
            problem(rel, f"does not list {name}")


def objects_of(docs, kind, under=None):
    for rel, objects in docs.items():
        if under and not rel.startswith(under):
            continue
        for obj in objects:
            if isinstance(obj, dict) and obj.get("kind") == kind:
                yield rel, obj


def help_flags(plugin, *subcommand):
    out = subprocess.run([plugin, *subcommand, "--help"], capture_output=True, text=True,
                         check=True).stdout
    return out, set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", out))


def check_daemonset(docs, plugin, fixture_tool):
    serve_help, serve_flags = help_flags(plugin, "serve")
    daemonsets = list(objects_of(docs, "DaemonSet"))
    if len(daemonsets) != 1:
        problem("deploy/daemonset", f"should hold one DaemonSet, holds {len(daemonsets)}")
        return
    rel, ds = daemonsets[0]
    pod = ds["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    configmaps = {obj["metadata"]["name"]: obj for _, obj in objects_of(docs, "ConfigMap")}
    accounts = {obj["metadata"]["name"] for _, obj in objects_of(docs, "ServiceAccount")}
    if pod.get("serviceAccountName") not in accounts:
        problem(rel, f"service account {pod.get('serviceAccountName')} is not defined")
    strategy = ds["spec"].get("updateStrategy", {}).get("rollingUpdate", {})
    container = pod["containers"][0]
    args = container.get("args", [])
    if args[:1] != ["serve"]:
        problem(rel, "the container's first argument must be the serve subcommand")
    values = {}
    for arg in args[1:]:
        flag, _, value = arg.partition("=")
        if flag.startswith("-v"):
            flag = "--v"
        if flag not in serve_flags:
            problem(rel, f"passes {flag}, which `serve --help` does not know")
        values[flag] = value
    env = {e["name"] for e in container.get("env", [])}
    for name in env:
        if f"(Env:{name})" not in serve_help:
            problem(rel, f"sets ${name}, which no serve flag reads")
    if strategy.get("maxSurge") and "POD_UID" not in env and "--pod-uid" not in values:
        problem(rel, "maxSurge rolling updates need per-pod sockets (--pod-uid or $POD_UID)")
    mounts = {}
    for m in container.get("volumeMounts", []):
        if m["name"] not in volumes:
            problem(rel, f"mounts volume {m['name']}, which is not defined")
            continue
        mounts[m["mountPath"]] = volumes[m["name"]]
    for flag in ("--sysfs-root", "--dev-root", "--registrar-dir", "--plugin-data-dir",
                 "--cdi-dir", "--config"):
        path = values.get(flag)
        if not path:
            continue
        owner = [mp for mp in mounts if path == mp or path.startswith(mp.rstrip("/") + "/")]
        if not owner:
            problem(rel, f"{flag}={path} is not inside any mounted volume")
            continue
        volume = mounts[max(owner, key=len)]
        host = volume.get("hostPath", {}).get("path")
        # The kubelet dials the socket path the plugin registers: it must be the same on the host.
        if flag in ("--registrar-dir", "--plugin-data-dir", "--cdi-dir") and host is not None:
            mount_path = max(owner, key=len)
            if not path.startswith(host) or mount_path != host:
                problem(rel, f"{flag}={path} must be mounted at its host path, not {mount_path}")
    for probe in ("livenessProbe", "readinessProbe"):
        if probe not in container:
            problem(rel, f"has no {probe}")
    if not container.get("resources", {}).get("requests"):
        problem(rel, "has no resource requests")
    # The admin policy the DaemonSet mounts must be one the plugin accepts.
    policy = values.get("--config")
    if policy:
        mount_dir, key = os.path.split(policy)
        volume = mounts.get(mount_dir, {})
        cm_name = volume.get("configMap", {}).get("name")
        data = (configmaps.get(cm_name) or {}).get("data", {})
        if key not in data:
            problem(rel, f"--config={policy}: ConfigMap {cm_name} has no key {key}")
        else:
            with tempfile.TemporaryDirectory() as tmp:
                with open(os.path.join(tmp, key), "w", encoding="utf-8") as f:
                    f.write(data[key])
                sysfs = make_fixture(fixture_tool, "vm-host", os.path.join(tmp, "node"))
                run = subprocess.run([plugin, "discover", "--sysfs-root", sysfs, "--config",
                                      os.path.join(tmp, key)], capture_output=True, text=True)
                if run.returncode != 0:
                    problem(f"ConfigMap {cm_name}", f"the plugin rejects the policy: "
                            f"{run.stderr.strip()}")


# Host paths the plugin writes (README, "Security"); every other hostPath is mounted read-only.
WRITTEN_HOST_PATHS = {"/sys", "/var/lib/kubelet/plugins_registry", "/var/lib/kubelet/plugins",
                      "/var/run/cdi"}


def apparmor_profiles(root):
    names = set()
    directory = os.path.join(root, "deploy", "apparmor")
    for name in os.listdir(directory) if os.path.isdir(directory) else []:
        with open(os.path.join(directory, name), encoding="utf-8") as f:
            names.update(re.findall(r"^profile\s+(\S+)", f.read(), re.M))
    return names


def check_least_privilege(root, docs):
    """The default install is the hardened pod the README's Security section describes."""
    for rel, ds in objects_of(docs, "DaemonSet", under="deploy/daemonset"):
        pod = ds["spec"]["template"]["spec"]
        for key in ("hostPID", "hostNetwork", "hostIPC"):
            if pod.get(key):
                problem(rel, f"sets {key}, which only an optional feature (deploy/features) adds")
        container = pod["containers"][0]
        sc = container.get("securityContext") or {}
        wanted = {"privileged": False, "allowPrivilegeEscalation": False,
                  "readOnlyRootFilesystem": True}
        for key, value in wanted.items():
            if sc.get(key) is not value:
                problem(rel, f"securityContext.{key} must be {value}, is {sc.get(key)}")
        caps = sc.get("capabilities") or {}
        if caps.get("drop") != ["ALL"] or caps.get("add"):
            problem(rel, f"capabilities must drop ALL and add none, are {caps}")
        if (sc.get("seccompProfile") or {}).get("type") != "RuntimeDefault":
            problem(rel, f"seccompProfile must be RuntimeDefault, is {sc.get('seccompProfile')}")
        apparmor = sc.get("appArmorProfile") or {}
        if (apparmor.get("type") != "Localhost" or
                apparmor.get("localhostProfile") not in apparmor_profiles(root)):
            problem(rel, f"appArmorProfile {apparmor} is not a Localhost profile of "
                         f"deploy/apparmor (it has {sorted(apparmor_profiles(root))})")
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        for mount in container.get("volumeMounts", []):
            host = (volumes.get(mount["name"], {}).get("hostPath") or {}).get("path")
            if host and host not in WRITTEN_HOST_PATHS and not mount.get("readOnly"):
                problem(rel, f"mounts the host's {host} writable; nothing is written there")


def make_fixture(fixture_tool, name, directory):
    """Builds a fixture node; returns its sysfs root (the tool prints it)."""
    out = subprocess.run([fixture_tool, name, directory], capture_output=True, text=True,
                         check=True).stdout
    return out.strip().splitlines()[-1]


_ATTRIBUTES = {}


def published_attributes(plugin, fixture_tool):
    """{attribute name (qualified): set of string values seen} over every fixture node."""
    if (plugin, fixture_tool) in _ATTRIBUTES:
        return _ATTRIBUTES[(plugin, fixture_tool)]
    seen = _ATTRIBUTES.setdefault((plugin, fixture_tool), {})
    fixtures = subprocess.run([fixture_tool], capture_output=True, text=True).stderr
    names = re.search(r"names: (.*)\)", fixtures).group(1).split()
    with tempfile.TemporaryDirectory() as tmp:
        hostdev_policy = os.path.join(tmp, "policy.yaml")
        with open(hostdev_policy, "w", encoding="utf-8") as f:
            f.write("version: v1\nselect:\n  - kind: hostdev\n    class: \"0108\"\n"
                    "  - kind: hostdev\n    class: \"0c03\"\n")
        for name in names:
            root = make_fixture(fixture_tool, name, os.path.join(tmp, name))
            for extra in ([], ["--config", hostdev_policy]):
                out = subprocess.run([plugin, "slices", "--sysfs-root", root, "--node-name",
                                      "node1", "-o", "json", *extra], capture_output=True,
                                     text=True, check=True).stdout
                for slice_ in json.loads(out)["items"]:
                    for device in slice_["spec"].get("devices", []):
                        for attr, value in device.get("attributes", {}).items():
                            qualified = attr if "/" in attr else f"{DRIVER}/{attr}"
                            seen.setdefault(qualified, set()).add(value.get("string"))
    return seen


CEL_ATTR = re.compile(r'device\.attributes\["([^"]+)"\]\.([A-Za-z0-9_]+)'
                      r'(?:\s*==\s*"([^"]*)")?')


def cel_expressions(obj):
    found = []

    def walk(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "cel" and isinstance(value, dict) and "expression" in value:
                    found.append(value["expression"])
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)
    walk(obj)
    return found


def check_selectors(docs, attributes):
    for rel, objects in docs.items():
        for obj in objects:
            if not isinstance(obj, dict):
                continue
            where = f"{rel} {obj.get('kind')} {obj.get('metadata', {}).get('name')}"
            for expr in cel_expressions(obj):
                for driver in re.findall(r'device\.driver\s*==\s*"([^"]*)"', expr):
                    if driver != DRIVER:
                        problem(where, f"selects driver {driver}, not {DRIVER}")
                for domain, name, literal in CEL_ATTR.findall(expr):
                    qualified = f"{domain}/{name}"
                    if qualified not in attributes:
                        problem(where, f"selects on {qualified}, which the plugin never publishes")
                    elif name == "type" and literal and literal not in attributes[qualified]:
                        problem(where, f"compares type with \"{literal}\", which no device has")


def check_examples(docs):
    classes = {obj["metadata"]["name"] for _, obj in objects_of(docs, "DeviceClass")}
    templates = {}
    claims = {}
    for rel, obj in objects_of(docs, "ResourceClaimTemplate", "deploy/daemonset/examples"):
        templates[(obj["metadata"].get("namespace", "default"), obj["metadata"]["name"])] = \
            obj["spec"]["spec"]
    for rel, obj in objects_of(docs, "ResourceClaim", "deploy/daemonset/examples"):
        claims[(obj["metadata"].get("namespace", "default"), obj["metadata"]["name"])] = \
            obj["spec"]
    for key, spec in list(templates.items()) + list(claims.items()):
        where = f"claim spec {key[0]}/{key[1]}"
        names = set()
        for request in spec.get("devices", {}).get("requests", []):
            names.add(request["name"])
            exactly = request.get("exactly", {})
            if exactly.get("deviceClassName") not in classes:
                problem(where, f"request {request['name']} uses device class "
                        f"{exactly.get('deviceClassName')}, which is not defined")
        for config in spec.get("devices", {}).get("config", []):
            for name in config.get("requests", []):
                if name not in names:
                    problem(where, f"config names request {name}, which does not exist")
            opaque = config.get("opaque", {})
            if opaque.get("driver") == DRIVER:
                params = opaque.get("parameters", {})
                if params.get("apiVersion") != f"{DRIVER}/v1alpha1" or \
                        params.get("kind") != "VfioConfig":
                    problem(where, "opaque config is not a vfio.dra.io/v1alpha1 VfioConfig")
                # The fields DecodeVfioConfig (src/prepare/vfio_config.cc) accepts.
                unknown = set(params) - {"apiVersion", "kind", "iommuInterface", "macAddress",
                                         "vlan", "qos", "spoofChk", "trust"}
                if unknown:
                    problem(where, f"opaque config has fields the plugin does not accept: "
                            f"{sorted(unknown)}")
    vmis = list(objects_of(docs, "VirtualMachineInstance"))
    if not vmis:
        problem("deploy/daemonset/examples", "holds no VirtualMachineInstance")
    for rel, vmi in vmis:
        ns = vmi["metadata"].get("namespace", "default")
        where = f"{rel} VMI {vmi['metadata']['name']}"
        spec = vmi["spec"]
        entries = {}
        for rc in spec.get("resourceClaims", []):
            if rc["name"] in entries:
                problem(where, f"resourceClaims name {rc['name']} is used twice")
            if ("resourceClaimName" in rc) == ("resourceClaimTemplateName" in rc):
                problem(where, f"resourceClaims {rc['name']} needs exactly one of "
                        "resourceClaimName and resourceClaimTemplateName")
            if "resourceClaimTemplateName" in rc:
                entries[rc["name"]] = templates.get((ns, rc["resourceClaimTemplateName"]))
                if entries[rc["name"]] is None:
                    problem(where, f"template {rc['resourceClaimTemplateName']} is not defined")
            else:
                entries[rc["name"]] = claims.get((ns, rc.get("resourceClaimName")))
                if entries[rc["name"]] is None:
                    problem(where, f"claim {rc.get('resourceClaimName')} is not defined")
        devices = spec.get("domain", {}).get("devices", {})
        refs = [(f"gpus[{i}]", d) for i, d in enumerate(devices.get("gpus", []))]
        refs += [(f"hostDevices[{i}]", d) for i, d in enumerate(devices.get("hostDevices", []))]
        refs += [(f"networks[{i}].resourceClaim", n["resourceClaim"])
                 for i, n in enumerate(spec.get("networks", [])) if "resourceClaim" in n]
        used = set()
        for field, ref in refs:
            claim, request = ref.get("claimName"), ref.get("requestName")
            if not claim or not request:
                problem(where, f"{field} needs claimName and requestName")
                continue
            if (claim, request) in used:
                problem(where, f"{field}: {claim}/{request} is used twice")
            used.add((claim, request))
            if claim not in entries:
                problem(where, f"{field}: claim {claim} is not in spec.resourceClaims")
            elif entries[claim] is not None:
                requests = {r["name"] for r in entries[claim].get("devices", {}).get("requests", [])}
                if request not in requests:
                    problem(where, f"{field}: claim {claim} has no request {request}")
        networks = {n["name"] for n in spec.get("networks", [])}
        for iface in devices.get("interfaces", []):
            if iface["name"] not in networks:
                problem(where, f"interface {iface['name']} has no network")


def check_readme(root, plugin):
    flags = set()
    for sub in ("serve", "discover", "slices", "version"):
        flags |= help_flags(plugin, sub)[1]
    # Flags of other tools the README shows in commands.
    tools = {"--test-dir", "--output-on-failure", "--tag", "--file", "--kustomize", "--for",
             "--timeout", "--namespace", "--selector", "--all-namespaces", "--raw",
             "--messages", "--registrar-dir", "--field-selector",
             "--set", "--reuse-values", "--strict"}  # helm
    # Flags our own scripts accept: the labels of their argument `case`, one (`--flag)`) or
    # several alternatives (`--a | --b)`).
    hack = os.path.join(root, "hack")
    for script in sorted(os.listdir(hack)):
        if script.endswith(".sh"):
            with open(os.path.join(hack, script), encoding="utf-8") as f:
                labels = re.findall(r"^\s*(--[a-z][a-z0-9-]*(?:\s*\|\s*--[a-z][a-z0-9-]*)*)\)",
                                    f.read(), re.M)
            for label in labels:
                tools |= {flag.strip() for flag in label.split("|")}
    with open(os.path.join(root, "README.md"), encoding="utf-8") as f:
        text = f.read()
    for flag in sorted(set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", text))):
        if flag not in flags and flag not in tools:
            problem("README.md", f"names {flag}, which no vfio-dra-plugin command has")
    for path in sorted(set(re.findall(r"(deploy/[A-Za-z0-9_./-]+)", text))):
        path = path.rstrip(".")
        if not os.path.exists(os.path.join(root, path)):
            problem("README.md", f"names {path}, which does not exist")


def check(root, plugin, fixture_tool):
    problems.clear()
    docs = load_all(root)
    check_objects(docs)
    check_kustomization(root, docs)
    check_daemonset(docs, plugin, fixture_tool)
    check_least_privilege(root, docs)
    check_selectors(docs, published_attributes(plugin, fixture_tool))
    check_examples(docs)
    check_readme(root, plugin)
    return docs


# (file, text, replacement, what the report must say)
BREAKS = [
    ("deploy/daemonset/daemonset.yaml", "--health-interval=", "--health-intervals=",
     "--health-intervals, which `serve --help` does not know"),
    ("deploy/daemonset/daemonset.yaml", "mountPath: /var/run/cdi", "mountPath: /run/cdi",
     "--cdi-dir=/var/run/cdi is not inside any mounted volume"),
    ("deploy/daemonset/daemonset.yaml", "- name: POD_UID", "- name: POD_ID",
     "sets $POD_ID, which no serve flag reads"),
    ("deploy/daemonset/admin-policy.yaml", "unsafeNoIommu: false", "unsafeNoIommu: maybe",
     "the plugin rejects the policy"),
    ("deploy/daemonset/deviceclasses.yaml", 'type == "vf"', 'type == "vfs"',
     'compares type with "vfs", which no device has'),
    ("deploy/daemonset/examples/vgpu.yaml", "].mdevType", "].mdevTyp",
     "vfio.dra.io/mdevTyp, which the plugin never publishes"),
    ("deploy/daemonset/examples/vgpu.yaml", "requestName: vgpu", "requestName: vgpu0",
     "claim vgpu-claim has no request vgpu0"),
    ("deploy/daemonset/examples/hostdev-nvme.yaml", "resourceClaimName: nvme-drive",
     "resourceClaimName: nvme-drives", "claim nvme-drives is not defined"),
    ("deploy/daemonset/examples/sriov-network.yaml", "claimName: nic", "claimName: nics",
     "claim nics is not in spec.resourceClaims"),
    ("deploy/daemonset/rbac.yaml", "kind: ClusterRole\n", "kind: ClusterRole\nfoo: [\n",
     "does not parse"),
    ("deploy/daemonset/namespace.yaml", "  name: vfio-dra\n", "  nam: vfio-dra\n",
     "has no metadata.name"),
    ("deploy/daemonset/kustomization.yaml", "  - deviceclasses.yaml\n", "",
     "does not list deviceclasses.yaml"),
    ("deploy/daemonset/daemonset.yaml", "privileged: false", "privileged: true",
     "securityContext.privileged must be False"),
    ("deploy/daemonset/daemonset.yaml", "add: []", 'add: ["SYS_ADMIN"]',
     "capabilities must drop ALL and add none"),
    ("deploy/daemonset/daemonset.yaml", "localhostProfile: vfio-dra-plugin",
     "localhostProfile: vfio-dra", "is not a Localhost profile of deploy/apparmor"),
    ("deploy/daemonset/daemonset.yaml", "mountPath: /lib/modules\n              readOnly: true",
     "mountPath: /lib/modules", "mounts the host's /lib/modules writable"),
    ("README.md", "`--unbind-timeout`", "`--unbind-timeouts`",
     "names --unbind-timeouts, which no vfio-dra-plugin command has"),
    ("README.md", "`./hack/test.sh --quick`", "`./hack/test.sh --quik`",
     "names --quik, which no vfio-dra-plugin command has"),
    ("README.md", "[--fault-gap S]` (", "[--fault-gaps S]` (",
     "names --fault-gaps, which no vfio-dra-plugin command has"),
]


def self_test(root, plugin, fixture_tool):
    failures = 0
    for path, text, replacement, expected in BREAKS:
        with tempfile.TemporaryDirectory() as tmp:
            shutil.copytree(os.path.join(root, "deploy"), os.path.join(tmp, "deploy"))
            shutil.copytree(os.path.join(root, "hack"), os.path.join(tmp, "hack"))
            shutil.copy(os.path.join(root, "README.md"), tmp)
            target = os.path.join(tmp, path)
            with open(target, encoding="utf-8") as f:
                content = f.read()
            if text not in content:
                print(f"self-test: {path} no longer contains {text!r}; update BREAKS")
                failures += 1
                continue
            with open(target, "w", encoding="utf-8") as f:
                f.write(content.replace(text, replacement, 1))
            check(tmp, plugin, fixture_tool)
            if not any(expected in p for p in problems):
                print(f"self-test: breaking {path} ({text!r} -> {replacement!r}) was not "
                      f"reported as {expected!r}; reported: {problems}")
                failures += 1
    print(f"self-test: {len(BREAKS) - failures} of {len(BREAKS)} breaks reported")
    return 1 if failures else 0


def main():
    args = sys.argv[1:]
    if args and args[0] == "--self-test":
        return self_test(*args[1:4])
    root, plugin, fixture_tool = args[:3]
    docs = check(root, plugin, fixture_tool)
    for p in problems:
        print(p)
    count = sum(len(o) for o in docs.values())
    print(f"checked {len(docs)} files, {count} objects: {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
