#pragma once

#include <sys/types.h>

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/base/unique_fd.h"

namespace kwatch::cli {

// The control socket through which a second kwatch joins the session of the kwatch that already
// traces a process (docs/gdbserver.md, "Joining"). One Unix stream socket per traced process,
// mode 0600 in a directory of the session's user (0700): /run/user/UID/kwatch/PID.sock when
// /run/user/UID exists, else /tmp/kwatch-UID/PID.sock. The listener also checks each client's
// uid (SO_PEERCRED): a client of another user is refused even when it could open the file.
//
// Messages: the joiner sends text lines (JoinRequest); the session answers in frames, one byte of
// channel ('O' the joiner's stdout, 'E' its stderr, 'X' the end, with the exit status as
// decimal text), four bytes of length (little-endian), then the bytes.

// The path of the control socket of the session of user `uid` that traces `target`.
std::string JoinSocketPath(uid_t uid, pid_t target);

// The kwatch that traces process `pid` (its TracerPid is a process named kwatch), if any.
struct KwatchTracer {
  pid_t pid = 0;
  uid_t uid = 0;
};
std::optional<KwatchTracer> TracingKwatch(pid_t pid);

// Listens on the control socket of `target` (the directory made 0700 if missing; a socket left
// by a session that ended is replaced; refused when another session listens there). Sets
// `*path`. The descriptor is nonblocking. Sockets that killed sessions left over processes
// that are gone are removed on the way.
absl::StatusOr<core::UniqueFd> ListenJoinSocket(pid_t target, std::string* path);

// Connects to the control socket of the session of `tracer` over `target`; the error says who
// may join and why this user cannot.
absl::StatusOr<core::UniqueFd> ConnectJoinSocket(const KwatchTracer& tracer, pid_t target);

// The uid of the process at the other end of a connected Unix socket.
absl::StatusOr<uid_t> PeerUid(int fd);

// Sends one frame (all of it; MSG_NOSIGNAL: a peer gone is an error, not a SIGPIPE).
absl::Status SendFrame(int fd, char channel, absl::string_view payload);
// Sends all of `bytes` on the control socket `fd` (retrying short sends and EINTR).
absl::Status SendAll(int fd, absl::string_view bytes);

struct JoinFrame {
  char channel = 0;
  std::string payload;
};
// Takes the first complete frame out of `buf` (bytes read so far); nullopt until one is whole.
std::optional<JoinFrame> TakeFrame(std::string& buf);

}  // namespace kwatch::cli
