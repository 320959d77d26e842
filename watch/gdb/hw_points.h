#pragma once

// gdb's hardware breakpoints and watchpoints (Z1-Z4) in a traced process, asked of drmgr at
// debugger priority and made real as kwatch makes its own (watch/trap_breakpoints.h): one perf
// breakpoint with sigtrap per thread and debug register, so that none outlives kwatch. A hit
// stops its thread with SIGTRAP (TRAP_PERF); Fired() says which of gdb's points it was.
//
// drmgr decides the registers (splitting a range over several, sharing equal ones); the
// kernel counts the registers kwatch's own watches hold in the same threads, so a request
// that does not fit fails (ResourceExhausted) and gdb is told. Owned by the gdb server; used
// from the tracer thread with the target stopped.

#include <sys/types.h>

#include <csignal>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "core/base/remote_addr.h"
#include "core/ptrace/process.h"
#include "drmgr/applier.h"
#include "drmgr/slot_allocator.h"
#include "watch/trap_breakpoints.h"

namespace kwatch::watch::gdb {

// The kind of a Z packet: 1 hardware breakpoint, 2 write, 3 read, 4 access watchpoint.
enum class HwKind : uint8_t { kBreak = 1, kWrite = 2, kRead = 3, kAccess = 4 };

class HwPoints final : public drmgr::Applier {
 public:
  explicit HwPoints(core::ptrace::Process& proc);
  // Arbitration with kwatch's own watches in the target (WatchSession::LendSlots): told how
  // many debug registers gdb needs kept free for it, after every change, and asked for one
  // more at a time when the kernel has none left for a new point of gdb's.
  using Lender = std::function<absl::Status(int registers)>;
  void set_lender(Lender lender) { lender_ = std::move(lender); }
  // Tells the lender what gdb's points hold now (at every resume). z1-z4 do not: gdb removes
  // its points at every stop and inserts them again before resuming, so registers go back to
  // kwatch's watches only when the target resumes without them.
  void Settle();
  // Debug registers gdb's points hold in each thread.
  int registers() const { return static_cast<int>(armed_.size()); }
  // The data gdb's watchpoints (Z2-Z4) watch, the one Insert is placing included (the lender
  // hears of it before it has a register): absolute address and length of each.
  std::vector<std::pair<uint64_t, uint64_t>> DataRanges() const;
  ~HwPoints() override;
  HwPoints(const HwPoints&) = delete;
  HwPoints& operator=(const HwPoints&) = delete;

  // Z1-Z4. InvalidArgument for a length drmgr refuses; ResourceExhausted when no register is
  // free for it (the registers are then as before).
  absl::Status Insert(HwKind kind, core::RemoteAddr addr, uint64_t len);
  // z1-z4 of a point Insert placed; NotFound otherwise.
  absl::Status Remove(HwKind kind, core::RemoteAddr addr, uint64_t len);
  // Every point removed (detach).
  void RemoveAll();

  struct Hit {
    HwKind kind = HwKind::kBreak;
    core::RemoteAddr addr;  // the point's address as gdb gave it
  };
  // Whether `si`, stopping `tid`, is the trap of one of gdb's points, and which.
  std::optional<Hit> Fired(pid_t tid, const siginfo_t& si) const;
  // A new thread: gets every armed register.
  absl::Status OnThreadStart(pid_t tid);
  bool empty() const { return points_.empty(); }
  const drmgr::SlotAllocator& allocator() const { return alloc_; }

  // drmgr::Applier.
  absl::Status Apply(const drmgr::Changes& changes) override;
  std::optional<drmgr::Scope> refused_scope() const override { return refused_; }

 private:
  struct Point {
    HwKind kind = HwKind::kBreak;
    core::RemoteAddr addr;
    uint64_t len = 0;
    drmgr::RequestId id;
  };
  struct Armed {
    TrapSlot slot;
    std::vector<drmgr::RequestId> holders;
  };
  using Layout = std::map<int, Armed>;  // by debug register

  absl::Status TryInsert(HwKind kind, core::RemoteAddr addr, uint64_t len);
  // Makes every thread hold `next` instead of `cur` (all or nothing).
  absl::Status Write(const Layout& cur, const Layout& next);

  core::ptrace::Process& proc_;
  drmgr::SlotAllocator alloc_;
  drmgr::ClientId client_;
  std::vector<Point> points_;
  std::optional<Point> placing_;  // Insert: the point being placed, for DataRanges
  Layout armed_;
  TrapBreakpoints bps_;
  std::optional<drmgr::Scope> refused_;
  Lender lender_;
  int lent_ = 0;  // what the lender was last told
};

}  // namespace kwatch::watch::gdb
