#pragma once

// What a `kwatch probe` that joins another kwatch's session (docs/gdbserver.md, "Joining") and
// that session say to each other over the control socket (cli/join_socket.h), beyond the
// watches' lines and frames. The joiner asks with request lines ("probe-file PATH", "spec
// SPEC", "fetch EVENT<TAB>NAME", "maxactive N", "stack N", then "go"); the session resolves the
// same specs against the same file (watch::probe::ResolveProbes: the same probe set, ids and
// addresses), places them in its INT3 engine and answers with frames:
//   'A'  armed: the load bias and each probe's id and address, for the joiner to check;
//   'H'  hits, one or more, each encoded by EncodeHit (binary, little-endian);
//   'S'  the end: each probe's engine counters, the stop reason and the target's exit;
// then 'X' as for watches. 'E' carries lines for the joiner's stderr.

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/ptrace/process_event.h"
#include "watch/probe/hit_sink.h"
#include "watch/probe/probe_set.h"

namespace kwatch::cli {

// What the session placed: 'A'.
struct ProbeJoinArmed {
  uint64_t load_bias = 0;
  std::map<uint32_t, uint64_t> addrs;  // ProbeDef::id -> absolute address
  std::string text() const;
};
absl::StatusOr<ProbeJoinArmed> ParseProbeJoinArmed(absl::string_view text);
// Armed's record of `set` at `load_bias`.
ProbeJoinArmed ArmedOf(const watch::probe::ProbeSet& set, uint64_t load_bias);

// Appends one hit to `out` (several make one 'H' frame).
void EncodeHit(const watch::probe::ProbeHit& hit, std::string& out);
// The hits of one 'H' frame, their probes found in `set` by id. InvalidArgument when the
// payload is not what EncodeHit wrote for this set.
absl::StatusOr<std::vector<watch::probe::ProbeHit>> DecodeHits(absl::string_view payload,
                                                               const watch::probe::ProbeSet& set);

// The end: 'S'.
struct ProbeJoinEnd {
  std::map<uint32_t, watch::probe::ProbeEndStats> stats;  // engine counters by ProbeDef::id
  std::string stop_reason;  // "" when the joiner asked for the end (its own reason stands)
  std::optional<core::ptrace::ExitInfo> exit;
  uint64_t spurious_traps = 0;
  std::string text() const;
};
absl::StatusOr<ProbeJoinEnd> ParseProbeJoinEnd(absl::string_view text);

}  // namespace kwatch::cli
