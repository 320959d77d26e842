#include "drmgr/placement.h"

#include <algorithm>
#include <numeric>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/base/status_macros.h"

namespace kwatch::drmgr {

void SlotLoad::Add(const Scope& scope, int n) {
  KW_CHECK(n >= 0);
  if (n == 0) {
    return;
  }
  const int own = own_[scope] += n;
  switch (scope.kind) {
    case Scope::Kind::kThread: {
      int& t = max_thread_[scope.pid];
      t = std::max(t, own);
      max_task_ = std::max(max_task_, t + Own(Scope::Process(scope.pid)));
      break;
    }
    case Scope::Kind::kProcess:
      max_task_ = std::max(max_task_, own + MaxThreadOf(scope.pid));
      break;
    case Scope::Kind::kCpu:
      max_cpu_ = std::max(max_cpu_, own);
      break;
    case Scope::Kind::kAllCpus:
      break;
  }
}

int SlotLoad::Own(const Scope& scope) const {
  auto it = own_.find(scope);
  return it == own_.end() ? 0 : it->second;
}

int SlotLoad::MaxThreadOf(pid_t pid) const {
  auto it = max_thread_.find(pid);
  return it == max_thread_.end() ? 0 : it->second;
}

int SlotLoad::Free(const Scope& scope) const {
  const int all = Own(Scope::AllCpus());
  int used = 0;
  switch (scope.kind) {
    case Scope::Kind::kThread:
      used = Own(scope) + Own(Scope::Process(scope.pid)) + all + max_cpu_;
      break;
    case Scope::Kind::kProcess:
      used = Own(scope) + MaxThreadOf(scope.pid) + all + max_cpu_;
      break;
    case Scope::Kind::kCpu:
      used = Own(scope) + all + max_task_;
      break;
    case Scope::Kind::kAllCpus:
      used = all + max_cpu_ + max_task_;
      break;
  }
  return std::max(0, kNumDebugRegisters - used);
}

namespace {

bool IsExec(DrKind kind) {
  return kind == DrKind::kExec;
}

struct State {
  std::vector<PlacedSlot> slots;
  std::map<std::tuple<Scope, Chunk, bool>, size_t> by_chunk;  // index into slots
  SlotLoad load;
};

// The slot of `scope` that a chunk of this kind can share, or -1.
int FindShare(const State& st, const Scope& scope, const Chunk& chunk, DrKind kind) {
  auto it = st.by_chunk.find({scope, chunk, IsExec(kind)});
  return it == st.by_chunk.end() ? -1 : static_cast<int>(it->second);
}

CoverChoice Fit(const State& st, const SlotRequest& req) {
  const int free = st.load.Free(req.scope);
  if (req.kind == DrKind::kExec) {
    CoverChoice c;
    const Chunk chunk{req.addr, 1};
    const bool held = FindShare(st, req.scope, chunk, req.kind) >= 0;
    c.new_slots = held ? 0 : 1;
    if (c.new_slots <= free) {
      c.kind = CoverChoice::Kind::kExact;
      c.chunks = {chunk};
      c.explanation = absl::StrFormat("execute breakpoint at 0x%x: 1 exact slot%s", req.addr.value,
                                      held ? ", shared with another request" : "");
    } else {
      c.explanation =
          absl::StrFormat("execute breakpoint at 0x%x needs 1 slot, 0 free", req.addr.value);
    }
    return c;
  }
  return ChooseCover(req.addr, req.len, free,
                     [&](const Chunk& c) { return FindShare(st, req.scope, c, req.kind) >= 0; });
}

void Place(State& st, RequestId id, const SlotRequest& req, Placement& p) {
  for (const Chunk& c : p.cover.chunks) {
    int idx = FindShare(st, req.scope, c, req.kind);
    if (idx < 0) {
      idx = static_cast<int>(st.slots.size());
      st.slots.push_back(PlacedSlot{req.scope, c, req.kind, {}});
      st.by_chunk.emplace(std::make_tuple(req.scope, c, IsExec(req.kind)), st.slots.size() - 1);
      st.load.Add(req.scope, 1);
    }
    PlacedSlot& slot = st.slots[idx];
    if (req.kind == DrKind::kReadWrite) {
      slot.kind = DrKind::kReadWrite;
    }
    slot.holders.push_back(id);
    p.slots.push_back(static_cast<size_t>(idx));
  }
  p.armed = true;
}

std::string Blockers(const State& st, const Scope& scope, const std::map<Scope, int>& external,
                     const std::map<RequestId, const RankedRequest*>& by_id) {
  std::vector<RequestId> ids;
  for (const PlacedSlot& s : st.slots) {
    if (!Overlaps(s.scope, scope)) {
      continue;
    }
    for (RequestId h : s.holders) {
      if (std::find(ids.begin(), ids.end(), h) == ids.end()) {
        ids.push_back(h);
      }
    }
  }
  int ext = 0;
  for (const auto& [s, n] : external) {
    if (Overlaps(s, scope)) {
      ext += n;
    }
  }
  std::vector<std::string> parts;
  if (!ids.empty()) {
    constexpr size_t kShown = 4;
    std::vector<std::string> names;
    for (size_t i = 0; i < ids.size() && i < kShown; ++i) {
      names.push_back(*by_id.at(ids[i])->who);
    }
    std::string held = absl::StrCat("held by ", absl::StrJoin(names, ", "));
    if (ids.size() > kShown) {
      absl::StrAppend(&held, " and ", ids.size() - kShown, " more");
    }
    parts.push_back(std::move(held));
  }
  if (ext > 0) {
    parts.push_back(absl::StrCat(ext, " held outside kwatch"));
  }
  if (parts.empty()) {
    return "";
  }
  return absl::StrCat(" (", scope.ToString(), ": ", absl::StrJoin(parts, "; "), ")");
}

std::string IdList(const std::vector<RequestId>& ids, RequestId except) {
  std::vector<std::string> out;
  for (RequestId id : ids) {
    if (id != except) {
      out.push_back(absl::StrCat(id.value));
    }
  }
  return absl::StrCat(out.size() == 1 ? "request " : "requests ", absl::StrJoin(out, ", "));
}

// Union-find over the kMultiplex requests of one priority, joined when their scopes overlap.
std::vector<int> Components(const std::vector<const RankedRequest*>& group) {
  std::vector<int> parent(group.size());
  std::iota(parent.begin(), parent.end(), 0);
  const auto find = [&](int x) {
    while (parent[x] != x) {
      x = parent[x] = parent[parent[x]];
    }
    return x;
  };
  for (size_t i = 0; i < group.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (Overlaps(group[i]->request->scope, group[j]->request->scope)) {
        parent[find(static_cast<int>(i))] = find(static_cast<int>(j));
      }
    }
  }
  std::vector<int> roots(group.size());
  for (size_t i = 0; i < group.size(); ++i) {
    roots[i] = find(static_cast<int>(i));
  }
  return roots;
}

}  // namespace

Decision Decide(const std::vector<RankedRequest>& ranked, const std::map<Scope, int>& external) {
  Decision d;
  State st;
  for (const auto& [scope, n] : external) {
    st.load.Add(scope, n);
  }
  std::map<RequestId, const RankedRequest*> by_id;
  for (const RankedRequest& r : ranked) {
    by_id[r.id] = &r;
  }
  std::map<RequestId, std::string> shortage;  // why a short request did not fit
  std::map<RequestId, bool> fits_first;       // kMultiplex: fits ahead of its peers
  std::optional<State> mux_base;              // state before the kMultiplex run of a priority
  int mux_priority = 0;
  std::vector<const RankedRequest*> group;  // the current kMultiplex run
  std::vector<std::vector<const RankedRequest*>> groups;

  for (const RankedRequest& r : ranked) {
    Placement& p = d.requests[r.id];
    if (r.failed->has_value()) {
      p.state = RequestState::kFailed;
      p.reason = **r.failed;
      continue;
    }
    const SlotRequest& req = *r.request;
    const bool mux = req.policy == ShortagePolicy::kMultiplex;
    if (mux && (!mux_base || mux_priority != req.priority)) {
      if (!group.empty()) {
        groups.push_back(std::move(group));
        group.clear();
      }
      mux_base = st;
      mux_priority = req.priority;
    }
    if (mux) {
      group.push_back(&r);
      fits_first[r.id] = Fit(*mux_base, req).kind != CoverChoice::Kind::kNone;
    }
    p.cover = Fit(st, req);
    if (p.cover.kind != CoverChoice::Kind::kNone) {
      Place(st, r.id, req, p);
      p.state = RequestState::kHardware;
      p.reason = p.cover.explanation;
      continue;
    }
    shortage[r.id] = p.cover.explanation + Blockers(st, req.scope, external, by_id);
    p.cover.chunks.clear();
    switch (req.policy) {
      case ShortagePolicy::kFail:
      case ShortagePolicy::kPreemptLower:
      case ShortagePolicy::kMultiplex:  // settled below
        p.state = RequestState::kPreempted;
        p.reason = absl::StrCat("waiting for a slot: ", shortage[r.id]);
        break;
      case ShortagePolicy::kFallbackPages:
        p.state = RequestState::kFallbackPages;
        p.reason = absl::StrCat("page protection until a slot frees: ", shortage[r.id]);
        break;
    }
  }
  if (!group.empty()) {
    groups.push_back(std::move(group));
  }

  // Rotation components: kMultiplex requests of one priority whose scopes overlap.
  for (const auto& g : groups) {
    const std::vector<int> roots = Components(g);
    std::map<int, int> component_of_root;
    for (size_t i = 0; i < g.size(); ++i) {
      auto [it, inserted] =
          component_of_root.emplace(roots[i], static_cast<int>(d.contended.size()));
      if (inserted) {
        d.contended.push_back(false);
        d.members.emplace_back();
      }
      const int c = it->second;
      Placement& p = d.requests[g[i]->id];
      p.component = c;
      p.rotating = fits_first[g[i]->id];
      if (p.rotating) {
        d.members[c].push_back(g[i]->id);
        if (!p.armed) {
          d.contended[c] = true;
        }
      }
    }
    for (const RankedRequest* r : g) {
      Placement& p = d.requests[r->id];
      if (!d.contended[p.component]) {
        if (!p.armed) {
          p.reason = absl::StrCat("waiting for a slot, no multiplexed request of priority ",
                                  r->request->priority, " to take turns with: ", shortage[r->id]);
        }
        continue;
      }
      const std::string peers = IdList(d.members[p.component], r->id);
      if (p.armed) {
        p.state = RequestState::kMultiplexed;
        p.reason = absl::StrCat(p.cover.explanation, "; taking turns with ", peers);
      } else if (p.rotating) {
        p.state = RequestState::kMultiplexed;
        p.reason =
            absl::StrCat("multiplexed, waiting for its turn with ", peers, ": ", shortage[r->id]);
      }
    }
  }

  for (const PlacedSlot& s : st.slots) {
    for (RequestId h : s.holders) {
      Placement& p = d.requests[h];
      p.shared = p.shared || s.holders.size() > 1;
      if (s.kind == DrKind::kReadWrite && by_id.at(h)->request->kind == DrKind::kWrite) {
        p.filter_reads = true;
      }
    }
  }
  d.slots = std::move(st.slots);
  d.load = std::move(st.load);
  return d;
}

}  // namespace kwatch::drmgr
