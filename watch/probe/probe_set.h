#pragma once

// The probes of one `kwatch probe` session: specs in perf-probe syntax resolved against one
// ELF file (the program, or a shared library given with -x) and their arguments compiled.
// Resolution needs only the file, so errors come before any target is started or touched.

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/probe/fetch.h"
#include "core/probe/probe_target.h"

namespace kwatch::watch::probe {

// One probe point with its compiled arguments. A spec that names several addresses (an
// inlined function, a line with several code ranges) gives one ProbeDef per address.
struct ProbeDef {
  uint32_t id = 0;   // 1, 2, ...: the probe's id in recordings
  std::string spec;  // the spec as written ("tick i r->len")
  core::probe::ResolvedPoint point;
  std::vector<core::probe::CompiledArg> args;
  bool needs_fpregs = false;  // an argument lives in an %xmm register
  // The spec's `if COND` ("" when none) and where COND starts in `spec`.
  std::string condition;
  size_t condition_offset = 0;
  // The last `hidden_args` of `args` are fetched for the condition only ("tick if n > 2"
  // fetches n): the filter (watch/probe/hit_filter.h) takes them off before a hit is shown,
  // counted or recorded.
  size_t hidden_args = 0;
  // A FUNC%return probe with $duration (among its arguments, in its condition or an --agg):
  // the time since the entry of the same call, paired by the filter (watch/probe/hit_filter.h)
  // with the hits of an internal probe at the function's entry, by thread and stack pointer
  // (the return's is the entry's + 8: recursion and longjmp are told apart). `sp_arg`: the
  // index in `args` of the stack pointer (a hidden $stack); `duration_shown`: where $duration
  // shows among the shown arguments (nullopt: not shown).
  bool duration = false;
  size_t sp_arg = 0;
  std::optional<size_t> duration_shown;
  // An internal probe (the entry of a return probe with $duration): the id of the return probe
  // it serves; 0 for the user's probes. Its hits are never shown, counted or recorded.
  uint32_t pairs_with = 0;
  bool internal() const { return pairs_with != 0; }

  // "tick+0x0", "tick%return", "0x1149" (raw addresses outside any function).
  std::string Location() const;
  // "uprobe_loop.c:16", "" without line information.
  std::string SourceLine() const;
};

// A name an --agg reads, and the event it is for ("" for every probe).
struct FetchFor {
  std::string event;
  std::string name;
  bool operator==(const FetchFor&) const = default;
};

struct ProbeSet {
  std::string path;  // the ELF file the specs refer to
  std::unique_ptr<core::probe::ProbeTarget> target;
  std::vector<ProbeDef> probes;
};

// The probes of `set` the user asked for (not the internal entries $duration adds).
size_t UserProbes(const ProbeSet& set);

// Opens `path` and resolves every spec. A spec may end with `if COND` (a condition over its
// arguments by name, tid, pid, cpu and comm, watch/condition.h; names it does not list as
// arguments are fetched as hidden ones: DWARF variables, $retval). Errors are for people: a bad
// argument or point is shown under the spec with a caret at the offending word; unknown functions
// list near matches (core/probe/probe_target.h). The names of `also_fetch` (what --agg reads)
// are fetched as hidden arguments by the probes of their event (every probe for "") where they
// compile.
absl::StatusOr<ProbeSet> ResolveProbes(const std::string& path,
                                       const std::vector<std::string>& specs,
                                       const std::vector<FetchFor>& also_fetch = {});

// The file a command would execute: `name` itself when it contains a '/', else the first
// executable `name` in $PATH. NotFound otherwise.
absl::StatusOr<std::string> FindProgram(const std::string& name);

// The ELF file probe specs refer to: `binary` (-x; under `root` when given, else through the
// filesystem of process `pid` when that one has it: a container's), else the program of
// `command`, else the program of `pid` (/proc/PID/exe). InvalidArgument without any.
absl::StatusOr<std::string> ProbedFile(const std::string& binary, const std::string& root,
                                       std::optional<pid_t> pid,
                                       const std::vector<std::string>& command);

// `text` with a second line holding a caret under [pos, pos + len): "  tick i:u7\n         ^~~~".
std::string PointAt(const std::string& text, size_t pos, size_t len);

}  // namespace kwatch::watch::probe
