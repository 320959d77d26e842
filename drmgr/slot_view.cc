#include "drmgr/slot_view.h"

#include <algorithm>
#include <array>
#include <cstddef>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kwatch::drmgr {

namespace {

// Whether slots of `scope` sit in the debug registers of thread `tid` of `pid`.
bool OnThread(const Scope& scope, pid_t pid, pid_t tid) {
  return (scope.kind == Scope::Kind::kProcess && scope.pid == pid) ||
         (scope.kind == Scope::Kind::kThread && scope.pid == pid && scope.tid == tid);
}

// kwatch's rows of thread `tid`, each with the index its allocator gave it.
std::vector<std::pair<int, SlotRow>> KwatchRows(pid_t pid, pid_t tid,
                                                const std::vector<PublishedSlots>& sessions) {
  std::vector<std::pair<int, SlotRow>> mine;
  for (const bool process_wide : {true, false}) {
    for (const PublishedSlots& s : sessions) {
      for (const ScopeView& sv : s.snapshot.scopes) {
        if (!OnThread(sv.scope, pid, tid) ||
            (sv.scope.kind == Scope::Kind::kProcess) != process_wide) {
          continue;
        }
        for (int i = 0; i < kNumDebugRegisters; ++i) {
          const SlotView& v = sv.slots[static_cast<size_t>(i)];
          if (v.state != SlotState::kArmed && v.state != SlotState::kMultiplexed &&
              v.state != SlotState::kPreempted) {
            continue;
          }
          SlotRow row;
          row.state = v.state;
          row.kwatch_pid = s.kwatch_pid;
          row.requests = v.holders;
          for (const RequestId id : v.holders) {
            row.labels.push_back(RequestLabel(s.snapshot, id));
          }
          for (const RequestId id : v.displaced) {
            row.waiting.push_back(RequestLabel(s.snapshot, id));
          }
          row.chunk = v.chunk;
          row.kind = v.kind;
          row.coverage = v.coverage;
          mine.emplace_back(i, std::move(row));
        }
      }
    }
  }
  return mine;
}

}  // namespace

std::string RequestLabel(const AllocatorSnapshot& snapshot, RequestId id) {
  for (const RequestView& r : snapshot.requests) {
    if (r.id == id && !r.request.label.empty()) {
      return r.request.label;
    }
  }
  return absl::StrCat("request ", id.value);
}

ThreadSlots ComposeThreadSlots(pid_t pid, pid_t tid, int free,
                               const std::vector<PublishedSlots>& sessions,
                               std::vector<std::string>& notes) {
  ThreadSlots t;
  t.tid = tid;
  t.free = free;
  std::vector<std::pair<int, SlotRow>> mine = KwatchRows(pid, tid, sessions);
  t.kwatch = static_cast<int>(mine.size());
  const int used = kNumDebugRegisters - free;
  t.external = std::max(0, used - t.kwatch);
  if (t.kwatch > used) {
    notes.push_back(absl::StrFormat(
        "thread %d: kwatch sessions published %d slots but the kernel shows %d in use (a "
        "session is changing its slots, or its last publication is out of date)",
        tid, t.kwatch, used));
  }
  std::array<bool, kNumDebugRegisters> taken{};
  std::vector<SlotRow> placed;
  std::vector<SlotRow> later;
  for (auto& [index, row] : mine) {
    if (!taken[static_cast<size_t>(index)]) {
      taken[static_cast<size_t>(index)] = true;
      row.dr = index;
      placed.push_back(std::move(row));
    } else {
      later.push_back(std::move(row));
    }
  }
  for (SlotRow& row : later) {
    row.dr = -1;
    for (int i = 0; i < kNumDebugRegisters && row.dr < 0; ++i) {
      if (!taken[static_cast<size_t>(i)]) {
        taken[static_cast<size_t>(i)] = true;
        row.dr = i;
      }
    }
    placed.push_back(std::move(row));  // dr -1: more than four (an out-of-date publication)
  }
  int external = t.external;
  for (int i = kNumDebugRegisters - 1; i >= 0; --i) {
    if (taken[static_cast<size_t>(i)]) {
      continue;
    }
    SlotRow row;
    row.dr = i;
    row.state = external > 0 ? SlotState::kExternal : SlotState::kFree;
    external -= external > 0 ? 1 : 0;
    placed.push_back(std::move(row));
  }
  std::sort(placed.begin(), placed.end(), [](const SlotRow& a, const SlotRow& b) {
    return static_cast<unsigned>(a.dr) < static_cast<unsigned>(b.dr);  // -1 last
  });
  t.rows = std::move(placed);
  return t;
}

std::vector<WaitingRequest> NotInHardware(pid_t pid, const std::vector<PublishedSlots>& sessions) {
  std::vector<WaitingRequest> out;
  for (const PublishedSlots& s : sessions) {
    for (const RequestView& r : s.snapshot.requests) {
      if (!r.armed && r.request.scope.is_task() && r.request.scope.pid == pid) {
        out.push_back(WaitingRequest{s.kwatch_pid, r});
      }
    }
  }
  return out;
}

std::vector<CpuSlots> KernelCpuSlots(const PublishedSlots& session) {
  std::vector<CpuSlots> out;
  for (const ScopeView& sv : session.snapshot.scopes) {
    if (sv.scope.kind != Scope::Kind::kCpu) {
      continue;
    }
    CpuSlots t;
    t.cpu = sv.scope.cpu;
    t.external = sv.external;
    t.free = sv.free;
    for (int i = 0; i < kNumDebugRegisters; ++i) {
      const SlotView& v = sv.slots[static_cast<size_t>(i)];
      SlotRow row;
      row.dr = i;
      row.state = v.state;
      if (!v.holders.empty()) {
        ++t.kwatch;
        row.kwatch_pid = session.kwatch_pid;
        row.requests = v.holders;
        for (const RequestId id : v.holders) {
          row.labels.push_back(RequestLabel(session.snapshot, id));
        }
        row.chunk = v.chunk;
        row.kind = v.kind;
      }
      t.rows.push_back(std::move(row));
    }
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace kwatch::drmgr
