#!/usr/bin/env python3
"""Checks that data flows one way through src/: a module includes only itself and the modules
listed before it in LAYERS (and generated or system headers). Prints every include that goes
upward or sideways, as file:line, and exits 1; a directory under src/ that is not listed is an
error too, so a new module has to take its place in the order.

Usage: hack/check_layering.py [SRC_DIR] | --self-test"""
import os
import re
import sys

# The order data flows in: sysfs -> inventory -> slices; kubelet call -> claim -> device work.
LAYERS = [
    "base",
    "sysfs",
    "kube",
    "discovery",
    "cdi",
    "slicepublisher",
    "vfio",
    "prepare",
    "plugin",
    "cmd",
]

# Narrow seams: a module may see only these headers of an earlier one. The kubelet-facing side
# sees device preparation through its contract alone, so it stays usable without the rest.
SEAMS = {
    ("plugin", "prepare"): {"claim_ref.h", "device_preparer.h"},
}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"/]+)/([^"]+)"')


def self_test():
    """The check must report an upward include and an unlisted module, and pass a clean tree."""
    import subprocess
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "src")
        for module in ("base", "vfio"):
            os.makedirs(os.path.join(src, module))
        with open(os.path.join(src, "vfio", "a.h"), "w") as f:
            f.write('#include "base/result.h"\n#include "dra_v1.pb.h"\n')
        run = lambda: subprocess.run([sys.executable, __file__, src], capture_output=True, text=True)
        clean = run()
        with open(os.path.join(src, "base", "b.h"), "w") as f:
            f.write('#include <string>\n#include "vfio/a.h"\n')
        upward = run()
        with open(os.path.join(src, "base", "b.h"), "w") as f:
            f.write("#include <string>\n")
        for module in ("prepare", "plugin"):
            os.makedirs(os.path.join(src, module))
        with open(os.path.join(src, "plugin", "c.cc"), "w") as f:
            f.write('#include "prepare/device_preparer.h"\n#include "prepare/plan.h"\n')
        seam = run()
        os.makedirs(os.path.join(src, "misc"))
        unlisted = run()
    ok = (clean.returncode == 0 and upward.returncode == 1 and "src/base/b.h:2" in upward.stdout
          and seam.returncode == 1 and "src/plugin/c.cc:2" in seam.stdout
          and "c.cc:1" not in seam.stdout
          and unlisted.returncode == 1 and "src/misc/" in unlisted.stdout)
    print("include layering self-test: " + ("ok" if ok else "FAILED"))
    return 0 if ok else 1


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    src = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "src")
    rank = {name: i for i, name in enumerate(LAYERS)}
    problems = []
    for module in sorted(os.listdir(src)):
        path = os.path.join(src, module)
        if not os.path.isdir(path):
            continue
        if module not in rank:
            problems.append(f"src/{module}/: not in the layer order of hack/check_layering.py")
            continue
        for root, _, files in os.walk(path):
            for name in sorted(files):
                if not name.endswith((".h", ".cc")):
                    continue
                file = os.path.join(root, name)
                with open(file, encoding="utf-8") as f:
                    for number, line in enumerate(f, 1):
                        match = INCLUDE.match(line)
                        if not match:
                            continue
                        target, header = match.group(1), match.group(2)
                        if target not in rank:
                            continue  # generated (proto) or third-party headers
                        rel = os.path.relpath(file, os.path.join(src, ".."))
                        if rank[target] > rank[module]:
                            problems.append(f"{rel}:{number}: {module} includes {target}, which "
                                            f"comes after it ({' -> '.join(LAYERS)})")
                        seam = SEAMS.get((module, target))
                        if seam is not None and header not in seam:
                            problems.append(f"{rel}:{number}: {module} includes {target}/{header}; "
                                            f"it may see {target} only through "
                                            f"{', '.join(sorted(seam))}")
    for problem in problems:
        print(problem)
    if problems:
        return 1
    print(f"include layering: {len(LAYERS)} modules, data flows one way")
    return 0


if __name__ == "__main__":
    sys.exit(main())
