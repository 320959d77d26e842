#pragma once

#include <cstdint>

#include "absl/strings/string_view.h"
#include "core/event.h"
#include "core/ptrace/process_event.h"
#include "watch/access_sink.h"
#include "watch/session.h"

namespace kwatch::watch {

// The watches other kwatch commands added to a process watch session by joining it
// (WatchSession::AddWatches): their events, their arrival and their departure. TargetSet owns
// the session and calls these from its own thread; the implementation (cli/join_server.h) owns
// the joiners' connections. Ids at or past the session's own watches belong to joiners.
class GuestRouter {
 public:
  virtual ~GuestRouter() = default;

  // One event of watch `ev.watch_id`, a joiner's: delivered to it (the session's own summary,
  // profile, --if and --count never see it). Events of a joiner that left are dropped.
  virtual void OnGuestEvent(WatchSession& session, const core::AccessEvent& ev) = 0;
  // Once per Step, after the drain, while the target's watches are armed: accepts joiners,
  // arms what they ask, flushes their output, and removes the watches of those that ended
  // (their debug registers go back to drmgr). Returns a line for people per change, for the
  // session's own event stream.
  virtual std::vector<std::string> Serve(WatchSession& session) = 0;
  // The session ends (`info` holds what the session's own summary says: reason, target exit):
  // each joiner gets its summary and is told why, before the watches are removed.
  virtual void EndAll(WatchSession& session, const RunInfo& info) = 0;
  // Something happened to the target process itself (not a followed child), seen by the
  // session's poll before it acts on it: at kExec the target is still stopped at its exec event
  // (what a joiner placed in the old image is gone), at kThreadExited the thread is gone.
  virtual void OnTargetEvent(const core::ptrace::ProcessEvent& /*event*/) {}
  // The session fails or goes (TargetSet::Abandon, its destructor) while the target is still
  // traced: whatever joiners placed in the target's code comes out now. Nothing once EndAll ran.
  virtual void Abandon() {}

 protected:
  GuestRouter() = default;
  GuestRouter(const GuestRouter&) = default;
  GuestRouter& operator=(const GuestRouter&) = default;
  GuestRouter(GuestRouter&&) = default;
  GuestRouter& operator=(GuestRouter&&) = default;
};

}  // namespace kwatch::watch
