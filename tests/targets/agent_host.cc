// A program that loads libkwatch-agent.so into itself and acts as its own kwatch: it builds
// the shared memory, writes probes and patches over its own code (tests/agent/fixtures.S),
// runs the probed code, drains the rings, and prints what it saw as `key=value` lines for
// tests/agent/agent_test.cc to compare with what it computed without probes.
//
// usage: agent_host SCENARIO [ARGS...]   (see Main() for the scenarios)

#include <fcntl.h>
#include <linux/hw_breakpoint.h>
#include <linux/perf_event.h>
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cinttypes>
#include <csetjmp>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tests/agent/fixtures.h"
#include "tests/agent/local_controller.h"

namespace {

using kwatch::agent::KwControl;
using kwatch::agent::KwProbe;
using kwatch::agent::KwProcess;
using kwatch::agent::KwRecord;
using kwatch::agent::testing::Arg;
using kwatch::agent::testing::Hit;
using kwatch::agent::testing::Layout;
using kwatch::agent::testing::LocalController;
using kwatch::agent::testing::OpAdd;
using kwatch::agent::testing::OpBegin;
using kwatch::agent::testing::OpDeref;
using kwatch::agent::testing::OpDerefSize;
using kwatch::agent::testing::OpEnd;
using kwatch::agent::testing::OpRead;
using kwatch::agent::testing::OpReadStr;
using kwatch::agent::testing::OpReg;
using kwatch::agent::testing::OpStack;
using kwatch::agent::testing::OpStore;
using kwatch::agent::testing::OpXmm;
using kwatch::agent::testing::ProbeSpec;
namespace ag = kwatch::agent;

void Say(const char* key, uint64_t value) {
  std::printf("%s=%" PRIu64 "\n", key, value);
}

std::unique_ptr<LocalController> Start(const Layout& layout = Layout{}) {
  auto c = LocalController::Create(layout);
  const int r = c->LoadAgent(KWATCH_AGENT_PATH);
  if (r != 0) {
    std::printf("init=%d init_error=%u\n", r, c->ctl().init_error);
    std::exit(2);  // NOLINT(concurrency-mt-unsafe): before any thread
  }
  return c;
}

// Out-of-line copies: 32-byte slots in one page near the fixtures.
uint64_t Xol(uint64_t from, uint32_t len) {
  static uint64_t page = 0;
  static uint64_t used = 0;
  if (page == 0) {
    page = LocalController::MapNear(Addr(&kwt_args), 4096);
  }
  const uint64_t slot = page + used;
  used += 32;
  LocalController::WriteXol(slot, from, len);
  return slot;
}

// An address that faults: a page mapped then unmapped.
uint64_t Unmapped() {
  void* p = mmap(nullptr, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  munmap(p, 4096);
  return Addr(p);
}

ProbeSpec Int3At(uint64_t addr, uint32_t len) {
  ProbeSpec s;
  s.addr = addr;
  s.insn_len = len;
  s.resume = ag::kKwResumeXol;
  s.xol_addr = Xol(addr, len);
  return s;
}

// The jump probe over kwt_jfunc's first 6 bytes, through kwt_tramp.
uint32_t JumpProbe(LocalController& c, ProbeSpec spec) {
  spec.addr = Addr(&kwt_jfunc);
  spec.flags |= ag::kKwProbeJump;
  spec.insn_len = 6;
  spec.xol_addr = Addr(kwt_tramp_displaced);
  return c.AddProbe(spec);
}
void ArmJump(LocalController& c, uint32_t index) {
  kwt_jump_entry = c.ctl().jump_entry;
  kwt_tramp_index = index;
  c.PatchJump(Addr(&kwt_jfunc), 6, Addr(&kwt_tramp), index);
}

uint64_t FsBase() {
  uint64_t v = 0;
  asm volatile("mov %%fs:0, %0" : "=r"(v));
  return v;
}

// ---------------------------------------------------------------------------------------
// int3-args N: an INT3 probe with register and memory arguments; bad pointers.

struct ArgsData {
  uint64_t value;
  uint32_t* word;
  const char* name;
};

int Int3Args(int n) {
  auto c = Start();
  ProbeSpec s = Int3At(Addr(&kwt_args), 1);
  s.id = 7;
  s.fetch = {OpBegin(0), OpReg(ag::kKwRdi),    OpStore(8),                        // %di
             OpBegin(1), OpReg(ag::kKwRsi, 4), OpStore(4),                        // %si:u32
             OpBegin(2), OpReg(ag::kKwRdx),    OpRead(8),                         // +0(%dx):u64
             OpBegin(3), OpReg(ag::kKwRdx),    OpAdd(8),   OpDeref(), OpRead(4),  // +0(+8(%dx)):u32
             OpBegin(4), OpReg(ag::kKwRdx),    OpAdd(16),  OpDeref(), OpReadStr(32),  // string
             OpEnd()};
  const uint32_t pi = c->AddProbe(s);
  c->SetState(ag::kKwStateActive);
  c->PatchInt3(Addr(&kwt_args), pi);
  static constexpr std::array<const char*, 3> kNames = {"alpha", "beta",
                                                        "a-name-longer-than-thirty-two-bytes!"};
  uint64_t matched = 0;
  uint64_t records = 0;
  uint64_t results_ok = 0;
  uint64_t fault_args = 0;
  uint64_t cut_args = 0;
  std::vector<ArgsData> sent;
  std::vector<uint32_t> words(static_cast<size_t>(n));
  auto check = [&](const Hit& h) {
    const ArgsData& d = sent[records++];
    bool ok = h.rec.type == ag::kKwRecordHit && h.rec.ip == Addr(&kwt_args) &&
              h.rec.tid == static_cast<int32_t>(gettid()) && h.args.size() == 5;
    for (const auto& a : h.args) {
      fault_args += a.status == 1 ? 1 : 0;
      cut_args += a.status == 2 ? 1 : 0;
    }
    if (ok) {
      const std::string name(reinterpret_cast<const char*>(h.args[4].bytes.data()),
                             h.args[4].bytes.size());
      ok = h.args[0].U64() == d.value * 2 && h.args[1].U64() == ((d.value * 2 + 1) & 0xffffffff) &&
           h.args[2].U64() == d.value && h.args[3].U64() == *d.word &&
           name == std::string(d.name).substr(0, 32);
    }
    matched += ok ? 1 : 0;
  };
  for (int i = 0; i < n; ++i) {
    words[i] = static_cast<uint32_t>(i * 7);
    const ArgsData d{static_cast<uint64_t>(i) * 3, &words[i], kNames[i % 3]};
    sent.push_back(d);
    const uint64_t a = d.value * 2;
    results_ok += kwt_args(a, a + 1, &sent.back()) == 2 * a + 1 ? 1 : 0;
    if (i % 64 == 63) {
      c->Drain(check);
    }
  }
  c->Drain(check);
  const uint64_t good_records = records;
  // Bad pointers: refused without reading (0x10), unmapped (a real fault, fixed up), and a
  // good struct whose pointers are unmapped.
  const uint64_t bad = Unmapped();
  uint64_t bad_records = 0;
  uint64_t bad_faults = 0;
  auto count_bad = [&](const Hit& h) {
    ++bad_records;
    for (const auto& a : h.args) {
      bad_faults += a.status == 1 ? 1 : 0;
    }
  };
  kwt_args(1, 2, reinterpret_cast<const void*>(0x10));
  kwt_args(1, 2, reinterpret_cast<const void*>(bad));
  ArgsData half{5, reinterpret_cast<uint32_t*>(bad), reinterpret_cast<const char*>(bad)};
  kwt_args(1, 2, &half);
  c->Drain(count_bad);
  const KwProbe& p = c->probe(pi);
  Say("records", good_records);
  Say("matched", matched);
  Say("results_ok", results_ok);
  Say("cut_args", cut_args);
  Say("fault_args", fault_args);
  Say("bad_records", bad_records);
  Say("bad_faults", bad_faults);
  Say("hits", p.hits.load());
  Say("faults", p.faults.load());
  Say("lost", p.lost.load());
  Say("stray_traps", c->ctl().stray_traps.load());
  return 0;
}

// ---------------------------------------------------------------------------------------
// resume: every KwResume kind on real instructions, compared with an unprobed run.

struct ResumeCase {
  const char* name;
  ProbeSpec spec;
  std::function<std::vector<uint64_t>()> run;
  uint64_t calls_per_run;  // traps per run
};

ProbeSpec At(const uint8_t* insn, const uint8_t* next, uint32_t resume) {
  ProbeSpec s;
  s.addr = Addr(insn);
  s.insn_len = static_cast<uint32_t>(next - insn);
  s.resume = resume;
  s.fetch = {OpBegin(0), OpReg(ag::kKwRdi), OpStore(8), OpEnd()};
  return s;
}

std::vector<uint64_t> FlagSet() {
  std::vector<uint64_t> f;
  for (int m = 0; m < 32; ++m) {
    uint64_t v = 0x2;
    v |= (m & 1) != 0 ? 1ULL << 0 : 0;    // CF
    v |= (m & 2) != 0 ? 1ULL << 2 : 0;    // PF
    v |= (m & 4) != 0 ? 1ULL << 6 : 0;    // ZF
    v |= (m & 8) != 0 ? 1ULL << 7 : 0;    // SF
    v |= (m & 16) != 0 ? 1ULL << 11 : 0;  // OF
    f.push_back(v);
  }
  return f;
}

thread_local uint64_t (*tls_fn)(uint64_t) = kwt_inc;

int Resume() {
  auto c = Start();
  std::vector<ResumeCase> cases;
  auto values = [](const std::function<uint64_t(uint64_t)>& f, int n) {
    std::vector<uint64_t> v;
    v.reserve(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
      v.push_back(f(static_cast<uint64_t>(i) * 1000 + 7));
    }
    return v;
  };
  {
    ProbeSpec s = At(kwt_jmp_insn, kwt_jmp_next, ag::kKwResumeJmp);
    s.target = Addr(kwt_jmp_target);
    cases.push_back({"jmp", s, [=] { return values(kwt_jmp, 10); }, 10});
  }
  struct Cc {
    const char* name;
    uint64_t (*fn)(uint64_t);
    const uint8_t* insn;
    const uint8_t* next;
    const uint8_t* target;
  };
#define KWT_CC(n)                                                                                  \
  {                                                                                                \
    "j" #n, reinterpret_cast<uint64_t (*)(uint64_t)>(&kwt_j##n), kwt_j##n##_insn, kwt_j##n##_next, \
        kwt_j##n##_target                                                                          \
  }
  // In condition-code order: the cond field is the index.
  const std::array<Cc, 16> ccs = {
      {KWT_CC(o), KWT_CC(no), KWT_CC(b), KWT_CC(ae), KWT_CC(e), KWT_CC(ne), KWT_CC(be), KWT_CC(a),
       KWT_CC(s), KWT_CC(ns), KWT_CC(p), KWT_CC(np), KWT_CC(l), KWT_CC(ge), KWT_CC(le), KWT_CC(g)}};
#undef KWT_CC
  const std::vector<uint64_t> flags = FlagSet();
  for (uint32_t cc = 0; cc < 16; ++cc) {
    ProbeSpec s = At(ccs[cc].insn, ccs[cc].next, ag::kKwResumeJcc);
    s.target = Addr(ccs[cc].target);
    s.cond = cc;
    auto* fn = ccs[cc].fn;
    cases.push_back({ccs[cc].name, s,
                     [fn, flags] {
                       std::vector<uint64_t> v;
                       v.reserve(flags.size());
                       for (const uint64_t f : flags) {
                         v.push_back(fn(f));
                       }
                       return v;
                     },
                     flags.size()});
  }
  {
    ProbeSpec s = At(kwt_jrcxz_insn, kwt_jrcxz_next, ag::kKwResumeJcc);
    s.target = Addr(kwt_jrcxz_target);
    s.cond = ag::kKwCondJrcxz;
    cases.push_back(
        {"jrcxz", s,
         [] {
           return std::vector<uint64_t>{kwt_jrcxz(0), kwt_jrcxz(5), kwt_jrcxz(1ULL << 32)};
         },
         3});
    ProbeSpec e = At(kwt_jecxz_insn, kwt_jecxz_next, ag::kKwResumeJcc);
    e.target = Addr(kwt_jecxz_target);
    e.cond = ag::kKwCondJecxz;
    cases.push_back(
        {"jecxz", e,
         [] {
           return std::vector<uint64_t>{kwt_jecxz(0), kwt_jecxz(5), kwt_jecxz(1ULL << 32)};
         },
         3});
  }
  constexpr uint64_t kZf = 1ULL << 6;
  {
    ProbeSpec s = At(kwt_loop_insn, kwt_loop_next, ag::kKwResumeJcc);
    s.target = Addr(kwt_loop_target);
    s.cond = ag::kKwCondLoop;
    cases.push_back({"loop", s,
                     [] {
                       const KwtLoop a = kwt_loop(5, 0x2);
                       const KwtLoop b = kwt_loop(1, 0x2);
                       return std::vector<uint64_t>{a.iterations, a.rcx, b.iterations, b.rcx};
                     },
                     6});
    ProbeSpec e = At(kwt_loope_insn, kwt_loope_next, ag::kKwResumeJcc);
    e.target = Addr(kwt_loope_target);
    e.cond = ag::kKwCondLoope;
    cases.push_back({"loope", e,
                     [] {
                       const KwtLoop a = kwt_loope(5, 0x2 | kZf);
                       const KwtLoop b = kwt_loope(5, 0x2);
                       return std::vector<uint64_t>{a.iterations, a.rcx, b.iterations, b.rcx};
                     },
                     6});
    ProbeSpec ne = At(kwt_loopne_insn, kwt_loopne_next, ag::kKwResumeJcc);
    ne.target = Addr(kwt_loopne_target);
    ne.cond = ag::kKwCondLoopne;
    cases.push_back({"loopne", ne,
                     [] {
                       const KwtLoop a = kwt_loopne(5, 0x2);
                       const KwtLoop b = kwt_loopne(5, 0x2 | kZf);
                       return std::vector<uint64_t>{a.iterations, a.rcx, b.iterations, b.rcx};
                     },
                     6});
    ProbeSpec l32 = At(kwt_loop32_insn, kwt_loop32_next, ag::kKwResumeJcc);
    l32.target = Addr(kwt_loop32_target);
    l32.cond = ag::kKwCondLoop | ag::kKwCondAddr32;
    cases.push_back({"loop32", l32,
                     [] {
                       const KwtLoop a = kwt_loop32((1ULL << 32) + 3, 0x2);
                       return std::vector<uint64_t>{a.iterations, a.rcx};
                     },
                     3});
  }
  {
    ProbeSpec s = At(kwt_call_insn, kwt_call_next, ag::kKwResumeCall);
    s.target = Addr(&kwt_inc);
    cases.push_back({"call", s, [=] { return values(kwt_call, 10); }, 10});
    ProbeSpec r = At(kwt_ret_insn, kwt_ret_next, ag::kKwResumeRet);
    cases.push_back({"ret", r, [=] { return values(kwt_ret, 10); }, 10});
    ProbeSpec r8 = At(kwt_ret8_insn, kwt_ret8_next, ag::kKwResumeRet);
    r8.ret_imm = 8;
    cases.push_back({"ret_imm16", r8, [=] { return values(kwt_ret8, 10); }, 10});
  }
  {
    ProbeSpec s = At(kwt_icall_reg_insn, kwt_icall_reg_next, ag::kKwResumeIndirect);
    s.ind_base = ag::kKwRsi + 1;
    s.ind_flags = ag::kKwIndCall;
    cases.push_back(
        {"call_reg", s,
         [=] { return values([](uint64_t x) { return kwt_icall_reg(x, kwt_inc); }, 10); }, 10});
    ProbeSpec m = At(kwt_icall_mem_insn, kwt_icall_mem_next, ag::kKwResumeIndirect);
    m.ind_disp = static_cast<int64_t>(Addr(&kwt_fnptr));
    m.ind_flags = ag::kKwIndCall | ag::kKwIndMemory;
    cases.push_back({"call_riprel", m, [=] { return values(kwt_icall_mem, 10); }, 10});
    static std::array<uint64_t (*)(uint64_t), 4> table = {nullptr, kwt_ret, kwt_inc, kwt_call};
    ProbeSpec sib = At(kwt_icall_sib_insn, kwt_icall_sib_next, ag::kKwResumeIndirect);
    sib.ind_base = ag::kKwRsi + 1;
    sib.ind_index = ag::kKwRdx + 1;
    sib.ind_scale = 8;
    sib.ind_disp = 8;
    sib.ind_flags = ag::kKwIndCall | ag::kKwIndMemory;
    cases.push_back({"call_sib", sib,
                     [] {
                       std::vector<uint64_t> v;
                       for (uint64_t i = 0; i < 9; ++i) {
                         v.push_back(kwt_icall_sib(i * 10, table.data(), i % 3));
                       }
                       return v;
                     },
                     9});
    ProbeSpec j = At(kwt_ijmp_reg_insn, kwt_ijmp_reg_next, ag::kKwResumeIndirect);
    j.ind_base = ag::kKwRsi + 1;
    cases.push_back(
        {"jmp_reg", j,
         [=] { return values([](uint64_t x) { return kwt_ijmp_reg(x, kwt_ret); }, 10); }, 10});
    ProbeSpec fs = At(kwt_ijmp_fs_insn, kwt_ijmp_fs_next, ag::kKwResumeIndirect);
    fs.ind_base = ag::kKwRsi + 1;
    fs.ind_flags = ag::kKwIndMemory | ag::kKwIndFs;
    cases.push_back({"jmp_fs", fs,
                     [=] {
                       const uint64_t off = Addr(&tls_fn) - FsBase();
                       return values([off](uint64_t x) { return kwt_ijmp_fs(x, off); }, 10);
                     },
                     10});
  }
  {
    ProbeSpec x = Int3At(Addr(&kwt_args), 1);
    x.fetch = {OpBegin(0), OpReg(ag::kKwRdi), OpStore(8), OpEnd()};
    cases.push_back({"xol", x,
                     [=] { return values([](uint64_t v) { return kwt_args(v, 1, nullptr); }, 10); },
                     10});
    // A jump probe met at its 0xCC (while kwatch or the watchdog writes or removes it): the
    // thread goes to the displaced copy in the trampoline.
    ProbeSpec j;
    j.addr = Addr(&kwt_jfunc);
    j.flags |= ag::kKwProbeJump;
    j.insn_len = 6;
    j.xol_addr = Addr(kwt_tramp_displaced);
    cases.push_back({"jump_at_int3", j,
                     [=] { return values([](uint64_t v) { return kwt_jfunc(v, 3); }, 10); }, 10});
    // A probe being removed runs its copy whatever its resume says.
    ProbeSpec r = Int3At(Addr(&kwt_fib), 1);
    r.resume = ag::kKwResumeCall;  // not used: removing
    r.flags |= ag::kKwProbeRemoving;
    cases.push_back(
        {"removing", r, [=] { return values([](uint64_t v) { return kwt_fib(v % 2); }, 10); }, 10});
  }
  // Unprobed first, then probed.
  std::vector<std::vector<uint64_t>> expected;
  expected.reserve(cases.size());
  for (auto& k : cases) {
    expected.push_back(k.run());
  }
  std::vector<uint32_t> index;
  index.reserve(cases.size());
  for (auto& k : cases) {
    index.push_back(c->AddProbe(k.spec));
  }
  c->SetState(ag::kKwStateActive);
  for (size_t i = 0; i < cases.size(); ++i) {
    c->PatchInt3(cases[i].spec.addr, index[i]);
  }
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::vector<uint64_t> got = cases[i].run();
    const uint64_t hits = c->probe(index[i]).hits.load();
    const bool ok = got == expected[i] && hits == cases[i].calls_per_run;
    std::printf("resume %s %s hits=%" PRIu64 "/%" PRIu64 "\n", cases[i].name, ok ? "ok" : "BAD",
                hits, cases[i].calls_per_run);
    if (got != expected[i]) {
      for (size_t k = 0; k < got.size() && k < expected[i].size(); ++k) {
        if (got[k] != expected[i][k]) {
          std::printf("  [%zu] expected %" PRIu64 " got %" PRIu64 "\n", k, expected[i][k], got[k]);
        }
      }
    }
  }
  // Disabled, then the session stopping: the hits are counted in missed and the code runs on.
  const size_t last = cases.size() - 3;  // "xol"
  c->SetEnabled(index[last], false);
  const bool disabled_ok = cases[last].run() == expected[last];
  c->SetEnabled(index[last], true);
  c->SetState(ag::kKwStateStopping);
  const bool stopping_ok = cases[last].run() == expected[last];
  const KwProbe& p = c->probe(index[last]);
  Say("cases", cases.size());
  Say("stray_traps", c->ctl().stray_traps.load());
  Say("missed", p.missed.load());
  Say("hits_after", p.hits.load());
  Say("disabled_ok", disabled_ok ? 1 : 0);
  Say("stopping_ok", stopping_ok ? 1 : 0);
  return 0;
}

// ---------------------------------------------------------------------------------------
// ret-fib N MAXACTIVE: a return probe on a recursive function.

struct FibTruth {
  uint64_t calls = 0;
  uint64_t tracked = 0;
  std::multiset<uint64_t> returns;  // of tracked calls
};
uint64_t FibMirror(uint64_t n, uint64_t depth, uint64_t max, FibTruth& t) {
  ++t.calls;
  const uint64_t r =
      n < 2 ? n : FibMirror(n - 1, depth + 1, max, t) + FibMirror(n - 2, depth + 1, max, t);
  if (depth <= max) {
    ++t.tracked;
    t.returns.insert(r);
  }
  return r;
}

int RetFib(int n, int maxactive) {
  Layout l;
  l.ring_bytes = 1 << 22;
  auto c = Start(l);
  ProbeSpec s = Int3At(Addr(&kwt_fib), 1);
  s.flags |= ag::kKwProbeReturn;
  s.maxactive = static_cast<uint32_t>(maxactive);
  s.fetch = {OpBegin(0), OpReg(ag::kKwRax), OpStore(8), OpEnd()};
  const uint32_t pi = c->AddProbe(s);
  c->SetState(ag::kKwStateActive);
  c->PatchInt3(Addr(&kwt_fib), pi);
  FibTruth truth;
  const uint64_t max = maxactive == 0 ? ag::kKwDefaultMaxActive : static_cast<uint64_t>(maxactive);
  const uint64_t expected = FibMirror(static_cast<uint64_t>(n), 1, max, truth);
  const uint64_t got = kwt_fib(static_cast<uint64_t>(n));
  std::multiset<uint64_t> returns;
  uint64_t well_formed = 0;
  c->Drain([&](const Hit& h) {
    returns.insert(h.args.empty() ? ~0ULL : h.args[0].U64());
    const bool inside =
        h.rec.return_address > Addr(&kwt_fib) && h.rec.return_address < Addr(&kwt_fib) + 64;
    well_formed += h.rec.type == ag::kKwRecordReturn && h.rec.ip == Addr(&kwt_fib) &&
                           (inside || h.rec.return_address != 0)
                       ? 1
                       : 0;
  });
  const KwProbe& p = c->probe(pi);
  Say("result_ok", got == expected ? 1 : 0);
  Say("calls", truth.calls);
  Say("tracked", truth.tracked);
  Say("returns", returns.size());
  Say("well_formed", well_formed);
  Say("returns_match", returns == truth.returns ? 1 : 0);
  Say("lost", p.lost.load());
  Say("hits", p.hits.load());
  Say("nmissed", p.nmissed.load());
  Say("expected_nmissed", truth.calls - truth.tracked);
  Say("active", p.active.load());
  Say("abandoned", p.abandoned.load());
  return 0;
}

// ---------------------------------------------------------------------------------------
// ret-longjmp N: a return-probed call left by longjmp, N times, each followed by a normal one.

jmp_buf g_jump;
uint64_t Jumper(uint64_t /*unused*/) {
  longjmp(g_jump, 1);
}
uint64_t PlusFive(uint64_t x) {
  return x + 5;
}

// Calls the return-probed function with a callback that longjmps back here: true if it did.
__attribute__((noinline)) bool LeftByLongjmp(uint64_t i) {
  if (setjmp(g_jump) == 0) {
    kwt_callback(Jumper, i);
    return false;
  }
  return true;
}

int RetLongjmp(int n) {
  auto c = Start();
  ProbeSpec s = Int3At(Addr(&kwt_callback), 1);
  s.flags |= ag::kKwProbeReturn;
  s.fetch = {OpBegin(0), OpReg(ag::kKwRax), OpStore(8), OpEnd()};
  const uint32_t pi = c->AddProbe(s);
  c->SetState(ag::kKwStateActive);
  c->PatchInt3(Addr(&kwt_callback), pi);
  uint64_t jumped = 0;
  uint64_t results_ok = 0;
  for (int i = 0; i < n; ++i) {
    jumped += LeftByLongjmp(static_cast<uint64_t>(i)) ? 1 : 0;
    results_ok +=
        kwt_callback(PlusFive, static_cast<uint64_t>(i)) == static_cast<uint64_t>(i) + 5 ? 1 : 0;
  }
  uint64_t returns = 0;
  uint64_t values_ok = 0;
  c->Drain([&](const Hit& h) {
    values_ok += h.args.size() == 1 && h.args[0].U64() == returns + 5 ? 1 : 0;
    ++returns;
  });
  const KwProbe& p = c->probe(pi);
  Say("jumped", jumped);
  Say("results_ok", results_ok);
  Say("returns", returns);
  Say("values_ok", values_ok);
  Say("abandoned", p.abandoned.load());
  Say("active", p.active.load());
  Say("nmissed", p.nmissed.load());
  return 0;
}

// ---------------------------------------------------------------------------------------
// own-trap before|after|signal N: the program's own SIGTRAP handler, installed before or after
// the agent, gets its own int3s; probes still work.

volatile sig_atomic_t g_own_int3 = 0;
volatile sig_atomic_t g_own_other = 0;
void OnTrap(int /*sig*/, siginfo_t* si, void* /*uc*/) {
  if (si->si_code == SI_KERNEL) {
    g_own_int3 = g_own_int3 + 1;
  } else {
    g_own_other = g_own_other + 1;
  }
}
void OnTrapPlain(int /*sig*/) {
  g_own_int3 = g_own_int3 + 1;
}

int OwnTrap(const std::string& when, int n) {
  struct sigaction sa {};
  sa.sa_sigaction = OnTrap;
  sa.sa_flags = SA_SIGINFO;
  if (when == "before") {
    sigaction(SIGTRAP, &sa, nullptr);
  }
  auto c = Start();
  if (when == "after") {
    sigaction(SIGTRAP, &sa, nullptr);
  } else if (when == "signal") {
    signal(SIGTRAP, OnTrapPlain);
  }
  ProbeSpec s = Int3At(Addr(&kwt_args), 1);
  s.fetch = {OpBegin(0), OpReg(ag::kKwRdi), OpStore(8), OpEnd()};
  const uint32_t pi = c->AddProbe(s);
  c->SetState(ag::kKwStateActive);
  c->PatchInt3(Addr(&kwt_args), pi);
  for (int i = 0; i < n; ++i) {
    kwt_own_int3();
    kwt_args(static_cast<uint64_t>(i), 0, nullptr);
  }
  raise(SIGTRAP);  // SI_TKILL: not the agent's either
  struct sigaction q {};
  sigaction(SIGTRAP, nullptr, &q);
  const bool query_ok = when == "signal" ? q.sa_handler == OnTrapPlain : q.sa_sigaction == OnTrap;
  struct {
    uint64_t handler, flags, restorer, mask;
  } k{};
  syscall(SYS_rt_sigaction, SIGTRAP, nullptr, &k, 8);
  Say("own_int3", static_cast<uint64_t>(g_own_int3));
  Say("own_other", static_cast<uint64_t>(g_own_other));
  Say("probe_hits", c->probe(pi).hits.load());
  Say("stray_traps", c->ctl().stray_traps.load());
  Say("query_ok", query_ok ? 1 : 0);
  Say("kernel_is_program", k.handler == Addr(&OnTrap) || k.handler == Addr(&OnTrapPlain) ? 1 : 0);
  return 0;
}

// ---------------------------------------------------------------------------------------
// die-int3|die-segv [--no-agent]: the program's own fatal trap, with nothing to handle it.

int Die(const std::string& what, bool agent) {
  std::unique_ptr<LocalController> c;
  if (agent) {
    c = Start();
    ProbeSpec s = Int3At(Addr(&kwt_args), 1);
    const uint32_t pi = c->AddProbe(s);
    c->SetState(ag::kKwStateActive);
    c->PatchInt3(Addr(&kwt_args), pi);
    kwt_args(1, 2, nullptr);
  }
  std::printf("dying\n");
  std::fflush(stdout);
  if (what == "die-int3") {
    kwt_own_int3();
  } else {
    *reinterpret_cast<volatile int*>(0x18) = 1;
  }
  std::printf("survived\n");
  return 0;
}

// ---------------------------------------------------------------------------------------
// segv-handler: the program's SIGSEGV handler (installed after the agent) sees its own faults
// exactly; a probe's bad pointer never reaches it.

sigjmp_buf g_segv_jump;
volatile uint64_t g_segv_addr = 0;
volatile int g_segv_code = 0;
volatile int g_segv_calls = 0;
void OnSegv(int /*sig*/, siginfo_t* si, void* /*uc*/) {
  g_segv_calls = g_segv_calls + 1;
  g_segv_addr = Addr(si->si_addr);
  g_segv_code = si->si_code;
  siglongjmp(g_segv_jump, 1);
}

int SegvHandler() {
  auto c = Start();
  struct sigaction sa {};
  sa.sa_sigaction = OnSegv;
  sa.sa_flags = SA_SIGINFO;
  sigaction(SIGSEGV, &sa, nullptr);
  ProbeSpec s;
  s.fetch = {OpBegin(0), OpReg(ag::kKwRsi), OpDeref(), OpStore(8), OpEnd()};
  const uint32_t pi = JumpProbe(*c, s);
  c->SetState(ag::kKwStateActive);
  ArmJump(*c, pi);
  const uint64_t bad = Unmapped();
  const uint64_t r = kwt_jfunc(1, bad);  // the probe reads *bad: a fault status, no signal
  uint64_t statuses = 0;
  c->Drain([&](const Hit& h) { statuses += h.args.size() == 1 && h.args[0].status == 1 ? 1 : 0; });
  volatile int recovered = 0;
  if (sigsetjmp(g_segv_jump, 1) == 0) {
    *reinterpret_cast<volatile int*>(bad + 8) = 1;
  } else {
    recovered = 1;
  }
  Say("result_ok", r == 2 + bad ? 1 : 0);
  Say("fault_statuses", statuses);
  Say("handler_calls", static_cast<uint64_t>(g_segv_calls));
  Say("si_addr_ok", g_segv_addr == bad + 8 ? 1 : 0);
  Say("si_code", static_cast<uint64_t>(g_segv_code));
  Say("recovered", static_cast<uint64_t>(recovered));
  return 0;
}

// ---------------------------------------------------------------------------------------
// ring-full: a 4 KiB ring; records beyond it are lost and counted, the program goes on.

int RingFull() {
  Layout l;
  l.ring_bytes = 4096;
  l.threads = 2;
  auto c = Start(l);
  ProbeSpec s;
  s.record_bytes = 16;  // one argument: 8 bytes of header, 8 of value
  s.fetch = {OpBegin(0), OpReg(ag::kKwRdi), OpStore(8), OpEnd()};
  const uint32_t pi = JumpProbe(*c, s);
  c->SetState(ag::kKwStateActive);
  ArmJump(*c, pi);
  std::vector<uint64_t> seen;
  auto sink = [&](const Hit& h) { seen.push_back(h.args.empty() ? ~0ULL : h.args[0].U64()); };
  for (uint64_t i = 0; i < 1000; ++i) {
    kwt_jfunc(i, 0);
  }
  const size_t first = c->Drain(sink);
  const uint64_t lost1 = c->probe(pi).lost.load();
  for (uint64_t i = 1000; i < 1100; ++i) {
    kwt_jfunc(i, 0);
  }
  const size_t second = c->Drain(sink);
  bool values_ok = seen.size() == first + second;
  for (size_t k = 0; k < first && values_ok; ++k) {
    values_ok = seen[k] == k;
  }
  for (size_t k = 0; k < second && values_ok; ++k) {
    values_ok = seen[first + k] == 1000 + k;
  }
  uint64_t ring_lost = 0;
  for (uint32_t i = 0; i < l.threads; ++i) {
    ring_lost += c->ring(i).lost.load();
  }
  Say("record_size", sizeof(KwRecord) + 16);
  Say("first", first);
  Say("lost1", lost1);
  Say("second", second);
  Say("lost", c->probe(pi).lost.load());
  Say("ring_lost", ring_lost);
  Say("hits", c->probe(pi).hits.load());
  Say("values_ok", values_ok ? 1 : 0);
  return 0;
}

// ---------------------------------------------------------------------------------------
// threads N: 4 threads hit an INT3 probe and a jump probe N times each, flat out, while this
// thread drains.

int Threads(int n) {
  Layout l;
  l.ring_bytes = 1 << 20;
  auto c = Start(l);
  ProbeSpec i3 = Int3At(Addr(&kwt_args), 1);
  i3.fetch = {OpBegin(0),        OpReg(ag::kKwRdi), OpStore(8), OpBegin(1),
              OpReg(ag::kKwRsi), OpStore(8),        OpEnd()};
  const uint32_t p_int3 = c->AddProbe(i3);
  ProbeSpec j;
  j.fetch = i3.fetch;
  const uint32_t p_jump = JumpProbe(*c, j);
  c->SetState(ag::kKwStateActive);
  c->PatchInt3(Addr(&kwt_args), p_int3);
  ArmJump(*c, p_jump);
  constexpr int kThreads = 4;
  std::atomic<int> done{0};
  std::atomic<uint64_t> bad_results{0};
  std::vector<std::thread> threads;
  threads.reserve(kThreads);
  std::vector<int32_t> tids(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      tids[t] = static_cast<int32_t>(gettid());
      for (int i = 0; i < n; ++i) {
        const auto a = static_cast<uint64_t>(t);
        const auto b = static_cast<uint64_t>(i);
        if (kwt_args(a, b, nullptr) != a + b || kwt_jfunc(a, b) != 2 * a + b) {
          bad_results.fetch_add(1);
        }
      }
      done.fetch_add(1);
    });
  }
  // Per (thread, probe): records seen and the last sequence number (records of one thread and
  // probe arrive in order, some possibly lost).
  std::map<std::pair<uint64_t, uint32_t>, uint64_t> count;
  std::map<std::pair<uint64_t, uint32_t>, int64_t> last;
  uint64_t out_of_order = 0;
  uint64_t wrong_tid = 0;
  auto sink = [&](const Hit& h) {
    const uint64_t t = h.args[0].U64();
    const auto key = std::make_pair(t, h.rec.probe_index);
    const auto seq = static_cast<int64_t>(h.args[1].U64());
    if (last.contains(key) && seq <= last[key]) {
      ++out_of_order;
    }
    last[key] = seq;
    ++count[key];
    wrong_tid += t < kThreads && h.rec.tid == tids[t] ? 0 : 1;
  };
  while (done.load() < kThreads) {
    c->Drain(sink);
    sched_yield();
  }
  for (auto& th : threads) {
    th.join();
  }
  c->Drain(sink);
  uint64_t records = 0;
  for (const auto& [k, v] : count) {
    records += v;
  }
  Say("int3_hits", c->probe(p_int3).hits.load());
  Say("jump_hits", c->probe(p_jump).hits.load());
  Say("lost", c->probe(p_int3).lost.load() + c->probe(p_jump).lost.load());
  Say("records", records);
  Say("records_plus_lost", records + c->probe(p_int3).lost.load() + c->probe(p_jump).lost.load());
  Say("out_of_order", out_of_order);
  Say("wrong_tid", wrong_tid);
  Say("bad_results", bad_results.load());
  Say("no_thread_slot", c->ctl().no_thread_slot.load());
  Say("recursion_miss", c->ctl().recursion_miss.load());
  return 0;
}

// ---------------------------------------------------------------------------------------
// watchdog: the lifeline closes while threads run through patched code; the agent restores
// every byte itself.

int Watchdog() {
  auto c = Start();
  struct Site {
    uint64_t addr;
    uint32_t len;
    std::vector<uint8_t> original;
  };
  std::vector<Site> sites = {
      {Addr(&kwt_args), 1, {}},
      {Addr(kwt_call_insn), static_cast<uint32_t>(kwt_call_next - kwt_call_insn), {}},
      {Addr(&kwt_fib), 1, {}},
      {Addr(&kwt_jfunc), 6, {}}};
  for (auto& s : sites) {
    const auto* p = reinterpret_cast<const uint8_t*>(s.addr);
    s.original.assign(p, p + s.len);
  }
  ProbeSpec a = Int3At(Addr(&kwt_args), 1);
  ProbeSpec call = At(kwt_call_insn, kwt_call_next, ag::kKwResumeCall);
  call.target = Addr(&kwt_inc);
  ProbeSpec fib = Int3At(Addr(&kwt_fib), 1);
  fib.flags |= ag::kKwProbeReturn;
  const uint32_t pa = c->AddProbe(a);
  const uint32_t pc = c->AddProbe(call);
  const uint32_t pf = c->AddProbe(fib);
  const uint32_t pj = JumpProbe(*c, ProbeSpec{});
  c->SetState(ag::kKwStateActive);
  c->PatchInt3(sites[0].addr, pa);
  c->PatchInt3(sites[1].addr, pc);
  c->PatchInt3(sites[2].addr, pf);
  ArmJump(*c, pj);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> calls{0};
  std::atomic<uint64_t> bad{0};
  std::vector<std::thread> threads;
  threads.reserve(2);
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&] {
      while (!stop.load()) {
        uint64_t ok = 1;
        ok &= kwt_args(3, 4, nullptr) == 7 ? 1 : 0;
        ok &= kwt_call(5) == 16 ? 1 : 0;
        ok &= kwt_fib(10) == 55 ? 1 : 0;
        ok &= kwt_jfunc(3, 4) == 10 ? 1 : 0;
        bad.fetch_add(1 - ok);
        calls.fetch_add(1);
      }
    });
  }
  while (c->probe(pa).hits.load() < 200) {
    sched_yield();
  }
  c->CloseLifeline();
  const int32_t watchdog = c->ctl().watchdog_tid;
  for (int i = 0; i < 20000 && c->ctl().state.load() != ag::kKwStateRestored; ++i) {
    usleep(500);
  }
  const uint64_t at_restore = calls.load();
  while (calls.load() < at_restore + 200) {
    sched_yield();
  }
  stop.store(true);
  for (auto& th : threads) {
    th.join();
  }
  uint64_t bytes_ok = 0;
  for (const auto& s : sites) {
    bytes_ok +=
        std::memcmp(reinterpret_cast<const void*>(s.addr), s.original.data(), s.len) == 0 ? 1 : 0;
  }
  const std::string task = "/proc/self/task/" + std::to_string(watchdog);
  bool gone = false;
  for (int i = 0; i < 20000 && !gone; ++i) {
    gone = access(task.c_str(), F_OK) != 0;
    if (!gone) {
      usleep(500);
    }
  }
  Say("state", c->ctl().state.load());
  Say("restored_by_agent", c->ctl().restored_by_agent.load());
  Say("sites", sites.size());
  Say("bytes_ok", bytes_ok);
  Say("bad_results", bad.load());
  Say("watchdog_was", watchdog > 0 ? 1 : 0);
  Say("watchdog_gone", gone ? 1 : 0);
  Say("calls_after_restore", calls.load() - at_restore >= 200 ? 1 : 0);
  Say("lifeline_closed", fcntl(static_cast<int>(c->ctl().lifeline_fd), F_GETFD) == -1 ? 1 : 0);
  return 0;
}

// lifeline-reuse: the program closes the agent's lifeline fd and reuses its number; the
// watchdog still sees kwatch go, and leaves the program's file alone.
int LifelineReuse() {
  auto c = Start();
  const int fd = static_cast<int>(c->ctl().lifeline_fd);
  close(fd);
  const int other = open("/dev/null", O_RDONLY | O_CLOEXEC);
  dup2(other, fd);
  close(other);
  c->CloseLifeline();
  for (int i = 0; i < 20000 && c->ctl().state.load() != ag::kKwStateRestored; ++i) {
    usleep(500);
  }
  const int32_t watchdog = c->ctl().watchdog_tid;
  const std::string task = "/proc/self/task/" + std::to_string(watchdog);
  for (int i = 0; i < 20000 && access(task.c_str(), F_OK) == 0; ++i) {
    usleep(500);
  }
  std::array<char, 64> path{};
  const std::string link = "/proc/self/fd/" + std::to_string(fd);
  const ssize_t n = readlink(link.c_str(), path.data(), path.size() - 1);
  Say("state", c->ctl().state.load());
  Say("program_fd_kept", n > 0 && std::string(path.data()) == "/dev/null" ? 1 : 0);
  return 0;
}

// ---------------------------------------------------------------------------------------
// fork follow|detach N: a fork inside a return-probed call; the child's hits are its own
// (follow) or its code is restored and nothing is recorded (detach).

std::unique_ptr<LocalController>* g_fork_controller = nullptr;
int g_fork_n = 0;
bool g_fork_follow = false;

uint64_t Forker(uint64_t /*unused*/) {
  std::fflush(stdout);
  const pid_t pid = fork();
  if (pid != 0) {
    return static_cast<uint64_t>(pid);
  }
  // The child: its own hits, then it returns through the trampoline like its parent.
  for (int i = 0; i < g_fork_n; ++i) {
    kwt_args(1000 + static_cast<uint64_t>(i), 0, nullptr);
  }
  const uint8_t byte = *reinterpret_cast<const uint8_t*>(Addr(&kwt_args));
  std::printf("child_code=%s\n", byte == 0xCC ? "patched" : "original");
  return 0;
}

int Fork(bool follow, int n) {
  Layout l;
  l.flags = follow ? uint32_t{ag::kKwFollowForks} : 0U;
  auto c = Start(l);
  g_fork_controller = &c;
  g_fork_n = n;
  g_fork_follow = follow;
  ProbeSpec a = Int3At(Addr(&kwt_args), 1);
  a.fetch = {OpBegin(0), OpReg(ag::kKwRdi), OpStore(8), OpEnd()};
  ProbeSpec cb = Int3At(Addr(&kwt_callback), 1);
  cb.flags |= ag::kKwProbeReturn;
  cb.fetch = a.fetch;
  const uint32_t pa = c->AddProbe(a);
  const uint32_t pc = c->AddProbe(cb);
  c->SetState(ag::kKwStateActive);
  c->PatchInt3(Addr(&kwt_args), pa);
  c->PatchInt3(Addr(&kwt_callback), pc);
  const uint64_t child = kwt_callback(Forker, 0);
  if (child == 0) {
    std::printf("child_returned=1\n");
    std::fflush(stdout);
    _exit(0);
  }
  int status = 0;
  waitpid(static_cast<pid_t>(child), &status, 0);
  for (int i = 0; i < n; ++i) {
    kwt_args(2000 + static_cast<uint64_t>(i), 0, nullptr);
  }
  uint64_t parent_hits = 0;
  uint64_t child_hits = 0;
  uint64_t parent_returns = 0;
  uint64_t child_returns = 0;
  c->Drain([&](const Hit& h) {
    const bool from_child = h.rec.tid == static_cast<int32_t>(child);
    if (h.rec.type == ag::kKwRecordReturn) {
      (from_child ? child_returns : parent_returns) += 1;
    } else {
      (from_child ? child_hits : parent_hits) += 1;
    }
  });
  uint64_t child_slots = 0;
  for (uint32_t i = 0; i < l.threads; ++i) {
    child_slots += c->thread(i).pid == static_cast<int32_t>(child) ? 1 : 0;
  }
  Say("child_exit", WIFEXITED(status) ? static_cast<uint64_t>(WEXITSTATUS(status)) : 999);
  Say("forks_seen", c->ctl().forks_seen.load());
  Say("parent_hits", parent_hits);
  Say("child_hits", child_hits);
  Say("parent_returns", parent_returns);
  Say("child_returns", child_returns);
  Say("child_slots", child_slots);
  Say("parent_code_patched", *reinterpret_cast<const uint8_t*>(Addr(&kwt_args)) == 0xCC ? 1 : 0);
  Say("forks_followed", c->ctl().forks_followed.load());
  // The process table: the child's entry (followed), or none (not followed).
  uint64_t entries = 0;
  for (uint32_t i = 0; i < l.processes; ++i) {
    const KwProcess& p = c->process(i);
    if (p.pid.load() == 0) {
      continue;
    }
    ++entries;
    Say("entry_is_child", p.pid.load() == static_cast<int32_t>(child) ? 1 : 0);
    Say("entry_parent_is_us", p.parent == getpid() ? 1 : 0);
    Say("entry_state", p.state.load());
  }
  Say("process_entries", entries);
  return 0;
}

// ---------------------------------------------------------------------------------------
// sigmask: the program blocks SIGSEGV (pthread_sigmask, and a raw system call); a probe's bad
// pointer still only gives a fault status.

uint64_t KernelBlocked() {
  std::ifstream in("/proc/thread-self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.starts_with("SigBlk:")) {
      return std::strtoull(line.c_str() + 7, nullptr, 16);
    }
  }
  return ~0ULL;
}

int Sigmask() {
  auto c = Start();
  ProbeSpec s;
  s.fetch = {OpBegin(0), OpReg(ag::kKwRsi), OpDeref(), OpStore(8), OpEnd()};
  const uint32_t pj = JumpProbe(*c, s);
  ProbeSpec a = Int3At(Addr(&kwt_args), 1);
  a.fetch = {OpBegin(0), OpReg(ag::kKwRdx), OpDeref(), OpStore(8), OpEnd()};
  const uint32_t pa = c->AddProbe(a);
  c->SetState(ag::kKwStateActive);
  ArmJump(*c, pj);
  c->PatchInt3(Addr(&kwt_args), pa);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGSEGV);
  sigaddset(&set, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  sigset_t now;
  pthread_sigmask(SIG_BLOCK, nullptr, &now);
  const uint64_t kernel = KernelBlocked();
  const uint64_t bad = Unmapped();
  kwt_jfunc(1, bad);
  // A raw rt_sigprocmask (as Go does) is not seen by the hook: the INT3 path unblocks for
  // its own time.
  const uint64_t segv = 1ULL << (SIGSEGV - 1);
  syscall(SYS_rt_sigprocmask, SIG_BLOCK, &segv, nullptr, 8);
  kwt_args(1, 2, reinterpret_cast<const void*>(bad));
  const uint64_t kernel_after = KernelBlocked();
  uint64_t faults = 0;
  c->Drain([&](const Hit& h) { faults += h.args.size() == 1 && h.args[0].status == 1 ? 1 : 0; });
  Say("view_segv_blocked", sigismember(&now, SIGSEGV) == 1 ? 1 : 0);
  Say("view_usr1_blocked", sigismember(&now, SIGUSR1) == 1 ? 1 : 0);
  Say("kernel_segv_blocked", (kernel & segv) != 0 ? 1 : 0);
  Say("kernel_usr1_blocked", (kernel & (1ULL << (SIGUSR1 - 1))) != 0 ? 1 : 0);
  Say("raw_block_kept", (kernel_after & segv) != 0 ? 1 : 0);
  Say("fault_statuses", faults);
  return 0;
}

// ---------------------------------------------------------------------------------------
// altstack: a stack overflow handled on the program's sigaltstack (SA_ONSTACK handler
// installed after the agent).

sigjmp_buf g_alt_jump;
volatile int g_alt_on_stack = 0;
stack_t g_alt;
void OnOverflow(int /*sig*/, siginfo_t* /*si*/, void* /*uc*/) {
  volatile char here = 0;
  const auto at = Addr(&here);
  g_alt_on_stack = at >= Addr(g_alt.ss_sp) && at < Addr(g_alt.ss_sp) + g_alt.ss_size ? 1 : 0;
  siglongjmp(g_alt_jump, 1);
}
// Keeps `p` (a stack frame's array) alive for the optimizer.
void Escape(void* p) {
  asm volatile("" : : "g"(p) : "memory");
}
volatile uint64_t g_depth_limit = ~0ULL;  // never reached: the stack ends first
uint64_t Recurse(uint64_t depth) {
  std::array<char, 1024> pad{};
  Escape(pad.data());
  pad[0] = static_cast<char>(depth);
  if (depth == g_depth_limit) {
    return 0;
  }
  return Recurse(depth + 1) + pad[0];
}

int Altstack() {
  auto c = Start();
  volatile int recovered = 0;
  std::thread t([&] {
    g_alt.ss_sp = std::malloc(1 << 16);
    g_alt.ss_size = 1 << 16;
    g_alt.ss_flags = 0;
    sigaltstack(&g_alt, nullptr);
    struct sigaction sa {};
    sa.sa_sigaction = OnOverflow;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigaction(SIGSEGV, &sa, nullptr);
    if (sigsetjmp(g_alt_jump, 1) == 0) {
      Recurse(0);
    } else {
      recovered = 1;
    }
  });
  t.join();
  Say("recovered", static_cast<uint64_t>(recovered));
  Say("on_altstack", static_cast<uint64_t>(g_alt_on_stack));
  return 0;
}

// ---------------------------------------------------------------------------------------
// init: refusals with their reasons, a second session while one is live, and a new session
// after the first is restored.

int InitCases() {
  auto try_init = [](const char* name, const std::function<void(KwControl&)>& spoil) {
    auto c = LocalController::Create(Layout{});
    spoil(c->ctl());
    const int r = c->LoadAgent(KWATCH_AGENT_PATH);
    std::printf("%s=%d/%u\n", name, r, c->ctl().init_error);
  };
  try_init("bad_magic", [](KwControl& k) { k.magic = 1; });
  try_init("bad_version", [](KwControl& k) { k.abi_version = 999; });
  try_init("bad_ring", [](KwControl& k) { k.ring_bytes = 100; });
  try_init("bad_size", [](KwControl& k) { k.total_size += 4096; });
  try_init("bad_lifeline", [](KwControl& k) { k.lifeline_fd = 999; });
  auto first = LocalController::Create(Layout{});
  const int r1 = first->LoadAgent(KWATCH_AGENT_PATH);
  std::printf("first=%d/%u features=%u\n", r1, first->ctl().init_error,
              first->ctl().agent_features);
  ProbeSpec a = Int3At(Addr(&kwt_args), 1);
  const uint32_t p1 = first->AddProbe(a);
  first->SetState(ag::kKwStateActive);
  first->PatchInt3(Addr(&kwt_args), p1);
  kwt_args(1, 2, nullptr);
  try_init("while_live", [](KwControl&) {});
  first->RestoreAll();
  auto second = LocalController::Create(Layout{});
  const int r2 = second->LoadAgent(KWATCH_AGENT_PATH);
  std::printf("second=%d/%u\n", r2, second->ctl().init_error);
  const uint32_t p2 = second->AddProbe(a);
  second->SetState(ag::kKwStateActive);
  second->PatchInt3(Addr(&kwt_args), p2);
  kwt_args(1, 2, nullptr);
  kwt_args(1, 2, nullptr);
  Say("first_hits", first->probe(p1).hits.load());
  Say("second_hits", second->probe(p2).hits.load());
  Say("jump_entry_set", second->ctl().jump_entry != 0 ? 1 : 0);
  Say("agent_base_set", second->ctl().agent_base != 0 ? 1 : 0);
  return 0;
}

// ---------------------------------------------------------------------------------------
// jump N: a jump probe with register and %xmm arguments and a return probe chained at the
// same address.

int Jump(int n) {
  Layout l;
  l.ring_bytes = 1 << 22;
  auto c = Start(l);
  ProbeSpec entry;
  entry.fetch = {OpBegin(0), OpReg(ag::kKwRdi), OpStore(8),  OpBegin(1), OpReg(ag::kKwRsi),
                 OpStore(8), OpBegin(2),        OpXmm(0, 8), OpEnd()};
  const uint32_t pe = JumpProbe(*c, entry);
  ProbeSpec ret;
  ret.flags |= ag::kKwProbeReturn;
  ret.in_hash = false;
  ret.fetch = {OpBegin(0), OpReg(ag::kKwRax), OpStore(8), OpEnd()};
  const uint32_t pr = JumpProbe(*c, ret);
  c->Chain(pe, pr);
  c->SetState(ag::kKwStateActive);
  ArmJump(*c, pe);
  uint64_t results_ok = 0;
  for (int i = 0; i < n; ++i) {
    const auto a = static_cast<uint64_t>(i);
    results_ok += kwt_xmm_call(a, a + 7, kwt_jfunc, a * 11) == 3 * a + 7 ? 1 : 0;
  }
  uint64_t entries = 0;
  uint64_t returns = 0;
  uint64_t entries_ok = 0;
  uint64_t returns_ok = 0;
  c->Drain([&](const Hit& h) {
    if (h.rec.type == ag::kKwRecordHit) {
      const uint64_t a = entries++;
      entries_ok += h.rec.probe_index == pe && h.args.size() == 3 && h.args[0].U64() == a &&
                            h.args[1].U64() == a + 7 && h.args[2].U64() == a * 11
                        ? 1
                        : 0;
    } else {
      const uint64_t a = returns++;
      returns_ok += h.rec.probe_index == pr && h.args.size() == 1 && h.args[0].U64() == 3 * a + 7 &&
                            h.rec.ip == Addr(&kwt_jfunc)
                        ? 1
                        : 0;
    }
  });
  Say("results_ok", results_ok);
  Say("entries", entries);
  Say("entries_ok", entries_ok);
  Say("returns", returns);
  Say("returns_ok", returns_ok);
  Say("entry_hits", c->probe(pe).hits.load());
  Say("return_hits", c->probe(pr).hits.load());
  Say("active", c->probe(pr).active.load());
  return 0;
}

// ---------------------------------------------------------------------------------------
// per-call N: a watch per call of kwt_callback on the object its argument points to (abi.h
// "Per-call watches"): each call's object armed in this thread's perf breakpoint at the entry,
// disarmed at the return, the call's writes copied into the ring. N calls write their object
// twice (alternately two objects); writes between calls and another thread's writes during a
// call are not the calls'; one call with a NULL object and one with a misaligned one are not
// armed.

std::atomic<int> g_other_phase{0};
uint64_t WriteTwice(uint64_t p) {
  if (p != 0) {
    *reinterpret_cast<volatile uint64_t*>(p) = 1;
    // Another thread writes the object now: not this call's (the breakpoint is this thread's).
    g_other_phase.store(1);
    while (g_other_phase.load() != 2) {
      sched_yield();
    }
    *reinterpret_cast<volatile uint64_t*>(p) = 2;
  }
  return 0;
}

int PerCall(int n) {
  Layout l;
  l.ring_bytes = 1 << 22;
  l.call_watches = 1;
  l.call_sample_type =
      PERF_SAMPLE_IP | PERF_SAMPLE_TID | PERF_SAMPLE_TIME | PERF_SAMPLE_ADDR | PERF_SAMPLE_CPU;
  auto c = Start(l);
  ProbeSpec ret = Int3At(Addr(&kwt_callback), 1);
  ret.flags |= ag::kKwProbeReturn;
  ret.call_watch = 1;
  const uint32_t pr = c->AddProbe(ret);
  ProbeSpec arm = ret;
  arm.flags = ag::kKwProbeUsed | ag::kKwProbeEnabled | ag::kKwProbeCallArm;
  arm.in_hash = false;
  arm.record_bytes = 16;
  arm.fetch = {OpBegin(0), OpReg(ag::kKwRsi), OpStore(8), OpEnd()};
  const uint32_t pa = c->AddProbe(arm);
  c->Chain(pr, pa);
  ag::KwCallWatch& cw = c->call_watch(0);
  cw.function = pr;
  cw.first = 0;
  cw.bp_type = HW_BREAKPOINT_W;
  cw.bp_len = 8;
  c->SetState(ag::kKwStateActive);
  c->PatchInt3(Addr(&kwt_callback), pr);
  alignas(8) static volatile uint64_t objects[2] = {0, 0};
  alignas(8) static uint8_t bytes[16] = {};
  volatile uint64_t* target = nullptr;
  std::atomic<bool> done{false};
  std::thread other([&] {
    while (!done.load()) {
      if (g_other_phase.load() == 1) {
        *target = 7;  // during the call, from another thread
        g_other_phase.store(2);
      }
      sched_yield();
    }
  });
  for (int i = 0; i < n; ++i) {
    target = &objects[i % 2];
    g_other_phase.store(0);
    kwt_callback(WriteTwice, Addr(const_cast<uint64_t*>(&objects[i % 2])));
    objects[i % 2] = 3;  // between calls: not watched
  }
  kwt_callback(WriteTwice, 0);
  kwt_callback(PlusFive, Addr(&bytes[1]));
  done.store(true);
  other.join();
  uint64_t arms = 0, armed = 0, null_objects = 0, unaligned = 0, fds = 0, ends = 0, samples = 0;
  uint64_t sample_addr_ok = 0;
  std::set<uint32_t> calls;
  c->Drain([&](const Hit& h) {
    if (h.payload.size() < sizeof(ag::KwCallRecord)) {
      return;
    }
    ag::KwCallRecord r{};
    std::memcpy(&r, h.payload.data(), sizeof(r));
    if (h.rec.type == ag::kKwRecordCallArm) {
      ++arms;
      calls.insert(r.call);
      armed += r.status == ag::kKwCallArmed ? 1 : 0;
      null_objects += r.status == ag::kKwCallNull ? 1 : 0;
      unaligned += r.status == ag::kKwCallUnaligned ? 1 : 0;
      fds += r.new_fd >= 0 ? 1 : 0;
    } else if (h.rec.type == ag::kKwRecordCallEnd) {
      ++ends;
    } else if (h.rec.type == ag::kKwRecordCallSamples) {
      size_t at = sizeof(r);
      while (at + sizeof(perf_event_header) <= h.payload.size()) {
        perf_event_header ph{};
        std::memcpy(&ph, h.payload.data() + at, sizeof(ph));
        if (ph.size == 0) {
          break;
        }
        if (ph.type == PERF_RECORD_SAMPLE) {
          ++samples;
          uint64_t addr = 0;  // IP, TID, TIME, ADDR: the breakpoint's address
          std::memcpy(&addr, h.payload.data() + at + 8 + 24, sizeof(addr));
          sample_addr_ok += addr == r.addr ? 1 : 0;
        }
        at += ph.size;
      }
    }
  });
  Say("arms", arms);
  Say("calls", calls.size());
  Say("armed", armed);
  Say("null", null_objects);
  Say("unaligned", unaligned);
  Say("fds_opened", fds);
  Say("ends", ends);
  Say("samples", samples);
  Say("sample_addr_ok", sample_addr_ok);
  Say("active", c->probe(pr).active.load());
  Say("missed", c->call_watch(0).missed.load());
  return 0;
}

// ---------------------------------------------------------------------------------------
// fetch-edges: reads that end at an unmapped page (ABI v3). At the last 4 bytes of a page
// ("tail", no NUL, the next page unmapped): a 4-byte dereference reads them, an 8-byte one
// faults, a string keeps them (fault status). On a thread whose stack mapping ends at an
// unmapped page: a stack copy larger than what is left keeps the bytes up to the end.

void* EdgeStackThread(void* /*unused*/) {
  kwt_args(3, 4, nullptr);
  return nullptr;
}

int FetchEdges() {
  constexpr uint32_t kSlice = 40 * 1024;
  Layout layout;
  layout.ring_bytes = 1 << 17;
  auto c = Start(layout);
  ProbeSpec s = Int3At(Addr(&kwt_args), 1);
  s.record_bytes = kSlice + 128;
  s.fetch = {OpBegin(0), OpReg(ag::kKwRdx), OpDerefSize(4), OpStore(8),  //
             OpBegin(1), OpReg(ag::kKwRdx), OpReadStr(32),               //
             OpBegin(2), OpReg(ag::kKwRdx), OpDeref(),      OpStore(8),  //
             OpBegin(3), OpReg(ag::kKwRsp), OpStore(8),                  //
             OpBegin(4), OpStack(kSlice),                                //
             OpEnd()};
  const uint32_t pi = c->AddProbe(s);
  c->SetState(ag::kKwStateActive);
  c->PatchInt3(Addr(&kwt_args), pi);
  constexpr size_t kPage = 4096;
  auto* page = static_cast<char*>(
      mmap(nullptr, 2 * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  munmap(page + kPage, kPage);
  constexpr std::array<char, 4> kTail = {'t', 'a', 'i', 'l'};  // no NUL
  std::copy(kTail.begin(), kTail.end(), page + kPage - kTail.size());
  kwt_args(1, 2, page + kPage - kTail.size());
  // A 32 KiB thread stack followed by an unmapped page.
  constexpr size_t kStack = size_t{32} * 1024;
  auto* stack = static_cast<char*>(
      mmap(nullptr, kStack + kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  munmap(stack + kStack, kPage);
  const uint64_t top = Addr(stack + kStack);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstack(&attr, stack, kStack);
  pthread_t th{};
  pthread_create(&th, &attr, EdgeStackThread, nullptr);
  pthread_join(th, nullptr);
  pthread_attr_destroy(&attr);
  std::vector<Hit> hits;
  c->Drain([&](const Hit& h) { hits.push_back(h); });
  Say("records", hits.size());
  if (hits.size() != 2 || hits[0].args.size() != 5 || hits[1].args.size() != 5) {
    return 1;
  }
  // Which hit is whose: the rings are drained in no set order (under load the thread's hit
  // came first), so tell them apart by the stack they ran on.
  const bool thread_first = hits[0].args[3].U64() >= Addr(stack) && hits[0].args[3].U64() < top;
  const Hit& h = hits[thread_first ? 1 : 0];
  Say("deref4", h.args[0].U64());
  Say("deref4_status", h.args[0].status);
  std::printf("str=%s\n", std::string(reinterpret_cast<const char*>(h.args[1].bytes.data()),
                                      h.args[1].bytes.size())
                              .c_str());
  Say("str_status", h.args[1].status);
  Say("deref8_status", h.args[2].status);
  const Hit& t = hits[thread_first ? 0 : 1];
  const uint64_t rsp = t.args[3].U64();
  const Arg& slice = t.args[4];
  Say("stack_status", slice.status);
  Say("stack_to_end", slice.bytes.size() == top - rsp ? 1 : 0);
  Say("stack_short", slice.bytes.size() < kSlice ? 1 : 0);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc < 2) {
    std::fprintf(stderr, "usage: agent_host SCENARIO [ARGS...]\n");
    return 2;
  }
  const std::string what = argv[1];
  const int n = argc > 2 ? std::atoi(argv[2]) : 0;
  if (what == "int3-args") {
    return Int3Args(n);
  }
  if (what == "resume") {
    return Resume();
  }
  if (what == "ret-fib") {
    return RetFib(n, argc > 3 ? std::atoi(argv[3]) : 0);
  }
  if (what == "ret-longjmp") {
    return RetLongjmp(n);
  }
  if (what == "own-trap") {
    return OwnTrap(argc > 2 ? argv[2] : "", argc > 3 ? std::atoi(argv[3]) : 0);
  }
  if (what == "die-int3" || what == "die-segv") {
    return Die(what, !(argc > 2 && std::string(argv[2]) == "--no-agent"));
  }
  if (what == "segv-handler") {
    return SegvHandler();
  }
  if (what == "ring-full") {
    return RingFull();
  }
  if (what == "threads") {
    return Threads(n);
  }
  if (what == "watchdog") {
    return Watchdog();
  }
  if (what == "fork") {
    return Fork(argc > 2 && std::string(argv[2]) == "follow", argc > 3 ? std::atoi(argv[3]) : 0);
  }
  if (what == "sigmask") {
    return Sigmask();
  }
  if (what == "altstack") {
    return Altstack();
  }
  if (what == "init") {
    return InitCases();
  }
  if (what == "lifeline-reuse") {
    return LifelineReuse();
  }
  if (what == "jump") {
    return Jump(n);
  }
  if (what == "per-call") {
    return PerCall(n);
  }
  if (what == "fetch-edges") {
    return FetchEdges();
  }
  std::fprintf(stderr, "agent_host: unknown scenario %s\n", what.c_str());
  return 2;
}
