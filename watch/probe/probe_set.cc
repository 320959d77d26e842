#include "watch/probe/probe_set.h"

#include <dwarf.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdlib>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "core/base/status_macros.h"
#include "core/base/syscall_status.h"
#include "core/base/target_files.h"
#include "core/probe/probe_spec.h"
#include "watch/condition.h"
#include "watch/probe/hit_filter.h"

namespace kwatch::watch::probe {

namespace {

std::string Basename(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// A word of a spec and where it starts.
struct Word {
  absl::string_view text;
  size_t pos = 0;
};

std::vector<Word> Words(absl::string_view spec) {
  std::vector<Word> out;
  for (absl::string_view w : absl::StrSplit(spec, absl::ByAnyChar(" \t\n"), absl::SkipEmpty())) {
    out.push_back(Word{w, static_cast<size_t>(w.data() - spec.data())});
  }
  return out;
}

absl::Status AtWord(const absl::Status& s, const std::string& spec, const Word& w) {
  return {s.code(), absl::StrCat(s.message(), "\n  ", PointAt(spec, w.pos, w.text.size()))};
}

// DWARF register numbers 17..32 are %xmm0..%xmm15 on x86-64.
bool IsXmm(uint64_t regno) {
  return regno >= 17 && regno <= 32;
}

bool UsesXmm(const core::probe::CompiledArg& arg) {
  return std::any_of(arg.location.begin(), arg.location.end(), [](const core::probe::DwarfOp& op) {
    return (op.atom >= DW_OP_reg0 && op.atom <= DW_OP_reg31 && IsXmm(op.atom - DW_OP_reg0)) ||
           (op.atom >= DW_OP_breg0 && op.atom <= DW_OP_breg31 && IsXmm(op.atom - DW_OP_breg0)) ||
           ((op.atom == DW_OP_regx || op.atom == DW_OP_bregx) && IsXmm(op.number));
  });
}

// The names of `def`'s condition that are not its arguments nor built in become hidden
// arguments (a DWARF variable at the point, $retval, comm as $comm).
// $duration as a word of a spec.
constexpr absl::string_view kDurationWord = "$duration";

// Whether `def` has an argument named (or written) `name`.
bool HasArg(const ProbeDef& def, const std::string& name) {
  return std::any_of(def.args.begin(), def.args.end(), [&](const core::probe::CompiledArg& a) {
    return a.name == name || a.text == name;
  });
}

// `name` compiled as an argument of `def` (comm as $comm), named `name`.
absl::StatusOr<core::probe::CompiledArg> CompileHidden(const core::probe::ProbeTarget& target,
                                                       const ProbeDef& def,
                                                       const std::string& name) {
  const std::string text = name == "comm" ? std::string("$comm") : name;
  KW_ASSIGN_OR_RETURN(core::probe::ProbeArgSpec arg, core::probe::ParseProbeArg(text));
  KW_ASSIGN_OR_RETURN(std::vector<core::probe::CompiledArg> compiled,
                      core::probe::CompileArgs(target, def.point, {arg}));
  if (compiled.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat("'", name, "' names several values"));
  }
  compiled.front().name = name;
  return std::move(compiled.front());
}

void AddHidden(ProbeDef& def, core::probe::CompiledArg arg) {
  def.args.push_back(std::move(arg));
  ++def.hidden_args;
}

// The names of `def`'s condition that are not its arguments nor built in become hidden
// arguments (a DWARF variable at the point, $retval, comm as $comm).
absl::Status AddConditionArgs(const core::probe::ProbeTarget& target, ProbeDef& def) {
  for (const std::string& name : watch::Condition::NamesIn(def.condition)) {
    if (HasArg(def, name) || IsHitBuiltin(name) || name == kDurationName) {
      continue;
    }
    absl::StatusOr<core::probe::CompiledArg> hidden = CompileHidden(target, def, name);
    if (!hidden.ok()) {
      const size_t at = def.spec.find(name, def.condition_offset);
      return absl::InvalidArgumentError(absl::StrCat(
          "'", name, "' in the condition is not an argument of the probe and cannot be fetched at ",
          def.Location(), ": ", hidden.status().message(), "\n  ",
          PointAt(def.spec, at == std::string::npos ? def.condition_offset : at, name.size())));
    }
    AddHidden(def, *std::move(hidden));
  }
  return absl::OkStatus();
}

// `names` (what --agg reads) that `def` can fetch become hidden arguments; the others are left
// for the aggregation to refuse, naming the probe.
void AddAlsoFetched(const core::probe::ProbeTarget& target, ProbeDef& def,
                    const std::vector<FetchFor>& names) {
  for (const auto& [event, name] : names) {
    if ((!event.empty() && event != def.point.event) || HasArg(def, name) || IsHitBuiltin(name) ||
        name == kDurationName) {
      continue;
    }
    if (absl::StatusOr<core::probe::CompiledArg> hidden = CompileHidden(target, def, name);
        hidden.ok()) {
      AddHidden(def, *std::move(hidden));
    }
  }
}

// For `ret`'s $duration: its stack pointer as a hidden argument, and the internal probe at
// the function's entry (id `id`) whose hits the filter pairs with its own.
absl::StatusOr<ProbeDef> PairForDuration(const core::probe::ProbeTarget& target, ProbeDef& ret,
                                         uint32_t id) {
  KW_ASSIGN_OR_RETURN(core::probe::CompiledArg sp, CompileHidden(target, ret, "$stack"));
  ret.sp_arg = ret.args.size();
  AddHidden(ret, sp);
  ProbeDef entry;
  entry.id = id;
  entry.spec = ret.spec;
  entry.point = ret.point;
  entry.point.is_return = false;
  entry.point.event = absl::StrCat(ret.point.event, "__entry");
  KW_ASSIGN_OR_RETURN(core::probe::CompiledArg entry_sp, CompileHidden(target, entry, "$stack"));
  entry.args.push_back(std::move(entry_sp));
  entry.hidden_args = 1;
  entry.pairs_with = ret.id;
  return entry;
}

// Compiles `def`'s condition once, so that its errors come with the spec, before any target.
absl::Status CheckCondition(const ProbeDef& def) {
  KW_ASSIGN_OR_RETURN(watch::ConditionOptions opts, ConditionOptionsFor(def));
  return watch::Condition::Parse(def.condition, opts).status();
}

}  // namespace

size_t UserProbes(const ProbeSet& set) {
  return static_cast<size_t>(std::count_if(set.probes.begin(), set.probes.end(),
                                           [](const ProbeDef& d) { return !d.internal(); }));
}

std::string ProbeDef::Location() const {
  if (point.is_return) {
    return point.function.empty() ? absl::StrCat(point.Where(), "%return")
                                  : absl::StrCat(point.function, "%return");
  }
  return point.Where();
}

std::string ProbeDef::SourceLine() const {
  if (point.file.empty()) {
    return "";
  }
  return absl::StrCat(Basename(point.file), ":", point.line);
}

std::string PointAt(const std::string& text, size_t pos, size_t len) {
  std::string caret(pos, ' ');
  caret += '^';
  if (len > 1) {
    caret += std::string(len - 1, '~');
  }
  return absl::StrCat(text, "\n  ", caret);
}

absl::StatusOr<std::string> FindProgram(const std::string& name) {
  if (absl::StrContains(name, '/')) {
    if (::access(name.c_str(), F_OK) != 0) {
      return absl::NotFoundError(absl::StrCat("no such file: '", name, "'"));
    }
    return name;
  }
  const char* path = std::getenv("PATH");  // NOLINT(concurrency-mt-unsafe): before threads
  for (absl::string_view dir : absl::StrSplit(path != nullptr ? path : "/usr/bin:/bin", ':')) {
    const std::string candidate = absl::StrCat(dir.empty() ? "." : dir, "/", name);
    if (::access(candidate.c_str(), X_OK) == 0) {
      return candidate;
    }
  }
  return absl::NotFoundError(absl::StrCat("'", name, "' is not in PATH"));
}

absl::StatusOr<std::string> ProbedFile(const std::string& binary, const std::string& root,
                                       std::optional<pid_t> pid,
                                       const std::vector<std::string>& command) {
  if (!binary.empty()) {
    std::string path = binary;
    if (!root.empty()) {
      path = absl::StrCat(absl::StripSuffix(root, "/"), binary[0] == '/' ? "" : "/", binary);
    } else if (pid.has_value() && binary[0] == '/' && !core::SharesFilesystem(*pid)) {
      // -p of a process in a container: -x names a file of its filesystem (the library it
      // loads from its /usr/lib is not the host's), when it has one there.
      const std::string inside = core::PathInTarget(*pid, binary);
      if (::access(inside.c_str(), R_OK) == 0) {
        path = inside;
      }
    }
    if (::access(path.c_str(), R_OK) != 0) {
      const int err = errno;
      return core::SyscallError(err, absl::StrCat("access(", path, ")"));
    }
    return path;
  }
  if (!command.empty()) {
    return FindProgram(command[0]);
  }
  if (pid.has_value()) {
    // A deleted or replaced program is still reachable through the link itself.
    absl::StatusOr<std::string> exe = core::OpenableExecutable(*pid);
    if (!exe.ok()) {
      return absl::Status(
          exe.status().code(),
          absl::StrCat(exe.status().message(), "; ",
                       absl::IsNotFound(exe.status())
                           ? absl::StrCat("no process ", *pid)
                           : std::string("tracing another user's process needs root or "
                                         "CAP_SYS_PTRACE (kernel.yama.ptrace_scope may restrict "
                                         "it further)")));
    }
    return exe;
  }
  return absl::InvalidArgumentError(
      "no program: give -x FILE, -p PID or a command after `--` (e.g. `-- ./prog args`)");
}

absl::StatusOr<ProbeSet> ResolveProbes(const std::string& path,
                                       const std::vector<std::string>& specs,
                                       const std::vector<FetchFor>& also_fetch) {
  ProbeSet set;
  set.path = path;
  KW_ASSIGN_OR_RETURN(set.target, core::probe::ProbeTarget::Open(path));
  uint32_t next_id = 1;
  for (const std::string& spec : specs) {
    const std::vector<Word> words = Words(spec);
    if (words.empty()) {
      return absl::InvalidArgumentError(
          "empty probe spec: give a point (FUNC, FUNC+OFF, FUNC%return, SRC:LINE, 0xADDR) and "
          "optional arguments, e.g. 'tick i r->len'");
    }
    // "POINT ARG... if COND": the condition is the rest of the spec after the word "if".
    size_t arg_words = words.size();
    std::string condition;
    size_t condition_offset = 0;
    for (size_t i = 1; i < words.size(); ++i) {
      if (words[i].text == "if") {
        arg_words = i;
        condition_offset = words[i].pos + 2;
        condition = std::string(absl::StripAsciiWhitespace(spec.substr(condition_offset)));
        condition_offset = spec.find(condition, condition_offset);
        if (condition.empty()) {
          return absl::InvalidArgumentError(
              absl::StrCat("'if' without a condition: write e.g. 'tick i if i > 1'\n  ",
                           PointAt(spec, words[i].pos, words[i].text.size())));
        }
        break;
      }
    }
    core::probe::ProbeSpec parsed;
    absl::StatusOr<core::probe::ProbePoint> point = core::probe::ParseProbePoint(words[0].text);
    if (!point.ok()) {
      return AtWord(point.status(), spec, words[0]);
    }
    parsed.point = *std::move(point);
    std::optional<size_t> duration_shown;
    for (size_t i = 1; i < arg_words; ++i) {
      if (words[i].text == kDurationWord) {
        if (!parsed.point.is_return) {
          return AtWord(absl::InvalidArgumentError(
                            "$duration is the time of a call: it is for FUNC%return probes"),
                        spec, words[i]);
        }
        duration_shown = parsed.args.size();
        continue;
      }
      absl::StatusOr<core::probe::ProbeArgSpec> arg = core::probe::ParseProbeArg(words[i].text);
      if (!arg.ok()) {
        return AtWord(arg.status(), spec, words[i]);
      }
      parsed.args.push_back(*std::move(arg));
    }
    absl::StatusOr<std::vector<core::probe::ResolvedPoint>> points =
        set.target->Resolve(parsed.point);
    if (!points.ok()) {
      return AtWord(points.status(), spec, words[0]);
    }
    for (const core::probe::ResolvedPoint& p : *points) {
      absl::StatusOr<std::vector<core::probe::CompiledArg>> args =
          core::probe::CompileArgs(*set.target, p, parsed.args);
      if (!args.ok()) {
        // Point at the first argument that fails on its own (else at the whole list).
        for (size_t i = 0; i < parsed.args.size(); ++i) {
          if (!core::probe::CompileArgs(*set.target, p, {parsed.args[i]}).ok()) {
            return AtWord(args.status(), spec, words[i + 1]);
          }
        }
        return absl::Status(args.status().code(),
                            absl::StrCat(args.status().message(), " (in '", spec, "')"));
      }
      ProbeDef def;
      def.id = next_id++;
      def.spec = spec;
      def.point = p;
      def.args = *std::move(args);
      def.duration_shown = duration_shown;
      if (!condition.empty()) {
        def.condition = condition;
        def.condition_offset = condition_offset;
        const std::vector<std::string> names = watch::Condition::NamesIn(condition);
        if (std::find(names.begin(), names.end(), kDurationName) != names.end()) {
          if (!p.is_return) {
            return absl::InvalidArgumentError(absl::StrCat(
                "$duration is the time of a call: it is for FUNC%return probes\n  ",
                PointAt(spec, spec.find(kDurationName, condition_offset), kDurationName.size())));
          }
          def.duration = true;
        }
      }
      def.duration |=
          duration_shown.has_value() ||
          (p.is_return && std::any_of(also_fetch.begin(), also_fetch.end(), [&](const FetchFor& f) {
             return f.name == kDurationName && (f.event.empty() || f.event == p.event);
           }));
      if (!condition.empty()) {
        KW_RETURN_IF_ERROR(AddConditionArgs(*set.target, def));
        KW_RETURN_IF_ERROR(CheckCondition(def));
      }
      AddAlsoFetched(*set.target, def, also_fetch);
      std::optional<ProbeDef> entry;
      if (def.duration) {
        KW_ASSIGN_OR_RETURN(entry, PairForDuration(*set.target, def, next_id++));
      }
      for (const core::probe::CompiledArg& a : def.args) {
        def.needs_fpregs |= UsesXmm(a);
      }
      set.probes.push_back(std::move(def));
      if (entry.has_value()) {
        set.probes.push_back(*std::move(entry));
      }
    }
  }
  // Two specs may name the same event (tick and tick@uprobe_loop.c): keep names unique, as
  // perf does, so that output and recordings tell them apart.
  absl::flat_hash_map<std::string, int> seen;
  for (ProbeDef& def : set.probes) {
    const int n = seen[def.point.event]++;
    if (n > 0) {
      absl::StrAppend(&def.point.event, "_", n);
    }
  }
  return set;
}

}  // namespace kwatch::watch::probe
