#!/usr/bin/env python3
"""`kwatch report FILE --format chrome-trace` on real recordings, checked exactly.

    chrome_trace_test.py KWATCH TARGETS_DIR

1. field_writer (2 threads, known writes and reads per thread, its own ground truth) watched
   in page mode with -o: one instant event per access, per thread and field as the truth says;
   the counters of each field sum to the same numbers; one thread track per worker.
2. uprobe_loop (2 threads, tick() called 25 times each) probed at entry and %return with -o:
   one instant per hit, one complete event per call on the caller's track, pairing each
   entry's i with the return value 3*i + r->len.
3. call_depth (descend(n) calls descend(n - 1), returns n): complete events nest, each return
   paired with its own entry (entry n == return value), inner calls inside outer ones.
"""

import json
import os
import subprocess
import sys
import tempfile
from collections import Counter


class Failure(Exception):
    pass


def expect(cond, what):
    if not cond:
        raise Failure(what)


def record_and_export(kwatch, tmp, name, args):
    rec = os.path.join(tmp, name + ".kwdb")
    probe = args[0] == "probe"
    args = args[:1] + ["-q", "-o", rec] + args[1:] if probe else ["-q", "-o", rec] + args
    r = subprocess.run([kwatch] + args, capture_output=True, text=True, timeout=120, check=False)
    expect(r.returncode == 0, f"{name}: kwatch exited {r.returncode}: {r.stderr}")
    out = os.path.join(tmp, name + ".json")
    with open(out, "w", encoding="utf-8") as f:
        r = subprocess.run([kwatch, "report", rec, "--format", "chrome-trace"], stdout=f,
                           stderr=subprocess.PIPE, text=True, timeout=120, check=False)
    expect(r.returncode == 0, f"{name}: report exited {r.returncode}: {r.stderr}")
    with open(out, encoding="utf-8") as f:
        doc = json.load(f)
    expect(set(doc) == {"traceEvents", "displayTimeUnit"}, f"{name}: keys {sorted(doc)}")
    evs = doc["traceEvents"]
    for e in evs:
        expect(e["ph"] in ("M", "i", "C", "X"), f"{name}: unexpected phase {e}")
        if e["ph"] == "i":
            expect(e["s"] == "t", f"{name}: instant not thread-scoped: {e}")
    return evs, r.stderr


def thread_tracks(evs):
    return {(e["pid"], e["tid"]) for e in evs if e["ph"] == "M" and e["name"] == "thread_name"}


def check_watch(kwatch, targets, tmp):
    truth = os.path.join(tmp, "truth")
    evs, err = record_and_export(kwatch, tmp, "watch", [
        "--backend", "page", "--rw", "g_stats", "--", os.path.join(targets, "field_writer"), "2",
        "40", "--truth", truth])
    with open(truth, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    expect(len(rows) == 2, f"truth: {rows}")
    want = Counter()
    for row in rows:
        want[(row["tid"], "g_stats.hits", "w")] += row["hits_w"]
        want[(row["tid"], "g_stats.misses", "w")] += row["misses_w"]
        want[(row["tid"], "g_stats.flags", "r")] += row["flags_r"]
    got = Counter((e["tid"], e["args"]["field"], e["args"]["access"]) for e in evs
                  if e["ph"] == "i" and e["cat"] == "access")
    expect(got == want, f"watch: accesses per thread and field {dict(got)} != truth {dict(want)}")
    for e in evs:
        if e["ph"] == "i" and e["name"] == "g_stats.hits":
            expect(" -> " in e["args"]["value"] and e["args"]["site"].startswith("Work+0x"),
                   f"watch: value or site missing: {e}")
    tids = {row["tid"] for row in rows}
    tracks = thread_tracks(evs)
    expect({t for _, t in tracks} == tids, f"watch: thread tracks {tracks}, workers {tids}")
    sums = Counter()
    for e in evs:
        if e["ph"] == "C":
            field = e["name"].removeprefix("accesses ")
            sums[(field, "r")] += e["args"]["reads"]
            sums[(field, "w")] += e["args"]["writes"]
    by_field = Counter()
    for (_, field, acc), n in want.items():
        by_field[(field, acc)] += n
    expect(+sums == +by_field, f"watch: counters sum to {dict(sums)}, truth {dict(by_field)}")
    total = sum(want.values())
    expect(f"kwatch: chrome trace: {total} accesses, 0 probe hits, 0 calls" in err, err)
    print(f"ok   watch: {total} accesses in {len(tracks)} thread tracks")


def check_calls(evs, name):
    hits = [e for e in evs if e["ph"] == "i" and e["cat"] == "probe"]
    calls = [e for e in evs if e["ph"] == "X"]
    for c in calls:
        expect(c["cat"] == "call" and c["dur"] >= 0, f"{name}: {c}")
    return hits, calls


def check_loop(kwatch, targets, tmp):
    evs, err = record_and_export(kwatch, tmp, "loop", [
        "probe", "tick i r->len", "tick%return $retval", "--",
        os.path.join(targets, "uprobe_loop"), "25", "--threads", "2"])
    hits, calls = check_calls(evs, "loop")
    expect(Counter(h["name"] for h in hits) == {"tick": 50, "tick__return": 50},
           f"loop: hits {Counter(h['name'] for h in hits)}")
    expect(len(calls) == 50, f"loop: {len(calls)} calls")
    per_tid = Counter(c["tid"] for c in calls)
    expect(len(per_tid) == 2 and set(per_tid.values()) == {25}, f"loop: calls per tid {per_tid}")
    for c in calls:
        entry, ret = c["args"]["entry"], c["args"]["return"]
        expect(int(ret["arg1"]) == 3 * int(entry["i"]) + int(entry["r->len"]),
               f"loop: return {ret} is not this entry's {entry}")
    tracks = thread_tracks(evs)
    expect({t for _, t in tracks} == set(per_tid), f"loop: tracks {tracks}, callers {per_tid}")
    expect("kwatch: chrome trace: 0 accesses, 100 probe hits, 50 calls" in err, err)
    print(f"ok   loop: {len(hits)} hits, {len(calls)} calls in {len(tracks)} thread tracks")


def check_nesting(kwatch, targets, tmp):
    rounds, depth = 3, 4
    evs, err = record_and_export(kwatch, tmp, "depth", [
        "probe", "descend n", "descend%return $retval", "--",
        os.path.join(targets, "call_depth"), str(rounds), str(depth)])
    hits, calls = check_calls(evs, "depth")
    n_calls = rounds * (depth + 1)
    expect(len(hits) == 2 * n_calls and len(calls) == n_calls,
           f"depth: {len(hits)} hits, {len(calls)} calls")
    for c in calls:
        expect(c["args"]["entry"]["n"] == c["args"]["return"]["arg1"],
               f"depth: a return paired with another call's entry: {c['args']}")
    calls.sort(key=lambda c: (c["ts"], -c["dur"]))
    for i in range(0, n_calls, depth + 1):
        chain = calls[i:i + depth + 1]  # one round: descend(depth) ... descend(0)
        expect([int(c["args"]["entry"]["n"]) for c in chain] == list(range(depth, -1, -1)),
               f"depth: round {[c['args'] for c in chain]}")
        for outer, inner in zip(chain, chain[1:]):
            expect(outer["ts"] <= inner["ts"] and
                   inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"] + 1e-3,
                   f"depth: {inner} is not inside {outer}")
    expect(f"{2 * n_calls} probe hits, {n_calls} calls" in err, err)
    print(f"ok   depth: {n_calls} nested calls")


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    kwatch, targets = sys.argv[1:]
    failed = False
    with tempfile.TemporaryDirectory(prefix="kwatch-trace-") as tmp:
        for check in (check_watch, check_loop, check_nesting):
            try:
                check(kwatch, targets, tmp)
            except Failure as e:
                print(f"FAIL {check.__name__}: {e}", file=sys.stderr)
                failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
