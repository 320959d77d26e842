#!/usr/bin/env python3
"""What a probe of a `kwatch probe` that joins another kwatch's session costs per hit
(docs/gdbserver.md, "A kwatch probe that joins"), against a standalone `kwatch probe --backend
ptrace`, on tests/targets/probe_join (one thread calling step(i, r) N times).

Cost per hit: the slope of the target's run time (from SIGUSR1 to its exit) between N = 5000 and
20000, median of 5 pairs; every process pinned to CPU 0 (taskset) so that the scheduler's
placement does not decide the result.

Usage: scripts/probe_join_cost.py BUILD_DIR   (as root: ptrace and perf breakpoints)
"""
import os
import signal
import statistics
import subprocess
import sys
import time

PIN = ["taskset", "-c", "0"]


def joined(build, n, field, probe):
    """Seconds probe_join takes under `kwatch --write FIELD` (and a joined `kwatch probe`)."""
    target = os.path.join(build, "tests/targets/probe_join")
    kwatch = os.path.join(build, "cli/kwatch")
    t = subprocess.Popen(PIN + [target, "1", str(n), "--wait"], stdout=subprocess.PIPE, text=True)
    t.stdout.readline()  # ready PID
    commands = [[kwatch, "--json", "-q", "--write", field, "-p", str(t.pid)]]
    if probe:  # joins once the session is armed
        commands.append([kwatch, "probe", "-q", "step i", "-p", str(t.pid)])
    procs = []
    for argv in commands:
        p = subprocess.Popen(PIN + argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True)
        procs.append(p)
        while True:
            line = p.stderr.readline()
            if not line:
                t.kill()
                sys.exit(f"{' '.join(argv)} ended before it armed")
            if "armed" in line:
                break
    start = time.monotonic()
    os.kill(t.pid, signal.SIGUSR1)
    t.wait()
    took = time.monotonic() - start
    for p in procs:
        p.wait()
    return took


def standalone(build, n):
    """Seconds a standalone `kwatch probe --backend ptrace 'step i' -- probe_join 1 N` takes."""
    start = time.monotonic()
    subprocess.run(PIN + [os.path.join(build, "cli/kwatch"), "probe", "-q", "--backend", "ptrace",
                          "step i", "--", os.path.join(build, "tests/targets/probe_join"), "1",
                          str(n)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   check=False)
    return time.monotonic() - start


def slope(run, *args):
    per_hit = [(run(*args[:1], 20000, *args[1:]) - run(*args[:1], 5000, *args[1:])) / 15000 * 1e6
               for _ in range(5)]
    return statistics.median(per_hit), min(per_hit), max(per_hit)


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    build = sys.argv[1]
    rows = [
        ("standalone kwatch probe --backend ptrace", slope(standalone, build)),
        ("joined probe, the session's watch on an untouched field",
         slope(joined, build, "g_stats.other", True)),
        ("the session's watch hit in each call, no joiner",
         slope(joined, build, "g_stats.calls", False)),
        ("the session's watch hit in each call, and the joined probe",
         slope(joined, build, "g_stats.calls", True)),
    ]
    for name, (median, low, high) in rows:
        print(f"{name}: {median:.1f} us per call (min {low:.1f}, max {high:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
