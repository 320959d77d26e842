#include "watch/gdb/signals.h"

#include <array>
#include <csignal>
#include <utility>

namespace kwatch::watch::gdb {

namespace {

constexpr int kGdbUnknown = 143;
constexpr int kGdbRealtime32 = 77;  // GDB_SIGNAL_REALTIME_32
constexpr int kGdbRealtime33 = 45;  // ... 33 to 63 are 45 to 75
constexpr int kGdbRealtime64 = 78;

// Linux signal, gdb signal (the standard ones).
constexpr std::array<std::pair<int, int>, 30> kTable = {{
    {SIGHUP, 1},     {SIGINT, 2},   {SIGQUIT, 3},   {SIGILL, 4},   {SIGTRAP, 5},  {SIGABRT, 6},
    {SIGBUS, 10},    {SIGFPE, 8},   {SIGKILL, 9},   {SIGUSR1, 30}, {SIGSEGV, 11}, {SIGUSR2, 31},
    {SIGPIPE, 13},   {SIGALRM, 14}, {SIGTERM, 15},  {SIGCHLD, 20}, {SIGCONT, 19}, {SIGSTOP, 17},
    {SIGTSTP, 18},   {SIGTTIN, 21}, {SIGTTOU, 22},  {SIGURG, 16},  {SIGXCPU, 24}, {SIGXFSZ, 25},
    {SIGVTALRM, 26}, {SIGPROF, 27}, {SIGWINCH, 28}, {SIGIO, 23},   {SIGPWR, 32},  {SIGSYS, 12},
}};

}  // namespace

int ToGdbSignal(int sig) {
  if (sig == 0) {
    return 0;
  }
  for (const auto& [linux_sig, gdb_sig] : kTable) {
    if (linux_sig == sig) {
      return gdb_sig;
    }
  }
  if (sig == 32) {
    return kGdbRealtime32;
  }
  if (sig >= 33 && sig <= 63) {
    return kGdbRealtime33 + (sig - 33);
  }
  if (sig == 64) {
    return kGdbRealtime64;
  }
  return kGdbUnknown;
}

int FromGdbSignal(int gdb_sig) {
  if (gdb_sig == 0) {
    return 0;
  }
  for (const auto& [linux_sig, g] : kTable) {
    if (g == gdb_sig) {
      return linux_sig;
    }
  }
  if (gdb_sig == kGdbRealtime32) {
    return 32;
  }
  if (gdb_sig >= kGdbRealtime33 && gdb_sig <= kGdbRealtime33 + 30) {
    return 33 + (gdb_sig - kGdbRealtime33);
  }
  if (gdb_sig == kGdbRealtime64) {
    return 64;
  }
  return 0;
}

}  // namespace kwatch::watch::gdb
