#pragma once

// Probes of a probe set in the ptrace INT3 engine (core/probe/int3_engine.h), and their hits as
// `kwatch probe` shows them: the ptrace backend's session and a session that hosts the probes of
// a kwatch that joined it (cli/join_server.h) register and fetch the same way. Runs on the
// engine's (tracer) thread, like the engine.

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>

#include "absl/status/statusor.h"
#include "core/probe/fetch.h"
#include "core/probe/int3_engine.h"
#include "core/probe/int3_probe.h"
#include "core/store/args_json.h"
#include "watch/probe/hit_sink.h"
#include "watch/probe/probe_set.h"

namespace kwatch::watch::probe {

// The arguments of `def`, fetched through `fc` (its registers, memory reader and thread) as
// perf probe formats them; a value that cannot be read shows as "<error: ...>". Reads the
// thread's floating-point registers when an argument lives in one (fc.tid stopped).
core::store::ProbeArgs FetchProbeArgs(const ProbeDef& def, core::probe::FetchContext fc);

// The hit of `def` the engine reports in `ctx` (a pre handler's: entry, or return probe at its
// return), its arguments fetched from the stopped thread; the image is loaded at `load_bias`.
// No stack (the caller unwinds when asked).
ProbeHit EngineHit(const ProbeDef& def, const core::probe::ProbeContext& ctx, uint64_t load_bias);

using EngineHitHandler = std::function<void(const ProbeDef&, const core::probe::ProbeContext&)>;

// Registers every probe of `set` (internal ones included) in `engine` at its address in an image
// loaded at `load_bias`; return probes track up to `maxactive` calls (0: the engine's default).
// `on_hit` runs at each hit. The caller stops the world around it (Int3Engine::StopWorld) so
// that the probes see the same calls. Returns ProbeDef::id -> engine id; on error (naming the
// probe), the probes it registered are unregistered again.
absl::StatusOr<std::map<uint32_t, core::probe::ProbeId>> RegisterProbes(
    core::probe::Int3Engine& engine, const ProbeSet& set, uint64_t load_bias, uint32_t maxactive,
    const EngineHitHandler& on_hit);

// Adds the engine's counters of the probes `ids` (ProbeDef::id -> engine id) to `stats`.
void AddEngineStats(const core::probe::Int3Engine& engine,
                    const std::map<uint32_t, core::probe::ProbeId>& ids,
                    std::map<uint32_t, ProbeEndStats>& stats);

}  // namespace kwatch::watch::probe
