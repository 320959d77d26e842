// The agent's filter programs (watch/probe/agent_filter.h) run by agent/filter.cc itself, against
// what kwatch decides for the same hit: the record's arguments as kwatch shows them
// (core::FormatAgentRecord), read as numbers (ArgNumber) and tested by watch::Condition. Every
// verdict must be the same: taken, rejected, no value, or a division by zero. And the agent's
// aggregations (watch/probe/agent_aggregation.h, agent/aggregate.cc) against the Aggregator fed
// the same hits: every row, key and bucket the same.

#include "watch/probe/agent_filter.h"

#include <sys/user.h>

#include <array>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/probe/agent_fetch.h"
#include "tests/core/probe/agent_interpreter.h"
#include "watch/agent/shm_layout.h"
#include "watch/agent/tables.h"
#include "watch/condition.h"
#include "watch/probe/agent_aggregation.h"
#include "watch/probe/aggregation.h"
#include "watch/probe/hit_filter.h"

namespace kwatch::watch::probe {
namespace {

using core::probe::ArgType;
using core::probe::CompiledArg;
using core::probe::FetchStep;
using testing::AgentInterpreter;
using Verdict = AgentInterpreter::Verdict;

constexpr uint64_t kMemAddr = 0x10000;  // the made-up memory `p` points at
constexpr int32_t kTid = 77;
constexpr int32_t kPid = 5;

CompiledArg RegisterArg(const char* name, size_t reg_offset, ArgType type, uint32_t size) {
  CompiledArg a;
  a.name = name;
  a.text = name;
  a.type = type;
  a.base = CompiledArg::Base::kRegister;
  a.reg_offset = reg_offset;
  a.size = size;
  return a;
}

// `name` is the `size` bytes at offset `off` of the memory register `reg_offset` points at.
CompiledArg MemoryArg(const char* name, size_t reg_offset, int64_t off, ArgType type,
                      uint32_t size) {
  CompiledArg a = RegisterArg(name, reg_offset, type, size);
  a.steps = {FetchStep{.kind = FetchStep::Kind::kDeref, .offset = 0},
             FetchStep{.kind = FetchStep::Kind::kOffset, .offset = off}};
  return a;
}

// The probe's arguments: a (int in %rdi), u (unsigned char p[8]), h (the 8 bytes at p, hex),
// bf (a signed 5-bit bitfield at bit 3 of p[16..20)), bad (a long through %rdx, which may
// point nowhere), big (unsigned long in %rcx).
std::vector<CompiledArg> Args() {
  return {
      RegisterArg("a", offsetof(user_regs_struct, rdi), ArgType{ArgType::Kind::kSigned, 32}, 4),
      MemoryArg("u", offsetof(user_regs_struct, rsi), 8, ArgType{ArgType::Kind::kUnsigned, 8}, 1),
      MemoryArg("h", offsetof(user_regs_struct, rsi), 0, ArgType{ArgType::Kind::kHex, 64}, 8),
      [] {
        CompiledArg bf = MemoryArg("bf", offsetof(user_regs_struct, rsi), 16,
                                   ArgType{ArgType::Kind::kSigned, 32}, 4);
        bf.bit_offset = 3;
        bf.bit_size = 5;
        return bf;
      }(),
      MemoryArg("bad", offsetof(user_regs_struct, rdx), 0, ArgType{ArgType::Kind::kSigned, 64}, 8),
      RegisterArg("big", offsetof(user_regs_struct, rcx), ArgType{ArgType::Kind::kUnsigned, 64}, 8),
  };
}

ProbeDef DefWith(const std::string& condition) {
  ProbeDef def;
  def.id = 1;
  def.spec = "f if " + condition;
  def.args = Args();
  def.condition = condition;
  return def;
}

// One hit: registers and the 24 bytes at kMemAddr.
struct Hit {
  user_regs_struct regs{};
  std::array<uint8_t, 24> mem{};
};

testing::FetchMemory MemoryOf(const Hit& hit) {
  return [&hit](uint64_t addr, std::span<uint8_t> out) {
    if (addr < kMemAddr || addr + out.size() > kMemAddr + hit.mem.size()) {
      return false;
    }
    std::memcpy(out.data(), hit.mem.data() + (addr - kMemAddr), out.size());
    return true;
  };
}

// The arguments of `hit` as kwatch shows them: the agent's record, formatted.
std::vector<std::pair<std::string, std::string>> ShownArgs(const ProbeDef& def, const Hit& hit) {
  const absl::StatusOr<core::probe::AgentFetchProgram> prog =
      core::probe::CompileAgentFetch(def.args, 0);
  EXPECT_TRUE(prog.ok()) << prog.status();
  AgentInterpreter fetch(hit.regs, nullptr, MemoryOf(hit));
  const std::vector<uint8_t> payload = fetch.Run(prog->ops, prog->record_bytes);
  absl::StatusOr<core::probe::AgentArgValues> shown =
      core::probe::FormatAgentRecord(def.args, *prog, payload, {});
  EXPECT_TRUE(shown.ok()) << shown.status();
  return std::move(shown->args);
}

// What kwatch decides for `hit`: its record formatted as shown, read as numbers, tested.
Verdict KwatchVerdict(const ProbeDef& def, const Hit& hit) {
  const absl::StatusOr<ConditionOptions> opts = ConditionOptionsFor(def);
  EXPECT_TRUE(opts.ok()) << opts.status();
  absl::StatusOr<Condition> cond = Condition::Parse(def.condition, *opts);
  EXPECT_TRUE(cond.ok()) << cond.status();
  const std::vector<std::pair<std::string, std::string>> shown = ShownArgs(def, hit);
  std::vector<std::optional<uint64_t>> numbers;
  for (size_t i = 0; i < def.args.size(); ++i) {
    numbers.push_back(ArgNumber(shown[i].second, *ConditionKindOf(def.args[i].type)));
  }
  ConditionInputs in;
  in.tid = kTid;
  in.pid = kPid;
  in.numbers = numbers;
  if (cond->Matches(in)) {
    return Verdict::kTaken;
  }
  if (cond->stats().missing_value > 0) {
    return Verdict::kNoValue;
  }
  return cond->stats().division_by_zero > 0 ? Verdict::kDivisionByZero : Verdict::kRejected;
}

Verdict AgentVerdict(const ProbeDef& def, const Hit& hit) {
  const AgentFilter filter = CompileAgentFilter(def, 0, true);
  EXPECT_FALSE(filter.ops.empty()) << def.condition << ": " << filter.in_kwatch_why;
  AgentInterpreter agent(hit.regs, nullptr, MemoryOf(hit));
  return agent.RunFilter(filter.ops, kTid, kPid);
}

const char* Name(Verdict v) {
  switch (v) {
    case Verdict::kTaken:
      return "taken";
    case Verdict::kRejected:
      return "rejected";
    case Verdict::kNoValue:
      return "no value";
    case Verdict::kDivisionByZero:
      return "division by zero";
  }
  return "?";
}

// Every operator, signed and unsigned, short-circuits over a value that may fault, bitfields,
// shifts past 63, INT64_MIN / -1, tid and pid.
const std::vector<std::string>& Conditions() {
  static const std::vector<std::string> conditions = {
      "a > 3",
      "a < -2",
      "a * 3 - 1 == u",
      "a / (u - 7) > 1",
      "a % 5 == -1",
      "u % (a & 3) == 0",
      "(a << 2) >> 1 == a * 2",
      "h >> 60 == 0xf",
      "h >> a == 0",
      "h << u != 0",
      "-a > u",
      "!a || ~u == 0xffffffffffffff00",
      "bf == -3",
      "bf < 0 && a >= 0",
      "bad == 0 || a == 1",
      "a == 1 || bad == 0",
      "a == 1 && bad != 7",
      "tid == 77 && pid == 5",
      "tid != pid + 72",
      "(a ^ u | h & 0xff) > 100",
      "a <= u",
      "a >= -1",
      "u != 0 && a / u >= 0",
      "big / a < 0",
      "big % (a + 0) > 3",
      "big > 0x8000000000000000",
      "-9223372036854775807 - 1 / a == big",
      "a / -1 == -a",
      "((a + 1) * (u + 2) - (bf + 3)) % 7 != 2",
      "!(a > 0) == (a <= 0)",
      "a",
      "u - u",
  };
  return conditions;
}

// A hit with made-up registers and memory (n < 44: edge values first).
Hit RandomHit(std::mt19937_64& rng, int n) {
  const std::vector<int64_t> edge_a = {0, 1, -1, 3, 7, 5, -5, INT32_MIN, INT32_MAX, 64, -64};
  const std::vector<uint64_t> edge_big = {0, 1, ~0ULL, 0x8000000000000000ULL, 12345};
  Hit hit;
  const int64_t a = n < 44 ? edge_a[n % edge_a.size()] : static_cast<int32_t>(rng());
  // The register holds garbage above the int's 32 bits, as compiled code leaves it.
  hit.regs.rdi = (rng() << 32) | (static_cast<uint64_t>(a) & 0xffffffff);
  hit.regs.rsi = kMemAddr;
  hit.regs.rdx = (n % 3 == 0) ? 0 : kMemAddr + 8;
  hit.regs.rcx = n < 20 ? edge_big[n % edge_big.size()] : rng();
  for (uint8_t& b : hit.mem) {
    b = static_cast<uint8_t>(rng());
  }
  if (n % 4 == 0) {
    hit.mem[8] = static_cast<uint8_t>(n % 8);  // small u: divisions by 0 and by 7
  }
  return hit;
}

TEST(AgentFilter, AgreesWithKwatchOnEveryHit) {
  std::mt19937_64 rng(20261127);
  int compared = 0;
  for (int n = 0; n < 400; ++n) {
    const Hit hit = RandomHit(rng, n);
    const auto a = static_cast<int32_t>(hit.regs.rdi);
    for (const std::string& c : Conditions()) {
      const ProbeDef def = DefWith(c);
      const Verdict want = KwatchVerdict(def, hit);
      const Verdict got = AgentVerdict(def, hit);
      ASSERT_EQ(got, want) << "'" << c << "' with a=" << a << " rdx=" << hit.regs.rdx
                           << ": kwatch says " << Name(want) << ", the agent " << Name(got);
      ++compared;
    }
  }
  EXPECT_EQ(compared, 400 * static_cast<int>(Conditions().size()));
}

TEST(AgentFilter, EachVerdictIsReached) {
  Hit hit;
  hit.regs.rdi = 4;
  hit.regs.rsi = kMemAddr;
  hit.regs.rdx = 0;  // `bad` faults
  hit.mem[8] = 7;
  EXPECT_EQ(AgentVerdict(DefWith("a > 3"), hit), Verdict::kTaken);
  EXPECT_EQ(AgentVerdict(DefWith("a > 4"), hit), Verdict::kRejected);
  EXPECT_EQ(AgentVerdict(DefWith("bad > 4"), hit), Verdict::kNoValue);
  EXPECT_EQ(AgentVerdict(DefWith("a / (u - 7) > 1"), hit), Verdict::kDivisionByZero);
}

TEST(AgentFilter, WhatStaysInKwatchSaysWhy) {
  ProbeDef def = DefWith("s == \"x\"");
  CompiledArg s =
      RegisterArg("s", offsetof(user_regs_struct, rdi), ArgType{ArgType::Kind::kString, 0}, 8);
  s.steps = {FetchStep{.kind = FetchStep::Kind::kDeref, .offset = 0}};
  def.args.push_back(s);
  EXPECT_EQ(CompileAgentFilter(def, 0, true).in_kwatch_why, "it compares strings");
  EXPECT_EQ(CompileAgentFilter(DefWith("cpu == 1"), 0, true).in_kwatch_why,
            "the agent does not see the cpu");
  EXPECT_EQ(CompileAgentFilter(DefWith("tid == 3"), 0, false).in_kwatch_why,
            "the target's tids and pids are its pid namespace's, not kwatch's");
  EXPECT_TRUE(CompileAgentFilter(DefWith("a == 3"), 0, false).in_kwatch_why.empty());
  // 40 values deep: watch::Condition takes it (64), the agent's stack is 32 words.
  std::string deep = "a";
  for (int i = 0; i < 40; ++i) {
    deep = "a + (" + deep + ")";
  }
  const AgentFilter f = CompileAgentFilter(DefWith(deep), 0, true);
  EXPECT_TRUE(f.ops.empty());
  EXPECT_EQ(f.in_kwatch_why, "it needs 41 stack words, the agent has 32");
  // No condition: nothing to run, nothing to say.
  ProbeDef none = DefWith("");
  EXPECT_TRUE(CompileAgentFilter(none, 0, true).ops.empty());
  EXPECT_TRUE(CompileAgentFilter(none, 0, true).in_kwatch_why.empty());
}

// Every aggregation the target can take, on the same hits as the Aggregator: identical tables.
TEST(AgentAggregation, AgreesWithTheAggregatorOnEveryRow) {
  const std::vector<std::string> texts = {
      "count()",         "count() by a",   "sum(a) by u",
      "min(a)",          "max(big)",       "avg(u)",
      "hist(a)",         "hist(big) by u", "lhist(a, -100, 100, 7)",
      "count() by bad",  "sum(bad)",       "count() by tid",
      "max(tid) by pid", "min(u) by big",  "sum(big)"};
  std::vector<AggregationSpec> specs;
  for (const std::string& t : texts) {
    absl::StatusOr<AggregationSpec> spec = ParseAggregation(t);
    ASSERT_TRUE(spec.ok()) << spec.status();
    specs.push_back(*spec);
  }
  const std::vector<ProbeDef> defs = {DefWith("")};
  absl::StatusOr<std::unique_ptr<Aggregator>> want = Aggregator::Make(defs, specs);
  ASSERT_TRUE(want.ok()) << want.status();
  absl::StatusOr<std::unique_ptr<Aggregator>> got = Aggregator::Make(defs, specs);
  ASSERT_TRUE(got.ok()) << got.status();

  // The target's side: an agent session's tables in a buffer, the aggregations chained.
  watch::agent::ShmConfig config;
  config.thread_capacity = 1;
  config.ring_bytes = 4096;
  config.aggs_bytes = kAgentAggregateBytes;
  const absl::StatusOr<watch::agent::ShmLayout> layout = watch::agent::ComputeLayout(config);
  ASSERT_TRUE(layout.ok()) << layout.status();
  std::vector<uint64_t> words(layout->total_size / 8);
  const std::span<uint8_t> shm(reinterpret_cast<uint8_t*>(words.data()), layout->total_size);
  watch::agent::InitControl(shm, *layout, 0, kPid, kPid);
  watch::agent::ShmTables tables(shm, *layout);
  kwatch::agent::KwProbe probe{};
  for (size_t i = (*got)->tables().size(); i-- > 0;) {
    std::string why;
    std::optional<watch::agent::AggregateEntry> e = CompileAgentAggregate(**got, i, 0, true, &why);
    ASSERT_TRUE(e.has_value()) << texts[i] << ": " << why;
    e->next = probe.agg;
    const absl::StatusOr<uint32_t> handle = tables.AddAggregate(*e);
    ASSERT_TRUE(handle.ok()) << handle.status();
    probe.agg = *handle;
    (*got)->TakeOver(i, [&tables, &agg = **got, i, h = *handle](AggregateTable& t) {
      ReadAgentAggregate(tables, h, agg.binding(i), t);
    });
  }
  kwatch::agent::Session session;
  session.code = tables.code();
  session.code_capacity = layout->code_capacity;
  session.aggs = shm.data() + layout->aggs_offset;
  session.aggs_bytes = layout->aggs_bytes;

  std::mt19937_64 rng(7);
  for (int n = 0; n < 600; ++n) {
    const Hit hit = RandomHit(rng, n);
    const int32_t tid = kTid + n % 3;
    AgentInterpreter(hit.regs, nullptr, MemoryOf(hit)).RunAggregates(session, probe, tid, kPid);
    ProbeHit h;
    h.probe = &defs[0];
    h.tid = tid;
    h.pid = kPid;
    h.args = ShownArgs(defs[0], hit);
    (*want)->Add(h);
  }
  (*got)->Release();
  for (size_t i = 0; i < texts.size(); ++i) {
    const AggregateTable& w = (*want)->tables()[i];
    const AggregateTable& g = (*got)->tables()[i];
    SCOPED_TRACE(texts[i]);
    EXPECT_TRUE(g.in_target);
    EXPECT_EQ(g.no_value, w.no_value);
    EXPECT_EQ(g.no_row, 0U);
    ASSERT_EQ(g.rows.size(), w.rows.size());
    for (const auto& [key, wv] : w.rows) {
      ASSERT_TRUE(g.rows.contains(key)) << (key.empty() ? "-" : key[0].second);
      const AggregateValue& gv = g.rows.at(key);
      EXPECT_EQ(gv.count, wv.count);
      EXPECT_EQ(g.Scalar(gv), w.Scalar(wv));
      EXPECT_EQ(gv.buckets, wv.buckets);
      if (w.spec->func == AggregationSpec::Func::kAvg) {
        EXPECT_DOUBLE_EQ(g.AverageOf(gv), w.AverageOf(wv));
      }
    }
  }
}

TEST(AgentAggregation, WhatStaysInKwatchSaysWhy) {
  std::vector<ProbeDef> defs = {DefWith("")};
  CompiledArg comm = RegisterArg("comm", 0, ArgType{ArgType::Kind::kString, 0}, 16);
  comm.base = CompiledArg::Base::kComm;
  defs[0].args.push_back(comm);
  struct Case {
    std::string text;
    std::string why;
  };
  for (const Case& c : std::vector<Case>{
           {"count() by comm", "comm is a string"},
           {"count() by cpu", "the agent does not see the cpu"},
           {"count() by a,u", "it has several keys"},
           {"count() by bf", "the key 'bf' is a bitfield"},
           {"count() by ustack", "stacks are unwound in kwatch"},
           {"lhist(a, 0, 8000, 1)", "8000 linear buckets (the target keeps at most 4096)"},
       }) {
    absl::StatusOr<AggregationSpec> spec = ParseAggregation(c.text);
    ASSERT_TRUE(spec.ok()) << spec.status();
    absl::StatusOr<std::unique_ptr<Aggregator>> agg = Aggregator::Make(defs, {*spec});
    ASSERT_TRUE(agg.ok()) << c.text << ": " << agg.status();
    std::string why;
    EXPECT_FALSE(CompileAgentAggregate(**agg, 0, 0, true, &why).has_value()) << c.text;
    EXPECT_EQ(why, c.why) << c.text;
  }
  absl::StatusOr<AggregationSpec> by_tid = ParseAggregation("count() by tid");
  ASSERT_TRUE(by_tid.ok());
  absl::StatusOr<std::unique_ptr<Aggregator>> agg = Aggregator::Make(defs, {*by_tid});
  ASSERT_TRUE(agg.ok());
  std::string why;
  EXPECT_FALSE(CompileAgentAggregate(**agg, 0, 0, false, &why).has_value());
  EXPECT_EQ(why, "the target's tids and pids are its pid namespace's, not kwatch's");
}

}  // namespace
}  // namespace kwatch::watch::probe
