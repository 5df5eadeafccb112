#!/usr/bin/env python3
"""The image test: builds the plugin image with hack/image.sh and runs its root file system, as
the DaemonSet runs it, on a test node, without a container runtime (none may run on this machine;
the real node, test/real-node, runs the image in containerd with the real kubelet).

Usage: run_image_test.py SOURCE_DIR PLUGIN MAKE_FIXTURE FAKE_APISERVER KUBELET_SIM

The OCI archive's layers are unpacked into a root file system, and the image's entrypoint runs
chrooted into it, so it finds only the image's own libraries, pci.ids and configuration. The
image's config must start the binary the DaemonSet expects. The process gets the DaemonSet's args,
environment and volume mounts (read from deploy/daemonset/daemonset.yaml, so a mount or flag the
image cannot satisfy fails here), bind-mounted into the root with the host paths mapped to a test
node: a fixture sysfs for /sys, an empty directory for /dev, the admin-policy ConfigMap's files
for /etc/vfio-dra, and the kubelet and CDI directories at their real paths. Those paths must be
identical inside and outside (the kubelet dials the socket path the plugin registers), so the test
runs in a private mount namespace where an overlay makes them writable without touching the host;
the chroot shares this machine's network, so the plugin reaches the fake API server on loopback.
It checks `version`, `discover` (device names come from the image's pci.ids), and `serve`:
registration with the kubelet simulator, ResourceSlices published to the fake API server, /healthz
ready, a NodePrepareResources call, and a clean exit on SIGTERM.

Needs root (image.sh's mmdebstrap, chroot, mounts) and a private mount namespace; without either
it fails, naming which.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid

import yaml

NODE = "image-test-node"
# Generous bounds: the machine may be busy with other builds. Waits end as soon as the condition
# holds.
WAIT_SECONDS = 120
KUBECONFIG_IN_CONTAINER = "/etc/vfio-dra-test/kubeconfig"


class Failure(Exception):
    pass


def run(cmd, check=True, **kwargs):
    print("+ " + " ".join(cmd), flush=True)
    result = subprocess.run(cmd, text=True, capture_output=True, **kwargs)
    if check and result.returncode != 0:
        raise Failure(f"{cmd[0]} {' '.join(cmd[1:3])} ... exited {result.returncode}\n"
                      f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}")
    return result


def wait_for(what, condition, log=None):
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise Failure(f"gave up after {WAIT_SECONDS} s waiting for {what}" +
                  (f"; plugin log:\n{open(log).read()}" if log else ""))


def prerequisites():
    """Raises the first missing prerequisite, with what provides it."""
    if os.geteuid() != 0:
        raise Failure("the image test must run as root: hack/image.sh builds the root file system "
                      "with mmdebstrap, and the test chroots into the image and mounts its volumes")
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "true"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        raise Failure(f"no private mount namespace, which keeps the test's mounts off the host "
                      f"(unshare: {probe.stderr.strip()}); run it where unshare --mount works")


def overlay(path, tmp):
    """Makes `path` writable in this mount namespace, its changes kept in `tmp`: an overlay on
    its nearest existing ancestor, so the host's directories are never written."""
    real = os.path.realpath(path)
    base = real
    while not os.path.isdir(base):
        base = os.path.dirname(base)
    upper = tempfile.mkdtemp(dir=tmp, prefix="overlay-")
    os.makedirs(f"{upper}/upper")
    os.makedirs(f"{upper}/work")
    run(["mount", "-t", "overlay", "overlay", "-o",
         f"lowerdir={base},upperdir={upper}/upper,workdir={upper}/work", base])
    os.makedirs(real, exist_ok=True)
    return base


def unpack_image(archive, tmp):
    """The OCI archive's root file system (its layers in order) and its config."""
    layout = f"{tmp}/layout"
    os.makedirs(layout)
    run(["tar", "-xf", archive, "-C", layout])

    def blob(digest):
        return f"{layout}/blobs/{digest.replace(':', '/')}"
    with open(f"{layout}/index.json", encoding="utf-8") as f:
        manifests = json.load(f)["manifests"]
    if len(manifests) != 1:
        raise Failure(f"the image archive {archive} holds {len(manifests)} manifests, not one")
    with open(blob(manifests[0]["digest"]), encoding="utf-8") as f:
        manifest = json.load(f)
    with open(blob(manifest["config"]["digest"]), encoding="utf-8") as f:
        config = json.load(f)["config"]
    rootfs = f"{tmp}/rootfs"
    os.makedirs(rootfs)
    for layer in manifest["layers"]:
        run(["tar", "--numeric-owner", "-xzf", blob(layer["digest"]), "-C", rootfs])
    return rootfs, config


def check_entrypoint(config, container):
    """The image must start the plugin as the DaemonSet expects: it sets only args."""
    if config.get("Entrypoint") != ["/usr/bin/vfio-dra-plugin"]:
        raise Failure(f"the image's entrypoint is {config.get('Entrypoint')}, not "
                      "[/usr/bin/vfio-dra-plugin]: the DaemonSet's args would not reach the plugin")
    if "command" in container:
        raise Failure(f"daemonset.yaml overrides the image's entrypoint with {container['command']}"
                      "; this test runs the image's own")


def daemonset_container(source_dir):
    with open(f"{source_dir}/deploy/daemonset/daemonset.yaml", encoding="utf-8") as f:
        spec = yaml.safe_load(f)["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    return container, volumes


def config_maps(source_dir):
    found = {}
    for name in os.listdir(f"{source_dir}/deploy/daemonset"):
        if not name.endswith(".yaml"):
            continue
        with open(f"{source_dir}/deploy/daemonset/{name}", encoding="utf-8") as f:
            for doc in yaml.safe_load_all(f):
                if doc and doc.get("kind") == "ConfigMap":
                    found[doc["metadata"]["name"]] = doc.get("data", {})
    return found


def mount_volumes(container, volumes, source_dir, node_sys, tmp, rootfs):
    """Bind-mounts the DaemonSet's volumes into the image's root, each host path mapped to the
    test node."""
    maps = config_maps(source_dir)
    flags = []
    for mount in container["volumeMounts"]:
        volume = volumes[mount["name"]]
        if "hostPath" in volume:
            host = volume["hostPath"]["path"]
            if host == "/sys":
                source = node_sys
            elif host == "/dev":
                source = f"{tmp}/dev"
                os.makedirs(source, exist_ok=True)
            elif host == "/lib/modules":
                # The test node's kernel states no variant drivers: an empty module tree.
                source = f"{tmp}/modules"
                os.makedirs(source, exist_ok=True)
            elif host.startswith(("/var/lib/kubelet/", "/var/run/")):
                source = host  # the same path outside, made writable by overlay()
                if not os.path.isdir(source):
                    raise Failure(f"hostPath {host} of volume {mount['name']} is missing")
            else:
                raise Failure(f"daemonset.yaml mounts hostPath {host} (volume {mount['name']}), "
                              f"which this test does not map to its test node: add it here")
        elif "configMap" in volume:
            name = volume["configMap"]["name"]
            if name not in maps:
                raise Failure(f"volume {mount['name']} needs ConfigMap {name}, which no file in "
                              f"deploy/daemonset defines")
            source = f"{tmp}/configmap-{name}"
            os.makedirs(source, exist_ok=True)
            for key, text in maps[name].items():
                with open(f"{source}/{key}", "w", encoding="utf-8") as f:
                    f.write(text)
        else:
            raise Failure(f"volume {mount['name']} has a kind this test does not map")
        bind(source, rootfs, mount["mountPath"], mount.get("readOnly", False))


def bind(source, rootfs, path, read_only):
    target = f"{rootfs}{path}"
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "a").close()
    run(["mount", "--bind", source, target])
    if read_only:
        run(["mount", "-o", "remount,bind,ro", target])


def main():
    source_dir, plugin, make_fixture, fake_apiserver, kubelet_sim = sys.argv[1:6]
    if os.environ.get("VFIO_DRA_IMAGE_TEST_NAMESPACE") != "1":
        try:
            prerequisites()
        except Failure as e:
            print(f"FAILED: {e}", flush=True)
            return 1
        env = dict(os.environ, VFIO_DRA_IMAGE_TEST_NAMESPACE="1")
        os.execvpe("unshare", ["unshare", "--mount", "--propagation", "private", sys.executable,
                               *sys.argv], env)
    tmp = tempfile.mkdtemp(prefix="vfio-dra-image-test.")
    processes = []
    try:
        check_image(source_dir, plugin, make_fixture, fake_apiserver, kubelet_sim, tmp,
                    processes)
    except Failure as e:
        print(f"FAILED: {e}", flush=True)
        return 1
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
                p.wait()
        unmount_under(tmp)
        shutil.rmtree(tmp, ignore_errors=True)
    print("image test: passed", flush=True)
    return 0


def unmount_under(tmp):
    """Unmounts what the test mounted in the image's root (innermost first), so that removing
    the temporary directory never descends into /proc or a bound directory."""
    with open("/proc/self/mounts", encoding="utf-8") as f:
        points = [line.split()[1] for line in f]
    for point in reversed(points):
        if point.startswith(tmp + "/"):
            subprocess.run(["umount", "--lazy", point], capture_output=True)


def check_image(source_dir, plugin, make_fixture, fake_apiserver, kubelet_sim, tmp, processes):
    started = time.monotonic()
    archive = f"{tmp}/vfio-dra-plugin.oci.tar"
    build = subprocess.run([f"{source_dir}/hack/image.sh", "--binary", plugin, "--output",
                            archive], text=True)
    if build.returncode != 0:
        raise Failure(f"hack/image.sh exited {build.returncode}")
    print(f"image built in {time.monotonic() - started:.0f} s", flush=True)

    container, volumes = daemonset_container(source_dir)
    rootfs, config = unpack_image(archive, tmp)
    check_entrypoint(config, container)
    for volume in volumes.values():
        path = volume.get("hostPath", {}).get("path", "")
        if path.startswith(("/var/lib/kubelet/", "/var/run/")):
            overlay(path, tmp)
    # The kernel's view a runtime gives every container; /sys and /dev are the DaemonSet's own.
    os.makedirs(f"{rootfs}/proc", exist_ok=True)
    run(["mount", "-t", "proc", "proc", f"{rootfs}/proc"])
    # Only the image's files and the image's environment: nothing of this machine's leaks in.
    image_env = dict(e.split("=", 1) for e in config.get("Env", []))
    entry = ["chroot", rootfs, *config["Entrypoint"]]

    version = run([*entry, "version"], env=image_env).stdout.strip()
    expected = run([plugin, "version"]).stdout.strip()
    if version != expected:
        raise Failure(f"the image's plugin says {version!r}, the built one {expected!r}")
    print(f"ok: version from the image: {version}", flush=True)

    node = f"{tmp}/node"
    run([make_fixture, "vm-host", node])
    mount_volumes(container, volumes, source_dir, f"{node}/sys", tmp, rootfs)
    keep = [a for a in container["args"] if a.startswith(("--sysfs-root=", "--config="))]
    discover = run([*entry, "discover", "-o", "json", *keep], env=image_env)
    functions = {f["address"]: f for f in json.loads(discover.stdout)["functions"]}
    gpu = functions.get("0000:01:00.0")
    if gpu is None or not gpu["published"]:
        raise Failure(f"discover from the image did not publish the fixture's GPU:\n"
                      f"{discover.stdout}")
    # The fixture's own pci.ids is not mounted: this name comes from the image's pci.ids package.
    if gpu["vendorName"] != "NVIDIA Corporation" or "RTX A6000" not in gpu["deviceName"]:
        raise Failure(f"device names are not from the image's pci.ids: {gpu}")
    print(f"ok: discover from the image: {len(functions)} functions, "
          f"{sum(f['published'] for f in functions.values())} published, GPU named "
          f"{gpu['vendorName']} {gpu['deviceName']}", flush=True)

    check_serve(source_dir, fake_apiserver, kubelet_sim, tmp, entry, image_env, rootfs,
                container, processes)


def check_serve(source_dir, fake_apiserver, kubelet_sim, tmp, entry, image_env, rootfs,
                container, processes):
    os.makedirs(f"{tmp}/kube")
    api = subprocess.Popen([fake_apiserver, "--kubeconfig-dir", f"{tmp}/kube", "--claims",
                            f"{source_dir}/hack/demo/claims.json", "--node",
                            f"{NODE}:{uuid.uuid4()}"], stdout=subprocess.PIPE, text=True)
    processes.append(api)
    kubeconfig = api.stdout.readline().strip()
    if not kubeconfig:
        raise Failure("fake-apiserver did not start")
    server = re.search(r"server: (\S+)", open(kubeconfig).read()).group(1)
    bind(kubeconfig, rootfs, KUBECONFIG_IN_CONTAINER, True)

    env = {"NODE_NAME": NODE, "POD_UID": str(uuid.uuid4())}
    for e in container.get("env", []):
        if e["name"] not in env:
            raise Failure(f"daemonset.yaml sets env {e['name']}, which this test does not map")
    args = []
    for a in container["args"]:
        # This machine's network: the DaemonSet's :8080 may be taken here; any loopback port does.
        args.append("--metrics-address=127.0.0.1:0" if a.startswith("--metrics-address") else a)
    log = f"{tmp}/plugin.log"
    serve = subprocess.Popen([*entry, *args, f"--kubeconfig={KUBECONFIG_IN_CONTAINER}"],
                             env={**image_env, **env}, stdout=open(log, "w"),
                             stderr=subprocess.STDOUT)
    processes.append(serve)
    print(f"+ chroot {rootfs} {' '.join(entry[2:])} {' '.join(args)} --kubeconfig=...",
          flush=True)

    registrar = next(a.split("=", 1)[1] for a in args if a.startswith("--registrar-dir="))
    registered = run([kubelet_sim, "register", "--registrar-dir", registrar, "--wait",
                      str(WAIT_SECONDS)], check=False)
    if registered.returncode != 0:
        raise Failure(f"the kubelet simulator could not register the plugin: "
                      f"{registered.stderr.strip()}; plugin log:\n{open(log).read()}")
    print("ok: the kubelet simulator registered the image's plugin", flush=True)

    def complete_pool():
        with urllib.request.urlopen(server + "/apis/resource.k8s.io/v1/resourceslices") as r:
            items = [s for s in json.load(r)["items"] if s["spec"]["pool"]["name"] == NODE]
        if items and len(items) == items[0]["spec"]["pool"]["resourceSliceCount"]:
            return items
        return None

    slices = wait_for("ResourceSlices for the test node", complete_pool, log)
    devices = sorted(d["name"] for s in slices for d in s["spec"].get("devices", []))
    if not devices:
        raise Failure(f"the published ResourceSlices have no devices: {slices}")
    print(f"ok: published {len(slices)} ResourceSlices with {len(devices)} devices", flush=True)

    def metrics_port():
        m = re.search(r"metrics and health endpoint listening.*?127\.0\.0\.1:(\d+)",
                      open(log).read())
        return m and m.group(1)

    port = wait_for("the metrics endpoint", metrics_port, log)

    def healthy():
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz") as r:
                return r.status == 200
        except OSError:
            return False

    wait_for("/healthz to answer 200 (registered, API server reachable)", healthy, log)
    print("ok: /healthz is ready", flush=True)

    # A claim allocated to another driver: the plugin reads it from the API server and has
    # nothing to do.
    prepared = run([kubelet_sim, "prepare", "--registrar-dir", registrar, "--claim",
                    "vms/nic-claim/5d7e1c0a-0000-4000-8000-000000000002"])
    if '"error"' in prepared.stdout:
        raise Failure(f"NodePrepareResources failed: {prepared.stdout}")
    print("ok: NodePrepareResources answered by the image's plugin", flush=True)

    serve.send_signal(signal.SIGTERM)
    try:
        code = serve.wait(timeout=WAIT_SECONDS)
    except subprocess.TimeoutExpired:
        raise Failure(f"the plugin did not stop on SIGTERM; log:\n{open(log).read()}")
    if code != 0:
        raise Failure(f"the image's plugin exited {code} on SIGTERM; log:\n{open(log).read()}")
    left = os.listdir(registrar)
    if left:
        raise Failure(f"the plugin left {left} in {registrar} after SIGTERM")
    print("ok: SIGTERM stops the image's plugin with exit code 0 and removes its sockets",
          flush=True)


if __name__ == "__main__":
    sys.exit(main())
