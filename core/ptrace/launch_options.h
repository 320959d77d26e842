#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kwatch::core::ptrace {

// Who a launched command runs as (`-u USER`, as strace does): resolved by ResolveUser.
struct RunAs {
  std::string name;
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;  // supplementary groups, the user's own (getgrouplist)
};

// USER is a login name or a numeric uid. NotFound names the user; PermissionDenied when
// kwatch is not root (switching user needs CAP_SETUID and CAP_SETGID).
absl::StatusOr<RunAs> ResolveUser(const std::string& user);

struct LaunchOptions {
  bool kill_on_exit = true;     // PTRACE_O_EXITKILL: the target dies if kwatch dies
  std::optional<RunAs> run_as;  // the command's user, groups and group ids (else kwatch's)
};

}  // namespace kwatch::core::ptrace
