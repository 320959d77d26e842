#pragma once

#include <sys/types.h>

#include "absl/strings/str_cat.h"
#include "drmgr/slot_allocator.h"
#include "watch/session.h"

// What a watch asks drmgr for (WatchSession's own, its joiners' and its debugger's lending,
// watch/session.cc and watch/session_lend.cc). Internal to WatchSession.
namespace kwatch::watch::session_internal {

// What a watch does when the registers run short under overcommit `o`. Pages cannot watch
// execution: an execute watch fails then, or (`exec_multiplex`: a debugger shares the
// registers, which it may take at any time) takes turns.
inline drmgr::ShortagePolicy PolicyFor(const WatchRequest& req, Overcommit o,
                                       bool exec_multiplex = false) {
  switch (o) {
    case Overcommit::kPages:
      if (req.kind == drmgr::DrKind::kExec) {
        return exec_multiplex ? drmgr::ShortagePolicy::kMultiplex : drmgr::ShortagePolicy::kFail;
      }
      return drmgr::ShortagePolicy::kFallbackPages;
    case Overcommit::kMultiplex:
      return drmgr::ShortagePolicy::kMultiplex;
    case Overcommit::kFail:
      return drmgr::ShortagePolicy::kFail;
  }
  return drmgr::ShortagePolicy::kFail;
}

inline drmgr::SlotRequest SlotRequestFor(const Watch& w, pid_t pid, drmgr::ShortagePolicy policy) {
  drmgr::SlotRequest r;
  r.addr = w.target.addr;
  r.len = w.target.length;
  r.kind = w.request.kind;
  r.scope = drmgr::Scope::Process(pid);
  r.priority = drmgr::DefaultPriority(drmgr::ClientKind::kWatchpoint);
  r.policy = policy;
  r.label = w.target.display;
  return r;
}

inline drmgr::SlotRequest SlotRequestFor(const Watch& w, pid_t pid, Overcommit o,
                                         bool exec_multiplex = false) {
  return SlotRequestFor(w, pid, PolicyFor(w.request, o, exec_multiplex));
}

// --follow: a write watch on pointer `p` of followed watch `w`, in debug registers only.
inline drmgr::SlotRequest PointerRequestFor(const core::symbols::PointerLoad& p, const Watch& w,
                                            pid_t pid) {
  drmgr::SlotRequest r;
  r.addr = p.addr;
  r.len = p.size;
  r.kind = drmgr::DrKind::kWrite;
  r.scope = drmgr::Scope::Process(pid);
  r.priority = drmgr::DefaultPriority(drmgr::ClientKind::kWatchpoint);
  r.policy = drmgr::ShortagePolicy::kFail;
  r.label = absl::StrCat(p.display, " (pointer of ", w.target.display, ", --follow)");
  return r;
}

}  // namespace kwatch::watch::session_internal
