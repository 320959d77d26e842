#include "watch/kernel/kernel_slots.h"

#include <algorithm>
#include <regex>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/base/status_macros.h"
#include "drmgr/scope.h"

namespace kwatch::watch::kernel {

KernelSlots::KernelSlots(watch::BreakpointRequest opened, std::vector<std::string> labels)
    : opened_(opened), labels_(std::move(labels)) {
  client_ = alloc_.AddClient(drmgr::ClientKind::kWatchpoint, "kwatch");
}

KernelSlots::KernelSlots(watch::BreakpointRequest opened, std::vector<std::string> labels,
                         pid_t pid, std::function<std::vector<pid_t>()> threads)
    : opened_(opened), labels_(std::move(labels)), pid_(pid), threads_(std::move(threads)) {
  client_ = alloc_.AddClient(drmgr::ClientKind::kWatchpoint, "kwatch");
}

std::string KernelSlots::PeopleReason(const std::string& reason) const {
  // "request 3 (watchpoint 'kwatch', jiffies, priority 10)" and "requests 2, 3".
  static const std::regex kOneRequest(
      R"(request (\d+) \(watchpoint 'kwatch', [^()]*, priority \d+\))");
  static const std::regex kManyRequests(R"(requests? ((\d+)(, \d+)*))");
  const std::string out = std::regex_replace(reason, kOneRequest, "request $1");
  std::string result;
  size_t last = 0;
  for (auto it = std::sregex_iterator(out.begin(), out.end(), kManyRequests);
       it != std::sregex_iterator(); ++it) {
    const std::smatch& m = *it;
    result.append(out, last, static_cast<size_t>(m.position(0)) - last);
    std::vector<std::string> names;
    for (absl::string_view n : absl::StrSplit(m[1].str(), ", ")) {
      uint64_t id = 0;
      auto o = absl::SimpleAtoi(n, &id) ? owner_.find(drmgr::RequestId{id}) : owner_.end();
      names.push_back(o == owner_.end()
                          ? absl::StrCat("request ", n)
                          : absl::StrCat("#", o->second.first + 1, " ", labels_[o->second.first]));
    }
    absl::StrAppend(&result, names.size() == 1 ? "watch " : "watches ", absl::StrJoin(names, ", "));
    last = static_cast<size_t>(m.position(0) + m.length(0));
  }
  result += out.substr(last);
  return result;
}

absl::Status KernelSlots::Apply(const drmgr::Changes& changes,
                                std::optional<drmgr::Scope>* refused) {
  std::vector<size_t> opened_here;  // indices into armed_ of breakpoints this call opened
  absl::Cleanup rollback = [&] {
    std::sort(opened_here.rbegin(), opened_here.rend());
    for (const size_t i : opened_here) {
      armed_.erase(armed_.begin() + static_cast<std::ptrdiff_t>(i));
    }
  };
  // The breakpoints of a slot: one on its CPU, or one per thread of the process.
  const auto of_slot = [](const drmgr::SlotChange& c) {
    const int cpu = c.scope.kind == drmgr::Scope::Kind::kCpu ? c.scope.cpu : -1;
    return
        [cpu, slot = c.slot](const KernelBreakpoint& k) { return k.cpu == cpu && k.slot == slot; };
  };
  auto holders = [&](const drmgr::SlotChange& c) {
    std::vector<size_t> out;
    for (const drmgr::SlotHolder& h : c.holders) {
      auto o = owner_.find(h.id);
      if (o != owner_.end() && std::find(out.begin(), out.end(), o->second.first) == out.end()) {
        out.push_back(o->second.first);
      }
    }
    return out;
  };
  for (const drmgr::SlotChange& c : changes.slots) {
    switch (c.op) {
      case drmgr::SlotChange::Op::kDisarm: {
        // Indices recorded in opened_here stay valid: a change list disarms before it arms.
        const auto gone = std::remove_if(armed_.begin(), armed_.end(), of_slot(c));
        armed_.erase(gone, armed_.end());
        break;
      }
      case drmgr::SlotChange::Op::kUpdateHolders:
        for (KernelBreakpoint& k : armed_) {
          if (of_slot(c)(k)) {
            k.watches = holders(c);
          }
        }
        break;
      case drmgr::SlotChange::Op::kArm: {
        const bool per_cpu = c.scope.kind == drmgr::Scope::Kind::kCpu;
        const std::vector<pid_t> tids = per_cpu ? std::vector<pid_t>{-1} : threads_();
        for (const pid_t tid : tids) {
          watch::BreakpointRequest req = opened_;
          req.addr = c.chunk.addr;
          req.len = static_cast<uint32_t>(c.chunk.len);
          req.kind = c.kind;
          req.cpu = per_cpu ? c.scope.cpu : -1;
          req.tid = tid;
          absl::StatusOr<std::unique_ptr<watch::PerfBreakpoint>> bp =
              watch::PerfBreakpoint::Open(req);
          if (!bp.ok()) {
            if (absl::IsResourceExhausted(bp.status())) {
              *refused = c.scope;
            }
            return bp.status();
          }
          KernelBreakpoint k;
          k.bp = *std::move(bp);
          k.watches = holders(c);
          k.cpu = req.cpu;
          k.slot = c.slot;
          k.tid = per_cpu ? 0 : tid;
          armed_.push_back(std::move(k));
          opened_here.push_back(armed_.size() - 1);
        }
        break;
      }
    }
  }
  std::move(rollback).Cancel();
  return absl::OkStatus();
}

absl::Status KernelSlots::Request(size_t w, uint64_t addr, uint64_t len, int cpu) {
  return RequestIn(w, addr, len, drmgr::Scope::Cpu(cpu));
}

absl::Status KernelSlots::RequestForProcess(size_t w, uint64_t addr, uint64_t len) {
  return RequestIn(w, addr, len, drmgr::Scope::Process(pid_));
}

absl::Status KernelSlots::RequestIn(size_t w, uint64_t addr, uint64_t len,
                                    const drmgr::Scope& scope) {
  const int cpu = scope.kind == drmgr::Scope::Kind::kCpu ? scope.cpu : -1;
  drmgr::SlotRequest r;
  r.addr = core::RemoteAddr{addr};
  r.len = len;
  r.kind = opened_.kind;
  r.scope = scope;
  r.priority = drmgr::DefaultPriority(drmgr::ClientKind::kWatchpoint);
  r.policy = drmgr::ShortagePolicy::kFail;
  r.label = labels_[w];
  absl::StatusOr<drmgr::Grant> g = alloc_.Request(client_, r);
  if (!g.ok()) {
    return g.status();
  }
  owner_[g->id] = {w, cpu};
  // A register of that CPU or thread may be held outside kwatch (another tool's breakpoint).
  Writer writer(*this);
  KW_RETURN_IF_ERROR(drmgr::ApplyWithRetry(alloc_, writer, std::move(g->changes)));
  absl::StatusOr<drmgr::RequestView> v = alloc_.Describe(g->id);
  if (!v.ok()) {
    return v.status();
  }
  if (v->state != drmgr::RequestState::kHardware) {
    absl::string_view why = v->reason;
    // kFail: refused at once ("no free slot: ..."), or when a decision changed ("waiting for a
    // slot: ...", it does not wait): the rest says why.
    if (!absl::ConsumePrefix(&why, "no free slot: ")) {
      absl::ConsumePrefix(&why, "waiting for a slot: ");
    }
    const std::string reason = PeopleReason(std::string(why.data(), why.size()));
    if (cpu < 0) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "watch #%d %s: no debug register free: %s; --kernel-accesses takes one debug "
          "register of every thread of the process per watch (4 at most, fewer when other "
          "tools hold some) and has no fallback (page protection cannot see the kernel's "
          "accesses): watch fewer objects at once",
          w + 1, labels_[w], reason));
    }
    return absl::ResourceExhaustedError(absl::StrFormat(
        "watch #%d %s on CPU %d: no debug register free: %s; kernel watches take one debug "
        "register per CPU each (4 per CPU at most, fewer when other tools hold some) and have "
        "no fallback: watch fewer objects at once",
        w + 1, labels_[w], cpu, reason));
  }
  return absl::OkStatus();
}

std::vector<KernelBreakpoint> KernelSlots::ReleaseCpu(int cpu) {
  std::vector<KernelBreakpoint> out;
  for (auto it = armed_.begin(); it != armed_.end();) {
    if (it->cpu == cpu) {
      out.push_back(std::move(*it));
      it = armed_.erase(it);
    } else {
      ++it;
    }
  }
  // Who holds that CPU's registers when it comes back is learned again.
  (void)alloc_.MarkExternallyHeld(drmgr::Scope::Cpu(cpu), 0);
  for (auto it = owner_.begin(); it != owner_.end();) {
    if (it->second.second == cpu) {
      // Its slots are closed above; the changes only disarm them (kFail: nobody waits).
      (void)alloc_.Release(it->first);
      it = owner_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

}  // namespace kwatch::watch::kernel
