#pragma once

#include <sys/types.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/base/remote_addr.h"
#include "core/base/unique_fd.h"
#include "core/base/unique_mmap.h"

namespace kwatch::core::ptrace {

// One change kwatch made to a target's memory: an INT3 over an instruction, a return address
// replaced by a trampoline (bytes), or pages protected by page mode (protection). Lives in
// memory shared with the guardian process.
struct PatchEntry {
  std::atomic<uint32_t> state;  // free, or which change it journals; published last (release)
  uint32_t len;                 // bytes: 1..16
  uint64_t addr;                // bytes: where; protection: the first page
  std::array<uint8_t, 16> original;
  std::array<uint8_t, 16> patched;
  uint64_t span;  // protection: bytes from addr, whole pages
  int32_t prot;   // protection: the PROT_* bits to put back
};

// The journal's head, in the same shared memory: how many entries kwatch ever used (the
// guardian reads only those).
struct alignas(64) JournalHeader {
  std::atomic<uint32_t> used{0};
};

// A guardian process that puts back every byte kwatch patched in a target if kwatch dies
// without doing it itself (SIGKILL, a crash). kwatch records each patch in a journal shared
// with the guardian (before writing the patch) and forgets it once restored; the guardian
// waits on a pipe and, when the pipe closes without Dismiss(), writes the original bytes back
// through /proc/PID/mem wherever memory still holds the patched bytes, and says so on stderr.
//
// Timing: the pipe closes when kwatch's files close, which the kernel does before it detaches
// kwatch's tracees, and kwatch's exit anchor (exit_anchor.h) makes that about 0.2 ms after
// the SIGKILL instead of ~6 ms. The guardian opens the target's memory in advance and reads
// only the journal entries kwatch used: the bytes are back about 0.5 ms after the SIGKILL
// (measured with scripts/kill_window.py). A thread that hits an INT3 in that time, or had
// already trapped into kwatch when it died, still receives its SIGTRAP when the kernel
// detaches it; nothing outside the tracer can cancel that signal.
//
// Page protections (page mode) can only be changed from inside the target: the guardian
// waits for the kernel to detach kwatch's tracees (woken by its parent-death signal, sent
// right after the detach), seizes every thread at once, runs mprotect in one of them for each
// journaled range and detaches. A thread that touches a protected page from the seize on
// stops for the guardian and is saved (its SIGSEGV is dropped and the access runs again on
// the restored page); one that touches it between kwatch's death and the seize (about 0.5 ms)
// still dies of SIGSEGV.
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
  // Journals that the pages [page, page+span) are about to lose their protections
  // `original_prot` (PROT_* bits). Call before the mprotect. ResourceExhausted when full.
  absl::StatusOr<Handle> RecordProtection(RemoteAddr page, uint64_t span, int original_prot);
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
  absl::StatusOr<Handle> Take();

  pid_t pid_ = -1;
  pid_t target_ = -1;
  UniqueFd pipe_;  // write end; closing it without a 'D' byte wakes the guardian
  UniqueMmap journal_;
  JournalHeader* header_ = nullptr;
  std::span<PatchEntry> entries_;
  std::vector<Handle> free_;
  size_t active_ = 0;
};

// The guardian's restore (exposed for tests): for each active entry whose memory in `target`
// still holds the patched bytes, writes the original bytes back. Returns entries restored.
// `mem_fd`: the target's /proc/PID/mem opened read-write in advance (closed here), else -1.
size_t RestorePatches(pid_t target, std::span<PatchEntry> entries, int mem_fd = -1);

// The guardian's restore of page protections (exposed for tests): waits up to `wait_ms` for
// `target` to have no tracer, seizes one of its threads, runs mprotect in it for each active
// protection entry, and detaches (a SIGSEGV that thread took on a journaled range is dropped,
// any other signal it stopped with is delivered). Returns the ranges restored; with fewer
// than journaled, `error` names the call that failed and its errno text. Only
// async-signal-safe calls (the guardian runs it in a fork of kwatch).
struct ProtectionRestore {
  size_t journaled = 0;
  size_t restored = 0;
  size_t saved = 0;  // accesses to journaled pages held meanwhile and run again (not SIGSEGV)
  std::array<char, 160> error{};
};
ProtectionRestore RestoreProtections(pid_t target, std::span<PatchEntry> entries, int wait_ms);

}  // namespace kwatch::core::ptrace
