#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/remote_addr.h"
#include "core/unique_fd.h"
#include "core/unique_mmap.h"

namespace kwatch::core {

// One change kwatch made to a target's memory: an INT3 over an instruction, a return address
// replaced by a trampoline. Lives in memory shared with the guardian process.
struct PatchEntry {
  std::atomic<uint32_t> state;  // kFree or kActive; published last (release)
  uint32_t len;                 // 1..16
  uint64_t addr;
  uint8_t original[16];
  uint8_t patched[16];
};

// A guardian process that puts back every byte kwatch patched in a target if kwatch dies
// without doing it itself (SIGKILL, a crash). kwatch records each patch in a journal shared
// with the guardian (before writing the patch) and forgets it once restored; the guardian
// waits on a pipe and, when the pipe closes without Dismiss(), writes the original bytes back
// through /proc/PID/mem wherever memory still holds the patched bytes, and says so on stderr.
//
// Timing: the pipe closes when kwatch's files close, which the kernel does before it detaches
// kwatch's tracees, so the bytes are normally back before any thread runs untraced. A thread
// that had already trapped into kwatch at the instant kwatch was killed still receives its
// SIGTRAP when the kernel detaches it; nothing outside the tracer can cancel that signal.
//
// The guardian runs in its own process group and ignores SIGINT/SIGTERM/SIGHUP (a Ctrl-C
// reaches kwatch, which cleans up and dismisses it). One target per guardian; not
// thread-safe (use from kwatch's tracer thread).
class Guardian {
 public:
  // Forks the guardian for `target`. `capacity` bounds the journal (entries).
  static absl::StatusOr<std::unique_ptr<Guardian>> Start(pid_t target, size_t capacity = 16384);
  ~Guardian();  // Dismiss()es.
  Guardian(const Guardian&) = delete;
  Guardian& operator=(const Guardian&) = delete;

  using Handle = uint32_t;
  // Journals that [addr, addr+len) is about to change from `original` to `patched` (same
  // length, at most 16 bytes). Call before writing. ResourceExhausted when the journal is full.
  absl::StatusOr<Handle> Record(RemoteAddr addr, std::span<const uint8_t> original,
                                std::span<const uint8_t> patched);
  // The patch was undone by kwatch (or the memory is gone).
  void Forget(Handle h);
  // Every patch is gone (the target exec'd or exited).
  void ForgetAll();
  size_t active() const { return active_; }

  // Ends the guard cleanly: kwatch restored everything itself. The guardian exits.
  absl::Status Dismiss();

  pid_t pid() const { return pid_; }

 private:
  Guardian() = default;

  pid_t pid_ = -1;
  pid_t target_ = -1;
  UniqueFd pipe_;  // write end; closing it without a 'D' byte wakes the guardian
  UniqueMmap journal_;
  std::span<PatchEntry> entries_;
  std::vector<Handle> free_;
  size_t active_ = 0;
};

// The guardian's restore (exposed for tests): for each active entry whose memory in `target`
// still holds the patched bytes, writes the original bytes back. Returns entries restored.
size_t RestorePatches(pid_t target, std::span<PatchEntry> entries);

}  // namespace kwatch::core
