#!/usr/bin/env python3
"""make lint: clang-tidy 14 with the repository's .clang-tidy (every warning an error) over the
sources of agent/, core/, drmgr/, watch/, cli/ and gui/ (tests/, bench/ and fuzz/ are not
linted), their headers included: a finding in a header is printed once, not once per file that
includes it.

A translation unit found clean is remembered in scripts/lint-clean.txt, committed with the code,
by a key of what clang-tidy's result depends on: the clang-tidy version, the configuration that
applies to the file (--dump-config), the compile command and the file's preprocessed text
(every header it includes, system headers too), comments (NOLINT) and macro definitions kept,
the repository's own path replaced by a placeholder (a clone elsewhere has the same keys). An
unchanged unit is not checked again, so CI checks only what changed since the last `make lint`
of whoever committed; a unit with findings is never remembered. A run over every file keeps
only the keys of today's units; a run over some files (REGEX) adds theirs.

Usage: scripts/lint.py BUILD_DIR [-j JOBS] [--no-cache] [REGEX...]  (--no-cache: check every
unit, remember nothing)  (REGEX: only the files
whose path relative to the repository it matches, e.g. watch/session)
Exit status: 0 clean, 1 findings (or clang-tidy failed), 2 usage or setup error.
"""

import argparse
import concurrent.futures
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLEAN_FILE = os.path.join(ROOT, "scripts", "lint-clean.txt")
FOLDERS = ("agent", "core", "drmgr", "watch", "cli", "gui", "version")
HEADER_FILTER = "^" + re.escape(ROOT) + "/(" + "|".join(FOLDERS) + ")/"
SOURCE_RE = re.compile(HEADER_FILTER + r".*\.cc$")
CLANG_TIDY = "clang-tidy"
CLANG = "clang++"
# A diagnostic's first line; the lines after it (source excerpt, notes) belong to it.
DIAG_RE = re.compile(r"^(/\S+?):(\d+):(\d+): (warning|error): ")
NOISE_RE = re.compile(r"^(\d+ warnings? (and \d+ errors? )?generated\.|"
                      r"Suppressed \d+ warnings? .*|Use -header-filter=.*|"
                      r"\d+ warnings? treated as errors?)$")


def run(cmd, merge=True, **kw):
    return subprocess.run(cmd, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT if merge else subprocess.DEVNULL, check=False,
                          **kw)


def preprocess_args(entry):
    """The unit's compile command as a clang++ -E command writing to stdout."""
    args = entry["arguments"] if "arguments" in entry else shlex.split(entry["command"])
    out = [CLANG]
    skip = False
    for a in args[1:]:
        if skip:
            skip = False
            continue
        if a in ("-o", "-MF", "-MT", "-MQ"):
            skip = True
            continue
        if a in ("-c", "-MD", "-MMD") or a.startswith(("-o", "-MF", "-MT", "-MQ")):
            continue
        out.append(a)
    # -CC keeps the comments (NOLINT), -dD the macro definitions (bugprone-macro-parentheses
    # looks at them even where no code uses the macro).
    return out + ["-E", "-CC", "-dD", "-Wno-everything", "-o", "-"]


def unit_key(entry, tidy_version):
    """The cache key of one unit, or None when it cannot be computed (then it is checked)."""
    root = ROOT.encode()
    h = hashlib.sha256()
    h.update(tidy_version)
    h.update(HEADER_FILTER.replace(re.escape(ROOT), "@ROOT@").encode())
    h.update(json.dumps(entry, sort_keys=True).encode().replace(root, b"@ROOT@"))
    config = run([CLANG_TIDY, "--dump-config", entry["file"]], merge=False)
    pre = run(preprocess_args(entry), merge=False, cwd=entry["directory"])
    if config.returncode != 0 or pre.returncode != 0:
        return None
    h.update(config.stdout.replace(root, b"@ROOT@"))
    h.update(pre.stdout.replace(root, b"@ROOT@"))
    return h.hexdigest()


def tidy(build, entry):
    """(exit status, output lines) of clang-tidy on one unit."""
    r = run([CLANG_TIDY, "-p", build, "--quiet", "--header-filter=" + HEADER_FILTER,
             entry["file"]])
    lines = [l for l in r.stdout.decode(errors="replace").splitlines() if not NOISE_RE.match(l)]
    return r.returncode, lines


def check(build, entry, clean, tidy_version):
    """(file, exit status, output lines, seconds clang-tidy took or None when a clean check of
    the same key answered, the unit's key when it is clean now) of one unit."""
    key = unit_key(entry, tidy_version) if clean is not None else None
    if key and key in clean:
        return entry["file"], 0, [], None, key
    start = time.monotonic()
    status, lines = tidy(build, entry)
    took = time.monotonic() - start
    return entry["file"], status, lines, took, key if status == 0 and not lines else None


def read_clean():
    try:
        with open(CLEAN_FILE, encoding="utf-8") as f:
            return {l.strip() for l in f if l.strip() and not l.startswith("#")}
    except FileNotFoundError:
        return set()


def write_clean(keys):
    text = ("# Keys of the units scripts/lint.py found clean (see its header); written by make lint.\n"
            + "".join(k + "\n" for k in sorted(keys)))
    try:
        with open(CLEAN_FILE, encoding="utf-8") as f:
            if f.read() == text:
                return
    except FileNotFoundError:
        pass
    with open(CLEAN_FILE, "w", encoding="utf-8") as f:
        f.write(text)


def diagnostics(lines):
    """Splits clang-tidy's output into diagnostics: (first line, the whole text)."""
    out = []
    for line in lines:
        if DIAG_RE.match(line) or not out:
            out.append([line])
        else:
            out[-1].append(line)
    return [(d[0], "\n".join(d)) for d in out]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("build")
    p.add_argument("-j", type=int, default=os.cpu_count() or 1)
    p.add_argument("--no-cache", action="store_true")
    p.add_argument("files", nargs="*", help="regexes: only the files whose path they match")
    a = p.parse_intermixed_args()
    db_path = os.path.join(a.build, "compile_commands.json")
    try:
        with open(db_path, encoding="utf-8") as f:
            db = json.load(f)
    except OSError as e:
        print(f"lint: {db_path}: {e.strerror} (configure first: make configure)", file=sys.stderr)
        return 2
    version = run([CLANG_TIDY, "--version"])
    if version.returncode != 0:
        print("lint: clang-tidy does not run (scripts/install-deps.sh installs it)",
              file=sys.stderr)
        return 2
    if b"version 14." not in version.stdout:
        print("lint: warning: .clang-tidy is written for clang-tidy 14 (Debian 12); this one "
              "may find other things: " + version.stdout.decode(errors="replace").strip(),
              file=sys.stderr)
    clean = None if a.no_cache else read_clean()
    units, seen = [], set()
    for e in db:
        path = os.path.normpath(os.path.join(e["directory"], e["file"]))
        rel = os.path.relpath(path, ROOT)
        if (SOURCE_RE.match(path) and path not in seen and
                (not a.files or any(re.search(f, rel) for f in a.files))):
            seen.add(path)
            units.append(dict(e, file=path))
    start = time.monotonic()
    printed, failed, times, clean_now = set(), [], {}, set()
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, a.j)) as pool:
        jobs = [pool.submit(check, a.build, e, clean, version.stdout) for e in units]
        for job in concurrent.futures.as_completed(jobs):
            path, status, lines, took, key = job.result()
            if key:
                clean_now.add(key)
            if took is not None:
                times[os.path.relpath(path, ROOT)] = took
            new = [text for first, text in diagnostics(lines) if first not in printed]
            printed.update(first for first, _ in diagnostics(lines))
            if new:
                print("\n".join(new), flush=True)
            if status != 0 or lines:
                failed.append(os.path.relpath(path, ROOT))
    if clean is not None:
        write_clean(clean_now if not a.files else clean | clean_now)
    findings = sum(1 for d in printed if DIAG_RE.match(d))
    took = time.monotonic() - start
    slowest = sorted(times.items(), key=lambda kv: -kv[1])[:3]
    print(f"lint: {len(units)} files, {len(units) - len(times)} unchanged since a clean check; "
          f"{findings} findings; {took:.0f} s"
          + ("; slowest: " + ", ".join(f"{p} {t:.0f} s" for p, t in slowest) if slowest else ""),
          file=sys.stderr)
    if failed:
        print("lint: not clean: " + " ".join(sorted(failed)), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
