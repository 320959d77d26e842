#include "drmgr/slot_registry.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/base/status_macros.h"
#include "core/base/syscall_status.h"
#include "core/base/unique_fd.h"

namespace kwatch::drmgr {

namespace {

using json = nlohmann::json;

constexpr int kFormatVersion = 1;
constexpr size_t kMaxScopes = 4096;
constexpr size_t kMaxRequests = 65536;
constexpr size_t kMaxIds = 65536;

// Where this process published last (empty: nothing published).
absl::Mutex g_mu;
std::string g_published_path ABSL_GUARDED_BY(g_mu);

// An owned copy without a functional cast (Debian's absl::string_view is a class).
std::string Own(absl::string_view v) {
  return {v.data(), v.size()};
}

std::string FileName(pid_t pid) {
  return absl::StrCat("kwatch-", pid, ".json");
}

// Field 22 of /proc/PID/stat (start time in clock ticks after boot); nullopt when the
// process does not exist or the file is odd.
std::optional<uint64_t> StartTicks(pid_t pid) {
  core::UniqueFd fd(::open(absl::StrCat("/proc/", pid, "/stat").c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) {
    return std::nullopt;
  }
  std::string text(4096, '\0');
  const ssize_t n = ::read(fd.get(), text.data(), text.size());
  if (n <= 0) {
    return std::nullopt;
  }
  text.resize(static_cast<size_t>(n));
  const size_t paren = text.rfind(')');
  if (paren == std::string::npos) {
    return std::nullopt;
  }
  // After ") ": field 3 (state) is the first; field 22 is the 20th.
  const std::vector<absl::string_view> fields =
      absl::StrSplit(absl::string_view(text).substr(paren + 1), ' ', absl::SkipEmpty());
  uint64_t ticks = 0;
  if (fields.size() < 20 || !absl::SimpleAtoi(fields[19], &ticks)) {
    return std::nullopt;
  }
  return ticks;
}

// Whether the directory at `dir` exists (false when missing) and is safe: a real directory
// (not a symlink), owned by us, closed to group and others.
absl::StatusOr<bool> CheckDir(const std::string& dir) {
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT) {
      return false;
    }
    return core::SyscallError(err, absl::StrCat("lstat(", dir, ")"));
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "kwatch's run directory ", dir, " is not a directory (a symlink or a file): remove it"));
  }
  if (st.st_uid != ::geteuid()) {
    return absl::FailedPreconditionError(
        absl::StrCat("kwatch's run directory ", dir, " belongs to uid ", st.st_uid, ", not ",
                     ::geteuid(), ": remove it, or set KWATCH_RUN_DIR"));
  }
  if ((st.st_mode & 077) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("kwatch's run directory ", dir, " is open to others (mode ",
                     absl::StrFormat("%o", st.st_mode & 0777), "): `chmod 700 ", dir, "`"));
  }
  return true;
}

absl::Status EnsureDir(const std::string& dir) {
  KW_ASSIGN_OR_RETURN(const bool exists, CheckDir(dir));
  if (exists) {
    return absl::OkStatus();
  }
  if (::mkdir(dir.c_str(), 0700) != 0) {
    const int err = errno;
    if (err != EEXIST) {
      return core::SyscallError(err, absl::StrCat("mkdir(", dir, ")"));
    }
  }
  KW_ASSIGN_OR_RETURN(const bool now, CheckDir(dir));
  if (!now) {
    return absl::InternalError(absl::StrCat(dir, " vanished after mkdir"));
  }
  return absl::OkStatus();
}

// ---- JSON ----

std::string ScopeKindName(Scope::Kind k) {
  switch (k) {
    case Scope::Kind::kThread:
      return "thread";
    case Scope::Kind::kProcess:
      return "process";
    case Scope::Kind::kCpu:
      return "cpu";
    case Scope::Kind::kAllCpus:
      return "all-cpus";
  }
  return "?";
}

json ScopeJson(const Scope& s) {
  return json{{"kind", ScopeKindName(s.kind)}, {"pid", s.pid}, {"tid", s.tid}, {"cpu", s.cpu}};
}

json IdsJson(const std::vector<RequestId>& ids) {
  json a = json::array();
  for (const RequestId id : ids) {
    a.push_back(id.value);
  }
  return a;
}

json ChunkJson(const Chunk& c) {
  return json{{"addr", c.addr.value}, {"len", c.len}};
}

json RequestJson(const RequestView& r) {
  json chunks = json::array();
  for (const Chunk& c : r.chunks) {
    chunks.push_back(ChunkJson(c));
  }
  return json{
      {"id", r.id.value},
      {"client", r.client.value},
      {"client_kind", Own(ClientKindName(r.client_kind))},
      {"addr", r.request.addr.value},
      {"len", r.request.len},
      {"kind", Own(DrKindName(r.request.kind))},
      {"scope", ScopeJson(r.request.scope)},
      {"priority", r.request.priority},
      {"policy", Own(ShortagePolicyName(r.request.policy))},
      {"label", r.request.label},
      {"state", Own(RequestStateName(r.state))},
      {"armed", r.armed},
      {"chunks", chunks},
      {"slots", r.slots},
      {"exact", r.exact},
      {"bytes_filtered", r.bytes_filtered},
      {"shared", r.shared},
      {"filter_reads", r.filter_reads},
      {"time_enabled_ns", absl::ToInt64Nanoseconds(r.time_enabled)},
      {"time_armed_ns", absl::ToInt64Nanoseconds(r.time_armed)},
      {"reason", r.reason},
  };
}

json SnapshotJson(const AllocatorSnapshot& snap) {
  json scopes = json::array();
  for (const ScopeView& s : snap.scopes) {
    json slots = json::array();
    for (const SlotView& v : s.slots) {
      slots.push_back(json{{"state", Own(SlotStateName(v.state))},
                           {"addr", v.chunk.addr.value},
                           {"len", v.chunk.len},
                           {"kind", Own(DrKindName(v.kind))},
                           {"holders", IdsJson(v.holders)},
                           {"displaced", IdsJson(v.displaced)},
                           {"coverage", v.coverage}});
    }
    scopes.push_back(json{{"scope", ScopeJson(s.scope)},
                          {"slots", slots},
                          {"external", s.external},
                          {"free", s.free}});
  }
  json requests = json::array();
  for (const RequestView& r : snap.requests) {
    requests.push_back(RequestJson(r));
  }
  return json{{"scopes", scopes}, {"requests", requests}};
}

// Strict readers: each names the field it rejects.
class Reader {
 public:
  explicit Reader(std::string where) : where_(std::move(where)) {}

  absl::StatusOr<const json*> Field(const json& obj, const char* name) const {
    if (!obj.is_object()) {
      return Bad("is not an object");
    }
    auto it = obj.find(name);
    if (it == obj.end()) {
      return Bad(absl::StrCat("has no \"", name, "\""));
    }
    return &*it;
  }
  absl::StatusOr<uint64_t> U64(const json& obj, const char* name) const {
    KW_ASSIGN_OR_RETURN(const json* v, Field(obj, name));
    if (!v->is_number_unsigned()) {
      return Bad(absl::StrCat("\"", name, "\" is not an unsigned integer"));
    }
    return v->get<uint64_t>();
  }
  absl::StatusOr<int64_t> I64(const json& obj, const char* name, int64_t lo, int64_t hi) const {
    KW_ASSIGN_OR_RETURN(const json* v, Field(obj, name));
    if (!v->is_number_integer()) {
      return Bad(absl::StrCat("\"", name, "\" is not an integer"));
    }
    int64_t x = 0;
    if (v->is_number_unsigned()) {
      const uint64_t u = v->get<uint64_t>();
      if (u > static_cast<uint64_t>(hi)) {
        return Bad(absl::StrCat("\"", name, "\" is out of range"));
      }
      x = static_cast<int64_t>(u);
    } else {
      x = v->get<int64_t>();
    }
    if (x < lo || x > hi) {
      return Bad(absl::StrCat("\"", name, "\" is out of range"));
    }
    return x;
  }
  absl::StatusOr<bool> Bool(const json& obj, const char* name) const {
    KW_ASSIGN_OR_RETURN(const json* v, Field(obj, name));
    if (!v->is_boolean()) {
      return Bad(absl::StrCat("\"", name, "\" is not a boolean"));
    }
    return v->get<bool>();
  }
  absl::StatusOr<std::string> Str(const json& obj, const char* name) const {
    KW_ASSIGN_OR_RETURN(const json* v, Field(obj, name));
    if (!v->is_string()) {
      return Bad(absl::StrCat("\"", name, "\" is not a string"));
    }
    return v->get<std::string>();
  }
  absl::StatusOr<const json*> Array(const json& obj, const char* name, size_t max) const {
    KW_ASSIGN_OR_RETURN(const json* v, Field(obj, name));
    if (!v->is_array()) {
      return Bad(absl::StrCat("\"", name, "\" is not an array"));
    }
    if (v->size() > max) {
      return Bad(absl::StrCat("\"", name, "\" has more than ", max, " entries"));
    }
    return v;
  }
  // One of `names` (index into it).
  template <typename Enum, size_t N>
  absl::StatusOr<Enum> Named(const json& obj, const char* name,
                             const std::array<std::pair<Enum, absl::string_view>, N>& names) const {
    KW_ASSIGN_OR_RETURN(const std::string s, Str(obj, name));
    for (const auto& [value, text] : names) {
      if (s == text) {
        return value;
      }
    }
    return Bad(absl::StrCat("\"", name, "\" has the unknown value \"", s.substr(0, 40), "\""));
  }

  absl::Status Bad(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(where_, " ", what));
  }
  Reader In(absl::string_view sub) const { return Reader(absl::StrCat(where_, ".", sub)); }

 private:
  std::string where_;
};

template <typename Enum, typename F, size_t... I>
auto NameTable(F name, std::array<Enum, sizeof...(I)> values,
               std::index_sequence<I...> /*unused*/) {
  return std::array<std::pair<Enum, absl::string_view>, sizeof...(I)>{
      std::pair<Enum, absl::string_view>{values[I], name(values[I])}...};
}

template <typename Enum, size_t N, typename F>
auto Names(F name, std::array<Enum, N> values) {
  return NameTable<Enum>(name, values, std::make_index_sequence<N>{});
}

const auto& KindNames() {
  static const auto kNames =
      Names<DrKind, 3>(DrKindName, {DrKind::kExec, DrKind::kWrite, DrKind::kReadWrite});
  return kNames;
}

absl::StatusOr<Scope> ScopeFrom(const Reader& r, const json& j) {
  using K = Scope::Kind;
  static const std::array<std::pair<K, absl::string_view>, 4> kScopeNames = {
      {{K::kThread, "thread"},
       {K::kProcess, "process"},
       {K::kCpu, "cpu"},
       {K::kAllCpus, "all-cpus"}}};
  Scope s;
  KW_ASSIGN_OR_RETURN(s.kind, r.Named(j, "kind", kScopeNames));
  KW_ASSIGN_OR_RETURN(const int64_t pid, r.I64(j, "pid", 0, INT32_MAX));
  KW_ASSIGN_OR_RETURN(const int64_t tid, r.I64(j, "tid", 0, INT32_MAX));
  KW_ASSIGN_OR_RETURN(const int64_t cpu, r.I64(j, "cpu", 0, 1 << 20));
  s.pid = static_cast<pid_t>(pid);
  s.tid = static_cast<pid_t>(tid);
  s.cpu = static_cast<int>(cpu);
  const bool ok = (s.kind == K::kThread && s.pid > 0 && s.tid > 0 && s.cpu == 0) ||
                  (s.kind == K::kProcess && s.pid > 0 && s.tid == 0 && s.cpu == 0) ||
                  (s.kind == K::kCpu && s.pid == 0 && s.tid == 0) ||
                  (s.kind == K::kAllCpus && s.pid == 0 && s.tid == 0 && s.cpu == 0);
  if (!ok) {
    return r.Bad("is not a valid scope");
  }
  return s;
}

absl::StatusOr<std::vector<RequestId>> IdsFrom(const Reader& r, const json& j, const char* name) {
  KW_ASSIGN_OR_RETURN(const json* a, r.Array(j, name, kMaxIds));
  std::vector<RequestId> ids;
  for (const json& v : *a) {
    if (!v.is_number_unsigned()) {
      return r.Bad(absl::StrCat("\"", name, "\" holds a non-id"));
    }
    ids.push_back(RequestId{v.get<uint64_t>()});
  }
  return ids;
}

absl::StatusOr<Chunk> ChunkFrom(const Reader& r, const json& j, bool may_be_empty) {
  Chunk c;
  KW_ASSIGN_OR_RETURN(c.addr.value, r.U64(j, "addr"));
  KW_ASSIGN_OR_RETURN(c.len, r.U64(j, "len"));
  const bool empty = c.len == 0 && c.addr.value == 0;
  const bool valid =
      (c.len == 1 || c.len == 2 || c.len == 4 || c.len == 8) && c.addr.value % c.len == 0;
  if (!(valid || (may_be_empty && empty))) {
    return r.Bad("is not an aligned 1, 2, 4 or 8-byte chunk");
  }
  return c;
}

absl::StatusOr<SlotView> SlotFrom(const Reader& r, const json& j) {
  using S = SlotState;
  static const auto kStates = Names<S, 5>(
      SlotStateName, {S::kFree, S::kArmed, S::kMultiplexed, S::kPreempted, S::kExternal});
  SlotView v;
  KW_ASSIGN_OR_RETURN(v.state, r.Named(j, "state", kStates));
  const bool held = v.state == S::kArmed || v.state == S::kMultiplexed || v.state == S::kPreempted;
  KW_ASSIGN_OR_RETURN(v.chunk, ChunkFrom(r, j, /*may_be_empty=*/!held));
  KW_ASSIGN_OR_RETURN(v.kind, r.Named(j, "kind", KindNames()));
  KW_ASSIGN_OR_RETURN(v.holders, IdsFrom(r, j, "holders"));
  KW_ASSIGN_OR_RETURN(v.displaced, IdsFrom(r, j, "displaced"));
  KW_ASSIGN_OR_RETURN(const json* cov, r.Field(j, "coverage"));
  if (!cov->is_number() || !std::isfinite(cov->get<double>()) || cov->get<double>() < 0 ||
      cov->get<double>() > 1) {
    return r.Bad("\"coverage\" is not a number from 0 to 1");
  }
  v.coverage = cov->get<double>();
  if (held && v.holders.empty()) {
    return r.Bad("is held by no request");
  }
  return v;
}

absl::StatusOr<RequestView> RequestFrom(const Reader& r, const json& j) {
  using C = ClientKind;
  using P = ShortagePolicy;
  using RS = RequestState;
  static const auto kClients =
      Names<C, 3>(ClientKindName, {C::kDebugger, C::kExecProbe, C::kWatchpoint});
  static const auto kPolicies = Names<P, 4>(
      ShortagePolicyName, {P::kFail, P::kPreemptLower, P::kMultiplex, P::kFallbackPages});
  static const auto kStates = Names<RS, 5>(
      RequestStateName,
      {RS::kHardware, RS::kMultiplexed, RS::kPreempted, RS::kFallbackPages, RS::kFailed});
  RequestView v;
  KW_ASSIGN_OR_RETURN(v.id.value, r.U64(j, "id"));
  KW_ASSIGN_OR_RETURN(v.client.value, r.U64(j, "client"));
  KW_ASSIGN_OR_RETURN(v.client_kind, r.Named(j, "client_kind", kClients));
  KW_ASSIGN_OR_RETURN(v.request.addr.value, r.U64(j, "addr"));
  KW_ASSIGN_OR_RETURN(v.request.len, r.U64(j, "len"));
  if (v.request.len == 0 || v.request.len > kMaxRequestLen) {
    return r.Bad("\"len\" is out of range");
  }
  KW_ASSIGN_OR_RETURN(v.request.kind, r.Named(j, "kind", KindNames()));
  KW_ASSIGN_OR_RETURN(const json* scope, r.Field(j, "scope"));
  KW_ASSIGN_OR_RETURN(v.request.scope, ScopeFrom(r.In("scope"), *scope));
  KW_ASSIGN_OR_RETURN(const int64_t prio, r.I64(j, "priority", INT32_MIN, INT32_MAX));
  v.request.priority = static_cast<int>(prio);
  KW_ASSIGN_OR_RETURN(v.request.policy, r.Named(j, "policy", kPolicies));
  KW_ASSIGN_OR_RETURN(v.request.label, r.Str(j, "label"));
  KW_ASSIGN_OR_RETURN(v.state, r.Named(j, "state", kStates));
  KW_ASSIGN_OR_RETURN(v.armed, r.Bool(j, "armed"));
  KW_ASSIGN_OR_RETURN(const json* chunks, r.Array(j, "chunks", kNumDebugRegisters));
  for (const json& c : *chunks) {
    KW_ASSIGN_OR_RETURN(Chunk chunk, ChunkFrom(r.In("chunks"), c, false));
    v.chunks.push_back(chunk);
  }
  KW_ASSIGN_OR_RETURN(const json* slots, r.Array(j, "slots", kNumDebugRegisters));
  for (const json& s : *slots) {
    if (!s.is_number_integer() || s.get<int64_t>() < 0 || s.get<int64_t>() >= kNumDebugRegisters) {
      return r.Bad("\"slots\" holds a slot other than 0..3");
    }
    v.slots.push_back(s.get<int>());
  }
  if (v.slots.size() != v.chunks.size()) {
    return r.Bad(R"(has a different number of "slots" and "chunks")");
  }
  KW_ASSIGN_OR_RETURN(v.exact, r.Bool(j, "exact"));
  KW_ASSIGN_OR_RETURN(v.bytes_filtered, r.U64(j, "bytes_filtered"));
  KW_ASSIGN_OR_RETURN(v.shared, r.Bool(j, "shared"));
  KW_ASSIGN_OR_RETURN(v.filter_reads, r.Bool(j, "filter_reads"));
  KW_ASSIGN_OR_RETURN(const int64_t enabled, r.I64(j, "time_enabled_ns", 0, INT64_MAX));
  KW_ASSIGN_OR_RETURN(const int64_t armed, r.I64(j, "time_armed_ns", 0, INT64_MAX));
  if (armed > enabled) {
    return r.Bad("was armed longer than enabled");
  }
  v.time_enabled = absl::Nanoseconds(enabled);
  v.time_armed = absl::Nanoseconds(armed);
  KW_ASSIGN_OR_RETURN(v.reason, r.Str(j, "reason"));
  return v;
}

absl::StatusOr<AllocatorSnapshot> SnapshotFrom(const Reader& r, const json& j) {
  AllocatorSnapshot snap;
  KW_ASSIGN_OR_RETURN(const json* scopes, r.Array(j, "scopes", kMaxScopes));
  for (size_t i = 0; i < scopes->size(); ++i) {
    const Reader rs = r.In(absl::StrCat("scopes[", i, "]"));
    const json& s = (*scopes)[i];
    ScopeView view;
    KW_ASSIGN_OR_RETURN(const json* scope, rs.Field(s, "scope"));
    KW_ASSIGN_OR_RETURN(view.scope, ScopeFrom(rs.In("scope"), *scope));
    KW_ASSIGN_OR_RETURN(const json* slots, rs.Array(s, "slots", kNumDebugRegisters));
    if (slots->size() != kNumDebugRegisters) {
      return rs.Bad("does not have 4 slots");
    }
    for (int k = 0; k < kNumDebugRegisters; ++k) {
      KW_ASSIGN_OR_RETURN(view.slots[k], SlotFrom(rs.In(absl::StrCat("slots[", k, "]")),
                                                  (*slots)[static_cast<size_t>(k)]));
    }
    KW_ASSIGN_OR_RETURN(const int64_t external, rs.I64(s, "external", 0, 4));
    KW_ASSIGN_OR_RETURN(const int64_t free, rs.I64(s, "free", 0, 4));
    view.external = static_cast<int>(external);
    view.free = static_cast<int>(free);
    snap.scopes.push_back(std::move(view));
  }
  KW_ASSIGN_OR_RETURN(const json* requests, r.Array(j, "requests", kMaxRequests));
  for (size_t i = 0; i < requests->size(); ++i) {
    KW_ASSIGN_OR_RETURN(RequestView v,
                        RequestFrom(r.In(absl::StrCat("requests[", i, "]")), (*requests)[i]));
    snap.requests.push_back(std::move(v));
  }
  return snap;
}

// Reads a registry file that must be a regular file owned by us, at most the size bound.
absl::StatusOr<std::string> ReadBounded(int dir_fd, const std::string& name) {
  core::UniqueFd fd(
      ::openat(dir_fd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY));
  if (!fd.valid()) {
    const int err = errno;
    if (err == ELOOP) {
      return absl::FailedPreconditionError("is a symlink");
    }
    return core::SyscallError(err, "open");
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    const int err = errno;
    return core::SyscallError(err, "fstat");
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError("is not a regular file");
  }
  if (st.st_uid != ::geteuid()) {
    return absl::FailedPreconditionError(absl::StrCat("belongs to uid ", st.st_uid));
  }
  if (st.st_size > kMaxRegistryFileBytes) {
    return absl::FailedPreconditionError(
        absl::StrCat("is larger than ", kMaxRegistryFileBytes, " bytes"));
  }
  std::string text;
  text.resize(static_cast<size_t>(kMaxRegistryFileBytes) + 1);
  size_t got = 0;
  while (got < text.size()) {
    const ssize_t n = ::read(fd.get(), text.data() + got, text.size() - got);
    if (n < 0) {
      const int err = errno;
      if (err == EINTR) {
        continue;
      }
      return core::SyscallError(err, "read");
    }
    if (n == 0) {
      break;
    }
    got += static_cast<size_t>(n);
  }
  if (got > static_cast<size_t>(kMaxRegistryFileBytes)) {
    return absl::FailedPreconditionError(
        absl::StrCat("is larger than ", kMaxRegistryFileBytes, " bytes"));
  }
  text.resize(got);
  return text;
}

bool Alive(pid_t pid, uint64_t start_ticks) {
  const std::optional<uint64_t> now = StartTicks(pid);
  return now.has_value() && *now == start_ticks;
}

}  // namespace

std::string SlotRegistryDir() {
  // NOLINTNEXTLINE(concurrency-mt-unsafe): kwatch never calls setenv
  if (const char* dir = std::getenv("KWATCH_RUN_DIR"); dir != nullptr && *dir != '\0') {
    return dir;
  }
  if (::access("/run", W_OK) == 0) {
    return "/run/kwatch";
  }
  // NOLINTNEXTLINE(concurrency-mt-unsafe): kwatch never calls setenv
  if (const char* xdg = std::getenv("XDG_RUNTIME_DIR"); xdg != nullptr && xdg[0] == '/') {
    return absl::StrCat(xdg, "/kwatch");
  }
  return absl::StrCat("/tmp/kwatch-", ::geteuid());
}

std::string PublishedSlotsToJson(const PublishedSlots& p, uint64_t kwatch_start_ticks) {
  const json j = {{"format", "kwatch-slots"},   {"version", kFormatVersion},
                  {"kwatch_pid", p.kwatch_pid}, {"kwatch_start_ticks", kwatch_start_ticks},
                  {"target", p.target},         {"command_line", p.command_line},
                  {"updated_ns", p.updated_ns}, {"snapshot", SnapshotJson(p.snapshot)}};
  // Replace invalid UTF-8 in labels and command lines instead of throwing.
  return j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
}

absl::StatusOr<PublishedSlots> PublishedSlotsFromJson(absl::string_view text,
                                                      uint64_t* kwatch_start_ticks) {
  if (text.size() > static_cast<size_t>(kMaxRegistryFileBytes)) {
    return absl::InvalidArgumentError("larger than the size bound");
  }
  const json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return absl::InvalidArgumentError("not JSON");
  }
  const Reader r("file");
  try {
    KW_ASSIGN_OR_RETURN(const std::string format, r.Str(j, "format"));
    KW_ASSIGN_OR_RETURN(const int64_t version, r.I64(j, "version", 0, INT32_MAX));
    if (format != "kwatch-slots" || version != kFormatVersion) {
      return absl::InvalidArgumentError(
          absl::StrCat("not a kwatch-slots file of version ", kFormatVersion));
    }
    PublishedSlots p;
    KW_ASSIGN_OR_RETURN(const int64_t kw, r.I64(j, "kwatch_pid", 1, INT32_MAX));
    KW_ASSIGN_OR_RETURN(const int64_t target, r.I64(j, "target", 0, INT32_MAX));
    p.kwatch_pid = static_cast<pid_t>(kw);
    p.target = static_cast<pid_t>(target);
    KW_ASSIGN_OR_RETURN(const uint64_t ticks, r.U64(j, "kwatch_start_ticks"));
    if (kwatch_start_ticks != nullptr) {
      *kwatch_start_ticks = ticks;
    }
    KW_ASSIGN_OR_RETURN(p.command_line, r.Str(j, "command_line"));
    KW_ASSIGN_OR_RETURN(p.updated_ns, r.U64(j, "updated_ns"));
    KW_ASSIGN_OR_RETURN(const json* snap, r.Field(j, "snapshot"));
    KW_ASSIGN_OR_RETURN(p.snapshot, SnapshotFrom(r.In("snapshot"), *snap));
    return p;
  } catch (const json::exception& e) {  // a check above missed a case: still just garbage
    return absl::InvalidArgumentError(absl::StrCat("malformed: ", e.what()));
  }
}

absl::Status PublishSlots(pid_t target, const AllocatorSnapshot& snapshot,
                          absl::string_view command_line) {
  const std::string dir = SlotRegistryDir();
  KW_RETURN_IF_ERROR(EnsureDir(dir));
  const pid_t self = ::getpid();
  const std::optional<uint64_t> ticks = StartTicks(self);
  if (!ticks.has_value()) {
    return absl::InternalError("cannot read kwatch's own start time from /proc/self/stat");
  }
  PublishedSlots p;
  p.kwatch_pid = self;
  p.target = target;
  p.command_line = Own(command_line);
  p.updated_ns = static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));
  p.snapshot = snapshot;
  const std::string text = PublishedSlotsToJson(p, *ticks);

  static std::atomic<uint64_t> counter{0};
  const std::string final_path = absl::StrCat(dir, "/", FileName(self));
  std::string tmp;
  core::UniqueFd fd;
  for (int attempt = 0; attempt < 2 && !fd.valid(); ++attempt) {
    tmp = absl::StrCat(dir, "/.kwatch-", self, ".", counter.fetch_add(1), ".tmp");
    fd.Reset(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!fd.valid()) {
      const int err = errno;
      if (err != EEXIST || attempt == 1) {
        return core::SyscallError(err, absl::StrCat("open(", tmp, ", O_CREAT|O_EXCL)"));
      }
      // A leftover of an earlier process with our pid (we own the directory): replace it.
      ::unlink(tmp.c_str());
    }
  }
  absl::Cleanup remove_tmp = [&tmp] { ::unlink(tmp.c_str()); };
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd.get(), text.data() + done, text.size() - done);
    if (n < 0) {
      const int err = errno;
      if (err == EINTR) {
        continue;
      }
      return core::SyscallError(err, absl::StrCat("write(", tmp, ")"));
    }
    done += static_cast<size_t>(n);
  }
  fd.Reset();
  if (::rename(tmp.c_str(), final_path.c_str()) != 0) {
    const int err = errno;
    return core::SyscallError(err, absl::StrCat("rename(", tmp, ", ", final_path, ")"));
  }
  std::move(remove_tmp).Cancel();
  absl::MutexLock lock(&g_mu);
  if (!g_published_path.empty() && g_published_path != final_path) {
    ::unlink(g_published_path.c_str());  // KWATCH_RUN_DIR changed in between (tests)
  }
  g_published_path = final_path;
  return absl::OkStatus();
}

void UnpublishSlots() {
  absl::MutexLock lock(&g_mu);
  if (!g_published_path.empty()) {
    ::unlink(g_published_path.c_str());
    g_published_path.clear();
  }
}

absl::StatusOr<std::vector<PublishedSlots>> ReadPublishedSlots(pid_t target,
                                                               std::vector<std::string>* notes) {
  const auto note = [notes](std::string text) {
    if (notes != nullptr) {
      notes->push_back(std::move(text));
    }
  };
  const std::string dir = SlotRegistryDir();
  KW_ASSIGN_OR_RETURN(const bool exists, CheckDir(dir));
  if (!exists) {
    return std::vector<PublishedSlots>{};
  }
  core::UniqueFd dir_fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!dir_fd.valid()) {
    const int err = errno;
    return core::SyscallError(err, absl::StrCat("open(", dir, ")"));
  }
  const int list_fd = ::dup(dir_fd.get());
  if (list_fd < 0) {
    const int err = errno;
    return core::SyscallError(err, "dup");
  }
  DIR* d = ::fdopendir(list_fd);
  if (d == nullptr) {
    const int err = errno;
    ::close(list_fd);
    return core::SyscallError(err, absl::StrCat("fdopendir(", dir, ")"));
  }
  absl::Cleanup close_dir = [d] { ::closedir(d); };
  std::map<pid_t, PublishedSlots> found;
  while (const dirent* e = ::readdir(d)) {  // NOLINT(concurrency-mt-unsafe): own DIR*
    const std::string name = e->d_name;
    absl::string_view digits = name;
    pid_t name_pid = 0;
    if (!absl::ConsumePrefix(&digits, "kwatch-") || !absl::ConsumeSuffix(&digits, ".json") ||
        !absl::SimpleAtoi(digits, &name_pid) || name_pid <= 0) {
      continue;  // temporary files, and whatever else lives there
    }
    const std::string path = absl::StrCat(dir, "/", name);
    absl::StatusOr<std::string> text = ReadBounded(dir_fd.get(), name);
    if (!text.ok()) {
      note(absl::StrCat("ignoring ", path, ": ", text.status().message()));
      continue;
    }
    uint64_t ticks = 0;
    absl::StatusOr<PublishedSlots> p = PublishedSlotsFromJson(*text, &ticks);
    if (!p.ok()) {
      note(absl::StrCat("ignoring ", path, ": ", p.status().message()));
      continue;
    }
    if (p->kwatch_pid != name_pid) {
      note(absl::StrCat("ignoring ", path, ": it names kwatch pid ", p->kwatch_pid));
      continue;
    }
    if (!Alive(p->kwatch_pid, ticks)) {
      // Left behind by a kwatch that was killed: remove it (best effort).
      ::unlinkat(dir_fd.get(), name.c_str(), 0);
      continue;
    }
    if (target != 0 && p->target != target) {
      continue;
    }
    const pid_t kwatch_pid = p->kwatch_pid;
    found.emplace(kwatch_pid, *std::move(p));
  }
  std::vector<PublishedSlots> out;
  out.reserve(found.size());
  for (auto& [pid, p] : found) {
    out.push_back(std::move(p));
  }
  return out;
}

absl::StatusOr<std::vector<PublishedSlots>> ReadPublishedSlots(pid_t target) {
  std::vector<std::string> notes;
  auto out = ReadPublishedSlots(target, &notes);
  for (const std::string& n : notes) {
    std::fprintf(stderr, "kwatch: note: %s\n", n.c_str());
  }
  return out;
}

}  // namespace kwatch::drmgr
