#pragma once

// `kwatch probe --hw`: probes as execute breakpoints in the debug registers (HwProbes,
// watch/probe/hw_probes.h), on a launched or attached process. The code is never patched: no
// INT3, no out-of-line copies, no guardian.

#include <memory>

#include "absl/status/statusor.h"
#include "core/base/unique_fd.h"
#include "watch/probe/probe_session.h"
#include "watch/probe/probe_set.h"

namespace kwatch::watch::probe {

// Refuses what --hw cannot run (CheckHwProbes) before any target is touched; then launches
// the command or attaches to `pid`, checks every probe is in executable code, opens the
// recording, arms the probes in the debug registers (all or nothing), begins through `hooks`
// and publishes drmgr's decisions for `kwatch slots` (until the session is destroyed). On
// error the registers are cleared and the target let go (a launched target that never ran
// with its probes is killed).
absl::StatusOr<std::unique_ptr<ProbeSession>> StartHwSession(const ProbeSessionOptions& opts,
                                                             const ProbeSet& set,
                                                             core::UniqueFd sigfd,
                                                             const ProbeSessionHooks& hooks);

}  // namespace kwatch::watch::probe
