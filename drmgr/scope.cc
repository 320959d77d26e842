#include "drmgr/scope.h"

#include "absl/strings/str_format.h"

namespace kwatch::drmgr {

std::string Scope::ToString() const {
  switch (kind) {
    case Kind::kThread:
      return absl::StrFormat("thread %d of process %d", tid, pid);
    case Kind::kProcess:
      return absl::StrFormat("process %d (all threads)", pid);
    case Kind::kCpu:
      return absl::StrFormat("CPU %d", cpu);
    case Kind::kAllCpus:
      return "all CPUs";
  }
  return "?";
}

bool Overlaps(const Scope& a, const Scope& b) {
  if (!a.is_task() || !b.is_task()) {
    if (a.kind == Scope::Kind::kCpu && b.kind == Scope::Kind::kCpu) {
      return a.cpu == b.cpu;
    }
    return true;
  }
  if (a.pid != b.pid) {
    return false;
  }
  if (a.kind == Scope::Kind::kThread && b.kind == Scope::Kind::kThread) {
    return a.tid == b.tid;
  }
  return true;
}

}  // namespace kwatch::drmgr
