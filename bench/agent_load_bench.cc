// Cost of loading the in-process agent into a target (watch/agent/loader.h): the remote
// dlopen and kwatch_agent_init, and the whole LoadAgent (thread choice, memfd, mappings,
// lifeline, dlopen, init, checks), in the two cases kwatch meets:
//  - at launch: tests/targets/remote_call stopped at its entry point (one thread);
//  - at attach: remote_call threads 3 (4 threads allocating and sleeping), attached and
//    stopped; the loader picks a thread by unwinding every stack and resumes the others
//    during dlopen and init.
// Each iteration starts a new program (not timed), loads (timed: Time is LoadAgent's total)
// and kills it. Counters: dlopen_us, init_us, setup_us (memfd, mappings, lifeline) and
// pick_us (what precedes the setup: symbols, the maps, the thread) per load.
//
// The library is the real agent where the tree builds it (KWATCH_AGENT_LIBRARY), else the
// tests' stand-in library (a smaller dlopen: say which in the results).

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <csignal>
#include <memory>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "core/ptrace/process.h"
#include "watch/agent/loader.h"

namespace kwatch::watch::agent {
namespace {

std::string Target() {
  return std::string(KWATCH_TARGETS_DIR) + "/remote_call";
}

std::string Library() {
#ifdef KWATCH_AGENT_LIBRARY
  return KWATCH_AGENT_LIBRARY;
#else
  return std::string(KWATCH_TARGETS_DIR) + "/libkwatch-stub-agent.so";
#endif
}

LoadOptions Options() {
  return LoadOptions{.agent_path = Library(),
                     .shm = ShmConfig{.probe_capacity = 256,
                                      .code_capacity = 8192,
                                      .thread_capacity = 64,
                                      .ring_bytes = 256 * 1024}};
}

struct Totals {
  double dlopen_us = 0;
  double init_us = 0;
  double setup_us = 0;
  double pick_us = 0;

  void Add(const LoadTimings& t) {
    dlopen_us += absl::ToDoubleMicroseconds(t.dlopen);
    init_us += absl::ToDoubleMicroseconds(t.init);
    setup_us += absl::ToDoubleMicroseconds(t.setup);
    pick_us += absl::ToDoubleMicroseconds(t.pick);
  }
  void Report(benchmark::State& state) const {
    const auto avg = benchmark::Counter::kAvgIterations;
    state.counters["dlopen_us"] = benchmark::Counter(dlopen_us, avg);
    state.counters["init_us"] = benchmark::Counter(init_us, avg);
    state.counters["setup_us"] = benchmark::Counter(setup_us, avg);
    state.counters["pick_us"] = benchmark::Counter(pick_us, avg);
    state.SetLabel(Library());
  }
};

void BM_AgentLoadAtLaunch(benchmark::State& state) {
  Totals totals;
  for (auto _ : state) {
    auto proc = core::ptrace::Process::Start(std::nullopt,
                                             {Target(), "count", "1", "--out", "/dev/null"}, {});
    if (!proc.ok()) {
      state.SkipWithError(std::string(proc.status().message()).c_str());
      return;
    }
    auto agent = LoadAgent(**proc, Options());
    if (!agent.ok()) {
      state.SkipWithError(std::string(agent.status().message()).c_str());
      return;
    }
    state.SetIterationTime(absl::ToDoubleSeconds(agent->timings.total));
    totals.Add(agent->timings);
    (void)(*proc)->Kill();
  }
  totals.Report(state);
}
BENCHMARK(BM_AgentLoadAtLaunch)->UseManualTime()->Unit(benchmark::kMillisecond);

// A 4-thread remote_call, its "ready" read from its stdout, then attached and stopped.
struct Attached {
  pid_t pid = -1;
  std::unique_ptr<core::ptrace::Process> proc;
};

absl::StatusOr<Attached> StartAttached() {
  std::array<int, 2> out{};
  if (::pipe2(out.data(), O_CLOEXEC) != 0) {
    return absl::InternalError("pipe2");
  }
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(out[1], STDOUT_FILENO);
    const std::string path = Target();
    ::execl(path.c_str(), path.c_str(), "threads", "3", nullptr);
    ::_exit(127);
  }
  ::close(out[1]);
  std::string got;
  std::array<char, 64> buf{};
  while (got.find("ready\n") == std::string::npos) {
    const ssize_t n = ::read(out[0], buf.data(), buf.size());
    if (n <= 0) {
      ::close(out[0]);
      return absl::InternalError("the target ended before it was ready");
    }
    got.append(buf.data(), static_cast<size_t>(n));
  }
  ::close(out[0]);
  Attached a;
  a.pid = pid;
  auto proc = core::ptrace::Process::Attach(pid);
  if (!proc.ok()) {
    return proc.status();
  }
  a.proc = std::move(*proc);
  if (absl::Status s = a.proc->StopAll(); !s.ok()) {
    return s;
  }
  return a;
}

void BM_AgentLoadAtAttach4Threads(benchmark::State& state) {
  Totals totals;
  for (auto _ : state) {
    auto target = StartAttached();
    if (!target.ok()) {
      state.SkipWithError(std::string(target.status().message()).c_str());
      return;
    }
    auto agent = LoadAgent(*target->proc, Options());
    if (!agent.ok()) {
      ::kill(target->pid, SIGKILL);
      state.SkipWithError(std::string(agent.status().message()).c_str());
      return;
    }
    state.SetIterationTime(absl::ToDoubleSeconds(agent->timings.total));
    totals.Add(agent->timings);
    (void)target->proc->Kill();
    int status = 0;
    ::waitpid(target->pid, &status, 0);
  }
  totals.Report(state);
}
BENCHMARK(BM_AgentLoadAtAttach4Threads)->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace kwatch::watch::agent

BENCHMARK_MAIN();
