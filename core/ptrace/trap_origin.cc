#include "core/ptrace/trap_origin.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <ucontext.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <csignal>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/base/unique_fd.h"

namespace kwatch::core::ptrace {
namespace {

constexpr uint8_t kIcebpOpcode = 0xF1;
// DR6: B0-B3 (a slot matched), BD (debug-register access), BS (single step), BT (task switch).
constexpr uint64_t kDr6CauseBits = 0xFULL | (1ULL << 13) | (1ULL << 14) | (1ULL << 15);

// What the probe child's handler saw ('T' trap, 'F' fault), written once by the handler.
volatile sig_atomic_t g_icebp_seen = 0;

// The probe child's SIGTRAP handler: a fault leaves the instruction pointer on the icebp,
// which the handler steps over so that the child does not run it again forever.
void OnProbeTrap(int /*sig*/, siginfo_t* /*si*/, void* uc) {
  auto* ctx = static_cast<ucontext_t*>(uc);
  greg_t& rip = ctx->uc_mcontext.gregs[REG_RIP];
  // The child's own code, at the interrupted instruction pointer.
  const auto* ip = reinterpret_cast<const uint8_t*>(rip);  // NOLINT(performance-no-int-to-ptr)
  if (*ip == kIcebpOpcode) {
    g_icebp_seen = 'F';
    ++rip;
  } else if (ip[-1] == kIcebpOpcode) {
    g_icebp_seen = 'T';
  } else {
    g_icebp_seen = '?';
  }
}

// Runs in the forked child: only async-signal-safe calls.
[[noreturn]] void IcebpProbeChild(int out_fd) {
  sigset_t none;
  sigemptyset(&none);
  pthread_sigmask(SIG_SETMASK, &none, nullptr);
  struct sigaction sa {};
  sa.sa_sigaction = OnProbeTrap;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTRAP, &sa, nullptr);
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigaction(SIGALRM, &dfl, nullptr);
  alarm(2);  // a host that loops on the icebp in some other way must not hang the caller
  __asm__ volatile(".byte 0xf1" ::: "memory");
  const char seen = g_icebp_seen == 0 ? 'D' : static_cast<char>(g_icebp_seen);
  const ssize_t n = write(out_fd, &seen, 1);
  _exit(n == 1 ? 0 : 1);
}

absl::StatusOr<IcebpKind> ProbeIcebpKind() {
  std::array<int, 2> fds{};
  if (pipe2(fds.data(), O_CLOEXEC) != 0) {
    const int err = errno;
    return absl::ErrnoToStatus(err, "pipe2 (icebp host check)");
  }
  UniqueFd read_end(fds[0]);
  UniqueFd write_end(fds[1]);
  const pid_t pid = fork();
  if (pid < 0) {
    const int err = errno;
    return absl::ErrnoToStatus(err, "fork (icebp host check)");
  }
  if (pid == 0) {
    IcebpProbeChild(write_end.get());
  }
  write_end.Reset();
  char seen = 0;
  ssize_t n = 0;
  do {
    n = read(read_end.get(), &seen, 1);
  } while (n < 0 && errno == EINTR);
  int status = 0;
  pid_t waited = 0;
  do {
    waited = waitpid(pid, &status, 0);
  } while (waited < 0 && errno == EINTR);
  if (n != 1) {
    return absl::InternalError(
        absl::StrCat("icebp host check: the child ended without an answer (",
                     WIFSIGNALED(status) ? absl::StrCat("killed by signal ", WTERMSIG(status))
                                         : absl::StrCat("exit status ", WEXITSTATUS(status)),
                     ")"));
  }
  switch (seen) {
    case 'T':
      return IcebpKind::kTrap;
    case 'F':
      return IcebpKind::kFault;
    case 'D':
      return IcebpKind::kDropped;
    default:
      return absl::InternalError(
          "icebp host check: SIGTRAP with the instruction pointer neither on nor after the icebp");
  }
}

}  // namespace

absl::StatusOr<IcebpKind> HostIcebpKind() {
  static const absl::StatusOr<IcebpKind> kKind = ProbeIcebpKind();  // once, thread-safe
  return kKind;
}

absl::string_view IcebpKindName(IcebpKind k) {
  switch (k) {
    case IcebpKind::kTrap:
      return "trap (reported after the instruction)";
    case IcebpKind::kFault:
      return "fault (reported on the instruction, which runs again on return)";
    case IcebpKind::kDropped:
      return "dropped (no signal)";
  }
  return "?";
}

uint64_t SiPerfData(const siginfo_t& si) {
  static_assert(kSiPerfDataOffset + sizeof(uint64_t) <= sizeof(siginfo_t));
  uint64_t data = 0;
  std::memcpy(&data, reinterpret_cast<const char*>(&si) + kSiPerfDataOffset, sizeof(data));
  return data;
}

TrapOrigin ClassifySigtrap(const TrapEvidence& e, IcebpKind icebp) {
  if (e.si_code <= 0) {
    return TrapOrigin::kSentByProcess;
  }
  switch (e.si_code) {
    case SI_KERNEL:
      return TrapOrigin::kInt3;
    case TRAP_TRACE:
      return TrapOrigin::kSingleStep;
    case TRAP_HWBKPT:
      return TrapOrigin::kHardwareBreakpoint;
    case kTrapPerf:
      return IsKwatchSigData(e.perf_data) ? TrapOrigin::kKwatchBreakpoint
                                          : TrapOrigin::kPerfSigtrap;
    case TRAP_BRKPT:
      if ((icebp == IcebpKind::kTrap && e.byte_before_ip == kIcebpOpcode) ||
          (icebp == IcebpKind::kFault && e.byte_at_ip == kIcebpOpcode)) {
        return TrapOrigin::kIcebp;
      }
      if ((e.dr6 & kDr6CauseBits) != 0) {
        return TrapOrigin::kHardwareBreakpoint;
      }
      // Unreadable code is not evidence of an icebp: nothing explains the trap.
      return TrapOrigin::kSpurious;
    default:
      return TrapOrigin::kOther;
  }
}

absl::string_view TrapOriginName(TrapOrigin o) {
  switch (o) {
    case TrapOrigin::kSentByProcess:
      return "sent by a process";
    case TrapOrigin::kInt3:
      return "int3 executed by the program";
    case TrapOrigin::kIcebp:
      return "icebp executed by the program";
    case TrapOrigin::kSingleStep:
      return "single step set by the program";
    case TrapOrigin::kHardwareBreakpoint:
      return "hardware breakpoint";
    case TrapOrigin::kPerfSigtrap:
      return "perf event sigtrap";
    case TrapOrigin::kKwatchBreakpoint:
      return "late trap of a kwatch breakpoint";
    case TrapOrigin::kSpurious:
      return "spurious debug exception";
    case TrapOrigin::kOther:
      return "other kernel trap";
  }
  return "?";
}

}  // namespace kwatch::core::ptrace
