#!/usr/bin/env python3
"""Checks that the Dockerfile's runtime stage installs every shared library the plugin links.

Usage: check_runtime_packages.py DOCKERFILE PLUGIN_BINARY
       check_runtime_packages.py --list DOCKERFILE


For every library `ldd` resolves for the binary, the Debian package that owns it must be one the
runtime stage installs, or a dependency (Depends/Pre-Depends, recursively) of one, or part of the
debian:12-slim base. Also every listed package must exist in the apt cache. This is what keeps
the package list honest when a new library is linked; test/image/run_image_test.py then runs the
image itself.

The Dockerfile's runtime-packages block is the one list of the image's packages: --list prints
it, one package a line, for hack/image.sh, which builds the same image without Docker.
"""
import re
import subprocess
import sys

# Packages debian:12-slim already has that a binary may link (the C and C++ runtimes).
BASE = {"libc6", "libgcc-s1", "libstdc++6", "zlib1g", "libzstd1"}


def runtime_packages(dockerfile):
    text = open(dockerfile, encoding="utf-8").read()
    block = re.search(r"# runtime-packages-begin\n(.*?)# runtime-packages-end", text, re.S)
    if not block:
        sys.exit(f"{dockerfile}: no runtime-packages-begin/end block")
    install = re.search(r"apt-get install[^\\]*\\\n(.*?)&&", block.group(1), re.S)
    return {p for p in re.split(r"[\s\\]+", install.group(1)) if p and not p.startswith("-")}


def spellings(path):
    """The names dpkg may know a library by: as given, resolved, and with /lib <-> /usr/lib
    (Debian 12 merges /usr, so a file may be recorded under either)."""
    resolved = subprocess.run(["readlink", "-f", path], capture_output=True,
                              text=True).stdout.strip()
    names = set()
    for p in (path, resolved):
        names.add(p)
        if p.startswith("/usr/lib/"):
            names.add(p[len("/usr"):])
        elif p.startswith("/lib/"):
            names.add("/usr" + p)
    return names


def owners(paths):
    """{path: package} for the given library paths, in one dpkg call."""
    names = {}
    for path in paths:
        for name in spellings(path):
            names[name] = path
    out = subprocess.run(["dpkg", "-S", *sorted(names)], capture_output=True, text=True).stdout
    found = {}
    for line in out.splitlines():
        pkg, _, file = line.partition(": ")
        if file in names:
            found[names[file]] = pkg.split(":")[0].strip()
    return found


def closure(packages):
    seen = set()
    todo = list(packages)
    while todo:
        pkg = todo.pop()
        if pkg in seen:
            continue
        seen.add(pkg)
        out = subprocess.run(["dpkg-query", "-W", "-f=${Depends}, ${Pre-Depends}", pkg],
                             capture_output=True, text=True).stdout
        for clause in out.split(","):
            for alternative in clause.split("|"):
                name = alternative.strip().split(" ")[0].split(":")[0]
                if name:
                    todo.append(name)
    return seen


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--list":
        print("\n".join(sorted(runtime_packages(sys.argv[2]))))
        return 0
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    dockerfile, binary = sys.argv[1:3]
    listed = runtime_packages(dockerfile)
    problems = []
    for pkg in sorted(listed):
        if subprocess.run(["apt-cache", "show", pkg], capture_output=True).returncode != 0:
            problems.append(f"{dockerfile}: runtime package {pkg} does not exist in Debian 12")
    covered = closure(listed | BASE)
    ldd = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
    libraries = sorted(set(re.findall(r"=>\s+(/\S+)", ldd)))
    owned = owners(libraries)
    for line in ldd.splitlines():
        if "not found" in line:
            problems.append(f"{binary}: ldd cannot resolve {line.strip()}")
    for lib in libraries:
        pkg = owned.get(lib)
        if pkg is None:
            problems.append(f"{binary} links {lib}, which no Debian package owns")
        elif pkg not in covered:
            problems.append(f"{binary} links {lib} from package {pkg}, which the runtime stage "
                            f"of {dockerfile} does not install (add {pkg} to its list)")
    for p in problems:
        print(p)
    print(f"{len(libraries)} libraries, {len(listed)} runtime packages: {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
