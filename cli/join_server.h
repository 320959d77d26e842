#pragma once

#include <sys/types.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/base/unique_fd.h"
#include "core/probe/int3_engine.h"
#include "core/probe/int3_probe.h"
#include "core/ptrace/guardian.h"
#include "watch/guests.h"
#include "watch/probe/hit_sink.h"
#include "watch/probe/probe_set.h"

namespace kwatch::cli {

// The owner's side of joining (docs/gdbserver.md, "Joining"): listens on the control socket of
// the process a watch session traces (cli/join_socket.h), and serves each kwatch that joins:
// checks its uid, resolves and arms its watches in the session (WatchSession::AddWatches, drmgr
// client "kwatch (joined, pid N)"), prints its events and summary as its own kwatch would (text
// or JSON, into frames for its stdout), removes its watches when it ends, goes away or is killed
// (their registers go back to drmgr), and tells it when the session ends.
//
// A `kwatch probe` that joins gets its probes placed in the session's INT3 engine (the ptrace
// path, core/probe/int3_engine.h: the engine a gdbserver session shares with gdb's Z0
// breakpoints, else one made for the first such joiner, with a guardian that puts the code back
// if this kwatch dies); their arguments are fetched at each hit while the thread is stopped
// (watch/probe/engine_probes.h) and the hits go to the joiner (cli/probe_join_wire.h), which
// prints them. Its probes come out when it ends, goes away or is killed.
//
// Owns the listening socket (unlinked at destruction) and the joiners' connections. Used from
// the session's thread only (TargetSet calls it through watch::GuestRouter).
class JoinServer final : public watch::GuestRouter {
 public:
  // Listens for joiners of the session over `target`. The error says why (another session
  // listens there, a directory of another user); the caller may run without joining.
  static absl::StatusOr<std::unique_ptr<JoinServer>> Listen(pid_t target);
  JoinServer(const JoinServer&) = delete;
  JoinServer& operator=(const JoinServer&) = delete;
  JoinServer(JoinServer&&) = delete;
  JoinServer& operator=(JoinServer&&) = delete;
  ~JoinServer() override;

  void OnGuestEvent(watch::WatchSession& session, const core::AccessEvent& ev) override;
  std::vector<std::string> Serve(watch::WatchSession& session) override;
  void EndAll(watch::WatchSession& session, const watch::RunInfo& info) override;
  void OnTargetEvent(const core::ptrace::ProcessEvent& event) override;
  void Abandon() override;

  // Joined probes go into `engine` (a gdbserver session's, where gdb's breakpoints are: one
  // engine per process); before the first probe joiner. nullptr: that engine goes (its owner
  // restores the code), and the probes placed in it with it.
  void ShareEngine(core::probe::Int3Engine* engine);

  const std::string& path() const { return path_; }

 private:
  struct Guest;

  JoinServer(core::UniqueFd fd, std::string path, pid_t target);
  // Reads what `g` sent; false when it went away (EOF or an error).
  static bool Read(Guest& g);
  // Handles complete request lines; arms the watches at "go".
  void Handle(watch::WatchSession& session, Guest& g, std::vector<std::string>& notes);
  void Arm(watch::WatchSession& session, Guest& g, std::vector<std::string>& notes);
  // Sends what its printer wrote since the last flush.
  static void Flush(Guest& g);
  // Its summary (`reason`, the target's exit when it ended), then the end frame; its watches
  // removed from the session.
  void Finish(watch::WatchSession& session, Guest& g, const std::string& reason,
              const watch::RunInfo* owner_info, std::vector<std::string>& notes);
  static void Refuse(Guest& g, const std::string& message);
  // A probe joiner's "go": resolves its specs, places its probes (the world stopped).
  void ArmProbes(watch::WatchSession& session, Guest& g, std::vector<std::string>& notes);
  // At each hit of one of its probes (the thread stopped): the hit, encoded for it.
  static void OnProbeHit(Guest& g, const watch::probe::ProbeDef& def,
                         const core::probe::ProbeContext& ctx);
  // Sends its hits not sent yet.
  static void FlushHits(Guest& g);
  // Takes its probes out (the last at an address puts the original byte back), their counters
  // into `stats`; nothing is written when the target is gone.
  void RemoveProbes(Guest& g, std::map<uint32_t, watch::probe::ProbeEndStats>* stats);
  // Its end: hits, counters, the reason (`owner_info`: the session's own end), 'X'.
  void FinishProbes(Guest& g, const watch::RunInfo* owner_info);
  // The engine of the probe joiners (made at the first); nullptr when it cannot be made.
  absl::StatusOr<core::probe::Int3Engine*> Engine(watch::WatchSession& session);
  // No probe joiner left: the engine this server made goes (the code is restored).
  void DropEngineIfUnused();

  core::UniqueFd fd_;
  std::string path_;
  pid_t target_;
  std::vector<std::unique_ptr<Guest>> guests_;
  std::map<uint32_t, Guest*> owner_of_;        // joined watches, by id, while their joiner is here
  core::probe::Int3Engine* engine_ = nullptr;  // the probe joiners' (own_engine_ or shared)
  std::unique_ptr<core::ptrace::Guardian> guardian_;     // own_engine_'s patches
  std::unique_ptr<core::probe::Int3Engine> own_engine_;  // made for the first probe joiner
  core::ptrace::Process* process_ = nullptr;             // the target, once known
};

}  // namespace kwatch::cli
