#include "watch/gdb/connection.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"
#include "core/base/syscall_status.h"

namespace kwatch::watch::gdb {

absl::StatusOr<Listener> Listener::Bind(absl::string_view host_port) {
  const size_t colon = host_port.rfind(':');
  if (colon == absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--listen wants HOST:PORT (e.g. localhost:2345 or :2345), not '", host_port, "'"));
  }
  std::string host{host_port.substr(0, colon)};
  const std::string port{host_port.substr(colon + 1)};
  int port_num = 0;
  if (!absl::SimpleAtoi(port, &port_num) || port_num < 0 || port_num > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("--listen: bad port '", port, "'"));
  }
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  if (const int rc =
          ::getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &res);
      rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--listen: cannot resolve '", host, "': ", ::gai_strerror(rc)));
  }
  absl::Status last = absl::UnavailableError("no address to listen on");
  Listener l;
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    core::UniqueFd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
    if (!fd) {
      const int err = errno;
      last = core::SyscallError(err, "socket");
      continue;
    }
    const int one = 1;
    (void)::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
      const int err = errno;
      if (err == EADDRINUSE) {
        ::freeaddrinfo(res);
        return absl::FailedPreconditionError(
            absl::StrCat("port ", port_num, " is in use (bind ", host.empty() ? "*" : host, ":",
                         port_num, ": address already in use): pick another with --listen ", host,
                         ":PORT, or :0 for a free one"));
      }
      last = core::SyscallError(err, absl::StrCat("bind(", host, ":", port_num, ")"));
      continue;
    }
    if (::listen(fd.get(), 1) != 0) {
      const int err = errno;
      last = core::SyscallError(err, "listen");
      continue;
    }
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&ss), &len) == 0) {
      l.port_ = ss.ss_family == AF_INET6
                    ? ntohs(reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_port)
                    : ntohs(reinterpret_cast<const sockaddr_in*>(&ss)->sin_port);
    }
    l.fd_ = std::move(fd);
    ::freeaddrinfo(res);
    return l;
  }
  ::freeaddrinfo(res);
  return last;
}

absl::StatusOr<core::UniqueFd> Listener::Accept(int wake_fd) {
  for (;;) {
    if (wake_fd >= 0) {
      std::array<pollfd, 2> p{pollfd{fd_.get(), POLLIN, 0}, pollfd{wake_fd, POLLIN, 0}};
      if (::poll(p.data(), p.size(), -1) < 0) {
        const int err = errno;
        if (err == EINTR) {
          continue;
        }
        return core::SyscallError(err, "poll (waiting for gdb)");
      }
      if ((p[0].revents & (POLLIN | POLLHUP | POLLERR)) == 0) {
        return absl::CancelledError("kwatch is ending (SIGINT, SIGTERM or SIGHUP)");
      }
    }
    core::UniqueFd c(::accept4(fd_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (c) {
      const int one = 1;
      (void)::setsockopt(c.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      fd_.Reset();
      return c;
    }
    const int err = errno;
    if (err != EINTR) {
      return core::SyscallError(err, "accept");
    }
  }
}

Connection::Connection(core::UniqueFd in, core::UniqueFd out)
    : in_(std::move(in)), out_(std::move(out)) {}

absl::Status Connection::WriteAll(absl::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(out_.get(), bytes.data(), bytes.size());
    if (n < 0) {
      const int err = errno;
      if (err == EINTR) {
        continue;
      }
      closed_ = true;
      return core::SyscallError(err, "write (to gdb)");
    }
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

absl::Status Connection::Fill(absl::Duration timeout) {
  if (closed_) {
    return absl::UnavailableError("gdb closed the connection");
  }
  const bool forever = timeout == absl::InfiniteDuration();
  std::array<pollfd, 2> p{pollfd{in_.get(), POLLIN, 0}, pollfd{wake_fd_, POLLIN, 0}};
  const nfds_t n_fds = forever && wake_fd_ >= 0 ? 2 : 1;
  const int ms = forever ? -1 : static_cast<int>(absl::ToInt64Milliseconds(timeout));
  const int r = ::poll(p.data(), n_fds, ms);
  if (r < 0) {
    const int err = errno;
    return err == EINTR ? absl::OkStatus() : core::SyscallError(err, "poll (gdb connection)");
  }
  if (r == 0) {
    return absl::OkStatus();
  }
  if ((p[0].revents & (POLLIN | POLLHUP | POLLERR)) == 0) {
    woken_ = true;
    return absl::CancelledError("kwatch is ending (SIGINT, SIGTERM or SIGHUP)");
  }
  std::array<char, 4096> buf{};
  const ssize_t n = ::read(in_.get(), buf.data(), buf.size());
  if (n < 0) {
    const int err = errno;
    if (err == EINTR || err == EAGAIN) {
      return absl::OkStatus();
    }
    closed_ = true;
    return core::SyscallError(err, "read (from gdb)");
  }
  if (n == 0) {
    closed_ = true;
    return absl::UnavailableError("gdb closed the connection");
  }
  std::vector<Frame> frames;
  decoder_.Feed(absl::string_view(buf.data(), static_cast<size_t>(n)), frames);
  for (Frame& f : frames) {
    frames_.push_back(std::move(f));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<Frame>> Connection::Next(absl::Duration timeout) {
  const absl::Time deadline =
      timeout == absl::InfiniteDuration() ? absl::InfiniteFuture() : absl::Now() + timeout;
  for (;;) {
    while (!frames_.empty()) {
      Frame f = std::move(frames_.front());
      frames_.pop_front();
      switch (f.kind) {
        case Frame::Kind::kAck:
        case Frame::Kind::kNack:
          continue;  // late acknowledgements of packets already settled
        case Frame::Kind::kBadChecksum:
        case Frame::Kind::kMalformed:
          if (!no_ack_) {
            KW_RETURN_IF_ERROR(WriteAll("-"));
          }
          return f;
        case Frame::Kind::kPacket:
          if (!no_ack_) {
            KW_RETURN_IF_ERROR(WriteAll("+"));
          }
          return f;
        case Frame::Kind::kInterrupt:
          return f;
      }
    }
    const absl::Time now = absl::Now();
    if (now >= deadline && timeout != absl::InfiniteDuration()) {
      // One look without waiting, then give up.
      KW_RETURN_IF_ERROR(Fill(absl::ZeroDuration()));
      if (frames_.empty()) {
        return std::nullopt;
      }
      continue;
    }
    KW_RETURN_IF_ERROR(
        Fill(timeout == absl::InfiniteDuration() ? absl::InfiniteDuration() : deadline - now));
    if (frames_.empty() && timeout != absl::InfiniteDuration() && absl::Now() >= deadline) {
      return std::nullopt;
    }
  }
}

absl::Status Connection::Send(absl::string_view payload) {
  const std::string packet = EncodePacket(payload);
  for (int attempt = 0;; ++attempt) {
    KW_RETURN_IF_ERROR(WriteAll(packet));
    if (no_ack_) {
      return absl::OkStatus();
    }
    // Wait for the acknowledgement; other frames (an interrupt) wait their turn.
    for (;;) {
      bool settled = false;
      bool resend = false;
      for (auto it = frames_.begin(); it != frames_.end(); ++it) {
        if (it->kind == Frame::Kind::kAck || it->kind == Frame::Kind::kNack) {
          resend = it->kind == Frame::Kind::kNack;
          frames_.erase(it);
          settled = true;
          break;
        }
      }
      if (settled) {
        if (!resend) {
          return absl::OkStatus();
        }
        break;
      }
      KW_RETURN_IF_ERROR(Fill(absl::Seconds(10)));
      if (frames_.empty()) {
        return absl::DeadlineExceededError("gdb did not acknowledge a packet in 10 s");
      }
    }
    if (attempt >= 10) {
      return absl::DataLossError("gdb refused a packet 10 times (bad line?)");
    }
  }
}

}  // namespace kwatch::watch::gdb
