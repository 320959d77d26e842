#!/usr/bin/env python3
"""Man pages and shell completions of kwatch and kwatch-gui, from their own --help.

    cli_docs.py --kwatch BIN [--gui BIN] --release X.Y.Z --out DIR

The one source of truth is the programs' option definitions (CLI11 for kwatch and its
subcommands, QCommandLineParser for kwatch-gui): this script runs each command's --help,
parses it, and writes
    DIR/man/man1/kwatch.1, kwatch-probe.1, kwatch-report.1, kwatch-slots.1,
    kwatch-gdbserver.1, kwatch-gui.1
    DIR/completions/kwatch.bash   (bash: the functions for kwatch and kwatch-gui)
    DIR/completions/_kwatch       (zsh: #compdef kwatch kwatch-gui)
Every option, its value, choices, default and exclusions, and every line of each help text
go into the man page, so that `--help` and the page cannot disagree (tests/packaging checks
it). The build runs this after linking the programs (packaging/CMakeLists.txt).
"""

import argparse
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field

# Subcommands of kwatch, in the order the pages list them: (argv after kwatch, page name).
SUBCOMMANDS = [([], "kwatch"), (["probe"], "kwatch-probe"), (["report"], "kwatch-report"),
               (["slots"], "kwatch-slots"), (["gdbserver"], "kwatch-gdbserver")]

# How the shells complete an option's value. The options themselves, their values' types and
# choices come from --help; only what a value names (a file, a directory, a pid, a user) is
# said here, by option name. Any other value takes no completion.
VALUE_KINDS = {
    "--output": "file", "--exec": "file", "--system-map": "file", "--vmlinux": "file",
    "--kcore": "file", "--png": "file", "--export-png": "file", "--export-svg": "file",
    "--root": "dir", "--pid": "pid", "--user": "user",
}


@dataclass
class Option:
    names: list            # ["-w", "--write"]
    value: str = ""        # "TEXT", "UINT", "[GLOB]", "out.png"; "" for a flag
    choices: list = field(default_factory=list)
    default: str = ""
    excludes: str = ""
    many: bool = False     # "...": repeatable
    desc: str = ""

    @property
    def long(self):
        longs = [n for n in self.names if n.startswith("--")]
        return longs[0] if longs else self.names[0]


@dataclass
class Positional:
    name: str
    value: str
    required: bool
    many: bool
    desc: str


@dataclass
class Command:
    page: str              # "kwatch-probe"
    prog: str              # "kwatch probe"
    description: list      # lines of the help's description
    usage: str
    positionals: list
    options: list
    footer: list


def run_help(argv, env=None):
    out = subprocess.run(argv + ["--help"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                         env=env, check=True, text=True)
    return out.stdout


def entries(lines, desc_col, wraps):
    """(spec, description) pairs of an option list whose descriptions start at desc_col. A
    spec too long for its column has its description on the next line (CLI11, which never
    wraps a description); Qt (wraps=True) makes the column fit every spec and wraps long
    descriptions onto the lines below."""
    out = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        if line[:desc_col].strip():  # a new entry
            below = lines[i + 1] if i + 1 < len(lines) else ""
            if not wraps and below.startswith(" " * desc_col) and below.strip():
                out.append([line.strip(), ""])
            else:
                out.append([line[:desc_col].strip(), line[desc_col:].strip()])
        else:
            out[-1][1] = (out[-1][1] + " " + line.strip()).strip()
    return out


def parse_cli11(text, page, prog):
    lines = text.rstrip("\n").split("\n")
    usage_at = next(i for i, l in enumerate(lines) if l.startswith("Usage: "))
    description = lines[:usage_at]
    usage = lines[usage_at][len("Usage: "):]
    sections = {}
    current = None
    footer = []
    for line in lines[usage_at + 1:]:
        if line in ("Positionals:", "Options:"):
            current = sections.setdefault(line[:-1], [])
        elif current is not None and (line.startswith("  ") or not line):
            current.append(line)
        else:
            current = None
            footer.append(line)
    while footer and not footer[0]:
        footer.pop(0)
    positionals = []
    for spec, desc in entries(sections.get("Positionals", []), 30, False):
        m = re.match(r"^(\S+) (\S+)( \.\.\.)?( REQUIRED)?$", spec)
        if not m:
            sys.exit(f"cli_docs: cannot read the positional '{spec}' of {prog} --help")
        positionals.append(Positional(m[1], m[2], bool(m[4]), bool(m[3]), desc))
    options = []
    for spec, desc in entries(sections.get("Options", []), 30, False):
        names, _, rest = spec.partition(" ")
        opt = Option(names=names.split(","), desc=desc)
        m = re.search(r"\s*Excludes: (.*)$", rest)
        if m:
            opt.excludes = m[1]
            rest = rest[:m.start()]
        if rest.endswith(" ..."):
            opt.many = True
            rest = rest[:-4]
        value, _, default = rest.partition("=")
        opt.value, opt.default = value, default
        m = re.search(r":\{(.*)\}$", value)
        if m:
            opt.choices = m[1].split(",")
        options.append(opt)
    return Command(page, prog, description, usage, positionals, options, footer)


def parse_qt(text, page, prog):
    lines = text.rstrip("\n").split("\n")
    usage = re.sub(r"^Usage: \S+", prog, lines[0])
    at = lines.index("Options:")
    description = [l for l in lines[1:at] if l.strip()]
    args_at = lines.index("Arguments:") if "Arguments:" in lines else len(lines)
    opt_lines = lines[at + 1:args_at]
    col = max(len(re.match(r"^(  \S.*?  +)\S", l)[1]) for l in opt_lines
              if re.match(r"^(  \S.*?  +)\S", l))
    options = []
    for spec, desc in entries(opt_lines, col, True):
        names = [n.strip() for n in spec.split("<")[0].split(",")]
        m = re.search(r"<(.*)>", spec)
        options.append(Option(names=[n for n in names if n], value=m[1] if m else "", desc=desc))
    positionals = []
    for spec, desc in entries(lines[args_at + 1:], col, True):
        positionals.append(Positional(spec, "", True, False, desc))
    return Command(page, prog, description, usage, positionals, options, [])


# --- man pages -------------------------------------------------------------------------

def roff(text):
    """Plain text as roff: backslashes, leading dots and quotes, and minus signs (a '-' that
    starts an option or a word: \\-) escaped."""
    text = text.replace("\\", "\\e")
    text = re.sub(r"(?<![A-Za-z0-9])-", r"\\-", text)
    if text.startswith((".", "'")):
        text = "\\&" + text
    return text


def summary(cmd):
    """The NAME line: the description's first clause, without the "prog: " prefix."""
    text = " ".join(l.strip() for l in cmd.description if l.strip())
    text = re.sub(r"^\S+( \S+)?: ", "", text, count=1) if text.startswith(cmd.prog) else text
    m = re.search(r"(?<![.])[.:](?=\s|$)", text)
    return text[:m.start()] if m else text


def paragraphs(lines):
    """Help text as roff: indented lines (examples) verbatim, the rest filled; blank lines
    separate paragraphs."""
    out = []
    verbatim = False
    for line in lines:
        if not line.strip():
            if verbatim:
                out += [".fi", ".RE"]
                verbatim = False
            out.append(".PP")
        elif line.startswith(" "):
            if not verbatim:
                out += [".RS 4", ".nf"]
                verbatim = True
            out.append(roff(line.strip()) if len(line) - len(line.lstrip()) == 2
                       else roff(line[2:]))
        else:
            if verbatim:
                out += [".fi", ".RE"]
                verbatim = False
            out.append(roff(line))
    if verbatim:
        out += [".fi", ".RE"]
    while out and out[-1] == ".PP":
        out.pop()
    return out


def option_roff(opt):
    head = ", ".join(f"\\fB{roff(n)}\\fR" for n in opt.names)
    if opt.value:
        head += f" \\fI{roff(opt.value)}\\fR"
    if opt.many:
        head += " ..."
    body = roff(opt.desc)
    if opt.default:
        body += f"\n.br\nDefault: {roff(opt.default)}."
    if opt.excludes:
        body += f"\n.br\nExcludes: {roff(opt.excludes)}."
    return [".TP", head, body]


def man_page(cmd, release, pages):
    title = cmd.page.upper()
    out = [f'.\\" Generated by scripts/cli_docs.py from `{cmd.prog} --help`: do not edit.',
           f'.TH {title} 1 "" "kwatch {release}" "User Commands"',
           ".nh", ".ad l",
           ".SH NAME", f"{cmd.page} \\- {roff(summary(cmd))}",
           ".SH SYNOPSIS", f"\\fB{roff(cmd.prog)}\\fR {roff(cmd.usage[len(cmd.prog):].strip())}"]
    if cmd.prog in ("kwatch", "kwatch probe"):
        out.append(".br")
        out.append(f"\\fB{roff(cmd.prog)}\\fR [\\fIOPTIONS\\fR] [\\fIspec\\fR...] \\-\\- "
                   "\\fICOMMAND\\fR [\\fIARGS\\fR...]" if cmd.prog == "kwatch probe" else
                   f"\\fB{roff(cmd.prog)}\\fR [\\fIOPTIONS\\fR] \\fIexpr\\fR... \\-\\- "
                   "\\fICOMMAND\\fR [\\fIARGS\\fR...]")
    out += [".SH DESCRIPTION"] + paragraphs(cmd.description)
    if cmd.positionals:
        out.append(".SH ARGUMENTS")
        for p in cmd.positionals:
            head = f"\\fI{roff(p.name)}\\fR" + (f" {roff(p.value)}" if p.value else "")
            head += " ..." if p.many else ""
            head += " (required)" if p.required and p.value else ""
            out += [".TP", head, roff(p.desc)]
    out.append(".SH OPTIONS")
    for opt in cmd.options:
        out += option_roff(opt)
    if cmd.footer:
        out += [".SH NOTES"] + paragraphs(cmd.footer)
    out += [".SH SEE ALSO",
            ", ".join(f"\\fB{p}\\fR(1)" for p in pages if p != cmd.page)]
    return "\n".join(out) + "\n"


# --- completions -----------------------------------------------------------------------

def value_kind(opt):
    if opt.choices:
        return "choices"
    return VALUE_KINDS.get(opt.long, "none") if opt.value else ""


def bash_value_cases(cmds_by_sub):
    """case arms "SUB:OPTION)" completing an option's value."""
    arms = []
    for sub, cmd in cmds_by_sub.items():
        for opt in cmd.options:
            kind = value_kind(opt)
            if not kind or opt.value.startswith("["):  # a flag, or an optional value
                continue
            pattern = "|".join(f"{sub}:{n}" for n in opt.names)
            action = {
                "choices": f'_kwatch_reply -W "{" ".join(opt.choices)}"',
                "file": "_kwatch_reply -f; compopt -o filenames 2>/dev/null",
                "dir": "_kwatch_reply -d; compopt -o filenames 2>/dev/null",
                "pid": '_kwatch_reply -W "$(cd /proc && echo [0-9]*)"',
                "user": "_kwatch_reply -u",
                "none": "COMPREPLY=()",
            }[kind]
            arms.append(f"    {pattern}) {action}; return ;;")
    return arms


def bash_script(cmds, gui):
    by_sub = {(c.prog.split(" ")[1] if " " in c.prog else ""): c for c in cmds}
    subs = " ".join(s for s in by_sub if s)
    lines = [
        "# bash completion of kwatch and kwatch-gui: generated by scripts/cli_docs.py from",
        "# their --help; do not edit. Installed as share/bash-completion/completions/kwatch",
        "# (and kwatch-gui); source it to try: `. kwatch.bash`.",
        "",
        "_kwatch_reply() {  # COMPREPLY from compgen ARGS... -- \"$cur\"",
        "  mapfile -t COMPREPLY < <(compgen \"$@\" -- \"$cur\")",
        "}",
        "",
        "# Sets cur and prev, with `--opt=value` split as bash splits it (at =).",
        "_kwatch_words() {",
        "  cur=${COMP_WORDS[COMP_CWORD]}",
        "  prev=${COMP_WORDS[COMP_CWORD - 1]}",
        "  if [[ $cur == = ]]; then",
        "    cur=\"\"",
        "  elif [[ $prev == = ]]; then",
        "    prev=${COMP_WORDS[COMP_CWORD - 2]}",
        "  fi",
        "}",
        "",
        "_kwatch() {",
        "  local cur prev sub=\"\" i",
        "  _kwatch_words",
        "  for ((i = 1; i < COMP_CWORD; i++)); do",
        "    if [[ ${COMP_WORDS[i]} == -- ]]; then  # the command kwatch launches",
        "      if ((i == COMP_CWORD - 1)); then _kwatch_reply -c; else _kwatch_reply -f; fi",
        "      compopt -o filenames 2>/dev/null",
        "      return",
        "    fi",
        "  done",
        "  if ((COMP_CWORD > 1)); then",
        "    case ${COMP_WORDS[1]} in",
        f"      {'|'.join(s for s in by_sub if s)}) sub=${{COMP_WORDS[1]}} ;;",
        "    esac",
        "  fi",
        "  case $sub:$prev in",
    ]
    lines += bash_value_cases(by_sub)
    lines += ["  esac", "  if [[ $cur == -* ]]; then", "    case $sub in"]
    for sub, cmd in by_sub.items():
        opts = " ".join(n for o in cmd.options for n in o.names)
        label = sub or '""'
        lines.append(f'      {label}) _kwatch_reply -W "{opts}" ;;')
    lines += ["    esac", "    return", "  fi", "  case $sub in"]
    lines.append(f'    "") ((COMP_CWORD == 1)) && _kwatch_reply -W "{subs}" ;;')
    for sub, cmd in by_sub.items():
        if sub and cmd.positionals and cmd.positionals[0].name == "file":
            lines.append(f"    {sub}) _kwatch_reply -f -X '!*.kwdb' -o plusdirs; "
                         "compopt -o filenames 2>/dev/null ;;")
    lines += ["  esac", "}", "complete -F _kwatch kwatch", ""]
    if gui is not None:
        lines += ["_kwatch_gui() {", "  local cur prev", "  _kwatch_words", "  case :$prev in"]
        lines += bash_value_cases({"": gui})
        opts = " ".join(n for o in gui.options for n in o.names)
        lines += ["  esac", "  if [[ $cur == -* ]]; then", f'    _kwatch_reply -W "{opts}"',
                  "  else", "    _kwatch_reply -f -X '!*.kwdb' -o plusdirs",
                  "    compopt -o filenames 2>/dev/null", "  fi", "}",
                  "complete -F _kwatch_gui kwatch-gui", ""]
    return "\n".join(lines)


def zsh_desc(text):
    text = re.split(r"(?<=[a-z)])[.;:](?=\s)", text)[0]
    if len(text) > 70:
        text = text[:67].rsplit(" ", 1)[0] + "..."
    return text.replace("\\", "\\\\").replace("[", "\\[").replace("]", "\\]").replace("'", "'\\''")


def zsh_specs(cmd):
    specs = []
    for opt in cmd.options:
        group = "(" + " ".join(opt.names) + ")" if not opt.many else "*"
        kind = value_kind(opt)
        action = {
            "choices": f":{opt.long[2:]}:({' '.join(opt.choices)})",
            "file": ":file:_files", "dir": ":directory:_files -/", "pid": ":pid:_pids",
            "user": ":user:_users", "none": f":{opt.value.lower()}: ",
            "": "",
        }[kind]
        if opt.value.startswith("["):
            action = "::" + action[1:]
        for n in opt.names:
            suffix = ("=" if n.startswith("--") else "+") if kind and not opt.value.startswith(
                "[") else ""
            specs.append(f"'{group}{n}{suffix}[{zsh_desc(opt.desc)}]{action}'")
    for i, p in enumerate(cmd.positionals):
        action = "_files -g '\\''*.kwdb'\\''" if p.name == "file" else " "
        star = "*" if p.many else ""
        specs.append(f"'{star}:{p.name}:{action}'")
    return specs


def zsh_script(cmds, gui):
    by_sub = {(c.prog.split(" ")[1] if " " in c.prog else ""): c for c in cmds}
    lines = [
        "#compdef kwatch kwatch-gui",
        "# zsh completion of kwatch and kwatch-gui: generated by scripts/cli_docs.py from their",
        "# --help; do not edit. Installed as share/zsh/site-functions/_kwatch.",
        "",
        "local -i dashdash=${words[(i)--]}",
        "if (( dashdash < CURRENT )); then  # the command kwatch launches",
        "  shift dashdash words",
        "  (( CURRENT -= dashdash ))",
        "  _normal",
        "  return",
        "fi",
        "if [[ $service == kwatch-gui ]]; then",
    ]
    if gui is not None:
        lines.append("  _arguments -s -S \\\n    " + " \\\n    ".join(zsh_specs(gui)))
    else:
        lines.append("  _files")
    lines += ["  return", "fi",
              f"if (( CURRENT > 2 )) && [[ $words[2] == ({'|'.join(s for s in by_sub if s)}) ]];"
              " then",
              "  local sub=$words[2]",
              "  shift words",
              "  (( CURRENT-- ))",
              "  case $sub in"]
    for sub, cmd in by_sub.items():
        if sub:
            lines.append(f"    {sub}) _arguments -s -S \\\n      " +
                         " \\\n      ".join(zsh_specs(cmd)) + " ;;")
    lines += ["  esac", "  return", "fi",
              "if (( CURRENT == 2 )) && [[ $PREFIX != -* ]]; then",
              "  local -a subcommands=("]
    for sub, cmd in by_sub.items():
        if sub:
            lines.append(f"    '{sub}:{zsh_desc(summary(cmd))}'")
    lines += ["  )", "  _describe -t commands 'kwatch subcommand' subcommands", "fi",
              "_arguments -s -S \\\n  " + " \\\n  ".join(zsh_specs(by_sub[""])), ""]
    return "\n".join(lines)


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    old = None
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            old = f.read()
    if old != text:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kwatch", required=True)
    ap.add_argument("--gui")
    ap.add_argument("--release", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    env = dict(os.environ, LC_ALL="C.UTF-8", COLUMNS="80")
    cmds = [parse_cli11(run_help([args.kwatch] + sub, env), page,
                        " ".join(["kwatch"] + sub)) for sub, page in SUBCOMMANDS]
    gui = None
    if args.gui:
        genv = dict(env, QT_QPA_PLATFORM="offscreen")
        gui = parse_qt(run_help([args.gui], genv), "kwatch-gui", "kwatch-gui")
    pages = [c.page for c in cmds] + (["kwatch-gui"] if gui else [])
    for cmd in cmds + ([gui] if gui else []):
        write(os.path.join(args.out, "man", "man1", cmd.page + ".1"),
              man_page(cmd, args.release, pages))
    write(os.path.join(args.out, "completions", "kwatch.bash"), bash_script(cmds, gui))
    write(os.path.join(args.out, "completions", "_kwatch"), zsh_script(cmds, gui))


if __name__ == "__main__":
    main()
