#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/base/remote_addr.h"

namespace kwatch::core::ptrace {

// One line of /proc/PID/maps.
struct MapEntry {
  RemoteAddr start;
  RemoteAddr end;  // exclusive
  bool read = false;
  bool write = false;
  bool exec = false;
  bool shared = false;
  uint64_t offset = 0;
  std::string dev;
  uint64_t inode = 0;
  std::string path;  // "" for anonymous mappings; "[heap]", "[stack]", ... kept as written

  bool Contains(RemoteAddr a) const { return a >= start && a < end; }
};

// Parses the text of a maps file. InvalidArgument naming the line on malformed input.
absl::StatusOr<std::vector<MapEntry>> ParseMaps(absl::string_view text);

// Reads and parses /proc/PID/maps. NotFound when the process is gone.
absl::StatusOr<std::vector<MapEntry>> ReadMaps(pid_t pid);

// The mapping containing `addr`, if any.
std::optional<MapEntry> FindMapping(const std::vector<MapEntry>& maps, RemoteAddr addr);

// Reads a whole (small) file such as /proc/PID/maps. Errors name the call and path.
absl::StatusOr<std::string> ReadSmallFile(const std::string& path);

// The state letter of a thread in /proc/PID/task/TID/stat ('R', 'S', 'D', 't', 'Z'...), or 0
// when the thread is gone. Async-signal-safe (the guardian calls it in a fork of kwatch).
char TaskStateLetter(pid_t pid, pid_t tid);

// Reads NAME from /proc/PID/status ("TracerPid", "Name"...), "" if absent.
std::string ProcStatusField(pid_t pid, const std::string& name);

}  // namespace kwatch::core::ptrace
