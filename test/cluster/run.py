#!/usr/bin/env python3
"""Runs one cluster-test scenario against a real control plane (test/cluster/README.md).

  run.py --release 1.37 --build-dir BUILD --work-dir DIR SCENARIO

Builds (or takes from the cache) the release's components with hack/kube-binaries.sh, starts the
control plane, applies deploy/daemonset as shipped, runs the scenario, and stops everything. On
failure the components' and the plugin's logs stay in DIR and their last lines are printed.
"""

import argparse
import os
import shutil
import subprocess
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import scenarios  # noqa: E402
from control_plane import ClusterError, ControlPlane  # noqa: E402

SOURCE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def kube_binaries(release):
    result = subprocess.run([os.path.join(SOURCE_DIR, "hack", "kube-binaries.sh"), release],
                            stdout=subprocess.PIPE, text=True)
    if result.returncode != 0:
        raise ClusterError(f"hack/kube-binaries.sh {release} failed (exit {result.returncode}); "
                           "its reason is printed above")
    return result.stdout.strip().splitlines()[-1]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--release", required=True)
    parser.add_argument("--build-dir", required=True)
    parser.add_argument("--work-dir", required=True)
    parser.add_argument("--binaries-only", action="store_true")
    parser.add_argument("--helm", help="the helm binary (hack/helm-binary.sh), for the chart")
    parser.add_argument("--kubevirt", help="KubeVirt's VMI CRD and admission "
                        "(hack/kubevirt-binary.sh), for the examples")
    parser.add_argument("scenario", nargs="?")
    args = parser.parse_args()
    bin_dir = kube_binaries(args.release)
    if args.binaries_only:
        print(f"Kubernetes {args.release} components in {bin_dir}")
        return 0
    scenario = scenarios.SCENARIOS.get(args.scenario)
    if scenario is None:
        print(f"run.py: unknown scenario {args.scenario!r} (known: "
              f"{', '.join(sorted(scenarios.SCENARIOS))})", file=sys.stderr)
        return 2
    shutil.rmtree(args.work_dir, ignore_errors=True)
    os.makedirs(args.work_dir)
    cluster = ControlPlane(bin_dir, os.path.join(args.work_dir, "control-plane"), args.release)
    env = scenarios.Environment(cluster, args.build_dir, args.work_dir, SOURCE_DIR, args.release,
                                args.helm, args.kubevirt)
    failed = False
    try:
        cluster.start(node_names=scenarios.node_names(args.scenario))
        print(f"control plane up: {cluster.version()['gitVersion']} at {cluster.server}",
              flush=True)
        scenario(env)
    except Exception as error:  # report every failure with the logs that explain it
        failed = True
        print(f"FAIL {args.scenario} on Kubernetes {args.release}: {error}", file=sys.stderr)
        traceback.print_exc()
        for node in env.nodes:
            for path in (node.log_path, os.path.join(node.dir, "plugin.log")):
                if os.path.exists(path):
                    with open(path, errors="replace") as f:
                        lines = f.read().splitlines()[-40:]
                    print(f"--- last lines of {path} ---\n" + "\n".join(lines), file=sys.stderr)
        print(cluster.logs_tail(), file=sys.stderr)
        print(f"logs kept in {args.work_dir}", file=sys.stderr)
    finally:
        for node in env.nodes:
            node.stop(keep_files=failed)
        cluster.stop()
    if not failed:
        print(f"PASS {args.scenario} on Kubernetes {args.release}")
        shutil.rmtree(args.work_dir, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
