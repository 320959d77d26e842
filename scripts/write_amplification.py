#!/usr/bin/env python3
"""write_amplification.py: what a recording session writes to disk per byte of its recording.

Runs a command (a kwatch session that records with -o FILE), and when it exits reads its
/proc/PID/io before reaping it (waitid WNOWAIT: the exited process's counters, every thread
included: kwatch's writer and its checkpoint thread), then compares with FILE's final size.

  usage: scripts/write_amplification.py FILE -- kwatch [ARGS...] -o FILE -- TARGET [ARGS...]

Prints one line of key=value: seconds, the exit status, write_bytes (pages the process dirtied:
what goes to the disk), cancelled_write_bytes, wchar (bytes handed to write(2)), the file's
size, and write_bytes / size (the write amplification of issue 27).
"""
import os
import sys
import time


def main():
    if len(sys.argv) < 4 or sys.argv[2] != "--":
        sys.stderr.write(__doc__)
        return 2
    path = sys.argv[1]
    argv = sys.argv[3:]
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:
        try:
            os.execvp(argv[0], argv)
        finally:
            os._exit(127)
    # Exited but not reaped: its /proc/PID/io still holds its totals.
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    seconds = time.monotonic() - t0
    io = {}
    with open(f"/proc/{pid}/io") as f:
        for line in f:
            key, value = line.split(":")
            io[key.strip()] = int(value)
    _, status = os.waitpid(pid, 0)
    size = os.stat(path).st_size
    out = {
        "seconds": f"{seconds:.1f}",
        "exit": os.waitstatus_to_exitcode(status),
        "write_bytes": io["write_bytes"],
        "cancelled_write_bytes": io["cancelled_write_bytes"],
        "wchar": io["wchar"],
        "file_bytes": size,
        "write_amplification": f"{io['write_bytes'] / size:.3f}" if size else "-",
        "wchar_per_file_byte": f"{io['wchar'] / size:.3f}" if size else "-",
    }
    print(" ".join(f"{k}={v}" for k, v in out.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
