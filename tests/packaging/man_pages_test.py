#!/usr/bin/env python3
"""The man pages say what --help says, and render without a warning.

    man_pages_test.py KWATCH_BIN MAN_DIR [KWATCH_GUI_BIN]

For kwatch, kwatch probe, kwatch report, kwatch slots (and kwatch-gui): every option name in
the command's --help is an option of its page's OPTIONS section, every option's description
and the help's description are in the page (whitespace aside), and `man --warnings -l` and
`groff -man -ww -z` print nothing on stderr. Read independently of scripts/cli_docs.py's
parser: what is checked is the rendered page against the program's own output.
"""

import os
import re
import subprocess
import sys

kwatch, man_dir = sys.argv[1], sys.argv[2]
gui = sys.argv[3] if len(sys.argv) > 3 else None
env = dict(os.environ, LC_ALL="C", MANWIDTH="80", QT_QPA_PLATFORM="offscreen")
commands = [([kwatch], "kwatch"), ([kwatch, "probe"], "kwatch-probe"),
            ([kwatch, "report"], "kwatch-report"), ([kwatch, "slots"], "kwatch-slots"),
            ([kwatch, "gdbserver"], "kwatch-gdbserver")]
if gui:
    commands.append(([gui], "kwatch-gui"))

OPTION = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)")
failures = []


def norm(text):
    return " ".join(text.split())


for argv, page in commands:
    path = os.path.join(man_dir, "man1", page + ".1")
    help_text = subprocess.run(argv + ["--help"], stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, env=env, check=True,
                               text=True).stdout
    shown = subprocess.run(["man", "--warnings", "-l", path], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, env=env, text=True)
    if shown.returncode != 0 or shown.stderr:
        failures.append(f"{page}: man -l: exit {shown.returncode}: {shown.stderr.strip()}")
    groff = subprocess.run(["groff", "-man", "-ww", "-z", path], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, env=env, text=True)
    if groff.returncode != 0 or groff.stderr:
        failures.append(f"{page}: groff -ww: {groff.stderr.strip()}")
    text = shown.stdout
    m = re.search(r"^OPTIONS\n(.*?)^\S", text, re.S | re.M)
    if not m:
        failures.append(f"{page}: no OPTIONS section")
        continue
    # The options of the page: the tags of OPTIONS (lines indented 7, not 14).
    tags = set()
    for line in m[1].split("\n"):
        if re.match(r"^ {7}-", line):
            tags.update(OPTION.findall(line))
    # The options of --help: the first column of its option lists.
    in_options = False
    wanted = set()
    descriptions = []
    for line in help_text.split("\n"):
        if line.strip() in ("Options:", "Arguments:", "Positionals:"):
            in_options = line.strip() == "Options:"
            continue
        if in_options and re.match(r"^  -", line):
            spec, desc = (re.split(r"\s{2,}", line.strip(), maxsplit=1) + [""])[:2]
            # The names: before the value's type, default and exclusions.
            wanted.update(OPTION.findall(re.split(r" Excludes:|=| <", spec)[0]))
            if desc:
                descriptions.append(desc)
        elif in_options and line.startswith(" " * 20) and line.strip():
            descriptions.append(line.strip())
    if len(wanted) < 3:
        failures.append(f"{page}: read only {sorted(wanted)} from --help")
    missing = sorted(wanted - tags)
    if missing:
        failures.append(f"{page}: options of --help not in the man page: {missing}")
    extra = sorted(tags - wanted)
    if extra:
        failures.append(f"{page}: options in the man page that --help lacks: {extra}")
    flat = norm(text)
    for d in descriptions:
        if norm(d) not in flat:
            failures.append(f"{page}: description not in the man page: {d!r}")
    print(f"{page}: {len(wanted)} options, {len(descriptions)} description lines checked")

if failures:
    print("\n".join("FAIL: " + f for f in failures))
    sys.exit(1)
print("man_pages_test: ok")
