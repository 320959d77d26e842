#include "core/base/syscall_status.h"

#include <array>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace kwatch::core {

std::string ErrnoText(int err) {
  std::array<char, 128> buf{};
  // GNU strerror_r returns a pointer that may or may not be `buf`.
  const char* text = strerror_r(err, buf.data(), buf.size());
  return text != nullptr ? std::string(text) : absl::StrCat("errno ", err);
}

absl::Status SyscallError(int err, absl::string_view call) {
  return {absl::ErrnoToStatusCode(err), absl::StrCat(call, ": ", ErrnoText(err))};
}

absl::Status SyscallError(int err, absl::string_view call, absl::string_view advice) {
  if (advice.empty()) {
    return SyscallError(err, call);
  }
  return {absl::ErrnoToStatusCode(err), absl::StrCat(call, ": ", ErrnoText(err), "; ", advice)};
}

}  // namespace kwatch::core
