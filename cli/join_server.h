#pragma once

#include <sys/types.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/base/unique_fd.h"
#include "watch/guests.h"

namespace kwatch::cli {

// The owner's side of joining (docs/gdbserver.md, "Joining"): listens on the control socket of
// the process a watch session traces (cli/join_socket.h), and serves each kwatch that joins:
// checks its uid, resolves and arms its watches in the session (WatchSession::AddWatches, drmgr
// client "kwatch (joined, pid N)"), prints its events and summary as its own kwatch would (text
// or JSON, into frames for its stdout), removes its watches when it ends, goes away or is killed
// (their registers go back to drmgr), and tells it when the session ends.
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

  core::UniqueFd fd_;
  std::string path_;
  pid_t target_;
  std::vector<std::unique_ptr<Guest>> guests_;
  std::map<uint32_t, Guest*> owner_of_;  // joined watches, by id, while their joiner is here
};

}  // namespace kwatch::cli
