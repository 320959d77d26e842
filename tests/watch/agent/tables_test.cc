#include "watch/agent/tables.h"

#include <cstring>
#include <optional>
#include <vector>

#include <gtest/gtest.h>

#include "agent/abi.h"
#include "watch/agent/shm_layout.h"

namespace kwatch::watch::agent {
namespace {

namespace ka = kwatch::agent;

// A page-aligned, zeroed buffer standing in for the memfd mapping.
struct Shm {
  explicit Shm(const ShmConfig& config) {
    auto l = ComputeLayout(config);
    EXPECT_TRUE(l.ok()) << l.status();
    layout = *l;
    bytes.assign(layout.total_size / 8 + 8, 0);
    InitControl(span(), layout, 0, 1, 2);
  }
  std::span<uint8_t> span() {
    return std::span<uint8_t>(reinterpret_cast<uint8_t*>(bytes.data()), layout.total_size);
  }
  ShmLayout layout;
  std::vector<uint64_t> bytes;  // 8-byte aligned
};

// The agent's lookup, written from agent/abi.h alone: the control block's offsets, the hash
// (addr * 0x9E3779B97F4A7C15) >> (64 - log2(capacity)), linear probing, 0 empty, ~0 deleted,
// and the seqlock on generation. Returns the probe index and copies the probe's id.
std::optional<uint32_t> AgentLookup(const uint8_t* shm, uint64_t addr, uint32_t* id) {
  const auto* c = reinterpret_cast<const ka::KwControl*>(shm);
  int shift = 64;
  for (uint32_t cap = c->hash_capacity; cap > 1; cap >>= 1) {
    --shift;
  }
  for (;;) {
    const uint32_t g = c->generation.load(std::memory_order_acquire);
    if ((g & 1) != 0) {
      continue;
    }
    std::optional<uint32_t> found;
    const auto* slots = reinterpret_cast<const ka::KwProbeSlot*>(shm + c->hash_offset);
    uint32_t i = static_cast<uint32_t>((addr * 0x9E3779B97F4A7C15ULL) >> shift);
    for (uint32_t n = 0; n < c->hash_capacity; ++n, i = (i + 1) & (c->hash_capacity - 1)) {
      const uint64_t a = slots[i].addr.load(std::memory_order_acquire);
      if (a == 0) {
        break;
      }
      if (a == addr) {
        found = slots[i].probe_index;
        break;
      }
    }
    if (found.has_value()) {
      const auto* probes = reinterpret_cast<const ka::KwProbe*>(shm + c->probes_offset);
      *id = probes[*found].id;
    }
    std::atomic_thread_fence(std::memory_order_acquire);
    if (c->generation.load(std::memory_order_relaxed) == g) {
      return found;
    }
  }
}

// The hash slot the agent starts at for `addr`.
uint32_t Home(uint64_t addr, uint32_t capacity) {
  int shift = 64;
  for (uint32_t cap = capacity; cap > 1; cap >>= 1) {
    --shift;
  }
  return static_cast<uint32_t>((addr * 0x9E3779B97F4A7C15ULL) >> shift);
}

// `n` addresses that all start at the same slot (collisions).
std::vector<uint64_t> Colliding(uint32_t capacity, size_t n) {
  std::vector<uint64_t> out;
  const uint32_t home = Home(0x401000, capacity);
  for (uint64_t a = 0x401000; out.size() < n; ++a) {
    if (Home(a, capacity) == home) {
      out.push_back(a);
    }
  }
  return out;
}

ProbeEntry Entry(uint32_t id, uint64_t addr, size_t ops = 2) {
  ProbeEntry e;
  e.id = id;
  e.addr = core::RemoteAddr{addr};
  for (size_t i = 0; i < ops; ++i) {
    e.program.push_back(ka::KwFetchOp{.op = ka::kKwOpReg, .a = ka::kKwRdi, .b = 8, .imm = 0});
  }
  e.record_bytes = 64;
  return e;
}

TEST(ShmLayout, EveryPartIsAlignedAndInOrder) {
  auto l = ComputeLayout(ShmConfig{.probe_capacity = 100,
                                   .code_capacity = 1000,
                                   .thread_capacity = 8,
                                   .ring_bytes = 8192,
                                   .process_capacity = 10});
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->hash_capacity, 256u);  // >= 2 x 100, a power of two
  EXPECT_EQ(l->patch_capacity, 100u);
  EXPECT_EQ(l->probes_offset, sizeof(ka::KwControl));  // a multiple of 64 (alignas)
  for (uint64_t off : {l->probes_offset, l->hash_offset, l->code_offset, l->patches_offset,
                       l->processes_offset, l->threads_offset, l->rings_offset}) {
    EXPECT_EQ(off % 64, 0u);
  }
  EXPECT_EQ(l->hash_offset, l->probes_offset + 100 * sizeof(ka::KwProbe));
  EXPECT_EQ(l->code_offset, l->hash_offset + 256 * sizeof(ka::KwProbeSlot));
  EXPECT_EQ(l->patches_offset, l->code_offset + 1000 * sizeof(ka::KwFetchOp));
  EXPECT_EQ(l->processes_offset, l->patches_offset + 100 * sizeof(ka::KwPatch));
  EXPECT_EQ(l->process_capacity, 10u);
  // 10 entries of 16 bytes, up to the next 64.
  EXPECT_EQ(l->threads_offset, l->processes_offset + 192);
  EXPECT_EQ(l->rings_offset, l->threads_offset + 8 * sizeof(ka::KwThread));
  EXPECT_EQ(l->total_size, (l->rings_offset + 8 * (192 + 8192) + 4095) / 4096 * 4096);
}

TEST(ShmLayout, RefusesWhatTheAgentCannotUse) {
  EXPECT_FALSE(ComputeLayout(ShmConfig{.ring_bytes = 5000}).ok());
  EXPECT_FALSE(ComputeLayout(ShmConfig{.ring_bytes = 1024}).ok());
  EXPECT_FALSE(ComputeLayout(ShmConfig{.probe_capacity = 0}).ok());
  EXPECT_FALSE(ComputeLayout(ShmConfig{.probe_capacity = 64, .hash_capacity = 64}).ok());
  EXPECT_FALSE(ComputeLayout(ShmConfig{.thread_capacity = 100000, .ring_bytes = 1 << 20}).ok());
}

TEST(ShmLayout, TheControlBlockSaysWhatTheAgentChecks) {
  Shm shm(ShmConfig{.thread_capacity = 4, .ring_bytes = 4096});
  const auto* c = reinterpret_cast<const ka::KwControl*>(shm.span().data());
  EXPECT_EQ(c->magic, ka::kKwMagic);
  EXPECT_EQ(c->abi_version, ka::kKwAbiVersion);
  EXPECT_EQ(c->total_size, shm.layout.total_size);
  EXPECT_EQ(c->controller_pid, 1);
  EXPECT_EQ(c->target_pid, 2);
  EXPECT_EQ(c->state.load(), ka::kKwStateInit);
  EXPECT_EQ(c->ring_count, 4u);
  EXPECT_EQ(c->ring_bytes, 4096u);
  EXPECT_EQ(c->processes_offset, shm.layout.processes_offset);
  EXPECT_EQ(c->process_capacity, 1024u);
  EXPECT_EQ(c->rings_offset, shm.layout.rings_offset);
}

TEST(ShmTables, ProbesAreFoundAsTheAgentLooksThemUpThroughCollisions) {
  Shm shm(ShmConfig{
      .probe_capacity = 16, .code_capacity = 64, .thread_capacity = 1, .ring_bytes = 4096});
  ShmTables tables(shm.span(), shm.layout);
  const std::vector<uint64_t> addrs = Colliding(shm.layout.hash_capacity, 5);
  std::vector<uint32_t> index;
  for (size_t i = 0; i < addrs.size(); ++i) {
    auto r = tables.AddProbe(Entry(100 + static_cast<uint32_t>(i), addrs[i]));
    ASSERT_TRUE(r.ok()) << r.status();
    index.push_back(*r);
  }
  EXPECT_EQ(tables.live_probes(), 5u);
  for (size_t i = 0; i < addrs.size(); ++i) {
    uint32_t id = 0;
    EXPECT_EQ(AgentLookup(shm.span().data(), addrs[i], &id), index[i]);
    EXPECT_EQ(id, 100 + i);
    EXPECT_EQ(tables.Lookup(core::RemoteAddr{addrs[i]}), index[i]);
    const ka::KwProbe& p = tables.probe(index[i]);
    EXPECT_EQ(p.addr, addrs[i]);
    EXPECT_EQ(p.flags.load(), ka::kKwProbeUsed | ka::kKwProbeEnabled);
    // The program ends with kKwOpEnd, in the pool at fetch_offset.
    ASSERT_EQ(p.fetch_len, 3u);
    EXPECT_EQ(tables.code()[p.fetch_offset].op, ka::kKwOpReg);
    EXPECT_EQ(tables.code()[p.fetch_offset + 2].op, ka::kKwOpEnd);
  }
  uint32_t id = 0;
  EXPECT_EQ(AgentLookup(shm.span().data(), 0x1234, &id), std::nullopt);
  // Every write was a seqlock write: even, and moved.
  const uint32_t g = tables.control().generation.load();
  EXPECT_EQ(g % 2, 0u);
  EXPECT_EQ(g, 10u);

  // The second of the chain goes: the ones after it are still found past its tombstone.
  ASSERT_TRUE(tables.RemoveProbe(index[1]).ok());
  EXPECT_EQ(AgentLookup(shm.span().data(), addrs[1], &id), std::nullopt);
  for (size_t i : {0, 2, 3, 4}) {
    EXPECT_EQ(AgentLookup(shm.span().data(), addrs[i], &id), index[i]) << i;
  }
  EXPECT_EQ(tables.probe(index[1]).flags.load(), 0u);
  // Its slot is reused by the next probe, found again.
  auto again = tables.AddProbe(Entry(200, addrs[1]));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, index[1]);
  EXPECT_EQ(AgentLookup(shm.span().data(), addrs[1], &id), index[1]);
  EXPECT_EQ(id, 200u);
}

TEST(ShmTables, ProbesAtOneAddressAreChainedFromTheHashSlot) {
  Shm shm(ShmConfig{
      .probe_capacity = 8, .code_capacity = 64, .thread_capacity = 1, .ring_bytes = 4096});
  ShmTables tables(shm.span(), shm.layout);
  auto a = tables.AddProbe(Entry(1, 0x7000));
  auto b = tables.AddProbe(Entry(2, 0x7000));
  auto c = tables.AddProbe(Entry(3, 0x7000));
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  // The agent's walk: the hash names the first, `next` (index + 1) the rest.
  const auto chain = [&]() {
    std::vector<uint32_t> ids;
    uint32_t id = 0;
    std::optional<uint32_t> at = AgentLookup(shm.span().data(), 0x7000, &id);
    while (at.has_value()) {
      ids.push_back(tables.probe(*at).id);
      const uint32_t next = tables.probe(*at).next;
      at = next == 0 ? std::nullopt : std::optional<uint32_t>(next - 1);
    }
    return ids;
  };
  EXPECT_EQ(chain(), (std::vector<uint32_t>{1, 2, 3}));
  ASSERT_TRUE(tables.RemoveProbe(*b).ok());  // the middle
  EXPECT_EQ(chain(), (std::vector<uint32_t>{1, 3}));
  ASSERT_TRUE(tables.RemoveProbe(*a).ok());  // the head: the next one takes the slot
  EXPECT_EQ(chain(), (std::vector<uint32_t>{3}));
  ASSERT_TRUE(tables.RemoveProbe(*c).ok());
  EXPECT_TRUE(chain().empty());
  EXPECT_EQ(tables.live_probes(), 0u);
}

TEST(ShmTables, AFreedThreadSlotTakesItsReturnInstancesFromTheCounts) {
  Shm shm(ShmConfig{
      .probe_capacity = 2, .code_capacity = 16, .thread_capacity = 2, .ring_bytes = 4096});
  ShmTables tables(shm.span(), shm.layout);
  auto p = tables.AddProbe(Entry(1, 0x8000));
  ASSERT_TRUE(p.ok());
  // What the agent leaves for a thread with two live instances of probe p.
  ka::KwThread& t = tables.thread(1);
  t.tid.store(1234);
  t.instances = 2;
  t.instance[0].probe_index = *p;
  t.instance[1].probe_index = *p;
  tables.probe(*p).active.store(5);
  tables.ring(1).tid.store(1234);
  tables.ring(1).head.store(64);
  tables.ring(1).tail.store(64);
  tables.FreeThread(1);
  EXPECT_EQ(tables.probe(*p).active.load(), 3u);
  EXPECT_EQ(t.tid.load(), 0);
  EXPECT_EQ(t.instances, 0u);
  EXPECT_EQ(tables.ring(1).tid.load(), 0);
  EXPECT_EQ(tables.ring(1).head.load(), 0u);
}

TEST(ShmTables, AFreedProcessEntryCanBeClaimedAgain) {
  Shm shm(ShmConfig{.probe_capacity = 2,
                    .code_capacity = 16,
                    .thread_capacity = 1,
                    .ring_bytes = 4096,
                    .process_capacity = 3});
  ShmTables tables(shm.span(), shm.layout);
  // What a followed child's agent leaves (agent/fork.cc).
  ka::KwProcess& e = tables.process(2);
  e.pid.store(4321);
  e.parent = 1234;
  e.state.store(ka::kKwProcessFollowed);
  tables.FreeProcess(2);
  EXPECT_EQ(e.pid.load(), 0);
  EXPECT_EQ(e.parent, 0);
  EXPECT_EQ(e.state.load(), static_cast<uint32_t>(ka::kKwProcessClaimed));
}

TEST(ShmTables, TombstonesAreSweptAndTheTablesFillUpCleanly) {
  Shm shm(ShmConfig{.probe_capacity = 4,
                    .hash_capacity = 8,
                    .code_capacity = 12,
                    .thread_capacity = 1,
                    .ring_bytes = 4096});
  ShmTables tables(shm.span(), shm.layout);
  // Churn: many more adds and removes than slots; lookups stay right.
  for (uint64_t round = 0; round < 50; ++round) {
    std::vector<uint32_t> idx;
    for (uint64_t k = 0; k < 4; ++k) {
      auto r = tables.AddProbe(Entry(static_cast<uint32_t>(k), 0x1000 + round * 16 + k, 2));
      ASSERT_TRUE(r.ok()) << round << ": " << r.status();
      idx.push_back(*r);
    }
    EXPECT_EQ(tables.AddProbe(Entry(9, 0x9999, 0)).status().code(),
              absl::StatusCode::kResourceExhausted);  // 4 probes: the table is full
    for (uint64_t k = 0; k < 4; ++k) {
      uint32_t id = 0;
      EXPECT_EQ(AgentLookup(shm.span().data(), 0x1000 + round * 16 + k, &id), idx[k]);
    }
    for (uint32_t i : idx) {
      ASSERT_TRUE(tables.RemoveProbe(i).ok());
    }
  }
  uint32_t id = 0;
  EXPECT_EQ(AgentLookup(shm.span().data(), 0x1000, &id), std::nullopt);
  // The pool: 12 ops. 3 + 3 + 3 fit, a 4-op program does not until two neighbours go.
  auto a = tables.AddProbe(Entry(1, 0x10, 2));
  auto b = tables.AddProbe(Entry(2, 0x20, 2));
  auto c = tables.AddProbe(Entry(3, 0x30, 2));
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(tables.AddProbe(Entry(4, 0x40, 3)).status().code(),
            absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(tables.RemoveProbe(*a).ok());
  EXPECT_FALSE(tables.AddProbe(Entry(4, 0x40, 5)).ok());
  ASSERT_TRUE(tables.RemoveProbe(*b).ok());
  auto d = tables.AddProbe(Entry(4, 0x40, 5));  // 6 ops in the coalesced 6
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(tables.probe(*d).fetch_offset, 0u);
}

TEST(ShmTables, FlagsChangeUnderTheSeqlock) {
  Shm shm(ShmConfig{
      .probe_capacity = 4, .code_capacity = 16, .thread_capacity = 1, .ring_bytes = 4096});
  ShmTables tables(shm.span(), shm.layout);
  auto i = tables.AddProbe(Entry(1, 0x5000));
  ASSERT_TRUE(i.ok());
  const uint32_t g = tables.control().generation.load();
  ASSERT_TRUE(tables.SetProbeFlags(*i, ka::kKwProbeRemoving, ka::kKwProbeEnabled).ok());
  EXPECT_EQ(tables.probe(*i).flags.load(), ka::kKwProbeUsed | ka::kKwProbeRemoving);
  EXPECT_EQ(tables.control().generation.load(), g + 2);
  EXPECT_EQ(tables.SetProbeFlags(3, 1, 0).code(), absl::StatusCode::kNotFound);
}

TEST(ShmTables, TheJournalHoldsWhatTheAgentRestores) {
  Shm shm(ShmConfig{
      .probe_capacity = 2, .code_capacity = 16, .thread_capacity = 1, .ring_bytes = 4096});
  ShmTables tables(shm.span(), shm.layout);
  auto j = tables.Journal(PatchEntry{.kind = ka::kKwPatchJump,
                                     .addr = core::RemoteAddr{0x401000},
                                     .original = {0x55, 0x48, 0x89, 0xe5, 0x90},
                                     .patched = {0xe9, 1, 2, 3, 4},
                                     .probe_index = 1});
  ASSERT_TRUE(j.ok()) << j.status();
  const auto* c = reinterpret_cast<const ka::KwControl*>(shm.span().data());
  const auto* patches = reinterpret_cast<const ka::KwPatch*>(shm.span().data() + c->patches_offset);
  EXPECT_EQ(patches[*j].state.load(), ka::kKwPatchJump);
  EXPECT_EQ(patches[*j].len, 5u);
  EXPECT_EQ(patches[*j].addr, 0x401000u);
  EXPECT_EQ(patches[*j].original[0], 0x55);
  EXPECT_EQ(patches[*j].patched[4], 4);
  EXPECT_EQ(patches[*j].probe_index, 1u);
  auto k = tables.Journal(PatchEntry{
      .addr = core::RemoteAddr{0x402000}, .original = {0x90}, .patched = {0xcc}, .probe_index = 0});
  ASSERT_TRUE(k.ok());
  EXPECT_EQ(tables
                .Journal(PatchEntry{
                    .addr = core::RemoteAddr{0x403000}, .original = {0x90}, .patched = {0xcc}})
                .status()
                .code(),
            absl::StatusCode::kResourceExhausted);  // 2 entries (patch capacity = probes)
  EXPECT_FALSE(tables.Journal(PatchEntry{.original = {1, 2}, .patched = {1}}).ok());
  tables.Unjournal(*j);
  EXPECT_EQ(patches[*j].state.load(), ka::kKwPatchFree);
}

}  // namespace
}  // namespace kwatch::watch::agent
