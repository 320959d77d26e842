#include "watch/gdb/svr4.h"

#include <elf.h>
#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"
#include "core/base/syscall_status.h"
#include "core/base/target_files.h"
#include "core/base/unique_fd.h"

namespace kwatch::watch::gdb {

namespace {

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  core::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) {
    const int err = errno;
    return core::SyscallError(err, absl::StrCat("open(", path, ")"));
  }
  std::string out;
  std::array<char, 4096> buf{};
  for (;;) {
    const ssize_t n = ::read(fd.get(), buf.data(), buf.size());
    if (n < 0) {
      const int err = errno;
      if (err == EINTR) {
        continue;
      }
      return core::SyscallError(err, absl::StrCat("read(", path, ")"));
    }
    if (n == 0) {
      return out;
    }
    out.append(buf.data(), static_cast<size_t>(n));
  }
}

template <typename T>
absl::StatusOr<T> ReadRemote(const core::ptrace::Process& proc, uint64_t addr) {
  T v{};
  KW_RETURN_IF_ERROR(proc.ReadMemory(
      core::RemoteAddr{addr}, std::span<uint8_t>(reinterpret_cast<uint8_t*>(&v), sizeof(v))));
  return v;
}

absl::StatusOr<std::string> ReadCString(const core::ptrace::Process& proc, uint64_t addr) {
  std::string out;
  std::array<uint8_t, 64> chunk{};
  while (out.size() < 4096) {
    if (!proc.ReadMemory(core::RemoteAddr{addr + out.size()}, chunk).ok()) {
      // The last bytes of a mapping: one at a time.
      uint8_t c = 0;
      KW_RETURN_IF_ERROR(
          proc.ReadMemory(core::RemoteAddr{addr + out.size()}, std::span<uint8_t>(&c, 1)));
      if (c == 0) {
        return out;
      }
      out += static_cast<char>(c);
      continue;
    }
    for (const uint8_t c : chunk) {
      if (c == 0) {
        return out;
      }
      out += static_cast<char>(c);
    }
  }
  return out;
}

std::string XmlEscape(absl::string_view s) {
  std::string out;
  for (const char c : s) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// The r_debug address from the executable's DT_DEBUG, or nullopt when there is none yet.
absl::StatusOr<std::optional<uint64_t>> FindRDebug(const core::ptrace::Process& proc) {
  KW_ASSIGN_OR_RETURN(const std::string auxv, ReadAuxv(proc.pid()));
  uint64_t phdr = 0;
  uint64_t phnum = 0;
  for (size_t off = 0; off + 16 <= auxv.size(); off += 16) {
    uint64_t type = 0;
    uint64_t value = 0;
    std::memcpy(&type, auxv.data() + off, 8);
    std::memcpy(&value, auxv.data() + off + 8, 8);
    if (type == AT_PHDR) {
      phdr = value;
    } else if (type == AT_PHNUM) {
      phnum = value;
    }
  }
  if (phdr == 0 || phnum == 0 || phnum > 256) {
    return std::nullopt;
  }
  std::optional<uint64_t> bias;
  std::optional<uint64_t> dynamic;
  for (uint64_t i = 0; i < phnum; ++i) {
    KW_ASSIGN_OR_RETURN(const Elf64_Phdr ph,
                        ReadRemote<Elf64_Phdr>(proc, phdr + i * sizeof(Elf64_Phdr)));
    if (ph.p_type == PT_PHDR) {
      bias = phdr - ph.p_vaddr;
    } else if (ph.p_type == PT_DYNAMIC) {
      dynamic = ph.p_vaddr;
    }
  }
  if (!dynamic.has_value()) {
    return std::nullopt;  // static
  }
  const uint64_t dyn = *dynamic + bias.value_or(0);
  for (uint64_t i = 0; i < 1024; ++i) {
    KW_ASSIGN_OR_RETURN(const Elf64_Dyn d,
                        ReadRemote<Elf64_Dyn>(proc, dyn + i * sizeof(Elf64_Dyn)));
    if (d.d_tag == DT_NULL) {
      break;
    }
    if (d.d_tag == DT_DEBUG) {
      if (d.d_un.d_ptr == 0) {
        return std::nullopt;
      }
      return d.d_un.d_ptr;
    }
  }
  return std::nullopt;
}

}  // namespace

absl::StatusOr<std::string> ReadAuxv(pid_t pid) {
  return ReadWholeFile(absl::StrCat("/proc/", pid, "/auxv"));
}

absl::StatusOr<std::string> ExecutablePath(pid_t pid) {
  return core::ExecutableLink(pid);
}

absl::StatusOr<std::string> LibraryListSvr4(const core::ptrace::Process& proc) {
  KW_ASSIGN_OR_RETURN(const std::optional<uint64_t> r_debug, FindRDebug(proc));
  if (!r_debug.has_value()) {
    return std::string("<library-list-svr4 version=\"1.0\"/>");
  }
  // struct r_debug { int r_version; struct link_map* r_map; ... }
  KW_ASSIGN_OR_RETURN(uint64_t lm, ReadRemote<uint64_t>(proc, *r_debug + 8));
  std::string body;
  std::string main_lm;
  for (int n = 0; lm != 0 && n < 100000; ++n) {
    // struct link_map { l_addr, l_name, l_ld, l_next, l_prev }
    KW_ASSIGN_OR_RETURN(const auto fields, (ReadRemote<std::array<uint64_t, 4>>(proc, lm)));
    if (n == 0) {
      main_lm = absl::StrFormat("0x%x", lm);
    } else {
      KW_ASSIGN_OR_RETURN(const std::string name, ReadCString(proc, fields[1]));
      absl::StrAppendFormat(
          &body, R"(<library name="%s" lm="0x%x" l_addr="0x%x" l_ld="0x%x" lmid="0x0"/>)",
          XmlEscape(name), lm, fields[0], fields[2]);
    }
    lm = fields[3];
  }
  return absl::StrCat("<library-list-svr4 version=\"1.0\"",
                      main_lm.empty() ? "" : absl::StrCat(" main-lm=\"", main_lm, "\""), ">", body,
                      "</library-list-svr4>");
}

}  // namespace kwatch::watch::gdb
