#include "watch/agent/loader.h"

#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/user.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <climits>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "agent/abi.h"
#include "core/base/status_macros.h"
#include "core/base/syscall_status.h"
#include "core/base/target_files.h"
#include "core/ptrace/process.h"
#include "core/ptrace/remote_call.h"
#include "core/symbols/unwind.h"

namespace kwatch::watch::agent {

namespace ka = kwatch::agent;
using core::RemoteAddr;

namespace {

constexpr uint64_t kNameAt = 64;     // in the scratch page: the memfd's name
constexpr uint64_t kLibNameAt = 96;  // the name of the library's memfd copy
constexpr uint64_t kPathAt = 128;    // the library's path
constexpr int kLifelineMinFd = 1000;
constexpr uint64_t kRtldDlopen = 0x80000000;  // glibc's __RTLD_DLOPEN, for __libc_dlopen_mode

std::string Basename(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

bool IsGlibc(const std::string& path) {
  const std::string base = Basename(path);
  return base == "libc.so.6" || (absl::StartsWith(base, "libc-2.") && absl::EndsWith(base, ".so"));
}

bool IsDynamicLoader(const std::string& path) {
  const std::string base = Basename(path);
  return absl::StartsWith(base, "ld-linux") || absl::StartsWith(base, "ld-2.") ||
         absl::StartsWith(base, "ld64.so") || absl::StartsWith(base, "ld-musl");
}

std::string Canonical(const std::string& path) {
  std::error_code ec;
  std::filesystem::path p = std::filesystem::canonical(path, ec);
  return ec ? path : p.string();
}

// A remote system call whose -errno result becomes a Status naming `what`.
absl::StatusOr<int64_t> Sys(core::ptrace::Process& proc, pid_t tid, long nr,
                            std::initializer_list<uint64_t> args, const std::string& what) {
  auto r = core::ptrace::RemoteSyscallByTrap(proc, tid, nr,
                                             std::span<const uint64_t>(args.begin(), args.size()));
  if (!r.ok()) {
    return absl::Status(r.status().code(), absl::StrCat(what, ": ", r.status().message()));
  }
  if (*r < 0 && *r > -4096) {
    return core::SyscallError(static_cast<int>(-*r), absl::StrCat(what, " in pid ", proc.pid()));
  }
  return *r;
}

// A NUL-terminated string of the target (up to `max` bytes).
std::string ReadRemoteString(const core::ptrace::Process& proc, RemoteAddr at, size_t max = 1024) {
  std::string out;
  std::array<uint8_t, 64> chunk{};
  while (out.size() < max) {
    // Never across a page: the next one may be unmapped.
    const uint64_t in_page = 4096 - ((at.value + out.size()) & 4095);
    const size_t n = std::min<uint64_t>(chunk.size(), in_page);
    if (!proc.ReadMemory(at + out.size(), std::span<uint8_t>(chunk.data(), n)).ok()) {
      break;
    }
    const auto* begin = chunk.data();
    const auto* end = std::find(begin, begin + n, 0);
    out.append(reinterpret_cast<const char*>(begin), static_cast<size_t>(end - begin));
    if (end != begin + n) {
      break;
    }
  }
  return out;
}

// The names of libc's allocator and of its parts of the dynamic loader: a thread inside one
// may hold a lock dlopen takes.
bool HoldsLoaderOrAllocatorLock(const std::string& fn) {
  static constexpr std::array<const char*, 15> kParts = {
      "malloc", "alloc",           "free",   "tcache",  "arena", "chunk", "systrim",  "heap_trim",
      "mtrim",  "dl_iterate_phdr", "dlopen", "dlclose", "dlsym", "_dl_",  "__libc_dl"};
  return std::any_of(kParts.begin(), kParts.end(),
                     [&fn](const char* part) { return absl::StrContains(fn, part); });
}

// Whether thread `tid` of `pid` blocks `sig` (SigBlk in its status).
bool Blocks(pid_t pid, pid_t tid, int sig) {
  auto text = core::ptrace::ReadSmallFile(absl::StrCat("/proc/", pid, "/task/", tid, "/status"));
  if (!text.ok()) {
    return false;
  }
  const size_t at = text->find("SigBlk:");
  if (at == std::string::npos) {
    return false;
  }
  uint64_t mask = 0;
  const size_t end = text->find('\n', at);
  if (!absl::SimpleHexAtoi(absl::StripAsciiWhitespace(text->substr(at + 7, end - at - 7)), &mask)) {
    return false;
  }
  return (mask & (uint64_t{1} << (sig - 1))) != 0;
}

// The functions a shared object exports (.dynsym), with link-time addresses and sizes: all
// the loader needs (dlopen, dlerror, dlclose, kwatch_agent_init, and the public entries of
// libc's allocator to recognise a thread inside one), without reading DWARF.
class ElfExports {
 public:
  static absl::StatusOr<ElfExports> Read(const std::string& path) {
    core::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd.valid()) {
      const int err = errno;
      return core::SyscallError(err, absl::StrCat("open(", path, ")"));
    }
    ::elf_version(EV_CURRENT);
    std::unique_ptr<Elf, int (*)(Elf*)> elf(::elf_begin(fd.get(), ELF_C_READ_MMAP, nullptr),
                                            &::elf_end);
    if (elf == nullptr || ::elf_kind(elf.get()) != ELF_K_ELF) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": not an ELF file"));
    }
    ElfExports out;
    for (Elf_Scn* scn = ::elf_nextscn(elf.get(), nullptr); scn != nullptr;
         scn = ::elf_nextscn(elf.get(), scn)) {
      GElf_Shdr sh{};
      if (::gelf_getshdr(scn, &sh) == nullptr || sh.sh_type != SHT_DYNSYM || sh.sh_entsize == 0) {
        continue;
      }
      Elf_Data* data = ::elf_getdata(scn, nullptr);
      const size_t n = sh.sh_size / sh.sh_entsize;
      for (size_t i = 1; data != nullptr && i < n; ++i) {
        GElf_Sym sym{};
        if (::gelf_getsym(data, static_cast<int>(i), &sym) == nullptr ||
            sym.st_shndx == SHN_UNDEF) {
          continue;
        }
        const int type = GELF_ST_TYPE(sym.st_info);
        if (type != STT_FUNC && type != STT_GNU_IFUNC) {
          continue;
        }
        const char* name = ::elf_strptr(elf.get(), sh.sh_link, sym.st_name);
        if (name != nullptr) {
          out.functions_.push_back(Function{name, sym.st_value, sym.st_size});
        }
      }
    }
    return out;
  }

  // The link-time address of function `name`, if exported.
  std::optional<uint64_t> Find(std::string_view name) const {
    for (const Function& f : functions_) {
      if (f.name == name) {
        return f.addr;
      }
    }
    return std::nullopt;
  }

  // The exported function whose [addr, addr + size) holds `addr` (link-time), if any.
  const std::string* Containing(uint64_t addr) const {
    for (const Function& f : functions_) {
      if (addr >= f.addr && addr - f.addr < f.size) {
        return &f.name;
      }
    }
    return nullptr;
  }

 private:
  struct Function {
    std::string name;
    uint64_t addr = 0;
    uint64_t size = 0;
  };
  std::vector<Function> functions_;
};

// What the agent's init was doing when it failed (KwControl::init_error).
std::string InitErrorText(uint32_t e) {
  switch (e) {
    case ka::kKwInitOk:
      return "";
    case ka::kKwInitBadMagic:
      return "the control block's magic";
    case ka::kKwInitBadVersion:
      return "the ABI version (kwatch and the agent differ)";
    case ka::kKwInitBadLayout:
      return "the shared memory's layout";
    case ka::kKwInitBusy:
      return "an earlier session of the agent is not over";
    case ka::kKwInitLifeline:
      return "the lifeline";
    case ka::kKwInitMembarrier:
      return "membarrier(REGISTER_PRIVATE_EXPEDITED_SYNC_CORE)";
    case ka::kKwInitSignals:
      return "installing its signal handlers";
    case ka::kKwInitHooks:
      return "hooking libc's sigaction and pthread_sigmask";
    case ka::kKwInitAtfork:
      return "pthread_atfork";
    case ka::kKwInitWatchdog:
      return "starting its watchdog thread";
    default:
      return absl::StrCat("step ", e);
  }
}

// Undo steps of a load, run in reverse on failure.
class Undo {
 public:
  Undo() = default;
  Undo(const Undo&) = delete;
  Undo& operator=(const Undo&) = delete;
  Undo(Undo&&) = delete;
  Undo& operator=(Undo&&) = delete;
  ~Undo() { (void)Run(); }

  // Returns a handle to drop the step once it no longer applies.
  size_t Add(std::string what, std::function<absl::Status()> step) {
    steps_.push_back({std::move(what), std::move(step)});
    return steps_.size() - 1;
  }
  void Drop(size_t handle) { steps_[handle].step = nullptr; }
  void DropAll() { steps_.clear(); }
  // Runs what is left, newest first; says what failed.
  std::string Run() {
    std::vector<std::string> failed;
    for (size_t i = steps_.size(); i-- > 0;) {
      const Step& step = steps_[i];
      if (step.step) {
        if (absl::Status s = step.step(); !s.ok()) {
          failed.push_back(absl::StrCat(step.what, ": ", s.message()));
        }
      }
    }
    steps_.clear();
    return absl::StrJoin(failed, "; ");
  }

 private:
  struct Step {
    std::string what;
    std::function<absl::Status()> step;
  };
  std::vector<Step> steps_;
};

}  // namespace

namespace {

// The file kwatch reads for the library mapped from `path` in `pid`, whose filesystem may
// not be kwatch's (a container): core/base/target_files.h. `path` when nothing better opens.
std::string ReadablePath(pid_t pid, const std::vector<core::ptrace::MapEntry>& maps,
                         const std::string& path) {
  for (const core::ptrace::MapEntry& m : maps) {
    if (m.path == path && m.offset == 0) {
      std::string readable = core::MappedFilePath(pid, path, m.inode, m.start.value, m.end.value);
      return readable.empty() ? path : readable;
    }
  }
  return path;
}

// Copies the file at `from` into the file open at `fd`.
absl::Status CopyFile(const std::string& from, int fd) {
  core::UniqueFd in(::open(from.c_str(), O_RDONLY | O_CLOEXEC));
  if (!in.valid()) {
    const int err = errno;
    return core::SyscallError(err, absl::StrCat("open(", from, ")"));
  }
  std::array<char, 65536> buf{};
  for (;;) {
    const ssize_t n = ::read(in.get(), buf.data(), buf.size());
    if (n < 0) {
      const int err = errno;
      return core::SyscallError(err, absl::StrCat("read(", from, ")"));
    }
    if (n == 0) {
      return absl::OkStatus();
    }
    for (ssize_t done = 0; done < n;) {
      const ssize_t w = ::write(fd, buf.data() + done, static_cast<size_t>(n - done));
      if (w < 0) {
        const int err = errno;
        return core::SyscallError(err, "write(the agent's copy)");
      }
      done += w;
    }
  }
}

}  // namespace

absl::StatusOr<std::string> FindAgentLibrary(const std::string& self_exe) {
  // NOLINTNEXTLINE(concurrency-mt-unsafe): read before any thread changes the environment
  if (const char* env = std::getenv("KWATCH_AGENT"); env != nullptr && *env != '\0') {
    if (::access(env, R_OK) == 0) {
      return std::string(env);
    }
    const int err = errno;
    return absl::NotFoundError(absl::StrCat("KWATCH_AGENT=", env, ": ", core::ErrnoText(err)));
  }
  std::string exe = self_exe;
  std::array<char, PATH_MAX> buf{};
  const ssize_t n = ::readlink(self_exe.c_str(), buf.data(), buf.size() - 1);
  if (n > 0) {
    exe.assign(buf.data(), static_cast<size_t>(n));
  }
  const std::filesystem::path dir = std::filesystem::path(exe).parent_path();
  std::vector<std::string> candidates = {
      (dir / kAgentLibraryName).lexically_normal().string(),
      (dir / ".." / "lib" / "kwatch" / kAgentLibraryName).lexically_normal().string(),
  };
#ifdef KWATCH_AGENT_BUILD_PATH
  candidates.emplace_back(KWATCH_AGENT_BUILD_PATH);
#endif
  for (const std::string& c : candidates) {
    if (::access(c.c_str(), R_OK) == 0) {
      return c;
    }
  }
  return absl::NotFoundError(absl::StrCat(kAgentLibraryName, " not found; looked in ",
                                          absl::StrJoin(candidates, ", "),
                                          " (KWATCH_AGENT=PATH names it)"));
}

absl::StatusOr<std::vector<pid_t>> ThreadsBlocking(pid_t pid, int sig) {
  std::vector<pid_t> out;
  std::error_code ec;
  for (const auto& e :
       std::filesystem::directory_iterator(absl::StrCat("/proc/", pid, "/task"), ec)) {
    pid_t tid = 0;
    if (absl::SimpleAtoi(e.path().filename().string(), &tid) && Blocks(pid, tid, sig)) {
      out.push_back(tid);
    }
  }
  if (ec) {
    return absl::NotFoundError(
        absl::StrCat("listing the threads of pid ", pid, ": ", ec.message()));
  }
  std::sort(out.begin(), out.end());
  return out;
}

absl::StatusOr<uint64_t> LoadBias(const core::ptrace::Process& proc,
                                  const std::vector<core::ptrace::MapEntry>& maps,
                                  const std::string& path) {
  const core::ptrace::MapEntry* first = nullptr;
  for (const core::ptrace::MapEntry& m : maps) {
    if (m.path == path && m.offset == 0) {
      first = &m;
      break;
    }
  }
  if (first == nullptr) {
    return absl::NotFoundError(absl::StrCat(path, " is not mapped in pid ", proc.pid()));
  }
  Elf64_Ehdr eh{};
  KW_RETURN_IF_ERROR(proc.ReadMemory(
      first->start, std::span<uint8_t>(reinterpret_cast<uint8_t*>(&eh), sizeof(eh))));
  if (std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 || eh.e_ident[EI_CLASS] != ELFCLASS64 ||
      eh.e_phentsize != sizeof(Elf64_Phdr)) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": its first mapped page in pid ", proc.pid(), " is no 64-bit ELF"));
  }
  for (uint16_t i = 0; i < eh.e_phnum; ++i) {
    Elf64_Phdr ph{};
    KW_RETURN_IF_ERROR(
        proc.ReadMemory(first->start + eh.e_phoff + uint64_t{i} * sizeof(ph),
                        std::span<uint8_t>(reinterpret_cast<uint8_t*>(&ph), sizeof(ph))));
    if (ph.p_type == PT_LOAD) {
      // The mapping at file offset 0 is the page of the first PT_LOAD.
      return first->start.value - ((ph.p_vaddr - ph.p_offset) & ~uint64_t{4095});
    }
  }
  return absl::FailedPreconditionError(absl::StrCat(path, " has no PT_LOAD segment"));
}

absl::StatusOr<DlopenSite> FindDlopen(const core::ptrace::Process& proc,
                                      const std::vector<core::ptrace::MapEntry>& maps) {
  const pid_t pid = proc.pid();
  std::string libc;
  bool loader = false;
  std::string other;
  for (const core::ptrace::MapEntry& m : maps) {
    if (IsGlibc(m.path) && libc.empty()) {
      libc = m.path;
    }
    loader = loader || IsDynamicLoader(m.path);
    if (absl::StrContains(Basename(m.path), "musl")) {
      other = m.path;
    }
  }
  if (libc.empty()) {
    if (!other.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("pid ", pid, " runs on ", other,
                       ", not glibc: kwatch loads its agent with glibc's dlopen only"));
    }
    if (!loader) {
      return absl::FailedPreconditionError(
          absl::StrCat("pid ", pid,
                       " is statically linked (no dynamic loader mapped): there is no dlopen "
                       "to load the agent with"));
    }
    return absl::FailedPreconditionError(
        absl::StrCat("pid ", pid, " has no glibc mapped (libc.so.6): no dlopen to call"));
  }
  KW_ASSIGN_OR_RETURN(const ElfExports exports, ElfExports::Read(ReadablePath(pid, maps, libc)));
  KW_ASSIGN_OR_RETURN(const uint64_t bias, LoadBias(proc, maps, libc));
  DlopenSite site;
  site.libc = libc;
  auto find = [&](const char* name) -> std::optional<uint64_t> {
    const std::optional<uint64_t> f = exports.Find(name);
    if (!f.has_value()) {
      return std::nullopt;
    }
    return *f + bias;
  };
  if (auto d = find("dlopen"); d.has_value()) {
    site.dlopen = RemoteAddr{*d};
    site.dlerror = RemoteAddr{find("dlerror").value_or(0)};
    site.dlclose = RemoteAddr{find("dlclose").value_or(0)};
  } else if (auto m = find("__libc_dlopen_mode"); m.has_value()) {
    site.dlopen = RemoteAddr{*m};
    site.dlclose = RemoteAddr{find("__libc_dlclose").value_or(0)};
    site.libc_dlopen_mode = true;
  } else {
    return absl::FailedPreconditionError(absl::StrCat(
        libc,
        " exports neither dlopen (glibc >= 2.34) nor __libc_dlopen_mode: no way to load "
        "the agent into pid ",
        pid));
  }
  return site;
}

absl::StatusOr<pid_t> PickLoadThread(core::ptrace::Process& proc) {
  const pid_t pid = proc.pid();
  KW_ASSIGN_OR_RETURN(const std::vector<core::ptrace::MapEntry> maps, proc.Maps());
  std::string libc;
  for (const core::ptrace::MapEntry& m : maps) {
    if (IsGlibc(m.path)) {
      libc = m.path;
      break;
    }
  }
  std::optional<ElfExports> libc_exports;
  uint64_t libc_bias = 0;
  if (!libc.empty()) {
    if (auto e = ElfExports::Read(ReadablePath(pid, maps, libc)); e.ok()) {
      libc_exports = std::move(*e);
    }
    if (auto b = LoadBias(proc, maps, libc); b.ok()) {
      libc_bias = *b;
    }
  }
  KW_ASSIGN_OR_RETURN(
      std::unique_ptr<core::symbols::Unwinder> unwinder,
      core::symbols::Unwinder::ForProcess(
          pid, [&proc](RemoteAddr a, std::span<uint8_t> out) { return proc.ReadMemory(a, out); }));
  std::vector<pid_t> blocked;  // safe, and inside a system call
  std::vector<pid_t> running;  // safe, in user code
  std::vector<std::string> refused;
  for (const pid_t tid : proc.TracedThreads()) {
    auto regs = proc.GetRegs(tid);
    if (!regs.ok()) {
      continue;  // gone, or not stopped (group stop)
    }
    if (Blocks(pid, tid, SIGTRAP)) {
      refused.push_back(absl::StrCat("thread ", tid, " blocks SIGTRAP"));
      continue;
    }
    auto frames = unwinder->Unwind(tid, *regs, 64);
    if (!frames.ok()) {
      refused.push_back(absl::StrCat("thread ", tid, ": ", frames.status().message()));
      continue;
    }
    std::string why;
    for (size_t i = 0; i < frames->size() && why.empty(); ++i) {
      const RemoteAddr pc = i == 0 ? (*frames)[i] : (*frames)[i] - 1;
      const std::optional<core::ptrace::MapEntry> m = core::ptrace::FindMapping(maps, pc);
      if (!m.has_value()) {
        continue;
      }
      if (IsDynamicLoader(m->path)) {
        why =
            absl::StrCat("thread ", tid, " is inside the dynamic loader (", Basename(m->path), ")");
      } else if (m->path == libc && libc_exports.has_value()) {
        // Internal functions (_int_malloc...) are not exported, but the public entry that
        // called them is a frame too.
        const std::string* fn = libc_exports->Containing(pc.value - libc_bias);
        if (fn != nullptr && HoldsLoaderOrAllocatorLock(*fn)) {
          why = absl::StrCat("thread ", tid, " is inside ", *fn, " (libc)");
        }
      }
    }
    if (!why.empty()) {
      refused.push_back(std::move(why));
      continue;
    }
    (static_cast<int64_t>(regs->orig_rax) >= 0 ? blocked : running).push_back(tid);
  }
  for (auto* list : {&blocked, &running}) {
    // The main thread first, then the oldest.
    std::sort(list->begin(), list->end());
    if (!list->empty()) {
      return list->front();
    }
  }
  return absl::FailedPreconditionError(
      absl::StrCat("no thread of pid ", pid, " can load the agent safely now: ",
                   refused.empty() ? "no stopped thread" : absl::StrJoin(refused, "; ")));
}

absl::StatusOr<LoadedAgent> LoadAgent(core::ptrace::Process& proc, const LoadOptions& options) {
  const absl::Time start = absl::Now();
  const pid_t pid = proc.pid();
  if (!proc.alive()) {
    return absl::FailedPreconditionError(absl::StrCat("process ", pid, " has exited"));
  }
  LoadedAgent agent;
  if (options.agent_path.empty()) {
    KW_ASSIGN_OR_RETURN(agent.path, FindAgentLibrary());
  } else {
    agent.path = options.agent_path;
  }
  if (::access(agent.path.c_str(), R_OK) != 0) {
    const int err = errno;
    return core::SyscallError(err, absl::StrCat("the agent library ", agent.path));
  }
  KW_ASSIGN_OR_RETURN(agent.layout, ComputeLayout(options.shm));
  const ShmLayout& layout = agent.layout;
  KW_RETURN_IF_ERROR(proc.StopAll());
  KW_ASSIGN_OR_RETURN(const std::vector<core::ptrace::MapEntry> maps, proc.Maps());
  KW_ASSIGN_OR_RETURN(const DlopenSite site, FindDlopen(proc, maps));
  KW_ASSIGN_OR_RETURN(const ElfExports agent_exports, ElfExports::Read(agent.path));
  const std::optional<uint64_t> init_symbol = agent_exports.Find("kwatch_agent_init");
  if (!init_symbol.has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat(agent.path, " has no kwatch_agent_init: not kwatch's agent library"));
  }

  // The thread.
  pid_t tid = options.thread;
  if (tid == 0 && proc.launched() && proc.TracedThreads().size() == 1) {
    tid = pid;
  }
  if (tid == 0) {
    const absl::Time give_up = absl::Now() + options.timeout;
    for (;;) {
      auto picked = PickLoadThread(proc);
      if (picked.ok()) {
        tid = *picked;
        break;
      }
      if (picked.status().code() != absl::StatusCode::kFailedPrecondition) {
        return picked.status();
      }
      if (absl::Now() >= give_up) {
        return absl::DeadlineExceededError(absl::StrCat(picked.status().message(), " (for ",
                                                        absl::FormatDuration(options.timeout),
                                                        "; --backend ptrace needs no agent)"));
      }
      // Let the threads move on, out of the allocator or the loader.
      KW_RETURN_IF_ERROR(proc.ResumeAll());
      ::usleep(10'000);
      KW_RETURN_IF_ERROR(proc.StopAll());
    }
  }
  agent.thread = tid;
  agent.timings.pick = absl::Now() - start;
  const absl::Time setup_start = absl::Now();

  Undo undo;
  const auto step_error = [&](const std::string& step, const absl::Status& s) {
    const std::string undone = undo.Run();
    return absl::Status(
        s.code(), absl::StrCat("loading the agent into pid ", pid, ": ", step, ": ", s.message(),
                               undone.empty() ? "" : "; undoing: ", undone));
  };
// `lhs` is a declaration: no parentheses.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define KW_LOAD_STEP(lhs, step, expr)                                   \
  auto KW_INTERNAL_CONCAT(r_, __LINE__) = (expr);                       \
  if (!KW_INTERNAL_CONCAT(r_, __LINE__).ok())                           \
    return step_error(step, KW_INTERNAL_CONCAT(r_, __LINE__).status()); \
  lhs = *std::move(KW_INTERNAL_CONCAT(r_, __LINE__))
  // NOLINTEND(bugprone-macro-parentheses)

  // A page for the return trap, the memfd's name and the library's path.
  // A target whose filesystem does not hold this very file (a container, a chroot) loads a
  // copy of it from a memfd, by /proc/self/fd/N.
  agent.copied = !core::TargetSeesOwnFile(pid, agent.path);
  const uint64_t scratch_size =
      (kPathAt + std::max<size_t>(agent.path.size(), 64) + 1 + 4095) & ~uint64_t{4095};
  KW_LOAD_STEP(const RemoteAddr scratch, "mapping a scratch page",
               core::ptrace::MapRemoteTrap(proc, tid, scratch_size));
  undo.Add("munmap(scratch)", [&proc, tid, scratch, scratch_size] {
    return core::ptrace::UnmapRemote(proc, tid, scratch, scratch_size);
  });
  {
    const std::string name = "kwatch-agent";
    const std::string lib_name = "kwatch-agent.so";
    absl::Status w = proc.WriteMemory(
        scratch + kNameAt,
        std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(name.c_str()), name.size() + 1));
    if (w.ok()) {
      w = proc.WriteMemory(
          scratch + kLibNameAt,
          std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(lib_name.c_str()),
                                   lib_name.size() + 1));
    }
    if (w.ok()) {
      w = proc.WriteMemory(
          scratch + kPathAt,
          std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(agent.path.c_str()),
                                   agent.path.size() + 1));
    }
    if (!w.ok()) {
      return step_error("writing the scratch page", w);
    }
  }

  // The shared memory.
  KW_LOAD_STEP(const int64_t memfd, "memfd_create",
               Sys(proc, tid, SYS_memfd_create, {(scratch + kNameAt).value, MFD_CLOEXEC},
                   "memfd_create(\"kwatch-agent\", MFD_CLOEXEC)"));
  const size_t close_memfd = undo.Add("close(memfd)", [&proc, tid, memfd] {
    return Sys(proc, tid, SYS_close, {static_cast<uint64_t>(memfd)}, "close").status();
  });
  KW_LOAD_STEP(const int64_t truncated, "ftruncate",
               Sys(proc, tid, SYS_ftruncate, {static_cast<uint64_t>(memfd), layout.total_size},
                   absl::StrCat("ftruncate(memfd, ", layout.total_size, ")")));
  (void)truncated;
  KW_LOAD_STEP(const int64_t mapped, "mmap",
               Sys(proc, tid, SYS_mmap,
                   {0, layout.total_size, PROT_READ | PROT_WRITE, MAP_SHARED,
                    static_cast<uint64_t>(memfd), 0},
                   absl::StrCat("mmap(", layout.total_size, ", MAP_SHARED, memfd)")));
  agent.remote_shm = RemoteAddr{static_cast<uint64_t>(mapped)};
  undo.Add("munmap(shared memory)", [&proc, tid, &agent, &layout] {
    return core::ptrace::UnmapRemote(proc, tid, agent.remote_shm, layout.total_size);
  });
  {
    const std::string fd_path = absl::StrCat("/proc/", pid, "/fd/", memfd);
    core::UniqueFd fd(::open(fd_path.c_str(), O_RDWR | O_CLOEXEC));
    if (!fd.valid()) {
      const int err = errno;
      return step_error("mapping the shared memory",
                        core::SyscallError(err, absl::StrCat("open(", fd_path, ")")));
    }
    void* local =
        ::mmap(nullptr, layout.total_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    if (local == MAP_FAILED) {
      const int err = errno;
      return step_error("mapping the shared memory",
                        core::SyscallError(err, absl::StrCat("mmap(", fd_path, ")")));
    }
    agent.shm = core::UniqueMmap(local, layout.total_size);
  }
  std::span<uint8_t> shm(static_cast<uint8_t*>(agent.shm.get()), layout.total_size);
  InitControl(shm, layout, options.shm.flags, ::getpid(), pid);
  auto* control = reinterpret_cast<ka::KwControl*>(shm.data());
  KW_LOAD_STEP(const int64_t closed, "closing the memfd",
               Sys(proc, tid, SYS_close, {static_cast<uint64_t>(memfd)}, "close(memfd)"));
  (void)closed;
  undo.Drop(close_memfd);

  // The lifeline. pipe2 writes its two fds into ring 0's data, which no agent uses yet.
  const uint64_t fds_offset = layout.rings_offset + sizeof(ka::KwRing);
  KW_LOAD_STEP(const int64_t piped, "pipe2",
               Sys(proc, tid, SYS_pipe2, {(agent.remote_shm + fds_offset).value, O_CLOEXEC},
                   "pipe2(O_CLOEXEC)"));
  (void)piped;
  std::array<int, 2> fds{};
  std::memcpy(fds.data(), shm.data() + fds_offset, sizeof(fds));
  std::memset(shm.data() + fds_offset, 0, sizeof(fds));
  const int read_end = fds[0];
  const int write_end = fds[1];
  const size_t close_read = undo.Add("close(lifeline read end)", [&proc, tid, read_end] {
    return Sys(proc, tid, SYS_close, {static_cast<uint64_t>(read_end)}, "close").status();
  });
  const size_t close_write = undo.Add("close(lifeline write end)", [&proc, tid, write_end] {
    return Sys(proc, tid, SYS_close, {static_cast<uint64_t>(write_end)}, "close").status();
  });
  {
    core::UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
    if (!pidfd.valid()) {
      const int err = errno;
      return step_error("taking the lifeline",
                        core::SyscallError(err, absl::StrCat("pidfd_open(", pid, ")")));
    }
    agent.lifeline =
        core::UniqueFd(static_cast<int>(::syscall(SYS_pidfd_getfd, pidfd.get(), write_end, 0)));
    if (!agent.lifeline.valid()) {
      const int err = errno;
      return step_error(
          "taking the lifeline",
          core::SyscallError(err, absl::StrCat("pidfd_getfd(", pid, ", ", write_end, ")")));
    }
  }
  KW_LOAD_STEP(const int64_t closed_write, "closing the target's write end",
               Sys(proc, tid, SYS_close, {static_cast<uint64_t>(write_end)}, "close"));
  (void)closed_write;
  undo.Drop(close_write);
  agent.remote_lifeline = read_end;
  auto moved =
      Sys(proc, tid, SYS_fcntl, {static_cast<uint64_t>(read_end), F_DUPFD_CLOEXEC, kLifelineMinFd},
          "fcntl(F_DUPFD_CLOEXEC, 1000)");
  if (moved.ok()) {
    KW_LOAD_STEP(const int64_t closed_read, "closing the lifeline's first fd",
                 Sys(proc, tid, SYS_close, {static_cast<uint64_t>(read_end)}, "close"));
    (void)closed_read;
    undo.Drop(close_read);
    agent.remote_lifeline = static_cast<int>(*moved);
    undo.Add("close(lifeline)", [&proc, tid, fd = agent.remote_lifeline] {
      return Sys(proc, tid, SYS_close, {static_cast<uint64_t>(fd)}, "close").status();
    });
  } else if (moved.status().code() != absl::StatusCode::kInvalidArgument &&
             moved.status().code() != absl::StatusCode::kResourceExhausted) {
    return step_error("moving the lifeline", moved.status());
  }  // else RLIMIT_NOFILE <= 1000: the fd stays where pipe2 put it
  control->lifeline_fd = static_cast<uint32_t>(agent.remote_lifeline);
  agent.timings.setup = absl::Now() - setup_start;

  // The copy, when the target cannot reach the file.
  std::string dlopen_path = agent.path;
  std::optional<size_t> close_copy;
  int64_t copy_fd = -1;
  if (agent.copied) {
    KW_LOAD_STEP(copy_fd, "memfd_create (the agent's copy)",
                 Sys(proc, tid, SYS_memfd_create, {(scratch + kLibNameAt).value, MFD_CLOEXEC},
                     "memfd_create(\"kwatch-agent.so\", MFD_CLOEXEC)"));
    close_copy = undo.Add("close(the agent's copy)", [&proc, tid, copy_fd] {
      return Sys(proc, tid, SYS_close, {static_cast<uint64_t>(copy_fd)}, "close").status();
    });
    const std::string fd_path = absl::StrCat("/proc/", pid, "/fd/", copy_fd);
    core::UniqueFd fd(::open(fd_path.c_str(), O_WRONLY | O_CLOEXEC));
    if (!fd.valid()) {
      const int err = errno;
      return step_error("copying the agent",
                        core::SyscallError(err, absl::StrCat("open(", fd_path, ")")));
    }
    if (absl::Status c = CopyFile(agent.path, fd.get()); !c.ok()) {
      return step_error("copying the agent", c);
    }
    dlopen_path = absl::StrCat("/proc/self/fd/", copy_fd);
    if (absl::Status w = proc.WriteMemory(
            scratch + kPathAt,
            std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(dlopen_path.c_str()),
                                     dlopen_path.size() + 1));
        !w.ok()) {
      return step_error("writing the scratch page", w);
    }
  }

  // dlopen.
  const core::ptrace::RemoteCallOptions call{
      .return_trap = scratch,
      .resume_others = !options.keep_others_stopped && proc.TracedThreads().size() > 1,
      .timeout = options.timeout};
  const std::string dlopen_what = absl::StrCat(
      site.libc_dlopen_mode ? "__libc_dlopen_mode(" : "dlopen(", dlopen_path, ", RTLD_NOW)",
      agent.copied ? absl::StrCat(" (a copy of ", agent.path,
                                  ", which the target's filesystem does not have)")
                   : "");
  {
    const std::array<uint64_t, 2> args = {
        (scratch + kPathAt).value,
        static_cast<uint64_t>(RTLD_NOW) | (site.libc_dlopen_mode ? kRtldDlopen : 0)};
    KW_LOAD_STEP(const core::ptrace::RemoteCallResult opened, dlopen_what,
                 core::ptrace::RemoteCall(proc, tid, site.dlopen, args, call));
    agent.timings.dlopen = opened.elapsed;
    if (opened.value == 0) {
      std::string why = "it returned NULL";
      if (site.dlerror.value != 0) {
        auto err = core::ptrace::RemoteCall(proc, tid, site.dlerror, {}, call);
        if (err.ok() && err->value != 0) {
          why = ReadRemoteString(proc, RemoteAddr{err->value});
        }
      }
      return step_error(dlopen_what, absl::FailedPreconditionError(why));
    }
    agent.handle = opened.value;
  }
  if (site.dlclose.value != 0) {
    undo.Add("dlclose", [&proc, tid, &site, &agent, call] {
      const std::array<uint64_t, 1> handle = {agent.handle};
      return core::ptrace::RemoteCall(proc, tid, site.dlclose, handle, call).status();
    });
  }

  // kwatch_agent_init, from the library's symbols and where it was mapped.
  KW_LOAD_STEP(const std::vector<core::ptrace::MapEntry> after, "reading the maps", proc.Maps());
  if (close_copy.has_value()) {  // the mapping holds the copy now
    KW_LOAD_STEP(const int64_t closed_copy, "closing the agent's copy",
                 Sys(proc, tid, SYS_close, {static_cast<uint64_t>(copy_fd)}, "close"));
    (void)closed_copy;
    undo.Drop(*close_copy);
  }
  const std::string mapped_path =
      agent.copied ? std::string("/memfd:kwatch-agent.so (deleted)") : Canonical(agent.path);
  KW_LOAD_STEP(const uint64_t bias, "finding the agent's load address",
               LoadBias(proc, after, mapped_path));
  for (const core::ptrace::MapEntry& m : after) {
    if (m.path == mapped_path && m.offset == 0) {
      agent.agent_base = m.start;
      break;
    }
  }
  const RemoteAddr init{*init_symbol + bias};
  {
    const std::array<uint64_t, 2> args = {agent.remote_shm.value, layout.total_size};
    KW_LOAD_STEP(const core::ptrace::RemoteCallResult inited, "kwatch_agent_init",
                 core::ptrace::RemoteCall(proc, tid, init, args, call));
    agent.timings.init = inited.elapsed;
    const auto rc = static_cast<int32_t>(static_cast<uint32_t>(inited.value));
    if (rc != 0) {
      const std::string during = InitErrorText(control->init_error);
      return step_error(
          "kwatch_agent_init",
          absl::FailedPreconditionError(absl::StrCat(
              "it returned ", rc, rc < 0 ? absl::StrCat(" (", core::ErrnoText(-rc), ")") : "",
              during.empty() ? "" : absl::StrCat(" at ", during))));
    }
  }
  if (control->magic != ka::kKwMagic || control->abi_version != ka::kKwAbiVersion) {
    return step_error(
        "checking the control block",
        absl::DataLossError("the agent's init left a control block kwatch did not write"));
  }
  if (control->agent_base != agent.agent_base.value) {
    return step_error("checking the control block",
                      absl::FailedPreconditionError(
                          absl::StrFormat("the agent says it is at 0x%x, the maps say 0x%x",
                                          control->agent_base, agent.agent_base.value)));
  }
#undef KW_LOAD_STEP

  // Loaded: only the scratch page goes.
  undo.DropAll();
  if (absl::Status s = core::ptrace::UnmapRemote(proc, tid, scratch, scratch_size); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("loading the agent into pid ", pid,
                                               ": unmapping the scratch page: ", s.message()));
  }
  agent.timings.total = absl::Now() - start;
  return agent;
}

}  // namespace kwatch::watch::agent
