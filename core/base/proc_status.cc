#include "core/base/proc_status.h"

#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace kwatch::core {

absl::string_view StatusFieldOf(absl::string_view status, absl::string_view name) {
  for (absl::string_view line : absl::StrSplit(status, '\n')) {
    if (absl::ConsumePrefix(&line, name) && absl::ConsumePrefix(&line, ":")) {
      return absl::StripAsciiWhitespace(line);
    }
  }
  return "";
}

std::string ProcStatusFieldOf(pid_t pid, absl::string_view name) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::stringstream text;
  text << in.rdbuf();
  return std::string(StatusFieldOf(text.str(), name));
}

}  // namespace kwatch::core
