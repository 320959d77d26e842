#!/usr/bin/env python3
"""Validates the real JSON output of every kwatch mode against docs/kwatch-events.schema.json.

    json_schema_test.py KWATCH TARGETS_DIR SCHEMA

Runs kwatch with --json in each mode on the bundled targets (process watches in perf, stop
and page mode, -f, a kernel watch, --kernel-accesses, probes through the agent, ptrace, the
uprobe PMU and --hw) and `kwatch report FILE --format json` on a watch and a probe recording,
then validates every line of stdout. Besides the schema, each mode must print the objects it
documents, in order (watch lines, then events or hits, then one summary), with as many events
or hits as its summary counts. Any mismatch fails naming the mode, the line and the schema's
error; the target's own stdout (known text) is the only other line allowed.
"""

import json
import os
import re
import subprocess
import sys
import tempfile

import jsonschema

# The piper program of tests/cli/kernel_cli_test.cc: the kernel writes `buf` in each read(2).
PIPER = r"""
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
_Alignas(64) char buf[64];
int main(int argc, char** argv) {
  int n = atoi(argv[1]), fds[2];
  if (pipe(fds) != 0) return 1;
  for (int i = 0; i < n; ++i) {
    if (write(fds[1], "12345678", 8) != 8) return 2;
    if (read(fds[0], buf, 8) != 8) return 3;
  }
  return 0;
}
"""


class Failure(Exception):
    pass


def main():
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    kwatch, targets, schema_path = sys.argv[1:]
    with open(schema_path, encoding="utf-8") as f:
        schema = json.load(f)
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    failures = []
    with tempfile.TemporaryDirectory(prefix="kwatch-schema-") as tmp:
        t = lambda name: os.path.join(targets, name)
        truth = os.path.join(tmp, "truth")
        fw = [t("field_writer"), "2", "40", "--truth", truth]
        loop = [t("uprobe_loop"), "25"]
        loop_out = r"sum=\d+"
        piper = os.path.join(tmp, "piper")
        with open(piper + ".c", "w", encoding="utf-8") as f:
            f.write(PIPER)
        subprocess.run(["gcc", "-g", "-O1", "-o", piper, piper + ".c"], check=True)
        watch_rec = os.path.join(tmp, "watch.kwdb")
        probe_rec = os.path.join(tmp, "probe.kwdb")
        # (name, kwatch arguments, what it prints, the target's own stdout lines)
        modes = [
            ("perf", ["--backend", "perf", "--rw", "g_stats.hits", "g_stats.misses", "--"] + fw,
             "watch", None),
            ("stop", ["--stop", "--write", "g_stats.hits", "--if", "new > 3", "--stack", "--"] + fw,
             "watch", None),
            ("page -f", ["--backend", "page", "--rw", "g_stats", "-f", "-o", watch_rec, "--"] + fw
             + ["--fork"], "watch", None),
            ("perf overcommit", ["--write", "g_stats.hits", "g_stats.misses", "g_stats.flags",
                                 "g_stats.tag", "g_sink", "--"] + fw, "watch", None),
            ("perf multiplex", ["--backend", "perf", "--overcommit", "multiplex", "--write",
                                "g_stats.hits", "g_stats.misses", "g_stats.flags", "g_stats.tag",
                                "g_sink", "--"] + fw, "watch", None),
            ("page syscalls", ["--backend", "page", "--write", "g_page.value", "--",
                               t("page_syscalls"), "pipe", "5"], "watch",
             r"pipe 5 last=4 text='msg 4'"),
            ("arm-at", ["--write", "g_p->v", "--arm-at", "write_through", "--",
                        t("late_pointer"), "20", "3"], "watch", None),
            ("per call", ["--write", "r->len", "--in", "recurse", "--", t("per_call"), "2", "0",
                          "5"], "watch", None),
            ("follow", ["--follow", "--write", "g_p->v", "--", t("follow_chain"), "null", "5",
                        "3", "2"], "watch", None),
            ("kernel", ["--write", "&jiffies", "--duration", "0.3", "--stack"], "kernel", None),
            ("kernel-accesses", ["--kernel-accesses", "--write", "buf", "--len", "8", "--",
                                 piper, "5"], "kernel", None),
            ("probe agent", ["probe", "-o", probe_rec, "--agg", "count() by tid", "--agg",
                             "tick:hist(i)", "tick i r->len", "tick%return $retval",
                             "--"] + loop, "probe", loop_out),
            ("probe ptrace", ["probe", "--backend", "ptrace", "--stack", "tick i if i % 2 == 0",
                              "tick%return $retval $duration", "--"] + loop, "probe", loop_out),
            ("probe uprobe", ["probe", "--backend", "uprobe", "tick i", "--"] + loop, "probe",
             loop_out),
            ("probe hw", ["probe", "--hw", "tick i", "--"] + loop, "probe", loop_out),
        ]
        # kwatch's auto backend checks whether this host delivers debug-register traps (some
        # hypervisors drop them all: watch/hw_probe) and takes page protection where it does
        # not; there the modes that need traps are skipped, as KW_REQUIRE_DEBUG_TRAPS does.
        auto = run(kwatch, ["--json", "-q", "--write", "g_stats.hits", "--"] + fw, None)
        traps = json.loads(auto[-1])["backend"] == "perf"
        needs_traps = {"perf", "stop", "perf overcommit", "perf multiplex", "per call", "follow",
                       "kernel",
                       "kernel-accesses", "probe hw"}
        for name, args, kind, foreign in modes:
            if not traps and name in needs_traps:
                print(f"skip {name}: this host does not deliver debug-register traps")
                continue
            try:
                json_args = args[:1] + ["--json"] + args[1:] if args[0] == "probe" else ["--json"] + args
                lines = run(kwatch, json_args, foreign)
                objs = validate(validator, name, lines)
                check_sequence(name, kind, objs)
                check_strict(validator, name, objs)
                check_exercised(name, objs)
                print(f"ok   {name}: {len(objs)} objects")
            except Failure as e:
                failures.append(str(e))
                print(f"FAIL {name}", file=sys.stderr)
        for name, rec in [("report watch", watch_rec), ("report probe", probe_rec)]:
            try:
                out = subprocess.run([kwatch, "report", rec, "--format", "json"],
                                     capture_output=True, text=True, check=False)
                if out.returncode != 0:
                    raise Failure(f"{name}: exit {out.returncode}: {out.stderr}")
                objs = validate(validator, name, [json.dumps(json.loads(out.stdout))])
                check_report(name, rec, objs[0])
                print(f"ok   {name}")
            except Failure as e:
                failures.append(str(e))
    for f in failures:
        print(f, file=sys.stderr)
    return 1 if failures else 0


def run(kwatch, args, foreign):
    out = subprocess.run([kwatch] + args, capture_output=True, text=True, timeout=120,
                         check=False)
    name = " ".join(args)
    if out.returncode != 0:
        raise Failure(f"kwatch {name}: exit {out.returncode}\n{out.stderr}")
    lines = []
    for line in out.stdout.splitlines():
        if foreign is not None and re.fullmatch(foreign, line):
            continue  # the target's own output
        lines.append(line)
    return lines


def validate(validator, name, lines):
    objs = []
    for n, line in enumerate(lines, 1):
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise Failure(f"{name}: line {n} is not JSON ({e}): {line[:200]}") from e
        errors = sorted(validator.iter_errors(obj), key=lambda e: e.path)
        if errors:
            best = jsonschema.exceptions.best_match(errors)
            where = "/".join(str(p) for p in best.absolute_path)
            raise Failure(f"{name}: line {n} does not match the schema at /{where}: "
                          f"{best.message}\n  line: {line[:600]}")
        objs.append(obj)
    return objs


def check_sequence(name, kind, objs):
    """watch lines (watch sessions), events or hits, then exactly one summary, last."""
    types = [o.get("type") for o in objs]
    if not types or types[-1] != "summary" or types.count("summary") != 1:
        raise Failure(f"{name}: expected one summary, last; got types {sorted(set(types))}")
    summary = objs[-1]
    if kind == "probe":
        hits = types.count("hit")
        # --agg: the aggregate lines, after the hits and before the summary.
        aggs = types.count("aggregate")
        if set(types) - {"aggregate"} != {"hit", "summary"} or hits != summary["hits"] or \
                hits == 0 or types[len(types) - 1 - aggs:-1] != ["aggregate"] * aggs:
            raise Failure(f"{name}: {hits} hit lines, the summary counts {summary['hits']}")
        return
    watches = [o for o in objs if o["type"] == "watch"]
    events = [o for o in objs if o["type"] == "event"]
    # --follow: a move may come before the first event (a watch that starts parked).
    first_event = min(types.index(k) for k in ("event", "move") if k in types) if events \
        else len(types) - 1
    if not watches or types[:len(watches)] != ["watch"] * len(watches) or \
            len(watches) != len(summary["watches"]) or first_event != len(watches):
        raise Failure(f"{name}: expected the watch lines first, one per watch; types {types[:8]}")
    if not events or len(events) != summary["events"]:
        raise Failure(f"{name}: {len(events)} event lines, the summary counts "
                      f"{summary['events']}")
    kernel_fields = kind == "kernel"
    if any(("comm" in e) != kernel_fields for e in events):
        raise Failure(f"{name}: events of the wrong kind (kernel fields: {kernel_fields})")


# Optional members each mode must print, so that their part of the schema is exercised.
EXERCISED = {
    "stop": ["if", "slots"],
    "page -f": ["processes", "profile"],
    "perf overcommit": ["placement"],
    "perf multiplex": ["multiplexed"],
    "page syscalls": ["kernel"],
    "arm-at": ["arm_at", "armed"],
    "per call": ["call", "calls", "why_not", "returned"],
    "follow": ["follow", "why", "pointer"],
    "kernel": ["stack"],
    "probe agent": ["return_address", "caller", "low", "value"],
    "probe ptrace": ["stack", "condition", "matched", "$duration"],
    "probe uprobe": ["kernel_count"],
    "probe hw": ["debug_register", "stray_traps"],
}


def check_exercised(name, objs):
    text = "\n".join(json.dumps(o) for o in objs)
    for key in EXERCISED.get(name, []):
        if f'"{key}":' not in text:
            raise Failure(f"{name}: no \"{key}\" in its output: the test no longer exercises it")


def check_strict(validator, name, objs):
    """The schema catches drift: each kind of object of this mode, with a field added, one
    removed or a type changed, must fail."""
    seen = {}
    for o in objs:
        seen.setdefault(o["type"], o)
    for o in seen.values():
        second = list(o)[1]  # after "type": a required field of every kind
        drifted = [dict(o, unknown_field=1), {k: v for k, v in o.items() if k != second},
                   dict(o, type="Event" if o["type"] == "event" else "event")]
        for d in drifted:
            if validator.is_valid(d):
                raise Failure(f"{name}: the schema accepts a drifted {o['type']}: "
                              f"{json.dumps(d)[:300]}")


def check_report(name, rec, report):
    if report["session"]["file"] != rec or not report["session"]["complete"]:
        raise Failure(f"{name}: session {report['session']}")
    if "watch" in name and (not report["watches"] or report["events"] == 0):
        raise Failure(f"{name}: no watches or events in the report")
    if "probe" in name and (len(report["probes"]) != 2 or report["session"]["hits"] != 50):
        raise Failure(f"{name}: expected 2 probes and 50 hits: {report['probes']}")
    if "probe" in name and [a["agg"] for a in report.get("aggregates", [])][:2] != \
            ["count() by tid", "count() by tid"]:
        raise Failure(f"{name}: expected the recorded aggregations: {report.get('aggregates')}")


if __name__ == "__main__":
    sys.exit(main())
