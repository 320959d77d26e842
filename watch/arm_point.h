#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/base/remote_addr.h"
#include "core/ptrace/guardian.h"
#include "core/ptrace/process.h"
#include "core/ptrace/signal_interceptor.h"

namespace kwatch::watch {

// Where and when a thread reached an --arm-at point.
struct ArmHit {
  pid_t tid = 0;
  core::RemoteAddr addr;  // absolute
  std::string where;      // "setup+0x0 (late_pointer.c:21)"
  uint64_t hit_ns = 0;    // CLOCK_MONOTONIC when kwatch handled the trap
};

// How waiting for the point ended: a hit, or why there was none.
struct ArmWait {
  std::optional<ArmHit> hit;
  std::string why_not;  // "the target exited with status 0", "interrupted by SIGINT"
};

// --arm-at: a one-shot breakpoint that defers arming a watch session until a thread of the
// target first runs a probe point (`kwatch probe`'s syntax: FUNC, FUNC+OFF, FUNC:RELLINE,
// SRC:LINE, 0xADDR, resolved in the target's executable by core::probe::ProbeTarget; every
// address the point names gets an INT3).
//
// Mechanism: the INT3s are written with every thread stopped. At the first hit (Handle, the
// world stopped) every original byte is put back, the trapping thread's rip goes back to the
// point (it runs the instruction unprobed when it resumes), and the world stays stopped
// (Process::HoldStopped) so that the caller resolves and arms its watches before any thread
// runs on; the caller then calls Process::ReleaseHold. Other threads that trapped at the same
// time are sent back to the point too. A child forked before the hit gets the original bytes
// back (OnFork).
//
// Lifetime: installed as one of the process's interceptors from Plant to the destructor, which
// restores what is still patched when the target lives. Each INT3 is journaled with a guardian
// (core/ptrace/guardian.h) before it is written: a kwatch killed while it waits for the point
// (SIGKILL, a crash) leaves the original bytes back in the target, not a stray INT3. The process
// must outlive it. Not thread-safe: use it from the tracer thread.
class ArmPoint final : public core::ptrace::SignalInterceptor {
 public:
  // Resolves `spec` against the target's executable and writes an INT3 at each address.
  // Errors name the option: NotFound for an unknown function (with near matches) or a line
  // without code, InvalidArgument for a return probe or a bad point. Nothing is patched then.
  static absl::StatusOr<std::unique_ptr<ArmPoint>> Plant(core::ptrace::Process& proc,
                                                         const std::string& spec);
  ~ArmPoint() override;
  ArmPoint(const ArmPoint&) = delete;
  ArmPoint& operator=(const ArmPoint&) = delete;

  // Lets the target run (a launched one from its entry point) until a thread reaches the
  // point, the target ends or execs, or a stop signal arrives on `sigfd` (BlockSessionSignals).
  // On a hit every thread is left stopped, held (see the class comment). Otherwise nothing of
  // the point is left in the target, which is stopped when it lives (the caller lets it go).
  absl::StatusOr<ArmWait> Wait(int sigfd);

  // "setup+0x0 (late_pointer.c:21)", or several, joined with ", ".
  const std::string& description() const { return description_; }
  const std::string& spec() const { return spec_; }

  // SignalInterceptor.
  bool Claims(pid_t tid, const siginfo_t& si) override;
  absl::Status Handle(pid_t tid, const siginfo_t& si) override;
  void Drop(pid_t tid, const siginfo_t& si) override;
  absl::Status OnFork(core::ptrace::Process& child) override;

 private:
  struct Site {
    core::RemoteAddr addr;
    uint8_t original = 0;
    std::string where;
    bool patched = false;
    core::ptrace::Guardian::Handle journal = 0;  // while patched
  };

  ArmPoint(core::ptrace::Process& proc, std::string spec, std::vector<Site> sites);
  absl::Status Patch();
  // Puts every original byte back (world stopped).
  absl::Status Restore();
  const Site* SiteAt(core::RemoteAddr addr) const;
  // Sends `tid` (stopped one past an INT3 of a site) back to the site.
  absl::Status Rewind(pid_t tid) const;

  core::ptrace::Process& proc_;
  std::unique_ptr<core::ptrace::Guardian> guardian_;
  std::string spec_;
  std::vector<Site> sites_;
  std::string description_;
  std::optional<ArmHit> hit_;
};

}  // namespace kwatch::watch
