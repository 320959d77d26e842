#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "core/base/remote_addr.h"
#include "core/event.h"
#include "drmgr/allocator_types.h"
#include "drmgr/applier.h"
#include "drmgr/scope.h"

namespace kwatch::drmgr {

// An in-memory applier for tests: every scope has simulated DR0-DR3 and DR7 registers
// (encoded with dr7.h), and the kernel's slot counting is enforced: a change list that would
// give some thread on some CPU a fifth slot fails with ResourceExhausted, like
// perf_event_open's ENOSPC. Accesses are matched against the decoded registers and then
// filtered in software the way a backend filters them. As an Applier it stands in for the
// perf and ptrace appliers, so that ApplyWithRetry runs against it. Not thread-safe.
class Simulator : public Applier {
 public:
  struct Registers {
    std::array<uint64_t, kNumDebugRegisters> dr{};
    uint64_t dr7 = 0x400;  // reserved bit 10 set, nothing enabled
    bool operator==(const Registers&) const = default;
  };

  struct Access {
    core::RemoteAddr addr;
    uint64_t size = 1;
    core::AccessKind kind = core::AccessKind::kWrite;
    pid_t pid = 0;
    pid_t tid = 0;
    int cpu = 0;
  };

  struct Outcome {
    // Debug registers whose condition matched: the traps the hardware takes.
    std::vector<std::pair<Scope, int>> trapped;
    // DR6 of each trapping scope (B0-B3 set for its matching slots).
    std::map<Scope, uint64_t> dr6;
    // Requests that see the access after software filtering (bytes outside their range,
    // reads for write-only holders of a read-write slot), sorted, each once.
    std::vector<RequestId> seen;
  };

  // Slots of `scope` held by someone else (a debugger), unknown to the allocator.
  void SetExternal(const Scope& scope, int n);

  // Applies the changes in order, all or nothing. FailedPrecondition for a change that does
  // not match the registers (arming a busy slot, disarming another chunk), InvalidArgument
  // for a chunk one debug register cannot hold, ResourceExhausted for a fifth slot on some
  // thread or CPU. On error no register changes.
  absl::Status Apply(const Changes& changes) override;
  // After Apply failed with ResourceExhausted: the scope of the refused arm (an applier
  // reports it to SlotAllocator::ReportNoSpace).
  std::optional<Scope> refused_scope() const override { return refused_scope_; }

  Registers RegistersOf(const Scope& scope) const;
  // Holders of an enabled slot (empty when disabled).
  std::vector<SlotHolder> HoldersOf(const Scope& scope, int slot) const;
  // Scopes with at least one enabled slot.
  std::vector<Scope> ArmedScopes() const;
  // The most slots any thread on any CPU carries (own, process, CPU, all-CPU and external).
  int MaxLoad() const;

  Outcome Simulate(const Access& access) const;

 private:
  struct Bank {
    Registers regs;
    std::array<std::vector<SlotHolder>, kNumDebugRegisters> holders;
  };

  static absl::Status ApplyOne(std::map<Scope, Bank>& banks, const SlotChange& change);
  absl::Status CheckCapacity(const std::map<Scope, Bank>& banks) const;
  int MaxLoadOf(const std::map<Scope, Bank>& banks, std::string* where) const;

  std::map<Scope, Bank> banks_;
  std::map<Scope, int> external_;
  std::optional<Scope> refused_scope_;
};

}  // namespace kwatch::drmgr
