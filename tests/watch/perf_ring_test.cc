#include "watch/perf_ring.h"

#include <linux/perf_event.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>
#include <ctime>
#include <optional>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/base/clock.h"
#include "core/base/unique_fd.h"
#include "tests/test_util.h"
#include "watch/perf_util.h"

namespace kwatch::watch {
namespace {

constexpr size_t kPage = 4096;

// A metadata page plus `data_size` bytes, written the way the kernel writes a perf ring:
// records at data_head (wrapping), head published after the records.
class FakeRing {
 public:
  explicit FakeRing(size_t data_size, uint64_t start = 0)
      : data_size_(data_size), mem_((kPage + data_size) / sizeof(uint64_t), 0), head_(start) {
    meta()->data_head = start;
    meta()->data_tail = start;
  }

  PerfRing Ring(PerfSampleFormat format = {}) {
    return PerfRing::OverMemory(mem_.data(), kPage, data_size_, format);
  }
  perf_event_mmap_page* meta() { return reinterpret_cast<perf_event_mmap_page*>(mem_.data()); }

  // Appends one record (header + payload, payload padded to 8 bytes) without publishing.
  void Put(uint32_t type, const std::vector<uint8_t>& payload) {
    perf_event_header hdr{};
    hdr.type = type;
    hdr.misc = PERF_RECORD_MISC_USER;
    hdr.size = static_cast<uint16_t>(sizeof(hdr) + payload.size());
    EXPECT_EQ(hdr.size % 8, 0);
    std::vector<uint8_t> bytes(sizeof(hdr));
    std::memcpy(bytes.data(), &hdr, sizeof(hdr));
    bytes.insert(bytes.end(), payload.begin(), payload.end());
    uint8_t* data = reinterpret_cast<uint8_t*>(mem_.data()) + kPage;
    for (uint8_t b : bytes) {
      data[head_ % data_size_] = b;
      ++head_;
    }
  }

  void PutSample(const PerfSample& s) {
    std::vector<uint8_t> p(kPerfSampleRecordSize - sizeof(perf_event_header), 0);
    std::memcpy(&p[0], &s.ip, 8);
    std::memcpy(&p[8], &s.pid, 4);
    std::memcpy(&p[12], &s.tid, 4);
    std::memcpy(&p[16], &s.time, 8);
    std::memcpy(&p[24], &s.addr, 8);
    std::memcpy(&p[32], &s.cpu, 4);
    Put(PERF_RECORD_SAMPLE, p);
  }

  // A sample followed by an optional callchain and a REGS_USER block of `abi` and `regs`.
  void PutSampleWithTail(const PerfSample& s, const std::vector<uint64_t>* chain, uint64_t abi,
                         const std::vector<uint64_t>& regs) {
    std::vector<uint8_t> p(kPerfSampleRecordSize - sizeof(perf_event_header), 0);
    std::memcpy(&p[0], &s.ip, 8);
    std::memcpy(&p[8], &s.pid, 4);
    std::memcpy(&p[12], &s.tid, 4);
    std::memcpy(&p[16], &s.time, 8);
    std::memcpy(&p[24], &s.addr, 8);
    std::memcpy(&p[32], &s.cpu, 4);
    auto put64 = [&p](uint64_t v) {
      const size_t at = p.size();
      p.resize(at + 8);
      std::memcpy(&p[at], &v, 8);
    };
    if (chain != nullptr) {
      put64(chain->size());
      for (uint64_t ip : *chain) {
        put64(ip);
      }
    }
    put64(abi);
    for (uint64_t r : regs) {
      put64(r);
    }
    Put(PERF_RECORD_SAMPLE, p);
  }

  void PutLost(uint64_t id, uint64_t lost) {
    std::vector<uint8_t> p(16);
    std::memcpy(&p[0], &id, 8);
    std::memcpy(&p[8], &lost, 8);
    Put(PERF_RECORD_LOST, p);
  }

  void Publish() { __atomic_store_n(&meta()->data_head, head_, __ATOMIC_RELEASE); }
  // Publishes only part of what was written (a record in progress).
  void PublishUpTo(uint64_t head) { __atomic_store_n(&meta()->data_head, head, __ATOMIC_RELEASE); }
  uint64_t head() const { return head_; }
  uint64_t tail() { return meta()->data_tail; }

 private:
  size_t data_size_;
  std::vector<uint64_t> mem_;  // 8-byte aligned like the kernel's pages
  uint64_t head_;
};

PerfSample MakeSample(uint64_t i) {
  PerfSample s;
  s.ip = 0x401000 + i;
  s.pid = 100;
  s.tid = static_cast<uint32_t>(200 + i);
  s.time = 1'000'000'000ULL * i + 7;
  s.addr = 0x7ffd00000000ULL + 8 * i;
  s.cpu = static_cast<uint32_t>(i % 3);
  return s;
}

void ExpectSame(const PerfSample& got, const PerfSample& want) {
  EXPECT_EQ(got.ip, want.ip);
  EXPECT_EQ(got.pid, want.pid);
  EXPECT_EQ(got.tid, want.tid);
  EXPECT_EQ(got.time, want.time);
  EXPECT_EQ(got.addr, want.addr);
  EXPECT_EQ(got.cpu, want.cpu);
}

std::vector<PerfSample> DrainAll(PerfRing& ring, size_t* returned = nullptr) {
  std::vector<PerfSample> out;
  const size_t n = ring.Drain([&](const PerfSample& s) { out.push_back(s); });
  EXPECT_EQ(n, out.size());
  if (returned != nullptr) {
    *returned = n;
  }
  return out;
}

TEST(PerfRing, EmptyRingDeliversNothing) {
  FakeRing fake(kPage);
  PerfRing ring = fake.Ring();
  EXPECT_EQ(ring.Pending(), 0u);
  EXPECT_TRUE(DrainAll(ring).empty());
  EXPECT_EQ(ring.lost(), 0u);
  EXPECT_EQ(fake.tail(), 0u);
}

TEST(PerfRing, ParsesSamplesInOrderAndPublishesTail) {
  FakeRing fake(kPage);
  for (uint64_t i = 0; i < 10; ++i) {
    fake.PutSample(MakeSample(i));
  }
  fake.Publish();
  PerfRing ring = fake.Ring();
  EXPECT_EQ(ring.Pending(), 10 * kPerfSampleRecordSize);

  const std::vector<PerfSample> got = DrainAll(ring);
  ASSERT_EQ(got.size(), 10u);
  for (uint64_t i = 0; i < 10; ++i) {
    ExpectSame(got[i], MakeSample(i));
  }
  EXPECT_EQ(fake.tail(), fake.head());
  EXPECT_EQ(ring.Pending(), 0u);
  EXPECT_TRUE(DrainAll(ring).empty());
}

TEST(PerfRing, LostRecordsAddUpAcrossDrains) {
  FakeRing fake(kPage);
  fake.PutSample(MakeSample(1));
  fake.PutLost(42, 5);
  fake.PutSample(MakeSample(2));
  fake.PutLost(42, 7);
  fake.Publish();
  PerfRing ring = fake.Ring();
  EXPECT_EQ(DrainAll(ring).size(), 2u);
  EXPECT_EQ(ring.lost(), 12u);

  fake.PutLost(42, 1000);
  fake.Publish();
  EXPECT_TRUE(DrainAll(ring).empty());
  EXPECT_EQ(ring.lost(), 1012u);
}

TEST(PerfRing, ReassemblesRecordsWrappingAroundTheEnd) {
  // Start every possible 8-byte position before the end so that a sample splits after 8, 16,
  // ... 40 bytes (and once exactly at the end), and a LOST record splits too.
  for (uint64_t back = 0; back <= kPerfSampleRecordSize; back += 8) {
    SCOPED_TRACE(back);
    const uint64_t start = 3 * kPage - back;  // also exercises head/tail beyond data_size
    FakeRing fake(kPage, start);
    fake.PutSample(MakeSample(1));
    fake.PutLost(9, 3);
    fake.PutSample(MakeSample(2));
    fake.Publish();
    PerfRing ring = fake.Ring();
    const std::vector<PerfSample> got = DrainAll(ring);
    ASSERT_EQ(got.size(), 2u);
    ExpectSame(got[0], MakeSample(1));
    ExpectSame(got[1], MakeSample(2));
    EXPECT_EQ(ring.lost(), 3u);
    EXPECT_EQ(fake.tail(), start + 2 * kPerfSampleRecordSize + 24);
  }
}

TEST(PerfRing, WrapsManyTimesOverASmallBuffer) {
  FakeRing fake(256);  // five samples fit at most
  PerfRing ring = fake.Ring();
  uint64_t next = 0;
  uint64_t seen = 0;
  for (int round = 0; round < 100; ++round) {
    const int batch = 1 + round % 5;
    for (int i = 0; i < batch; ++i) {
      fake.PutSample(MakeSample(next++));
    }
    fake.Publish();
    for (const PerfSample& s : DrainAll(ring)) {
      ExpectSame(s, MakeSample(seen++));
    }
  }
  EXPECT_EQ(seen, next);
  EXPECT_EQ(ring.lost(), 0u);
}

TEST(PerfRing, SkipsUnknownAndOtherRecordTypes) {
  FakeRing fake(kPage, kPage - 16);
  fake.Put(PERF_RECORD_MMAP, std::vector<uint8_t>(56, 0xab));  // wraps, skipped
  fake.PutSample(MakeSample(1));
  fake.Put(PERF_RECORD_THROTTLE, std::vector<uint8_t>(24, 0x11));
  fake.Put(0x7777, std::vector<uint8_t>(8, 0xcc));               // a type from the future
  fake.Put(PERF_RECORD_COMM, std::vector<uint8_t>(1000, 0x22));  // larger than a sample
  fake.PutSample(MakeSample(2));
  fake.Publish();
  PerfRing ring = fake.Ring();
  const std::vector<PerfSample> got = DrainAll(ring);
  ASSERT_EQ(got.size(), 2u);
  ExpectSame(got[0], MakeSample(1));
  ExpectSame(got[1], MakeSample(2));
  EXPECT_EQ(ring.lost(), 0u);
  EXPECT_EQ(ring.Pending(), 0u);
}

TEST(PerfRing, LongerSampleRecordsParseTheirPrefix) {
  FakeRing fake(kPage, kPage - 24);
  // A sample with more fields after CPU (e.g. a callchain): the prefix is ours, rest skipped.
  PerfSample s = MakeSample(5);
  std::vector<uint8_t> p(kPerfSampleRecordSize - sizeof(perf_event_header) + 32, 0xee);
  std::memcpy(&p[0], &s.ip, 8);
  std::memcpy(&p[8], &s.pid, 4);
  std::memcpy(&p[12], &s.tid, 4);
  std::memcpy(&p[16], &s.time, 8);
  std::memcpy(&p[24], &s.addr, 8);
  std::memcpy(&p[32], &s.cpu, 4);
  fake.Put(PERF_RECORD_SAMPLE, p);
  fake.PutSample(MakeSample(6));
  fake.Publish();
  PerfRing ring = fake.Ring();
  const std::vector<PerfSample> got = DrainAll(ring);
  ASSERT_EQ(got.size(), 2u);
  ExpectSame(got[0], s);
  ExpectSame(got[1], MakeSample(6));
}

// The general registers in perf_regs order (AX BX CX DX SI DI BP SP IP R8..R15), distinct.
std::vector<uint64_t> GeneralRegs(uint64_t seed) {
  std::vector<uint64_t> v;
  for (uint64_t i = 0; i < 17; ++i) {
    v.push_back(seed * 0x100 + i);
  }
  return v;
}

TEST(PerfRing, SamplesCarryTheirUserRegistersAlsoWhenWrapping) {
  const uint64_t mask = PerfUserRegsMaskGeneral();
  const size_t record = PerfSampleRecordSize(mask);
  EXPECT_EQ(record, 48u + 8 + 17 * 8);
  // Every 8-byte split of a register sample across the end of the buffer.
  for (uint64_t back = 0; back <= record; back += 8) {
    SCOPED_TRACE(back);
    const uint64_t start = 3 * kPage - back;
    FakeRing fake(kPage, start);
    fake.PutSampleWithTail(MakeSample(1), nullptr, PERF_SAMPLE_REGS_ABI_64, GeneralRegs(1));
    fake.PutSampleWithTail(MakeSample(2), nullptr, PERF_SAMPLE_REGS_ABI_64, GeneralRegs(2));
    fake.Publish();
    PerfRing ring = fake.Ring({.regs_user = mask});
    std::vector<user_regs_struct> regs;
    std::vector<PerfSample> got;
    ring.Drain([&](const PerfSample& s) {
      got.push_back(s);
      user_regs_struct r{};
      EXPECT_TRUE(LoadPerfUserRegs(s.user_regs, mask, r));
      regs.push_back(r);
    });
    ASSERT_EQ(got.size(), 2u);
    for (uint64_t i = 0; i < 2; ++i) {
      ExpectSame(got[i], MakeSample(i + 1));
      EXPECT_EQ(got[i].user_regs.size(), 17u * 8);
      const uint64_t b = (i + 1) * 0x100;
      EXPECT_EQ(regs[i].rax, b + 0);
      EXPECT_EQ(regs[i].rbx, b + 1);
      EXPECT_EQ(regs[i].rcx, b + 2);
      EXPECT_EQ(regs[i].rdx, b + 3);
      EXPECT_EQ(regs[i].rsi, b + 4);
      EXPECT_EQ(regs[i].rdi, b + 5);
      EXPECT_EQ(regs[i].rbp, b + 6);
      EXPECT_EQ(regs[i].rsp, b + 7);
      EXPECT_EQ(regs[i].rip, b + 8);
      EXPECT_EQ(regs[i].r8, b + 9);
      EXPECT_EQ(regs[i].r15, b + 16);
      EXPECT_EQ(regs[i].eflags, 0u);  // not in the mask
    }
    EXPECT_EQ(fake.tail(), start + 2 * record);
  }
}

TEST(PerfRing, RegistersAfterACallchainAndMissingOrShortRegisters) {
  const uint64_t mask = PerfUserRegsMaskGeneral();
  FakeRing fake(kPage);
  const std::vector<uint64_t> chain = {PERF_CONTEXT_USER, 0x401234, 0x401300};
  fake.PutSampleWithTail(MakeSample(1), &chain, PERF_SAMPLE_REGS_ABI_64, GeneralRegs(1));
  // abi NONE: the kernel had no user registers; the block is just the abi word.
  fake.PutSampleWithTail(MakeSample(2), &chain, PERF_SAMPLE_REGS_ABI_NONE, {});
  // A record shorter than its mask says: the sample without registers.
  fake.PutSampleWithTail(MakeSample(3), &chain, PERF_SAMPLE_REGS_ABI_64, {1, 2, 3});
  fake.Publish();
  PerfRing ring = fake.Ring({.callchain = true, .regs_user = mask});
  std::vector<PerfSample> got;
  std::vector<uint64_t> rip;
  ring.Drain([&](const PerfSample& s) {
    got.push_back(s);
    user_regs_struct r{};
    rip.push_back(LoadPerfUserRegs(s.user_regs, mask, r) ? r.rip : 0);
  });
  ASSERT_EQ(got.size(), 3u);
  ExpectSame(got[0], MakeSample(1));
  EXPECT_EQ(got[0].user_regs.size(), 17u * 8);
  EXPECT_EQ(rip[0], 0x108u);
  ExpectSame(got[1], MakeSample(2));
  EXPECT_TRUE(got[1].user_regs.empty());
  ExpectSame(got[2], MakeSample(3));
  EXPECT_TRUE(got[2].user_regs.empty());
  EXPECT_EQ(rip[2], 0u);
}

TEST(PerfRing, LeavesARecordThatIsNotCompletelyPublished) {
  FakeRing fake(kPage);
  fake.PutSample(MakeSample(1));
  fake.PutSample(MakeSample(2));
  fake.PublishUpTo(kPerfSampleRecordSize + 16);
  PerfRing ring = fake.Ring();
  std::vector<PerfSample> got = DrainAll(ring);
  ASSERT_EQ(got.size(), 1u);
  ExpectSame(got[0], MakeSample(1));
  EXPECT_EQ(fake.tail(), kPerfSampleRecordSize);
  EXPECT_EQ(ring.Pending(), 16u);

  fake.Publish();
  got = DrainAll(ring);
  ASSERT_EQ(got.size(), 1u);
  ExpectSame(got[0], MakeSample(2));
  EXPECT_EQ(ring.Pending(), 0u);
}

TEST(PerfRing, CorruptHeaderDropsThePublishedDataInsteadOfLooping) {
  FakeRing fake(kPage);
  fake.PutSample(MakeSample(1));
  fake.Put(PERF_RECORD_SAMPLE, {});  // fix the size below to 0
  const uint64_t bad = fake.head() - sizeof(perf_event_header);
  uint8_t* data = reinterpret_cast<uint8_t*>(fake.meta()) + kPage;
  perf_event_header hdr{};
  std::memcpy(&hdr, data + bad, sizeof(hdr));
  hdr.size = 0;
  std::memcpy(data + bad, &hdr, sizeof(hdr));
  fake.PutSample(MakeSample(2));
  fake.Publish();
  PerfRing ring = fake.Ring();
  const std::vector<PerfSample> got = DrainAll(ring);
  ASSERT_EQ(got.size(), 1u);
  ExpectSame(got[0], MakeSample(1));
  EXPECT_EQ(fake.tail(), fake.head());
}

TEST(PerfRing, JoinedRingsDrainAsOne) {
  FakeRing cpu0(kPage);
  FakeRing cpu1(kPage, kPage - 8);
  cpu0.PutSample(MakeSample(1));
  cpu0.PutLost(1, 2);
  cpu1.PutSample(MakeSample(2));
  cpu1.PutSample(MakeSample(3));
  cpu1.PutLost(2, 5);
  cpu0.Publish();
  cpu1.Publish();
  PerfRing ring = cpu0.Ring();
  ring.Join(cpu1.Ring());
  EXPECT_EQ(ring.Pending(), 3 * kPerfSampleRecordSize + 2 * 24);
  PerfRing moved = std::move(ring);
  const std::vector<PerfSample> got = DrainAll(moved);
  ASSERT_EQ(got.size(), 3u);
  ExpectSame(got[0], MakeSample(1));
  ExpectSame(got[1], MakeSample(2));
  ExpectSame(got[2], MakeSample(3));
  EXPECT_EQ(moved.lost(), 7u);
  EXPECT_EQ(moved.Pending(), 0u);
  EXPECT_EQ(cpu0.tail(), cpu0.head());
  EXPECT_EQ(cpu1.tail(), cpu1.head());
}

// A real kernel ring, fed by the software page-fault event (whose samples carry the faulting
// address in ADDR): same record layout as breakpoint samples, and it fires on any machine.
core::UniqueFd OpenPageFaultEvent(pid_t tid, int cpu, bool inherit) {
  perf_event_attr attr;
  std::memset(&attr, 0, sizeof(attr));
  attr.type = PERF_TYPE_SOFTWARE;
  attr.size = sizeof(attr);
  attr.config = PERF_COUNT_SW_PAGE_FAULTS;
  attr.sample_period = 1;
  attr.sample_type =
      PERF_SAMPLE_IP | PERF_SAMPLE_TID | PERF_SAMPLE_TIME | PERF_SAMPLE_ADDR | PERF_SAMPLE_CPU;
  attr.inherit = inherit ? 1 : 0;
  attr.exclude_kernel = 1;
  attr.exclude_hv = 1;
  attr.use_clockid = 1;
  attr.clockid = CLOCK_MONOTONIC;
  attr.wakeup_events = 1;
  return core::UniqueFd(
      static_cast<int>(::syscall(SYS_perf_event_open, &attr, tid, cpu, -1, PERF_FLAG_FD_CLOEXEC)));
}

// Anonymous pages that fault once each on first touch (no transparent huge pages).
class FreshPages {
 public:
  explicit FreshPages(size_t count) : size_(count * kPage) {
    base_ = static_cast<uint8_t*>(
        ::mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    EXPECT_NE(base_, MAP_FAILED);
    ::madvise(base_, size_, MADV_NOHUGEPAGE);
  }
  ~FreshPages() { ::munmap(base_, size_); }
  FreshPages(const FreshPages&) = delete;
  FreshPages& operator=(const FreshPages&) = delete;

  void Touch(size_t page) { *static_cast<volatile uint8_t*>(base_ + page * kPage) = 1; }
  uint64_t Page(size_t page) const { return reinterpret_cast<uintptr_t>(base_ + page * kPage); }
  bool Contains(uint64_t addr) const { return addr >= Page(0) && addr < Page(0) + size_; }

 private:
  size_t size_;
  uint8_t* base_ = nullptr;
};

TEST(PerfRing, DrainsARealKernelRingThatWrapsManyTimes) {
  constexpr size_t kBatches = 20;
  constexpr size_t kPerBatch = 50;  // 2400 bytes of samples per batch, one 4 KiB data page
  FreshPages pages(kBatches * kPerBatch);
  std::vector<PerfSample> got;
  got.reserve(4 * kBatches * kPerBatch);  // no page faults of our own while draining

  core::UniqueFd fd = OpenPageFaultEvent(::gettid(), -1, /*inherit=*/false);
  KW_REQUIRE_FEATURE(fd.valid(), "perf_event_open(software page faults) failed");
  absl::StatusOr<PerfRing> ring = PerfRing::Map(fd.get(), 1);
  ASSERT_TRUE(ring.ok()) << ring.status();

  const uint64_t t0 = core::MonotonicNs();
  for (size_t b = 0; b < kBatches; ++b) {
    for (size_t i = 0; i < kPerBatch; ++i) {
      pages.Touch(b * kPerBatch + i);
    }
    ring->Drain([&](const PerfSample& s) { got.push_back(s); });
  }
  const uint64_t t1 = core::MonotonicNs();
  EXPECT_EQ(ring->lost(), 0u);

  size_t next = 0;
  for (const PerfSample& s : got) {
    if (!pages.Contains(s.addr)) {
      continue;  // a fault of the test itself
    }
    ASSERT_EQ(s.addr, pages.Page(next)) << next;
    ASSERT_EQ(s.tid, static_cast<uint32_t>(::gettid()));
    ASSERT_EQ(s.pid, static_cast<uint32_t>(::getpid()));
    ASSERT_NE(s.ip, 0u);
    ASSERT_GE(s.time + 1'000'000, t0);  // CLOCK_MONOTONIC domain, 1 ms slack
    ASSERT_LE(s.time, t1 + 1'000'000);
    ++next;
  }
  EXPECT_EQ(next, kBatches * kPerBatch);
}

TEST(PerfRing, CountsWhatTheKernelCouldNotFit) {
  constexpr size_t kTouches = 400;  // far more than one 4 KiB data page holds
  FreshPages pages(kTouches + 1);
  core::UniqueFd fd = OpenPageFaultEvent(::gettid(), -1, /*inherit=*/false);
  KW_REQUIRE_FEATURE(fd.valid(), "perf_event_open(software page faults) failed");
  absl::StatusOr<PerfRing> ring = PerfRing::Map(fd.get(), 1);
  ASSERT_TRUE(ring.ok()) << ring.status();

  for (size_t i = 0; i < kTouches; ++i) {
    pages.Touch(i);
  }
  size_t in_range = 0;
  const auto count = [&](const PerfSample& s) { in_range += pages.Contains(s.addr) ? 1 : 0; };
  ring->Drain(count);
  pages.Touch(kTouches);  // the kernel writes PERF_RECORD_LOST before the next sample
  ring->Drain(count);
  EXPECT_GT(ring->lost(), 0u);
  EXPECT_LT(in_range, kTouches + 1);
  // Every fault was either delivered or counted lost (faults of the test itself only add).
  EXPECT_GE(in_range + ring->lost(), kTouches + 1);
}

TEST(PerfRing, InheritedPerCpuRingsJoinedSeeAChildThread) {
  // The layout PerfBreakpoint uses for inherited watches: one inherited event per CPU.
  constexpr size_t kTouches = 300;
  FreshPages pages(kTouches);
  std::vector<core::UniqueFd> fds;
  std::optional<PerfRing> ring;
  const long cpus = ::sysconf(_SC_NPROCESSORS_ONLN);
  for (long cpu = 0; cpu < cpus; ++cpu) {
    fds.push_back(OpenPageFaultEvent(::gettid(), static_cast<int>(cpu), /*inherit=*/true));
    KW_REQUIRE_FEATURE(fds.back().valid(), "perf_event_open(software page faults) failed");
    absl::StatusOr<PerfRing> r = PerfRing::Map(fds.back().get(), 16);
    ASSERT_TRUE(r.ok()) << r.status();
    if (ring.has_value()) {
      ring->Join(*std::move(r));
    } else {
      ring.emplace(*std::move(r));
    }
  }
  uint32_t child = 0;
  std::thread t([&] {
    child = static_cast<uint32_t>(::gettid());
    for (size_t i = 0; i < kTouches; ++i) {
      pages.Touch(i);
    }
  });
  t.join();
  std::vector<bool> seen(kTouches, false);
  size_t in_range = 0;
  ring->Drain([&](const PerfSample& s) {
    if (!pages.Contains(s.addr)) {
      return;
    }
    EXPECT_EQ(s.tid, child);
    const size_t page = (s.addr - pages.Page(0)) / kPage;
    EXPECT_FALSE(seen[page]) << page;
    seen[page] = true;
    ++in_range;
  });
  EXPECT_EQ(in_range, kTouches);
  EXPECT_EQ(ring->lost(), 0u);
}

TEST(PerfRing, MapRefusesNonPowerOfTwo) {
  const absl::StatusOr<PerfRing> ring = PerfRing::Map(-1, 3);
  ASSERT_FALSE(ring.ok());
  EXPECT_EQ(ring.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(PerfRing, MapReportsTheMmapFailure) {
  const absl::StatusOr<PerfRing> ring = PerfRing::Map(-1, 4);
  ASSERT_FALSE(ring.ok());
  EXPECT_THAT(std::string(ring.status().message()), ::testing::HasSubstr("mmap(perf ring)"));
}

// A sample with PERF_SAMPLE_CALLCHAIN: the fixed fields, then nr and the frames with the
// kernel's context markers, as a kernel watch's sample looks when the access came from a
// system call (kernel frames, then the user frames of the task).
TEST(PerfCallchain, SampleIsSplitIntoKernelAndUserFrames) {
  FakeRing fake(kPage);
  PerfSample s;
  s.ip = 0xffffffff81234567;
  s.pid = 41;
  s.tid = 42;
  s.time = 123456789;
  s.addr = 0x7ffd0000;
  s.cpu = 1;
  const std::vector<uint64_t> chain = {PERF_CONTEXT_KERNEL, 0xffffffff81234567, 0xffffffff81000100,
                                       PERF_CONTEXT_USER,   0x401234,           0x401500};
  std::vector<uint8_t> p(kPerfSampleRecordSize - sizeof(perf_event_header) + 8 + 8 * chain.size(),
                         0);
  std::memcpy(&p[0], &s.ip, 8);
  std::memcpy(&p[8], &s.pid, 4);
  std::memcpy(&p[12], &s.tid, 4);
  std::memcpy(&p[16], &s.time, 8);
  std::memcpy(&p[24], &s.addr, 8);
  std::memcpy(&p[32], &s.cpu, 4);
  const uint64_t nr = chain.size();
  std::memcpy(&p[40], &nr, 8);
  std::memcpy(&p[48], chain.data(), 8 * chain.size());
  fake.Put(PERF_RECORD_SAMPLE, p);
  fake.PutLost(7, 3);
  // A record that claims more frames than it holds.
  const uint64_t too_many = 1000;
  std::memcpy(&p[40], &too_many, 8);
  fake.Put(PERF_RECORD_SAMPLE, p);
  fake.Publish();
  PerfRing ring = fake.Ring();
  std::vector<PerfSample> samples;
  std::vector<PerfCallchain> chains;
  size_t refused = 0;
  EXPECT_EQ(ring.DrainRecords([&](std::span<const uint8_t> record) {
    PerfSample got;
    PerfCallchain c;
    if (ParseCallchainSample(record, got, c)) {
      samples.push_back(got);
      chains.push_back(c);
    } else {
      ++refused;
      EXPECT_TRUE(c.kernel.empty() && c.user.empty());
    }
  }),
            3u);
  EXPECT_EQ(refused, 2u);  // the lost record and the short one
  EXPECT_EQ(ring.lost(), 3u);
  ASSERT_EQ(samples.size(), 1u);
  EXPECT_EQ(samples[0].ip, s.ip);
  EXPECT_EQ(samples[0].pid, 41u);
  EXPECT_EQ(samples[0].tid, 42u);
  EXPECT_EQ(samples[0].time, 123456789u);
  EXPECT_EQ(samples[0].addr, 0x7ffd0000u);
  EXPECT_EQ(samples[0].cpu, 1u);
  EXPECT_EQ(chains[0].kernel, (std::vector<uint64_t>{0xffffffff81234567, 0xffffffff81000100}));
  EXPECT_EQ(chains[0].user, (std::vector<uint64_t>{0x401234, 0x401500}));
}

}  // namespace
}  // namespace kwatch::watch
