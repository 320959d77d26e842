#include "core/ptrace/maps.h"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <charconv>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "core/base/proc_status.h"
#include "core/base/syscall_status.h"
#include "core/base/unique_fd.h"

namespace kwatch::core::ptrace {

namespace {

bool ParseHex(absl::string_view s, uint64_t& out) {
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), out, 16);
  return ec == std::errc() && ptr == s.data() + s.size();
}

bool ParseDec(absl::string_view s, uint64_t& out) {
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), out, 10);
  return ec == std::errc() && ptr == s.data() + s.size();
}

// Splits off the next space-delimited token of `line`.
absl::string_view NextToken(absl::string_view& line) {
  while (!line.empty() && line.front() == ' ') {
    line.remove_prefix(1);
  }
  const size_t end = line.find(' ');
  const absl::string_view tok = line.substr(0, end);
  line.remove_prefix(end == absl::string_view::npos ? line.size() : end);
  return tok;
}

}  // namespace

absl::StatusOr<std::vector<MapEntry>> ParseMaps(absl::string_view text) {
  std::vector<MapEntry> out;
  int lineno = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++lineno;
    if (line.empty()) {
      continue;
    }
    absl::string_view rest = line;
    const absl::string_view range = NextToken(rest);
    const absl::string_view perms = NextToken(rest);
    const absl::string_view offset = NextToken(rest);
    const absl::string_view dev = NextToken(rest);
    const absl::string_view inode = NextToken(rest);
    const size_t dash = range.find('-');
    MapEntry e;
    if (dash == absl::string_view::npos || perms.size() != 4 ||
        !ParseHex(range.substr(0, dash), e.start.value) ||
        !ParseHex(range.substr(dash + 1), e.end.value) || !ParseHex(offset, e.offset) ||
        !ParseDec(inode, e.inode)) {
      return absl::InvalidArgumentError(
          absl::StrCat("malformed maps line ", lineno, ": '", line, "'"));
    }
    e.read = perms[0] == 'r';
    e.write = perms[1] == 'w';
    e.exec = perms[2] == 'x';
    e.shared = perms[3] == 's';
    e.dev = std::string{dev};
    e.path = std::string(absl::StripLeadingAsciiWhitespace(rest));
    out.push_back(std::move(e));
  }
  return out;
}

absl::StatusOr<std::string> ReadSmallFile(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) {
    const int err = errno;
    return SyscallError(err, absl::StrCat("open(", path, ")"));
  }
  std::string out;
  std::array<char, 16384> buf{};
  for (;;) {
    const ssize_t n = ::read(fd.get(), buf.data(), buf.size());
    if (n < 0) {
      const int err = errno;
      if (err == EINTR) {
        continue;
      }
      return SyscallError(err, absl::StrCat("read(", path, ")"));
    }
    if (n == 0) {
      break;
    }
    out.append(buf.data(), static_cast<size_t>(n));
  }
  return out;
}

absl::StatusOr<std::vector<MapEntry>> ReadMaps(pid_t pid) {
  auto text = ReadSmallFile(absl::StrCat("/proc/", pid, "/maps"));
  if (!text.ok()) {
    if (absl::IsNotFound(text.status())) {
      return absl::NotFoundError(absl::StrCat("process ", pid, " has exited"));
    }
    return text.status();
  }
  return ParseMaps(*text);
}

std::optional<MapEntry> FindMapping(const std::vector<MapEntry>& maps, RemoteAddr addr) {
  for (const auto& m : maps) {
    if (m.Contains(addr)) {
      return m;
    }
  }
  return std::nullopt;
}

char TaskStateLetter(pid_t pid, pid_t tid) {
  std::array<char, 64> path{};
  std::snprintf(path.data(), path.size(), "/proc/%d/task/%d/stat", pid, tid);
  const int fd = ::open(path.data(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return 0;
  }
  std::array<char, 512> buf{};
  const ssize_t n = ::read(fd, buf.data(), buf.size() - 1);
  ::close(fd);
  if (n <= 0) {
    return 0;
  }
  buf[n] = '\0';
  // "TID (comm) S ...": the command may hold spaces and parentheses; the last ')' ends it.
  const char* close_paren = std::strrchr(buf.data(), ')');
  if (close_paren == nullptr || close_paren[1] != ' ') {
    return 0;
  }
  return close_paren[2];
}

std::string ProcStatusField(pid_t pid, const std::string& name) {
  auto text = ReadSmallFile(absl::StrCat("/proc/", pid, "/status"));
  if (!text.ok()) {
    return "";
  }
  return std::string(StatusFieldOf(*text, name));
}

}  // namespace kwatch::core::ptrace
