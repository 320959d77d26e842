#pragma once

// The byte stream to gdb: a TCP connection (`--listen HOST:PORT`, one client) or a pair of
// pipes (`--stdio`, for `target remote | kwatch gdbserver --stdio ...`), with the protocol's
// acknowledgements (until gdb turns them off with QStartNoAckMode). Not thread-safe.

#include <deque>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "core/base/unique_fd.h"
#include "watch/gdb/packet.h"

namespace kwatch::watch::gdb {

// A listening TCP socket.
class Listener {
 public:
  // Binds and listens on HOST:PORT (HOST: a name or address, empty for every address; PORT 0
  // picks a free one). FailedPrecondition naming the port when it is in use; InvalidArgument
  // for a malformed HOST:PORT; other errors name the call and errno.
  static absl::StatusOr<Listener> Bind(absl::string_view host_port);
  // The port it listens on (the one picked, for port 0).
  int port() const { return port_; }
  // Waits for one client and stops listening. Cancelled when `wake_fd` (-1: none; see
  // Connection::set_wake_fd) becomes readable first.
  absl::StatusOr<core::UniqueFd> Accept(int wake_fd = -1);

 private:
  core::UniqueFd fd_;
  int port_ = 0;
};

class Connection {
 public:
  // Reads from `in` and writes to `out` (the same socket for TCP: pass a second fd of it).
  Connection(core::UniqueFd in, core::UniqueFd out);

  // The next frame: waits up to `timeout` (zero: only what is already there). nullopt when
  // nothing came in time; Unavailable ("gdb closed the connection") at end of stream.
  // Packets are acknowledged ('+') in ack mode; bad ones get '-' (gdb sends them again).
  absl::StatusOr<std::optional<Frame>> Next(absl::Duration timeout);
  // Sends a packet; in ack mode waits for gdb's '+' (sending again after a '-').
  absl::Status Send(absl::string_view payload);
  // QStartNoAckMode: after the OK, neither side acknowledges.
  void set_no_ack() { no_ack_ = true; }
  int in_fd() const { return in_.get(); }
  // While Next waits without a timeout (gdb holds the target stopped), `fd` becoming readable
  // ends the wait with Cancelled: a signalfd of the signals that end kwatch, never read here
  // (the session's loop reads the signal once the server lets go). -1: none. Not owned.
  void set_wake_fd(int fd) { wake_fd_ = fd; }
  // Whether a wait ended that way.
  bool woken() const { return woken_; }
  bool closed() const { return closed_; }

 private:
  // Reads what is there (waiting up to `timeout`) into the decoder.
  absl::Status Fill(absl::Duration timeout);
  absl::Status WriteAll(absl::string_view bytes);

  core::UniqueFd in_;
  core::UniqueFd out_;
  PacketDecoder decoder_;
  std::deque<Frame> frames_;
  bool no_ack_ = false;
  bool closed_ = false;
  int wake_fd_ = -1;
  bool woken_ = false;
};

}  // namespace kwatch::watch::gdb
