#include "watch/kernel/task_names.h"

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "core/kernel/kallsyms.h"

namespace kwatch::watch::kernel {

const std::string& TaskNames::Get(pid_t tid, uint32_t cpu) {
  // tid 0 is each CPU's own idle task: one name per CPU.
  const int64_t key = tid == 0 ? -1 - static_cast<int64_t>(cpu) : tid;
  auto it = names_.find(key);
  if (it != names_.end()) {
    return it->second;
  }
  std::string name;
  if (tid == 0) {
    name = absl::StrCat("swapper/", cpu);  // the idle task of that CPU
  } else {
    auto comm = core::kernel::ReadWholeFile(absl::StrCat("/proc/", tid, "/comm"));
    name = comm.ok() ? std::string(absl::StripAsciiWhitespace(*comm)) : "?";
  }
  return names_.emplace(key, std::move(name)).first->second;
}

}  // namespace kwatch::watch::kernel
