// The probe printers, exactly: one hit as a text line and as a JSON line, the column header,
// -q, a closed output, and the summaries (text and JSON, --hw's registers in JSON).

#include "cli/probe_output.h"

#include <sys/mman.h>
#include <unistd.h>

#include <array>
#include <csignal>
#include <cstdio>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/base/unique_fd.h"
#include "watch/probe/hit_tally.h"
#include "watch/probe/probe_note.h"
#include "watch/probe/probe_session.h"

namespace kwatch::cli {
namespace {

using watch::probe::HitTally;
using watch::probe::ProbeNote;
using watch::probe::ProbeSessionEnd;

constexpr uint64_t kStart = 1'000'000'000'000;
constexpr uint64_t kBias = 0x555555554000;

std::vector<ProbeDef> TwoProbes() {
  std::vector<ProbeDef> probes(2);
  probes[0].id = 1;
  probes[0].spec = "tick i r->len";
  probes[0].point.event = "tick";
  probes[0].point.function = "tick";
  probes[0].point.vaddr = core::RemoteAddr{0x1189};
  probes[0].point.function_start = core::RemoteAddr{0x1189};
  probes[0].point.file = "/src/uprobe_loop.c";
  probes[0].point.line = 17;
  probes[1].id = 2;
  probes[1].spec = "tick%return $retval";
  probes[1].point.event = "tick__return";
  probes[1].point.function = "tick";
  probes[1].point.vaddr = core::RemoteAddr{0x1189};
  probes[1].point.function_start = core::RemoteAddr{0x1189};
  probes[1].point.file = "/src/uprobe_loop.c";
  probes[1].point.line = 17;
  probes[1].point.is_return = true;
  return probes;
}

ProbeHit EntryHit(const ProbeDef& p) {
  ProbeHit h;
  h.time_ns = kStart + 1'500'000'000;
  h.pid = 4243;
  h.tid = 4243;
  h.cpu = 1;
  h.probe = &p;
  h.ip = core::RemoteAddr{0x1189 + kBias};
  h.args = {{"i", "0"}, {"r->len", "100"}, {"r->name", "\"lo\\nop\""}};
  return h;
}

// A followed child's return hit, no cpu known.
ProbeHit ReturnHit(const ProbeDef& p) {
  ProbeHit h;
  h.time_ns = kStart + 2'250'000'000;
  h.pid = 4250;
  h.tid = 4251;
  h.probe = &p;
  h.ip = core::RemoteAddr{0x1189 + kBias};
  h.return_address = core::RemoteAddr{0x11f0 + kBias};
  h.args = {{"arg1", "103"}};
  return h;
}

PrinterOptions Options(bool quiet = false) {
  PrinterOptions o;
  o.quiet = quiet;
  o.start_ns = kStart;
  o.main_pid = 4243;
  o.caller = [](core::RemoteAddr ra) {
    return ra.value == 0x11f0 + kBias ? std::string("run+0x4b (uprobe_loop.c:26)")
                                      : std::string("?");
  };
  return o;
}

// What was written to a memfd.
std::string Contents(int fd) {
  std::string out;
  std::array<char, 4096> buf{};
  ::lseek(fd, 0, SEEK_SET);
  for (ssize_t n; (n = ::read(fd, buf.data(), buf.size())) > 0;) {
    out.append(buf.data(), static_cast<size_t>(n));
  }
  return out;
}

// What PrintSummary wrote.
std::string Summary(const ProbePrinter& printer, const ProbeSummary& s) {
  char* buf = nullptr;
  size_t len = 0;
  FILE* mem = ::open_memstream(&buf, &len);
  EXPECT_NE(mem, nullptr);
  if (mem == nullptr) {
    return "";
  }
  printer.PrintSummary(mem, s);
  std::fclose(mem);
  std::string text(buf, len);
  std::free(buf);  // NOLINT(cppcoreguidelines-no-malloc): open_memstream's buffer
  return text;
}

TEST(ProbeTextPrinter, HeaderAndOneLinePerHitExactly) {
  const std::vector<ProbeDef> probes = TwoProbes();
  core::UniqueFd fd(::memfd_create("probe-text", MFD_CLOEXEC));
  ASSERT_TRUE(fd.valid());
  ProbeTextPrinter printer(fd.get(), Options());
  printer.OnStart();
  EXPECT_TRUE(printer.Add(EntryHit(probes[0])));
  EXPECT_TRUE(printer.Add(ReturnHit(probes[1])));
  printer.Flush();
  EXPECT_TRUE(printer.status().ok());
  EXPECT_EQ(Contents(fd.get()),
            "TIME(s)      TID     EVENT                LOCATION                           ARGS\n"
            "1.500000     4243    tick                 tick (uprobe_loop.c:17)            i=0 "
            "r->len=100 r->name=\"lo\\nop\"\n"
            "2.250000     4250/4251 tick__return         tick%return <- run+0x4b "
            "(uprobe_loop.c:26) arg1=103\n");
}

TEST(ProbeJsonPrinter, OneObjectPerHitExactlyAndNoHeader) {
  const std::vector<ProbeDef> probes = TwoProbes();
  core::UniqueFd fd(::memfd_create("probe-json", MFD_CLOEXEC));
  ASSERT_TRUE(fd.valid());
  ProbeJsonPrinter printer(fd.get(), Options());
  printer.OnStart();
  EXPECT_TRUE(printer.Add(EntryHit(probes[0])));
  EXPECT_TRUE(printer.Add(ReturnHit(probes[1])));
  printer.Flush();
  EXPECT_EQ(Contents(fd.get()),
            "{\"type\":\"hit\",\"time_ns\":1001500000000,\"time\":1.500000000,\"pid\":4243,"
            "\"tid\":4243,\"cpu\":1,\"probe\":1,\"event\":\"tick\",\"ip\":\"0x555555555189\","
            "\"function\":\"tick\",\"offset\":0,\"file\":\"/src/uprobe_loop.c\",\"line\":17,"
            "\"is_return\":false,\"args\":{\"i\":0,\"r->len\":100,\"r->name\":\"lo\\nop\"}}\n"
            "{\"type\":\"hit\",\"time_ns\":1002250000000,\"time\":2.250000000,\"pid\":4250,"
            "\"tid\":4251,\"cpu\":null,\"probe\":2,\"event\":\"tick__return\","
            "\"ip\":\"0x555555555189\",\"function\":\"tick\",\"offset\":0,"
            "\"file\":\"/src/uprobe_loop.c\",\"line\":17,\"is_return\":true,"
            "\"return_address\":\"0x5555555551f0\",\"caller\":\"run+0x4b (uprobe_loop.c:26)\","
            "\"args\":{\"arg1\":103}}\n");
}

TEST(ProbePrinter, QuietPrintsNoLinesButTakesTheHits) {
  const std::vector<ProbeDef> probes = TwoProbes();
  core::UniqueFd fd(::memfd_create("probe-quiet", MFD_CLOEXEC));
  ProbeTextPrinter printer(fd.get(), Options(/*quiet=*/true));
  printer.OnStart();
  EXPECT_TRUE(printer.Add(EntryHit(probes[0])));
  printer.Flush();
  EXPECT_EQ(Contents(fd.get()), "");
}

TEST(ProbePrinter, AClosedOutputIsTheStopReason) {
  const std::vector<ProbeDef> probes = TwoProbes();
  std::array<int, 2> p{};
  ASSERT_EQ(::pipe(p.data()), 0);
  core::UniqueFd rd(p[0]);
  core::UniqueFd wr(p[1]);
  rd.Reset();  // the reader went away
  void (*old)(int) = std::signal(SIGPIPE, SIG_IGN);
  ProbeJsonPrinter printer(wr.get(), Options());
  EXPECT_TRUE(printer.Add(EntryHit(probes[0])));
  printer.Flush();
  std::signal(SIGPIPE, old);
  EXPECT_EQ(printer.status(), absl::UnavailableError("output closed"));
}

// A session's end as the ptrace backend gives it: two probes, a note, the target's exit.
ProbeSessionEnd PtraceEnd(const std::vector<ProbeDef>& probes) {
  ProbeSessionEnd end;
  end.stats[2].nmissed = 3;
  end.stats[2].abandoned = 1;
  end.info.backend = "ptrace";
  end.info.stop_reason = "target exited";
  end.info.seconds = 0.25;
  end.info.pid = 4243;
  end.info.exit = core::ptrace::ExitInfo{};
  ProbeNote exec;
  exec.kind = ProbeNote::Kind::kExec;
  exec.pid = 4243;
  end.info.notes.push_back(exec);
  (void)probes;
  return end;
}

TEST(ProbeTextPrinter, SummaryExactly) {
  const std::vector<ProbeDef> probes = TwoProbes();
  HitTally tally(probes, 0);
  ASSERT_TRUE(tally.Add(EntryHit(probes[0])));
  ProbeHit second = EntryHit(probes[0]);
  second.args = {{"i", "1"}, {"r->len", "100"}, {"r->name", "\"lo\\nop\""}};
  ASSERT_TRUE(tally.Add(second));
  ASSERT_TRUE(tally.Add(ReturnHit(probes[1])));
  const ProbeSessionEnd end = PtraceEnd(probes);
  ProbeTextPrinter printer(STDOUT_FILENO, Options());
  EXPECT_EQ(Summary(printer, ProbeSummary{probes, tally, end}),
            "\n== kwatch probe summary: 3 hits in 0.250 s, ptrace backend (target exited) ==\n"
            "EVENT                LOCATION                 SOURCE                       HITS   "
            "MISSES  NMISSED\n"
            "tick                 tick                     uprobe_loop.c:17                2     "
            "   0        -\n"
            "    i                2 distinct: 0 (1) 1 (1)\n"
            "    r->len           1 distinct: 100 (2)\n"
            "    r->name          1 distinct: \"lo\\nop\" (2)\n"
            "tick__return         tick%return              uprobe_loop.c:17                1     "
            "   0        3\n"
            "    1 tracked call never returned (longjmp, exception, thread exit)\n"
            "    arg1             1 distinct: 103 (1)\n"
            "note: target 4243 called exec: the probes of the old image ended there\n"
            "target 4243 exited with status 0\n");
}

TEST(ProbeJsonPrinter, SummaryExactlyWithTheDebugRegistersOfHw) {
  const std::vector<ProbeDef> probes = TwoProbes();
  HitTally tally(probes, 0);
  ASSERT_TRUE(tally.Add(EntryHit(probes[0])));
  ProbeSessionEnd end;
  end.info.backend = "hw";
  end.info.stop_reason = "interrupted by INT";
  end.info.seconds = 0.5;
  end.info.pid = 4243;
  ProbeNote placed;
  placed.kind = ProbeNote::Kind::kHwPlacement;
  placed.probe = &probes[0];
  placed.reg = 0;
  placed.address = 0x1189 + kBias;
  end.info.notes.push_back(placed);
  ProbeNote held;
  held.kind = ProbeNote::Kind::kExternalRegisters;
  held.count = 1;
  held.pid = 4243;
  end.info.notes.push_back(held);
  ProbeSessionEnd::Hw& hw = end.hw.emplace();
  hw.registers = {{1, 0}, {2, -1}};
  hw.external_slots = 1;
  hw.stray_traps = 2;
  ProbeJsonPrinter printer(STDOUT_FILENO, Options());
  EXPECT_EQ(
      Summary(printer, ProbeSummary{probes, tally, end}),
      "{\"type\":\"summary\",\"backend\":\"hw\",\"hits\":1,\"seconds\":0.5,"
      "\"stop_reason\":\"interrupted by INT\",\"pid\":4243,\"exit_code\":null,\"signal\":0,"
      "\"probes\":[{\"id\":1,\"event\":\"tick\",\"spec\":\"tick i r->len\",\"location\":\"tick\","
      "\"function\":\"tick\",\"offset\":0,\"file\":\"/src/uprobe_loop.c\",\"line\":17,"
      "\"is_return\":false,\"address\":\"0x1189\",\"hits\":1,\"misses\":0,\"nmissed\":0,"
      "\"abandoned\":0,\"faults\":0,\"lost\":0,\"path\":\"hw\",\"args\":[{\"name\":\"i\","
      "\"distinct\":1,"
      "\"more\":false,\"top\":[{\"value\":\"0\",\"count\":1}]},{\"name\":\"r->len\","
      "\"distinct\":1,\"more\":false,\"top\":[{\"value\":\"100\",\"count\":1}]},"
      "{\"name\":\"r->name\",\"distinct\":1,\"more\":false,\"top\":[{\"value\":"
      "\"\\\"lo\\\\nop\\\"\","
      "\"count\":1}]}],\"debug_register\":0},"
      "{\"id\":2,\"event\":\"tick__return\",\"spec\":\"tick%return $retval\","
      "\"location\":\"tick%return\",\"function\":\"tick\",\"offset\":0,"
      "\"file\":\"/src/uprobe_loop.c\",\"line\":17,\"is_return\":true,\"address\":\"0x1189\","
      "\"hits\":0,\"misses\":0,\"nmissed\":0,\"abandoned\":0,\"faults\":0,\"lost\":0,"
      "\"path\":\"hw\",\"args\":[],\"debug_register\":null}],"
      "\"notes\":[\"hw: probe #1 tick (tick): debug register DR0, execute breakpoint at "
      "0x555555555189 in every thread\",\"hw: 1 debug register was held outside kwatch\"],"
      "\"external_slots\":1,\"stray_traps\":2}\n");
}

}  // namespace
}  // namespace kwatch::cli
