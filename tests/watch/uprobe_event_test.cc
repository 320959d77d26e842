#include "watch/uprobe_event.h"

#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "core/base/unique_fd.h"
#include "core/symbols/symbols.h"
#include "tests/test_util.h"

namespace kwatch::watch {
namespace {

using ::kwatch::testing::TargetPath;

// File offset of link-time address `vaddr` in ELF file `path` (its PT_LOAD segment).
uint64_t FileOffsetOf(const std::string& path, uint64_t vaddr) {
  elf_version(EV_CURRENT);
  core::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  EXPECT_TRUE(fd.valid());
  Elf* elf = elf_begin(fd.get(), ELF_C_READ, nullptr);
  EXPECT_NE(elf, nullptr);
  size_t n = 0;
  elf_getphdrnum(elf, &n);
  uint64_t off = 0;
  for (size_t i = 0; i < n; ++i) {
    GElf_Phdr ph;
    if (gelf_getphdr(elf, static_cast<int>(i), &ph) != nullptr && ph.p_type == PT_LOAD &&
        vaddr >= ph.p_vaddr && vaddr < ph.p_vaddr + ph.p_filesz) {
      off = vaddr - ph.p_vaddr + ph.p_offset;
    }
  }
  elf_end(elf);
  return off;
}

// A uprobe opened with pid -1 is on the inode: every process running that file hits it,
// including the same fixture run by another test at the same time (ctest -j). Each test
// therefore probes its own copy of the target, a file no one else runs.
struct TickProbe {
  std::filesystem::path dir;
  std::string path;
  uint64_t offset = 0;

  TickProbe() = default;
  TickProbe(const TickProbe&) = delete;
  TickProbe& operator=(const TickProbe&) = delete;
  ~TickProbe() {
    std::error_code ec;
    if (!dir.empty()) {
      std::filesystem::remove_all(dir, ec);
    }
  }
};

void Tick(TickProbe& t) {
  char tmpl[] = "/tmp/kwatch-uprobe-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr) << "mkdtemp: " << std::strerror(errno);
  t.dir = tmpl;
  t.path = (t.dir / "uprobe_loop").string();
  std::filesystem::copy_file(TargetPath("uprobe_loop"), t.path);
  auto syms = core::symbols::Symbols::ForFile(t.path);
  EXPECT_TRUE(syms.ok()) << syms.status();
  auto fn = (*syms)->FindFunction("tick");
  EXPECT_TRUE(fn.has_value());
  t.offset = FileOffsetOf(t.path, fn->start.value);
  EXPECT_NE(t.offset, 0u);
}

TEST(UprobeEvent, PmuIsFound) {
  auto pmu = FindUprobePmu();
  ASSERT_TRUE(pmu.ok()) << pmu.status();
  EXPECT_GT(pmu->type, 0u);
}

TEST(UprobeEvent, GlobalEntryProbeSeesEveryCallWithArguments) {
  TickProbe t;
  Tick(t);
  auto ev = UprobeEvent::Open({.path = t.path, .file_offset = t.offset, .ring_pages = 512});
  ASSERT_TRUE(ev.ok()) << ev.status();
  // The probe is on the inode: a process started after it is opened is probed.
  auto run = kwatch::testing::Run({t.path, "1000"});
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_code, 0);
  // sum of 3i + 100 for i < 1000
  EXPECT_EQ(run->out, "sum=1598500\n");

  // Hits come per CPU ring; the process may have moved between CPUs: order them by time.
  struct Seen {
    uint64_t time_ns;
    uint64_t arg;
    std::optional<int64_t> len;
  };
  std::vector<Seen> seen;
  pid_t pid = 0;
  (*ev)->Drain([&](const UprobeHit& hit) {
    if (pid == 0) {
      pid = hit.pid;
    }
    if (hit.pid != pid) {
      return;  // another test running the same fixture at the same time
    }
    Seen s{hit.time_ns, hit.regs.rdi, std::nullopt};
    const uint64_t r = hit.regs.rsi;  // struct req* on the caller's stack
    const uint64_t len_at = r + 8;
    if (len_at >= hit.regs.rsp && len_at + 8 <= hit.regs.rsp + hit.stack.size()) {
      int64_t len = 0;
      std::memcpy(&len, hit.stack.data() + (len_at - hit.regs.rsp), 8);
      s.len = len;
    }
    seen.push_back(s);
  });
  std::stable_sort(seen.begin(), seen.end(),
                   [](const Seen& a, const Seen& b) { return a.time_ns < b.time_ns; });
  std::vector<uint64_t> args;
  std::vector<int64_t> lens;
  for (const Seen& s : seen) {
    args.push_back(s.arg);
    if (s.len.has_value()) {
      lens.push_back(*s.len);
    }
  }
  ASSERT_EQ(args.size(), 1000u);
  for (uint64_t i = 0; i < 1000; ++i) {
    ASSERT_EQ(args[i], i);
  }
  ASSERT_EQ(lens.size(), 1000u) << "struct req was not inside the sampled stack";
  EXPECT_EQ(lens.front(), 100);
  EXPECT_EQ((*ev)->lost(), 0u);
  auto count = (*ev)->Count();
  ASSERT_TRUE(count.ok());
  EXPECT_GE(*count, 1000u);
}

TEST(UprobeEvent, ReturnProbeSeesReturnValues) {
  TickProbe t;
  Tick(t);
  auto ev = UprobeEvent::Open(
      {.path = t.path, .file_offset = t.offset, .is_return = true, .ring_pages = 512});
  ASSERT_TRUE(ev.ok()) << ev.status();
  auto run = kwatch::testing::Run({t.path, "500"});
  ASSERT_TRUE(run.ok()) << run.status();
  std::vector<std::pair<uint64_t, uint64_t>> timed;  // (time, return value), per CPU ring
  pid_t pid = 0;
  (*ev)->Drain([&](const UprobeHit& hit) {
    if (pid == 0) {
      pid = hit.pid;
    }
    if (hit.pid == pid) {
      timed.emplace_back(hit.time_ns, hit.regs.rax);
    }
  });
  std::stable_sort(timed.begin(), timed.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<uint64_t> rets;
  for (const auto& [time_ns, rax] : timed) {
    rets.push_back(rax);
  }
  ASSERT_EQ(rets.size(), 500u);
  for (uint64_t i = 0; i < 500; ++i) {
    ASSERT_EQ(rets[i], 3 * i + 100);
  }
}

TEST(UprobeEvent, BadOffsetAndPathAreExplained) {
  TickProbe t;
  Tick(t);
  auto missing = UprobeEvent::Open({.path = "/nonexistent/prog", .file_offset = 0x1000});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/nonexistent/prog"), std::string::npos)
      << missing.status();
  auto beyond = UprobeEvent::Open({.path = t.path, .file_offset = 0x7fffffff});
  ASSERT_FALSE(beyond.ok());
  EXPECT_NE(beyond.status().message().find("perf_event_open(uprobe"), std::string::npos)
      << beyond.status();
}

}  // namespace
}  // namespace kwatch::watch
