#!/usr/bin/env python3
"""The side-by-side benchmark's smoke (issue 58): builds the Go reference driver through
hack/bench-peer.sh, runs one short round of both plugins at 8 devices, and checks that the table
has each figure's row with a number for both plugins and their ratio. No figure is judged: the
machine this runs on is shared, and the benchmark's run for the record is hack/bench-peer.sh.
    smoke.py PEER_BENCH_BINARY"""
import os
import re
import subprocess
import sys

FIGURES = [
    "Start to published",
    "Idle RSS",
    "Idle CPU (utime+stime)",
    "Idle CPU (threads' schedstat)",
    "Prepare p50, one claim at a time",
    "Prepare p99, claims at once (8)",
    "Plugin CPU per claim (prepare + unprepare)",
]
NUMBER = r"[0-9]+(?:\.[0-9]+)?"


def main():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PEER_BENCH=sys.argv[1])
    run = subprocess.run(
        [os.path.join(root, "hack", "bench-peer.sh"), "--runs", "1", "--idle-seconds", "2",
         "--rounds", "1", "--devices", "8"],
        env=env, capture_output=True, text=True, check=False)
    print(run.stdout)
    if run.returncode != 0:
        sys.exit("bench-peer.sh failed with exit code %d:\n%s" % (run.returncode, run.stderr))
    missing = []
    for figure in FIGURES:
        row = re.compile(r"^\| %s \| 8 \| (%s) [^|]+ \| (%s) [^|]+ \| (%sx|n/a) \|$" %
                         (re.escape(figure), NUMBER, NUMBER, NUMBER), re.M)
        if not row.search(run.stdout):
            missing.append(figure)
    if missing:
        sys.exit("bench-peer.sh's table lacks a row with both figures and the ratio for: " +
                 "; ".join(missing))
    if "vfio-dra 8: 8; 1" not in run.stdout or "reference 8: 8; 1" not in run.stdout:
        sys.exit("bench-peer.sh did not report both plugins publishing their 8 devices")
    print("bench_peer_smoke: every row present with numbers")


if __name__ == "__main__":
    main()
