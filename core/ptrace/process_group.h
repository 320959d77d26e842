#pragma once

// Several traced processes under one tracer thread: a target and the children it forks that
// kwatch follows (-f/--follow-forks, as strace does).
//
// ptrace delivers every tracee's stops to the same waitpid(-1): a Process that polls may reap
// a status of another member. Members of a group hand such statuses to their owner (each
// Process keeps a queue of them, taken before waitpid), and a forked child's first stop seen
// before its parent's fork event is remembered here whichever member saw it.
//
// With following on, a member's fork yields a new member: the child, traced with the same
// options, stopped before it has run any code, a copy of its parent kwatch's changes
// included. The fork event (ProcessEvent::kForked, `child`) tells the owner to TakeChild() it,
// give it what it needs (an engine adopting the parent's breakpoints...) and resume it. With
// following off, forks are cleaned through the interceptors and let go, as without a group.
//
// Lifetime: outlives its members (a Process leaves its group when destroyed). Not
// thread-safe: use it from the tracer thread.

#include <sys/types.h>

#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"

namespace kwatch::core::ptrace {

class Process;

class ProcessGroup {
 public:
  explicit ProcessGroup(bool follow_forks) : follow_forks_(follow_forks) {}
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  // Makes `process` a member (its stops are routed to it from other members' waits).
  void Add(Process& process);
  // Whether forks made from now on are followed; off: they are cleaned and let go.
  bool follow_forks() const { return follow_forks_; }
  void set_follow_forks(bool on) { follow_forks_ = on; }

  // The followed child `pid` announced by a kForked event (stopped, traced, a member), once;
  // nullptr if unknown or already taken.
  std::unique_ptr<Process> TakeChild(pid_t pid);
  // Children forked and not taken yet.
  std::vector<pid_t> UntakenChildren() const;
  // Children followed so far.
  uint64_t followed() const { return followed_; }

 private:
  friend class Process;
  void Remove(Process& process);
  // The member that `tid` belongs to (one of its threads, or a thread of its thread group
  // not seen yet), or nullptr.
  Process* Owner(pid_t tid) const;

  bool follow_forks_;
  uint64_t followed_ = 0;
  std::vector<Process*> members_;
  absl::flat_hash_set<pid_t> foreign_stops_;  // first stops of children not announced yet
  absl::flat_hash_map<pid_t, std::unique_ptr<Process>> children_;  // forked, not taken
};

}  // namespace kwatch::core::ptrace
