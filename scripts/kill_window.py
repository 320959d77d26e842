#!/usr/bin/env python3
"""How often does SIGKILL of kwatch kill the target it watches? (README "Known limits")

usage: scripts/kill_window.py [--runs N] [--threads T] [--modes M,...] [--periods US,...]
                              [--build DIR]

For each mode and period: start tests/targets/kill_target (T threads, each calling
kill_tick every US microseconds; 0 is a tight loop), attach kwatch to it, let the target hit
for a random 0.3-1.0 s, SIGKILL kwatch and wait for the target. A target that ends with
status 0 and its normal output survived; any other end (133: SIGTRAP, 139: SIGSEGV) is a
target kwatch's death killed. Prints one line per cell: survived/runs and the deaths by
signal.

Modes (those that need debug traps are refused on a host that drops them):
  probe-ptrace  kwatch probe --backend ptrace kill_tick      (INT3, a ptrace stop per hit)
  page          kwatch --backend page --write g_val          (page protection, ptrace)
  probe-agent   kwatch probe --backend agent kill_tick       (in-process agent: the control)
  probe-hw      kwatch probe --hw kill_tick                  (execute breakpoints, ptrace)
  stop          kwatch --stop --write g_val                  (write breakpoints, ptrace)

Run it on a quiet machine: the window depends on how fast kwatch dies, and a loaded machine
stretches it.
"""

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

MODES = {
    "probe-ptrace": ["probe", "--backend", "ptrace", "kill_tick"],
    "page": ["--backend", "page", "--write", "g_val"],
    "probe-agent": ["probe", "--backend", "agent", "kill_tick"],
    "probe-hw": ["probe", "--hw", "kill_tick"],
    "stop": ["--stop", "--write", "g_val"],
}


def wait_for_line(stream, text, deadline):
    """Reads lines of a pipe until one holds `text`; False at EOF or after `deadline`."""
    os.set_blocking(stream.fileno(), False)
    buf = b""
    while time.monotonic() < deadline:
        try:
            chunk = os.read(stream.fileno(), 65536)
        except BlockingIOError:
            time.sleep(0.005)
            continue
        if not chunk:
            return False
        buf += chunk
        if text.encode() in buf:
            return True
    return False


def one_run(build, mode, threads, period_us):
    """Returns (outcome, detail): outcome 'survived', 'died' or 'error'."""
    tmp = tempfile.mkdtemp(prefix="kwatch-kill-")
    go = os.path.join(tmp, "go")
    calls = 10_000_000 if period_us == 0 else max(1, int(3.0e6 / period_us))
    target = subprocess.Popen(
        [os.path.join(build, "tests/targets/kill_target"), str(threads), str(calls),
         str(period_us), go],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    kw = None
    try:
        if not wait_for_line(target.stdout, "ready", time.monotonic() + 10):
            return "error", "the target printed no ready"
        kw = subprocess.Popen(
            [os.path.join(build, "cli/kwatch")] + MODES[mode] + ["-p", str(target.pid)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        if not wait_for_line(kw.stderr, "armed", time.monotonic() + 20):
            return "error", "kwatch did not arm"
        with open(go, "w", encoding="ascii") as f:
            f.write("1")
        time.sleep(random.uniform(0.3, 1.0))
        if target.poll() is not None:
            return "error", "the target ended before kwatch was killed (lengthen the loop)"
        kw.send_signal(signal.SIGKILL)
        kw.wait()
        # A tight loop of 10M calls unwatched takes well under a minute.
        try:
            status = target.wait(timeout=120)
        except subprocess.TimeoutExpired:
            target.kill()
            target.wait()
            return "died", "hung"
        if status == 0:
            return "survived", ""
        if status < 0:
            return "died", signal.Signals(-status).name
        return "died", f"exit {status}"
    finally:
        if kw is not None and kw.poll() is None:
            kw.kill()
            kw.wait()
        if target.poll() is None:
            target.kill()
            target.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--modes", default="probe-ptrace,page,probe-agent")
    ap.add_argument("--periods", default="0,2000,20000",
                    help="microseconds between one thread's calls (0: tight loop)")
    ap.add_argument("--build", default="build/default")
    args = ap.parse_args()
    modes = args.modes.split(",")
    for m in modes:
        if m not in MODES:
            sys.exit(f"kill_window: unknown mode {m!r} (known: {', '.join(MODES)})")
    print(f"# {args.threads} threads, {args.runs} runs per cell, kwatch SIGKILLed after "
          f"0.3-1.0 s; {os.uname().release}")
    print(f"{'mode':<14} {'period':>10} {'hits/s/thread':>14} {'survived':>9}  deaths")
    for m in modes:
        for p in (int(x) for x in args.periods.split(",")):
            counts = {"survived": 0, "died": 0, "error": 0}
            details = {}
            for _ in range(args.runs):
                outcome, detail = one_run(args.build, m, args.threads, p)
                counts[outcome] += 1
                if detail:
                    details[detail] = details.get(detail, 0) + 1
            rate = "tight" if p == 0 else f"{1e6 / p:.0f}"
            period = "0" if p == 0 else f"{p} us"
            done = counts["survived"] + counts["died"]
            detail = ", ".join(f"{k}: {v}" for k, v in sorted(details.items()))
            print(f"{m:<14} {period:>10} {rate:>14} {counts['survived']:>4}/{done:<4}  {detail}",
                  flush=True)


if __name__ == "__main__":
    main()
