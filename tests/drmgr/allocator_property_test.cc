// Property tests: random request/release/external/rotate sequences (seeded, thousands of
// steps), with every change list applied to the simulator and the invariants checked after
// every step; and ApplyWithRetry (drmgr/applier.h) against registers held outside kwatch.
#include <algorithm>
#include <array>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "drmgr/applier.h"
#include "drmgr/dr7.h"
#include "drmgr/placement.h"
#include "drmgr/range_cover.h"
#include "drmgr/simulator.h"
#include "drmgr/slot_allocator.h"

namespace kwatch::drmgr {
namespace {

constexpr std::array<Scope, 10> kScopes = {Scope::Thread(100, 101), Scope::Thread(100, 101),
                                           Scope::Thread(100, 101), Scope::Thread(100, 102),
                                           Scope::Process(100),     Scope::Thread(200, 201),
                                           Scope::Process(200),     Scope::Cpu(0),
                                           Scope::Cpu(1),           Scope::AllCpus()};

// A thread that carries the slots of `scope` (a new thread for a process scope).
Simulator::Access In(const Scope& s, uint64_t addr, core::AccessKind kind) {
  Simulator::Access a{core::RemoteAddr{addr}, 1, kind, 300, 301, 0};
  switch (s.kind) {
    case Scope::Kind::kThread:
      a.pid = s.pid;
      a.tid = s.tid;
      break;
    case Scope::Kind::kProcess:
      a.pid = s.pid;
      a.tid = 999;
      break;
    case Scope::Kind::kCpu:
      a.cpu = s.cpu;
      break;
    case Scope::Kind::kAllCpus:
      break;
  }
  return a;
}

bool Contains(const std::vector<RequestId>& v, RequestId id) {
  return std::find(v.begin(), v.end(), id) != v.end();
}

class Harness {
 public:
  explicit Harness(uint32_t seed, bool hidden_externals = false)
      : rng_(seed), hidden_externals_(hidden_externals) {
    clients_ = {alloc_.AddClient(ClientKind::kDebugger, "gdb"),
                alloc_.AddClient(ClientKind::kExecProbe, "probe"),
                alloc_.AddClient(ClientKind::kWatchpoint, "kwatch")};
  }

  int Rand(int n) { return static_cast<int>(rng_() % static_cast<uint32_t>(n)); }
  ClientId RandomClient() { return clients_[Rand(3)]; }

  SlotRequest RandomRequest() {
    SlotRequest r;
    r.scope = kScopes[Rand(static_cast<int>(kScopes.size()))];
    const int k = Rand(10);
    if (k == 0) {
      r.kind = DrKind::kExec;
      r.addr = core::RemoteAddr{0x401000 + static_cast<uint64_t>(Rand(4))};
      r.len = 1;
    } else {
      r.kind = k < 6 ? DrKind::kWrite : DrKind::kReadWrite;
      const int shape = Rand(20);
      if (shape < 9) {  // a naturally aligned field: often the same chunk as another request
        r.len = uint64_t{1} << Rand(4);
        r.addr = core::RemoteAddr{0x1000 + r.len * static_cast<uint64_t>(Rand(4))};
      } else {
        r.addr = core::RemoteAddr{0x1000 + static_cast<uint64_t>(Rand(48))};
        r.len = shape < 17 ? 1 + Rand(12) : 13 + Rand(28);
      }
    }
    r.priority = std::array{10, 10, 50, 100}[Rand(4)];
    r.policy = static_cast<ShortagePolicy>(Rand(4));
    if (!r.scope.is_task() && r.policy == ShortagePolicy::kFallbackPages) {
      r.policy = ShortagePolicy::kPreemptLower;
    }
    return r;
  }

  // Applies like an applier would: on ENOSPC, tell the allocator and retry.
  void Apply(Changes changes) {
    for (int tries = 0;; ++tries) {
      absl::Status s = sim_.Apply(changes);
      if (s.ok()) {
        return;
      }
      ASSERT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
      ASSERT_TRUE(hidden_externals_) << "refused without hidden slots: " << s;
      ASSERT_LT(tries, 16) << s;
      ++learned_;
      absl::StatusOr<Changes> retry = alloc_.ReportNoSpace(*sim_.refused_scope());
      ASSERT_TRUE(retry.ok()) << retry.status();
      changes = *std::move(retry);
    }
  }

  void Request() {
    absl::StatusOr<Grant> g = alloc_.Request(clients_[Rand(3)], RandomRequest());
    ASSERT_TRUE(g.ok()) << g.status();
    live_.push_back(g->id);
    Apply(g->changes);
  }

  void Release() {
    if (live_.empty()) {
      return;
    }
    const int i = Rand(static_cast<int>(live_.size()));
    absl::StatusOr<Changes> c = alloc_.Release(live_[i]);
    ASSERT_TRUE(c.ok()) << c.status();
    live_.erase(live_.begin() + i);
    Apply(*c);
  }

  void External() {
    const Scope s = kScopes[Rand(static_cast<int>(kScopes.size()))];
    const int n = Rand(3);
    // Outside holders are themselves bound by the 4 registers of a thread.
    Simulator outside_only;
    for (const auto& [scope, k] : outside_) {
      outside_only.SetExternal(scope, k);
    }
    outside_only.SetExternal(s, n);
    if (outside_only.MaxLoad() > kNumDebugRegisters) {
      return;
    }
    const int before = outside_[s];
    if (hidden_externals_ && Rand(2) == 0) {
      // Someone takes slots behind the allocator's back, when the kernel lets them.
      sim_.SetExternal(s, n);
      if (sim_.MaxLoad() > kNumDebugRegisters) {
        sim_.SetExternal(s, before);
      } else {
        outside_[s] = n;
      }
      return;
    }
    absl::StatusOr<Changes> c = alloc_.MarkExternallyHeld(s, n);
    ASSERT_TRUE(c.ok()) << c.status();
    if (n < before) {
      sim_.SetExternal(s, n);
      outside_[s] = n;
      Apply(*c);
      return;
    }
    Apply(*c);
    sim_.SetExternal(s, n);
    if (sim_.MaxLoad() > kNumDebugRegisters) {
      // Only possible while other holders are still unknown to the allocator.
      ASSERT_TRUE(hidden_externals_);
      sim_.SetExternal(s, before);
    } else {
      outside_[s] = n;
    }
  }

  void Rotate() {
    now_ += absl::Milliseconds(1 + Rand(15));
    Apply(alloc_.Rotate(now_));
  }

  // request B; release B == the snapshot (and registers) before B. Returns whether B took
  // hardware from anyone.
  bool RequestReleaseRestores(std::optional<SlotRequest> forced = std::nullopt) {
    const AllocatorSnapshot before = alloc_.Snapshot();
    const int learned = learned_;
    std::map<Scope, Simulator::Registers> regs;
    for (const ScopeView& s : before.scopes) {
      regs[s.scope] = sim_.RegistersOf(s.scope);
    }
    const SlotRequest b = forced ? *forced : RandomRequest();
    absl::StatusOr<Grant> g = alloc_.Request(clients_[Rand(3)], b);
    EXPECT_TRUE(g.ok()) << g.status();
    if (!g.ok()) {
      return false;
    }
    Apply(g->changes);
    bool evicted = false;
    for (const RequestChange& rc : g->changes.requests) {
      evicted = evicted || (rc.from.has_value() && rc.was_armed && !rc.armed);
    }
    const std::string during = alloc_.Snapshot().ToString();
    absl::StatusOr<Changes> c = alloc_.Release(g->id);
    EXPECT_TRUE(c.ok());
    Apply(c.value_or(Changes{}));
    const AllocatorSnapshot after = alloc_.Snapshot();
    if (learned != learned_) {
      return evicted;  // the allocator learned about slots held outside: a different state
    }
    EXPECT_EQ(after, before) << "before:\n"
                             << before.ToString() << "with B:\n"
                             << during << "after:\n"
                             << after.ToString();
    for (const auto& [scope, r] : regs) {
      EXPECT_EQ(sim_.RegistersOf(scope), r) << scope.ToString();
    }
    return evicted;
  }

  void CheckInvariants() const {
    ASSERT_LE(sim_.MaxLoad(), kNumDebugRegisters);
    const AllocatorSnapshot snap = alloc_.Snapshot();
    std::map<RequestId, const RequestView*> views;
    for (const RequestView& v : snap.requests) {
      views[v.id] = &v;
    }
    // The snapshot is what the registers hold.
    std::vector<Scope> seen_scopes;
    for (const ScopeView& sv : snap.scopes) {
      seen_scopes.push_back(sv.scope);
      const Simulator::Registers regs = sim_.RegistersOf(sv.scope);
      absl::StatusOr<Dr7> dr7 = DecodeDr7(regs.dr7);
      ASSERT_TRUE(dr7.ok());
      int own = 0;
      for (int i = 0; i < kNumDebugRegisters; ++i) {
        const SlotView& slot = sv.slots[i];
        const bool armed = slot.state == SlotState::kArmed ||
                           slot.state == SlotState::kMultiplexed ||
                           slot.state == SlotState::kPreempted;
        own += armed || slot.state == SlotState::kExternal ? 1 : 0;
        ASSERT_EQ(dr7->slots[i].enabled(), armed) << sv.scope.ToString() << " DR" << i;
        if (!armed) {
          continue;
        }
        ASSERT_EQ(regs.dr[i], slot.chunk.addr.value);
        ASSERT_EQ(DrLenBytes(dr7->slots[i].len), slot.chunk.len);
        ASSERT_EQ(dr7->slots[i].kind, slot.kind);
        std::vector<RequestId> holders;
        for (const SlotHolder& h : sim_.HoldersOf(sv.scope, i)) {
          holders.push_back(h.id);
        }
        ASSERT_EQ(holders, slot.holders);
      }
      ASSERT_EQ(own,
                std::min(kNumDebugRegisters, own - sv.external + alloc_.ExternallyHeld(sv.scope)));
    }
    for (const Scope& s : sim_.ArmedScopes()) {
      ASSERT_TRUE(std::find(seen_scopes.begin(), seen_scopes.end(), s) != seen_scopes.end());
    }
    for (const RequestView& v : snap.requests) {
      CheckCovered(v);
      CheckPriority(v, snap);
    }
  }

  // Every byte of a request in hardware traps for it with the right kind; nothing else does.
  void CheckCovered(const RequestView& v) const {
    const SlotRequest& r = v.request;
    const auto sees = [&](uint64_t addr, core::AccessKind kind) {
      return Contains(sim_.Simulate(In(r.scope, addr, kind)).seen, v.id);
    };
    ASSERT_EQ(v.armed, v.state == RequestState::kHardware ||
                           (v.state == RequestState::kMultiplexed && v.armed));
    if (!v.armed) {
      ASSERT_TRUE(v.chunks.empty());
      ASSERT_FALSE(sees(r.addr.value, r.kind == DrKind::kExec ? core::AccessKind::kExec
                                                              : core::AccessKind::kWrite));
      return;
    }
    if (r.kind == DrKind::kExec) {
      ASSERT_TRUE(sees(r.addr.value, core::AccessKind::kExec));
      ASSERT_FALSE(sees(r.addr.value + 1, core::AccessKind::kExec));
      return;
    }
    ASSERT_EQ(v.exact, BytesOutside(v.chunks, r.addr, r.len) == 0);
    for (uint64_t b = r.addr.value; b < r.addr.value + r.len; ++b) {
      ASSERT_TRUE(sees(b, core::AccessKind::kWrite)) << v.id.value << " byte " << b;
      ASSERT_EQ(sees(b, core::AccessKind::kRead), r.kind == DrKind::kReadWrite) << b;
    }
    ASSERT_FALSE(sees(r.addr.value - 1, core::AccessKind::kWrite));
    ASSERT_FALSE(sees(r.addr.value + r.len, core::AccessKind::kWrite));
  }

  // A waiting request could not fit even if every strictly lower-ranked request were gone:
  // rebuild the slots of the requests ranked above it (higher priority, or equal priority,
  // not multiplexed, earlier) and try it there.
  void CheckPriority(const RequestView& v, const AllocatorSnapshot& snap) const {
    if (v.armed || v.state == RequestState::kFailed ||
        v.request.policy == ShortagePolicy::kMultiplex) {
      return;
    }
    std::map<RequestId, const RequestView*> views;
    for (const RequestView& o : snap.requests) {
      views[o.id] = &o;
    }
    const auto above = [&](RequestId id) {
      const RequestView& h = *views.at(id);
      return h.request.priority > v.request.priority ||
             (h.request.priority == v.request.priority &&
              h.request.policy != ShortagePolicy::kMultiplex && h.id < v.id);
    };
    SlotLoad load;
    std::vector<std::pair<Scope, SlotView>> kept;
    for (const ScopeView& sv : snap.scopes) {
      load.Add(sv.scope, alloc_.ExternallyHeld(sv.scope));
      for (const SlotView& slot : sv.slots) {
        if (std::any_of(slot.holders.begin(), slot.holders.end(), above)) {
          load.Add(sv.scope, 1);
          kept.emplace_back(sv.scope, slot);
        }
      }
    }
    const SlotRequest& r = v.request;
    const auto held = [&](const Chunk& c) {
      return std::any_of(kept.begin(), kept.end(), [&](const auto& k) {
        return k.first == r.scope && k.second.chunk == c &&
               (k.second.kind == DrKind::kExec) == (r.kind == DrKind::kExec);
      });
    };
    const int free = load.Free(r.scope);
    const bool fits = r.kind == DrKind::kExec
                          ? held(Chunk{r.addr, 1}) || free > 0
                          : ChooseCover(r.addr, r.len, free, held).kind != CoverChoice::Kind::kNone;
    ASSERT_FALSE(fits) << "request " << v.id.value << " waits while lower ranks hold its slots\n"
                       << snap.ToString();
  }

  void Run(int steps) {
    for (int step = 0; step < steps; ++step) {
      const int op = live_.size() > 16 ? 50 : Rand(100);
      if (op < 40) {
        Request();
      } else if (op < 72) {
        Release();
      } else if (op < 78) {
        External();
      } else if (op < 88) {
        Rotate();
      } else {
        RequestReleaseRestores();
      }
      if (::testing::Test::HasFatalFailure()) {
        ADD_FAILURE() << "at step " << step;
        return;
      }
      CheckInvariants();
      if (::testing::Test::HasFatalFailure()) {
        ADD_FAILURE() << "at step " << step << "\n" << alloc_.Snapshot().ToString();
        return;
      }
    }
  }

  SlotAllocator alloc_;
  Simulator sim_;

 private:
  std::mt19937 rng_;
  bool hidden_externals_;
  std::vector<ClientId> clients_;
  std::vector<RequestId> live_;
  std::map<Scope, int> outside_;
  int learned_ =
      0;  // ReportNoSpace calls  // all slots held outside kwatch, as the simulator has them
  absl::Time now_ = absl::UnixEpoch();
};

class AllocatorProperty : public ::testing::TestWithParam<uint32_t> {};

TEST_P(AllocatorProperty, RandomSequencesKeepTheInvariants) {
  Harness h(GetParam());
  h.Run(10000);
}

// A high-priority request that preempts others, released at once, leaves no trace.
TEST_P(AllocatorProperty, PreemptionIsUndoneByRelease) {
  Harness h(GetParam() + 100);
  int evictions = 0;
  for (int round = 0; round < 400; ++round) {
    h.Run(5);
    if (::testing::Test::HasFailure()) {
      return;
    }
    SlotRequest b = h.RandomRequest();
    b.priority = 1000;
    b.policy = ShortagePolicy::kPreemptLower;
    evictions += h.RequestReleaseRestores(b) ? 1 : 0;
    if (::testing::Test::HasFailure()) {
      ADD_FAILURE() << "round " << round;
      return;
    }
  }
  EXPECT_GT(evictions, 50);  // ~100 per seed: the check above ran on real preemptions
}

TEST_P(AllocatorProperty, SlotsTakenBehindItsBackAreLearned) {
  Harness h(GetParam() * 7919, /*hidden_externals=*/true);
  h.Run(5000);
}

TEST_P(AllocatorProperty, Deterministic) {
  Harness a(GetParam());
  Harness b(GetParam());
  a.Run(500);
  b.Run(500);
  EXPECT_EQ(a.alloc_.Snapshot(), b.alloc_.Snapshot());
}

// Multiplexing over a fixed set of requests: the time armed, as the allocator reports it,
// matches what the registers held; no thread carries more than 4 slots on average either;
// every multiplexed request gets a turn.
TEST_P(AllocatorProperty, MultiplexCoverageAddsUp) {
  std::mt19937 rng(GetParam());
  const auto rand = [&](int n) { return static_cast<int>(rng() % static_cast<uint32_t>(n)); };
  for (int round = 0; round < 20; ++round) {
    SlotAllocator::Options opts;
    opts.rotate_interval = absl::Milliseconds(5);
    SlotAllocator alloc(opts);
    Simulator sim;
    const ClientId client = alloc.AddClient(ClientKind::kWatchpoint, "");
    const std::vector<Scope> scopes = {Scope::Thread(100, 101), Scope::Thread(100, 102),
                                       Scope::Process(100)};
    std::vector<RequestId> ids;
    const int pinned = rand(3);
    const int muxed = 5 + rand(8);
    for (int i = 0; i < pinned + muxed; ++i) {
      SlotRequest r;
      r.addr =
          core::RemoteAddr{0x1000 + 64 * static_cast<uint64_t>(i) + static_cast<uint64_t>(rand(8))};
      r.len = 1 + rand(16);
      r.kind = rand(2) == 0 ? DrKind::kWrite : DrKind::kReadWrite;
      r.scope = scopes[rand(3)];
      r.priority = i < pinned ? 10 + 40 * rand(2) : 10;
      r.policy = i < pinned ? ShortagePolicy::kFail : ShortagePolicy::kMultiplex;
      absl::StatusOr<Grant> g = alloc.Request(client, r);
      ASSERT_TRUE(g.ok());
      ASSERT_TRUE(sim.Apply(g->changes).ok());
      ids.push_back(g->id);
    }
    absl::Time now = absl::UnixEpoch();
    alloc.AdvanceClock(now);
    const absl::Duration dt = absl::Milliseconds(5);
    std::map<RequestId, absl::Duration> armed;
    // Slot-time each physical thread carried: thread 101, thread 102, a new thread.
    std::map<pid_t, absl::Duration> slot_time;
    const int steps = 6 * muxed;
    for (int step = 0; step < steps; ++step) {
      for (const RequestView& v : alloc.Snapshot().requests) {
        if (!v.armed) {
          continue;
        }
        armed[v.id] += dt;
        for (pid_t tid : {101, 102, 999}) {
          if (v.request.scope.kind == Scope::Kind::kProcess || v.request.scope.tid == tid) {
            slot_time[tid] += dt * static_cast<int64_t>(v.chunks.size());
          }
        }
      }
      now += dt;
      ASSERT_TRUE(sim.Apply(alloc.Rotate(now)).ok());
      ASSERT_LE(sim.MaxLoad(), kNumDebugRegisters);
    }
    const absl::Duration total = dt * steps;
    std::map<pid_t, double> coverage_sum;
    for (RequestId id : ids) {
      absl::StatusOr<RequestView> v = alloc.Describe(id);
      ASSERT_TRUE(v.ok());
      EXPECT_EQ(v->time_enabled, v->state == RequestState::kFailed ? absl::ZeroDuration() : total);
      EXPECT_EQ(v->time_armed, armed[id]) << id.value;
      if (v->state == RequestState::kMultiplexed) {
        EXPECT_GT(v->coverage(), 0.0) << "request " << id.value << " never got a turn\n"
                                      << alloc.Snapshot().ToString();
      }
      for (pid_t tid : {101, 102, 999}) {
        if (v->request.scope.kind == Scope::Kind::kProcess || v->request.scope.tid == tid) {
          coverage_sum[tid] += v->coverage();
        }
      }
    }
    for (pid_t tid : {101, 102, 999}) {
      EXPECT_LE(coverage_sum[tid], kNumDebugRegisters + 1e-9) << tid;
      EXPECT_LE(absl::FDivDuration(slot_time[tid], total), kNumDebugRegisters + 1e-9) << tid;
    }
  }
}

// ApplyWithRetry, the one ENOSPC loop of every applier, against registers the simulator holds
// "outside kwatch" (a debugger, another tool) unknown to the allocator: every change list ends
// applied, every request either placed on registers nobody outside holds, or refused with
// drmgr's reason; no register ever carries both a kwatch slot and an outside holder.
TEST_P(AllocatorProperty, ApplyWithRetryPlacesOrRefusesAroundRegistersHeldOutside) {
  int learned = 0;  // ReportNoSpace calls made by ApplyWithRetry, over all rounds
  int refused = 0;  // requests left out of hardware with a reason naming the outside holders
  for (int round = 0; round < 40; ++round) {
    Harness h(GetParam() * 31 + static_cast<uint32_t>(round), /*hidden_externals=*/true);
    // Registers held outside kwatch, bound like anyone by the four of each thread and CPU.
    std::map<Scope, int> outside;
    for (int i = 0; i < 3; ++i) {
      const Scope s = kScopes[h.Rand(static_cast<int>(kScopes.size()))];
      const int n = 1 + h.Rand(3);
      h.sim_.SetExternal(s, n);
      if (h.sim_.MaxLoad() > kNumDebugRegisters) {
        h.sim_.SetExternal(s, outside[s]);
      } else {
        outside[s] = n;
      }
    }
    const auto known = [&] {
      int n = 0;
      for (const Scope& scope : std::set<Scope>(kScopes.begin(), kScopes.end())) {
        n += h.alloc_.ExternallyHeld(scope);
      }
      return n;
    };
    std::vector<RequestId> live;
    for (int step = 0; step < 60; ++step) {
      const int before = known();
      absl::StatusOr<Changes> changes;
      const int op = h.Rand(10);
      if (op < 6 || live.empty()) {
        absl::StatusOr<Grant> g = h.alloc_.Request(h.RandomClient(), h.RandomRequest());
        ASSERT_TRUE(g.ok()) << g.status();
        live.push_back(g->id);
        changes = std::move(g->changes);
      } else if (op < 9) {
        const int i = h.Rand(static_cast<int>(live.size()));
        changes = h.alloc_.Release(live[i]);
        live.erase(live.begin() + i);
      } else {
        changes = h.alloc_.Rotate(absl::UnixEpoch() + absl::Milliseconds(20 * (step + 1)));
      }
      ASSERT_TRUE(changes.ok()) << changes.status();
      const absl::Status s = ApplyWithRetry(h.alloc_, h.sim_, *std::move(changes));
      ASSERT_TRUE(s.ok()) << "round " << round << " step " << step << ": " << s << "\n"
                          << h.alloc_.Snapshot().ToString();
      learned += known() - before;
      // Never two holders on one register: kwatch's slots and the outside ones fit in four.
      ASSERT_LE(h.sim_.MaxLoad(), kNumDebugRegisters);
      // The registers are what drmgr decided, and every armed request sees its bytes.
      h.CheckInvariants();
      if (::testing::Test::HasFatalFailure()) {
        ADD_FAILURE() << "round " << round << " step " << step;
        return;
      }
      for (const RequestView& v : h.alloc_.Snapshot().requests) {
        if (v.armed) {
          continue;
        }
        ASSERT_NE(v.state, RequestState::kHardware) << v.id.value;
        ASSERT_FALSE(v.reason.empty()) << "request " << v.id.value << " refused without a reason";
        // Waiting for a register: drmgr's reason, decided again at every change, counts the
        // ones held outside. (A request refused at admission keeps the reason it got then.)
        const bool short_of_slots = v.state != RequestState::kFailed &&
                                    (absl::StrContains(v.reason, "waiting for a slot") ||
                                     absl::StartsWith(v.reason, "page protection until a slot"));
        bool outside_known = false;
        for (const Scope& scope : kScopes) {
          outside_known = outside_known ||
                          (h.alloc_.ExternallyHeld(scope) > 0 && Overlaps(scope, v.request.scope));
        }
        if (short_of_slots && outside_known) {
          ASSERT_TRUE(absl::StrContains(v.reason, "held outside kwatch"))
              << "request " << v.id.value << ": " << v.reason;
          ++refused;
        }
      }
    }
  }
  EXPECT_GT(learned, 20);  // the retry ran
  EXPECT_GT(refused, 5);   // ... and left requests out with drmgr's reason
}

INSTANTIATE_TEST_SUITE_P(Seeds, AllocatorProperty, ::testing::Values(1U, 2U, 3U, 20240611U));

}  // namespace
}  // namespace kwatch::drmgr
