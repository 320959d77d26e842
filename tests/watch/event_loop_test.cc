#include "watch/event_loop.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <csignal>
#include <memory>

#include <gtest/gtest.h>

#include "core/base/unique_fd.h"

namespace kwatch::watch {
namespace {

using Kind = EventLoop::Event::Kind;

// A loop over a fresh signalfd. Ticks rarely unless told: the tests wait for what they cause.
std::unique_ptr<EventLoop> MakeLoop(absl::Duration tick = absl::Hours(1)) {
  absl::StatusOr<core::UniqueFd> sigfd = BlockSessionSignals();
  EXPECT_TRUE(sigfd.ok()) << sigfd.status();
  if (!sigfd.ok()) {
    return nullptr;
  }
  absl::StatusOr<std::unique_ptr<EventLoop>> loop = EventLoop::Create(*std::move(sigfd), tick);
  EXPECT_TRUE(loop.ok()) << loop.status();
  return loop.ok() ? *std::move(loop) : nullptr;
}

// Waits (up to 30 s per round) until a wait reports an event of `kind`; returns that wait's.
EventLoop::Ready WaitFor(EventLoop& loop, Kind kind) {
  for (int round = 0; round < 100; ++round) {
    absl::StatusOr<EventLoop::Ready> r = loop.Wait(absl::Seconds(30));
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) {
      break;
    }
    for (const EventLoop::Event& e : r->events) {
      if (e.kind == kind) {
        return *r;
      }
    }
  }
  ADD_FAILURE() << "no event of kind " << static_cast<int>(kind);
  return {};
}

TEST(EventLoop, StopSignalsAreReadInTheKernelsOrderAndTheFirstStops) {
  std::unique_ptr<EventLoop> loop = MakeLoop();
  ASSERT_NE(loop, nullptr);
  // Both pending before the wait: the signalfd gives the lower number first.
  ASSERT_EQ(::raise(SIGTERM), 0);
  ASSERT_EQ(::raise(SIGINT), 0);
  const EventLoop::Ready r = WaitFor(*loop, Kind::kSignal);
  ASSERT_EQ(r.events.size(), 2u);
  EXPECT_EQ(r.events[0].kind, Kind::kSignal);
  EXPECT_EQ(r.events[0].value, SIGINT);
  EXPECT_EQ(r.events[1].value, SIGTERM);
  EXPECT_EQ(r.stop_signal(), SIGINT);
  EXPECT_FALSE(r.child());
  EXPECT_FALSE(r.tick());
  // Read: nothing is left.
  absl::StatusOr<EventLoop::Ready> again = loop->Wait(absl::ZeroDuration());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->events.empty());
}

TEST(EventLoop, SigchldIsAChildEventNotAStop) {
  std::unique_ptr<EventLoop> loop = MakeLoop();
  ASSERT_NE(loop, nullptr);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::_exit(7);
  }
  const EventLoop::Ready r = WaitFor(*loop, Kind::kSignal);
  EXPECT_TRUE(r.child());
  EXPECT_EQ(r.stop_signal(), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_EQ(WEXITSTATUS(status), 7);
}

TEST(EventLoop, TakeStopSignalReadsWithoutWaitingAndDropsSigchld) {
  std::unique_ptr<EventLoop> loop = MakeLoop();
  ASSERT_NE(loop, nullptr);
  EXPECT_EQ(loop->TakeStopSignal(), 0);  // nothing pending
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);  // its SIGCHLD is pending from here on
  ASSERT_EQ(::raise(SIGHUP), 0);
  EXPECT_EQ(loop->TakeStopSignal(), SIGHUP);
  // Both were read: the loop has nothing more to report.
  absl::StatusOr<EventLoop::Ready> r = loop->Wait(absl::ZeroDuration());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->events.empty());
}

TEST(EventLoop, TheTickComes) {
  std::unique_ptr<EventLoop> loop = MakeLoop(absl::Milliseconds(5));
  ASSERT_NE(loop, nullptr);
  const EventLoop::Ready r = WaitFor(*loop, Kind::kTick);
  EXPECT_TRUE(r.tick());
  EXPECT_EQ(r.stop_signal(), 0);
  // A tick is reported once per wait, however many intervals passed.
  size_t ticks = 0;
  for (const EventLoop::Event& e : r.events) {
    ticks += e.kind == Kind::kTick ? 1 : 0;
  }
  EXPECT_EQ(ticks, 1u);
}

TEST(EventLoop, AnAddedFdWakesTheLoopWhenReadable) {
  std::unique_ptr<EventLoop> loop = MakeLoop();
  ASSERT_NE(loop, nullptr);
  std::array<int, 2> p{};
  ASSERT_EQ(::pipe2(p.data(), O_CLOEXEC | O_NONBLOCK), 0);
  core::UniqueFd rd(p[0]);
  core::UniqueFd wr(p[1]);
  ASSERT_TRUE(loop->Add(rd.get()).ok());
  ASSERT_TRUE(loop->Add(rd.get()).ok()) << "adding an fd twice is not an error";
  // Not readable yet: a wait that does not block reports nothing.
  absl::StatusOr<EventLoop::Ready> idle = loop->Wait(absl::ZeroDuration());
  ASSERT_TRUE(idle.ok()) << idle.status();
  EXPECT_TRUE(idle->events.empty());
  ASSERT_EQ(::write(wr.get(), "x", 1), 1);
  const EventLoop::Ready r = WaitFor(*loop, Kind::kFd);
  ASSERT_EQ(r.events.size(), 1u);
  EXPECT_EQ(r.events[0].kind, Kind::kFd);
  EXPECT_EQ(r.events[0].value, rd.get());
  EXPECT_FALSE(r.child());
  EXPECT_EQ(r.stop_signal(), 0);
}

}  // namespace
}  // namespace kwatch::watch
