#include "core/ptrace/process_group.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/ptrace/process.h"

namespace kwatch::core::ptrace {

ProcessGroup::~ProcessGroup() {
  children_.clear();  // untaken children: their destructors detach them
  for (Process* p : members_) {
    p->group_ = nullptr;
  }
}

void ProcessGroup::Add(Process& process) {
  if (std::find(members_.begin(), members_.end(), &process) == members_.end()) {
    members_.push_back(&process);
  }
  process.group_ = this;
}

void ProcessGroup::Remove(Process& process) {
  std::erase(members_, &process);
  process.group_ = nullptr;
}

std::unique_ptr<Process> ProcessGroup::TakeChild(pid_t pid) {
  auto it = children_.find(pid);
  if (it == children_.end()) {
    return nullptr;
  }
  std::unique_ptr<Process> child = std::move(it->second);
  children_.erase(it);
  return child;
}

std::vector<pid_t> ProcessGroup::UntakenChildren() const {
  std::vector<pid_t> out;
  out.reserve(children_.size());
  for (const auto& [pid, p] : children_) {
    out.push_back(pid);
  }
  std::sort(out.begin(), out.end());
  return out;
}

Process* ProcessGroup::Owner(pid_t tid) const {
  for (Process* p : members_) {
    if (p->pid_ == tid || p->threads_.contains(tid)) {
      return p;
    }
  }
  const std::string tgid = ProcStatusField(tid, "Tgid");
  for (Process* p : members_) {
    if (tgid == absl::StrCat(p->pid_)) {
      return p;
    }
  }
  return nullptr;
}

}  // namespace kwatch::core::ptrace
