#include "watch/page_backend.h"

#include <sys/mman.h>

#include <gtest/gtest.h>

#include "core/ptrace/maps.h"
#include "tests/test_util.h"
#include "watch/session.h"

namespace kwatch::watch {
namespace {

// Protections of the mapping holding `addr` as "rwx" letters.
std::string PermsAt(const core::ptrace::Process& proc, core::RemoteAddr addr) {
  auto maps = proc.Maps();
  if (!maps.ok()) {
    return "?";
  }
  const auto m = core::ptrace::FindMapping(*maps, addr);
  if (!m.has_value()) {
    return "unmapped";
  }
  return std::string(m->read ? "r" : "-") + (m->write ? "w" : "-") + (m->exec ? "x" : "-");
}

std::unique_ptr<core::ptrace::Process> LaunchWriter(const std::string& iters) {
  auto p = core::ptrace::Process::Launch(
      {kwatch::testing::TargetPath("field_writer"), "2", iters, "--truth", "/dev/null"});
  EXPECT_TRUE(p.ok()) << p.status();
  if (!p.ok()) {
    return nullptr;
  }
  EXPECT_TRUE((*p)->RunToEntry().ok());
  return *std::move(p);
}

std::unique_ptr<WatchSession> PageSession(core::ptrace::Process& proc, const std::string& expr,
                                          drmgr::DrKind kind) {
  WatchRequest req;
  req.expr = expr;
  req.kind = kind;
  SessionOptions opts;
  opts.backend = BackendKind::kPage;
  auto s = WatchSession::Create(proc, {req}, opts);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *std::move(s) : nullptr;
}

TEST(PageBackend, ProtectsWhileArmedAndRestoresOnDisarm) {
  auto proc = LaunchWriter("10");
  ASSERT_NE(proc, nullptr);
  auto session = PageSession(*proc, "g_stats.hits", drmgr::DrKind::kWrite);
  ASSERT_NE(session, nullptr);
  const core::RemoteAddr addr = session->watches()[0].target.addr;
  EXPECT_EQ(PermsAt(*proc, addr), "rw-");
  ASSERT_TRUE(session->Arm().ok());
  EXPECT_EQ(PermsAt(*proc, addr), "r--");  // writes fault, reads do not
  session->Disarm();
  EXPECT_EQ(PermsAt(*proc, addr), "rw-");
  ASSERT_TRUE(proc->Kill().ok());
}

TEST(PageBackend, CountsEveryStoreWithExactAddressAndSize) {
  auto proc = LaunchWriter("10");
  ASSERT_NE(proc, nullptr);
  auto session = PageSession(*proc, "g_stats.hits", drmgr::DrKind::kWrite);
  ASSERT_NE(session, nullptr);
  const core::RemoteAddr addr = session->watches()[0].target.addr;
  ASSERT_TRUE(session->Arm().ok());  // resumes the target
  while (proc->alive()) {
    ASSERT_TRUE(proc->Poll(true).ok());
  }
  EXPECT_EQ(proc->exit_info()->code, 0);
  uint64_t writes = 0;
  session->Drain([&](const core::AccessEvent& ev) {
    EXPECT_EQ(ev.kind, core::AccessKind::kWrite);
    EXPECT_TRUE(ev.value_exact);
    EXPECT_EQ(ev.access_addr, addr);
    EXPECT_EQ(ev.access_size, 8u);
    ++writes;
  });
  EXPECT_EQ(writes, 20u);  // 2 threads x 10 stores
}

TEST(PageBackend, ReadWriteWatchTakesThePageEntirely) {
  auto proc = LaunchWriter("1");
  ASSERT_NE(proc, nullptr);
  auto session = PageSession(*proc, "g_stats.flags", drmgr::DrKind::kReadWrite);
  ASSERT_NE(session, nullptr);
  const core::RemoteAddr addr = session->watches()[0].target.addr;
  ASSERT_TRUE(session->Arm().ok());
  EXPECT_EQ(PermsAt(*proc, addr), "---");
  // kwatch itself still reads the watched bytes (through /proc/PID/mem).
  uint8_t buf[2] = {0xff, 0xff};
  EXPECT_TRUE(proc->ReadMemory(addr, buf).ok());
  EXPECT_EQ(buf[0], 0);
  session.reset();  // destruction disarms
  EXPECT_EQ(PermsAt(*proc, addr), "rw-");
  ASSERT_TRUE(proc->Kill().ok());
}

TEST(PageBackend, ExecWatchesAreRefused) {
  auto proc = LaunchWriter("1");
  ASSERT_NE(proc, nullptr);
  WatchRequest req;
  req.expr = "g_stats.hits";
  req.kind = drmgr::DrKind::kExec;
  req.length = 1;
  SessionOptions opts;
  opts.backend = BackendKind::kPage;
  auto s = WatchSession::Create(*proc, {req}, opts);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("--exec needs hardware breakpoints"), absl::string_view::npos)
      << s.status();
  ASSERT_TRUE(proc->Kill().ok());
}

}  // namespace
}  // namespace kwatch::watch
