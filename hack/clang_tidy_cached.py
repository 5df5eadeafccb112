#!/usr/bin/env python3
"""Runs clang-tidy over translation units, skipping those it has found clean before.

  clang_tidy_cached.py BUILD_DIR FILE...

A unit is skipped when a clean result is cached for the same input: the unit preprocessed (every
header it includes, so a change to any of them runs it again), its compile command, the
.clang-tidy configuration and the clang-tidy version. Paths under the source tree are replaced
by a placeholder first, so a fresh clone elsewhere finds the same results. Only clean results are
cached: a unit with findings runs again every time. clang-tidy over all of src/ takes about a
quarter of an hour of one core on the project's machines; a run with nothing changed takes the
preprocessing alone. The cache is ~/.cache/vfio-dra/clang-tidy (VFIO_DRA_LINT_CACHE overrides).
"""

import concurrent.futures
import hashlib
import json
import os
import shlex
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.environ.get("VFIO_DRA_LINT_CACHE",
                       os.path.join(os.path.expanduser("~"), ".cache", "vfio-dra", "clang-tidy"))


def compile_commands(build_dir):
    path = os.path.join(build_dir, "compile_commands.json")
    try:
        with open(path) as f:
            entries = json.load(f)
    except (OSError, ValueError) as error:
        sys.exit(f"clang_tidy_cached.py: cannot read {path}: {error} (configure the build first)")
    commands = {}
    for entry in entries:
        file = os.path.normpath(os.path.join(entry["directory"], entry["file"]))
        args = entry.get("arguments") or shlex.split(entry["command"])
        commands[file] = (entry["directory"], args)
    return commands


def preprocess_args(args):
    """The compile command with its output dropped and -E added (the source stays as given)."""
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg in ("-o", "-MF", "-MT", "-MQ"):
            skip = True
            continue
        if arg in ("-c", "-MD", "-MMD") or arg.startswith("-o"):
            continue
        out.append(arg)
    return out + ["-E", "-P", "-o", "-"]


def key_of(file, directory, args, common):
    result = subprocess.run(preprocess_args(args), cwd=directory, capture_output=True)
    if result.returncode != 0:
        return None  # clang-tidy will say what is wrong
    digest = hashlib.sha256(common)
    digest.update(" ".join(args).replace(ROOT, "@SRC@").encode())
    digest.update(os.path.relpath(file, ROOT).encode())
    digest.update(result.stdout.replace(ROOT.encode(), b"@SRC@"))
    return digest.hexdigest()


def check(file, build_dir, commands, common):
    entry = commands.get(file)
    key = key_of(file, *entry, common) if entry else None
    if key and os.path.exists(os.path.join(CACHE, key)):
        return file, True, "", True
    result = subprocess.run(["clang-tidy", "-p", build_dir, "--quiet", file],
                            capture_output=True, text=True)
    clean = result.returncode == 0
    if clean and key:
        os.makedirs(CACHE, exist_ok=True)
        with open(os.path.join(CACHE, key), "w") as f:
            f.write(os.path.relpath(file, ROOT) + "\n")
    return file, clean, result.stdout, False


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: clang_tidy_cached.py BUILD_DIR FILE...")
    build_dir = os.path.abspath(sys.argv[1])
    files = [os.path.abspath(f) for f in sys.argv[2:]]
    commands = compile_commands(build_dir)
    version = subprocess.run(["clang-tidy", "--version"], capture_output=True, text=True).stdout
    with open(os.path.join(ROOT, ".clang-tidy"), "rb") as f:
        common = version.encode() + f.read()
    failed, cached = [], 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        for file, clean, output, hit in pool.map(
                lambda f: check(f, build_dir, commands, common), files):
            cached += hit
            if not clean:
                failed.append(file)
                print(output, end="", flush=True)
    print(f"clang-tidy: {len(files) - len(failed)} of {len(files)} files clean "
          f"({cached} known clean from an earlier run)")
    if failed:
        print("clang-tidy: findings in " + " ".join(os.path.relpath(f, ROOT) for f in failed),
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
