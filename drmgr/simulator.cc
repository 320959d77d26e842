#include "drmgr/simulator.h"

#include <algorithm>
#include <optional>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"
#include "drmgr/dr7.h"

namespace kwatch::drmgr {
namespace {

int EnabledCount(const Simulator::Registers& regs) {
  const absl::StatusOr<Dr7> dr7 = DecodeDr7(regs.dr7);
  KW_CHECK(dr7.ok());  // only valid values are ever stored
  int n = 0;
  for (const Dr7Slot& s : dr7->slots) {
    n += s.enabled() ? 1 : 0;
  }
  return n;
}

bool Overlap(uint64_t a, uint64_t alen, uint64_t b, uint64_t blen) {
  return a < b + blen && b < a + alen;
}

}  // namespace

void Simulator::SetExternal(const Scope& scope, int n) {
  if (n == 0) {
    external_.erase(scope);
  } else {
    external_[scope] = n;
  }
}

absl::Status Simulator::ApplyOne(std::map<Scope, Bank>& banks, const SlotChange& c) {
  if (c.slot < 0 || c.slot >= kNumDebugRegisters) {
    return absl::InvalidArgumentError(absl::StrFormat("no debug register %d", c.slot));
  }
  Bank& bank = banks[c.scope];
  KW_ASSIGN_OR_RETURN(Dr7 dr7, DecodeDr7(bank.regs.dr7));
  Dr7Slot& slot = dr7.slots[c.slot];
  const bool matches = slot.enabled() && bank.regs.dr[c.slot] == c.chunk.addr.value &&
                       slot.kind == c.kind && DrLenBytes(slot.len) == c.chunk.len;
  switch (c.op) {
    case SlotChange::Op::kArm:
      if (slot.enabled()) {
        return absl::FailedPreconditionError(
            absl::StrFormat("%s: DR%d is busy (DR7 0x%x)", c.ToString(), c.slot, bank.regs.dr7));
      }
      KW_RETURN_IF_ERROR(CheckHardwareRange(c.chunk.addr, c.chunk.len, c.kind));
      slot = LocalSlot(c.kind, c.chunk.len);
      bank.regs.dr[c.slot] = c.chunk.addr.value;
      bank.holders[c.slot] = c.holders;
      break;
    case SlotChange::Op::kDisarm:
    case SlotChange::Op::kUpdateHolders:
      if (!matches) {
        return absl::FailedPreconditionError(absl::StrFormat("%s: DR%d holds 0x%x with DR7 0x%x",
                                                             c.ToString(), c.slot,
                                                             bank.regs.dr[c.slot], bank.regs.dr7));
      }
      if (c.op == SlotChange::Op::kUpdateHolders) {
        bank.holders[c.slot] = c.holders;
      } else {
        slot = Dr7Slot{};
        bank.regs.dr[c.slot] = 0;
        bank.holders[c.slot].clear();
      }
      break;
  }
  KW_ASSIGN_OR_RETURN(bank.regs.dr7, EncodeDr7(dr7));
  return absl::OkStatus();
}

int Simulator::MaxLoadOf(const std::map<Scope, Bank>& banks, std::string* where) const {
  const auto count = [&](const Scope& s) {
    auto b = banks.find(s);
    auto e = external_.find(s);
    return (b == banks.end() ? 0 : EnabledCount(b->second.regs)) +
           (e == external_.end() ? 0 : e->second);
  };
  // Every physical register set: a known thread, a new thread of a known process, or a
  // thread of any other process, each on a known CPU or any other one.
  std::set<std::pair<pid_t, std::optional<pid_t>>> threads{{-1, std::nullopt}};
  std::set<std::optional<int>> cpus{std::nullopt};
  const auto note = [&](const Scope& s) {
    if (s.is_task()) {
      threads.insert({s.pid, std::nullopt});
      if (s.kind == Scope::Kind::kThread) {
        threads.insert({s.pid, s.tid});
      }
    } else if (s.kind == Scope::Kind::kCpu) {
      cpus.insert(s.cpu);
    }
  };
  for (const auto& [s, b] : banks) {
    note(s);
  }
  for (const auto& [s, n] : external_) {
    note(s);
  }
  int best = 0;
  for (const auto& [pid, tid] : threads) {
    for (const std::optional<int>& cpu : cpus) {
      int n = count(Scope::AllCpus());
      if (cpu) {
        n += count(Scope::Cpu(*cpu));
      }
      if (pid > 0) {
        n += count(Scope::Process(pid));
      }
      if (tid) {
        n += count(Scope::Thread(pid, *tid));
      }
      if (n > best) {
        best = n;
        if (where != nullptr) {
          *where = absl::StrFormat("%s on %s",
                                   tid       ? Scope::Thread(pid, *tid).ToString()
                                   : pid > 0 ? "a new thread of process " + std::to_string(pid)
                                             : std::string("any other thread"),
                                   cpu ? Scope::Cpu(*cpu).ToString() : "any CPU");
        }
      }
    }
  }
  return best;
}

absl::Status Simulator::CheckCapacity(const std::map<Scope, Bank>& banks) const {
  std::string where;
  const int load = MaxLoadOf(banks, &where);
  if (load > kNumDebugRegisters) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("no space: %s would carry %d debug registers; x86 has %d", where, load,
                        kNumDebugRegisters));
  }
  return absl::OkStatus();
}

absl::Status Simulator::Apply(const Changes& changes) {
  std::map<Scope, Bank> banks = banks_;
  refused_scope_.reset();
  for (const SlotChange& c : changes.slots) {
    KW_RETURN_IF_ERROR(ApplyOne(banks, c));
    if (c.op == SlotChange::Op::kArm) {
      absl::Status s = CheckCapacity(banks);  // the kernel checks each new breakpoint
      if (!s.ok()) {
        refused_scope_ = c.scope;
        return {s.code(), absl::StrCat(c.ToString(), ": ", s.message())};
      }
    }
  }
  std::erase_if(banks, [](const auto& kv) { return EnabledCount(kv.second.regs) == 0; });
  banks_ = std::move(banks);
  return absl::OkStatus();
}

Simulator::Registers Simulator::RegistersOf(const Scope& scope) const {
  auto it = banks_.find(scope);
  return it == banks_.end() ? Registers{} : it->second.regs;
}

std::vector<SlotHolder> Simulator::HoldersOf(const Scope& scope, int slot) const {
  auto it = banks_.find(scope);
  if (it == banks_.end() || slot < 0 || slot >= kNumDebugRegisters) {
    return {};
  }
  return it->second.holders[slot];
}

std::vector<Scope> Simulator::ArmedScopes() const {
  std::vector<Scope> out;
  for (const auto& [s, b] : banks_) {
    out.push_back(s);
  }
  return out;
}

int Simulator::MaxLoad() const {
  return MaxLoadOf(banks_, nullptr);
}

Simulator::Outcome Simulator::Simulate(const Access& a) const {
  Outcome out;
  std::set<RequestId> seen;
  for (const Scope& s :
       {Scope::Thread(a.pid, a.tid), Scope::Process(a.pid), Scope::Cpu(a.cpu), Scope::AllCpus()}) {
    auto it = banks_.find(s);
    if (it == banks_.end()) {
      continue;
    }
    const Bank& bank = it->second;
    const absl::StatusOr<Dr7> dr7 = DecodeDr7(bank.regs.dr7);
    KW_CHECK(dr7.ok());
    Dr6 dr6;
    for (int i = 0; i < kNumDebugRegisters; ++i) {
      const Dr7Slot& slot = dr7->slots[i];
      if (!slot.enabled()) {
        continue;
      }
      const uint64_t base = bank.regs.dr[i];
      bool hit = false;
      switch (slot.kind) {
        case DrKind::kExec:
          hit = a.kind == core::AccessKind::kExec && a.addr.value == base;
          break;
        case DrKind::kWrite:
          hit = a.kind == core::AccessKind::kWrite &&
                Overlap(a.addr.value, a.size, base, DrLenBytes(slot.len));
          break;
        case DrKind::kReadWrite:
          hit = a.kind != core::AccessKind::kExec &&
                Overlap(a.addr.value, a.size, base, DrLenBytes(slot.len));
          break;
      }
      if (!hit) {
        continue;
      }
      dr6.hit[i] = true;
      out.trapped.emplace_back(s, i);
      for (const SlotHolder& h : bank.holders[i]) {
        bool wanted = false;
        if (h.kind == DrKind::kExec) {
          wanted = a.kind == core::AccessKind::kExec && a.addr == h.addr;
        } else {
          wanted = Overlap(a.addr.value, a.size, h.addr.value, h.len) &&
                   (h.kind == DrKind::kReadWrite || a.kind == core::AccessKind::kWrite);
        }
        if (wanted) {
          seen.insert(h.id);
        }
      }
    }
    if (!dr6.Spurious()) {
      out.dr6[s] = EncodeDr6(dr6);
    }
  }
  out.seen.assign(seen.begin(), seen.end());
  return out;
}

}  // namespace kwatch::drmgr
