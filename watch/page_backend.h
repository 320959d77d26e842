#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "core/process.h"
#include "core/x86_access.h"
#include "watch/backend.h"
#include "watch/session.h"

namespace kwatch::watch {

// Page-protection watchpoints ("pagepoints"): the pages holding watched bytes are
// mprotect()ed inside the target (PROT_READ for write watches, PROT_NONE when reads count);
// each access faults, kwatch decodes the faulting instruction (Zydis) to learn the exact
// address, size and kind, reads the old value, lifts the protection, single-steps the
// instruction with every other thread stopped, reads the new value and protects again.
// Exact (old and new values, no lost events) for any number of watches, at the cost of a
// fault and a few ptrace stops per access to the page, including accesses to other data
// on it (counted as unrelated()). The kernel's own accesses to a protected page (a read()
// into it) fail with EFAULT instead of faulting: a documented limit of the method.
class PageBackend : public WatchBackend, public core::SignalInterceptor {
 public:
  PageBackend(core::Process& proc, const std::vector<Watch>& watches)
      : proc_(proc), watches_(watches) {}
  ~PageBackend() override;
  PageBackend(const PageBackend&) = delete;
  PageBackend& operator=(const PageBackend&) = delete;

  BackendKind kind() const override { return BackendKind::kPage; }
  absl::Status Arm() override;
  void Disarm() override;
  void Forget() override;
  void Collect(std::vector<core::AccessEvent>& out) override;
  uint64_t unrelated() const override { return unrelated_; }

  bool Claims(pid_t tid, const siginfo_t& si) override;
  absl::Status Handle(pid_t tid, const siginfo_t& si) override;
  absl::StatusOr<bool> HandleInPlace(pid_t tid, const siginfo_t& si) override;
  // A forked child inherits the protected pages: give it back their original protections.
  absl::Status OnFork(core::Process& child) override;

  // Faults handled by emulating the instruction, and by single-stepping it.
  uint64_t emulated() const { return emulated_; }
  uint64_t stepped() const { return stepped_; }

  // Pages kwatch protects, page address -> protections (PROT_*) before and while armed.
  struct Page {
    int original = 0;
    int armed = 0;
  };
  const std::map<uint64_t, Page>& pages() const { return pages_; }

 private:
  absl::Status Protect(pid_t tid, uint64_t page, int prot);
  static absl::Status ProtectIn(core::Process& proc, pid_t tid, uint64_t page, int prot);
  absl::Status ReadValue(uint64_t addr, uint32_t size, uint64_t& out) const;
  // Which watches the instruction touches (reading their values before the access), and
  // the protected pages its operands lie on.
  struct Hit {
    uint32_t watch_id;
    core::AccessKind kind;
    uint64_t addr;  // the watched bytes the operand touched
    uint32_t size;
    uint64_t old_value;
  };
  void Match(const absl::StatusOr<core::DecodedAccess>& decoded, uint64_t fault,
             std::vector<Hit>& hits, std::vector<uint64_t>& touched) const;
  void Record(pid_t tid, uint64_t rip, const std::vector<Hit>& hits);

  core::Process& proc_;
  const std::vector<Watch>& watches_;
  std::map<uint64_t, Page> pages_;
  bool armed_ = false;
  // After Disarm: faults raised while the pages were protected may still be on their way
  // (queued SIGSEGVs); they are claimed and dropped, the instruction then runs unprotected.
  bool draining_ = false;
  std::vector<core::AccessEvent> events_;
  // Up to 16 bytes of code at an address (fewer at the end of a mapping), read once.
  struct Code {
    std::array<uint8_t, 16> bytes{};
    size_t size = 0;
  };
  std::span<const uint8_t> CodeAt(uint64_t rip);
  absl::flat_hash_map<uint64_t, Code> code_cache_;  // by instruction address
  uint64_t unrelated_ = 0;
  uint64_t emulated_ = 0;
  uint64_t stepped_ = 0;
};

}  // namespace kwatch::watch
