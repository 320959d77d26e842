#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "drmgr/allocator_types.h"

// Where running kwatch sessions publish their debug-register decisions, so that
// `kwatch slots` (another process) can show who holds which slot of a target.
//
// One file per kwatch process, `kwatch-<pid>.json`, in the run directory: $KWATCH_RUN_DIR when
// set (tests), else /run/kwatch when /run is writable (root), else $XDG_RUNTIME_DIR/kwatch,
// else /tmp/kwatch-<uid>. The directory is created 0700 and must be owned by the caller and
// closed to others (a directory that is a symlink or open to group/others is refused). Files
// are 0600, written to a fresh temporary name (O_EXCL|O_NOFOLLOW) and renamed over the old
// one, so readers see either the previous or the new decision, never a mix.
//
// Readers treat files as untrusted: at most kMaxRegistryFileBytes, regular files owned by the
// reader, schema-checked; anything else is skipped with a note.
namespace kwatch::drmgr {

inline constexpr int64_t kMaxRegistryFileBytes = int64_t{4} << 20;

// Publishes this kwatch process's slot decisions for `target` (atomically replaces the
// previous file; the file names kwatch's pid, the target pid, the command line and time).
// Errors are returned, never fatal for the session.
absl::Status PublishSlots(pid_t target, const AllocatorSnapshot& snapshot,
                          absl::string_view command_line);

// Removes this process's file (on session end). Safe to call when nothing was published.
void UnpublishSlots();

struct PublishedSlots {
  pid_t kwatch_pid = 0;
  pid_t target = 0;
  std::string command_line;
  uint64_t updated_ns = 0;  // CLOCK_REALTIME of the publication
  AllocatorSnapshot snapshot;
};

// Every published session watching `target` (or all when target == 0), by kwatch pid.
// Skips files whose kwatch process is no longer alive (same pid and start time), removing
// them when allowed, and skips unreadable or malformed files; each skip adds one sentence to
// `notes` (when not null). A missing directory means no sessions. Errors: the directory
// exists but cannot be listed, or is not safe (see above).
absl::StatusOr<std::vector<PublishedSlots>> ReadPublishedSlots(pid_t target,
                                                               std::vector<std::string>* notes);
// As above; the notes go to stderr as "kwatch: note: ...".
absl::StatusOr<std::vector<PublishedSlots>> ReadPublishedSlots(pid_t target);

// The run directory (not created), as chosen above.
std::string SlotRegistryDir();

// The file format, exposed for tests: these two round-trip (time_enabled and time_armed in
// whole nanoseconds). `kwatch_start_ticks` is the kwatch process's start time (field 22 of
// /proc/PID/stat), which tells a live publisher from a later process with the same pid.
// PublishedSlotsFromJson returns InvalidArgument naming the first offending field.
std::string PublishedSlotsToJson(const PublishedSlots& published, uint64_t kwatch_start_ticks);
absl::StatusOr<PublishedSlots> PublishedSlotsFromJson(absl::string_view text,
                                                      uint64_t* kwatch_start_ticks);

}  // namespace kwatch::drmgr
