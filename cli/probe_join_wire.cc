#include "cli/probe_join_wire.h"

#include <array>
#include <cstring>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"

namespace kwatch::cli {

namespace {

template <typename T>
void Put(std::string& out, T v) {
  std::array<char, sizeof(T)> b{};
  std::memcpy(b.data(), &v, sizeof(T));  // x86-64 only: little-endian
  out.append(b.data(), b.size());
}

void PutString(std::string& out, absl::string_view s) {
  Put<uint32_t>(out, static_cast<uint32_t>(s.size()));
  out.append(s.data(), s.size());
}

// Reads what Put wrote; false when the payload is short.
class Reader {
 public:
  explicit Reader(absl::string_view in) : in_(in) {}
  template <typename T>
  bool Get(T& v) {
    if (in_.size() < sizeof(T)) {
      return false;
    }
    std::memcpy(&v, in_.data(), sizeof(T));
    in_.remove_prefix(sizeof(T));
    return true;
  }
  bool GetString(std::string& s) {
    uint32_t n = 0;
    if (!Get(n) || in_.size() < n) {
      return false;
    }
    s.assign(in_.data(), n);
    in_.remove_prefix(n);
    return true;
  }
  bool empty() const { return in_.empty(); }

 private:
  absl::string_view in_;
};

constexpr uint32_t kMaxCount = 1 << 20;  // arguments or frames of one hit, at most

}  // namespace

std::string ProbeJoinArmed::text() const {
  std::string s = absl::StrCat("bias ", load_bias, "\n");
  for (const auto& [id, addr] : addrs) {
    absl::StrAppend(&s, "probe ", id, " ", addr, "\n");
  }
  return s;
}

absl::StatusOr<ProbeJoinArmed> ParseProbeJoinArmed(absl::string_view text) {
  ProbeJoinArmed a;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    const std::vector<absl::string_view> f = absl::StrSplit(line, ' ');
    uint32_t id = 0;
    uint64_t v = 0;
    if (f.size() == 2 && f[0] == "bias" && absl::SimpleAtoi(f[1], &v)) {
      a.load_bias = v;
    } else if (f.size() == 3 && f[0] == "probe" && absl::SimpleAtoi(f[1], &id) &&
               absl::SimpleAtoi(f[2], &v)) {
      a.addrs[id] = v;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("malformed armed line '", line, "'"));
    }
  }
  return a;
}

ProbeJoinArmed ArmedOf(const watch::probe::ProbeSet& set, uint64_t load_bias) {
  ProbeJoinArmed a;
  a.load_bias = load_bias;
  for (const watch::probe::ProbeDef& def : set.probes) {
    a.addrs[def.id] = def.point.vaddr.value + load_bias;
  }
  return a;
}

void EncodeHit(const watch::probe::ProbeHit& hit, std::string& out) {
  Put<uint64_t>(out, hit.time_ns);
  Put<int32_t>(out, hit.pid);
  Put<int32_t>(out, hit.tid);
  Put<uint32_t>(out, hit.cpu);
  Put<uint32_t>(out, hit.probe != nullptr ? hit.probe->id : 0);
  Put<uint64_t>(out, hit.ip.value);
  Put<uint64_t>(out, hit.return_address.value);
  Put<uint32_t>(out, static_cast<uint32_t>(hit.args.size()));
  for (const auto& [name, value] : hit.args) {
    PutString(out, name);
    PutString(out, value);
  }
  Put<uint32_t>(out, static_cast<uint32_t>(hit.stack.size()));
  for (const core::RemoteAddr a : hit.stack) {
    Put<uint64_t>(out, a.value);
  }
}

absl::StatusOr<std::vector<watch::probe::ProbeHit>> DecodeHits(absl::string_view payload,
                                                               const watch::probe::ProbeSet& set) {
  std::map<uint32_t, const watch::probe::ProbeDef*> by_id;
  for (const watch::probe::ProbeDef& def : set.probes) {
    by_id[def.id] = &def;
  }
  std::vector<watch::probe::ProbeHit> hits;
  Reader r(payload);
  const auto bad = [] { return absl::InvalidArgumentError("a malformed hit from the session"); };
  while (!r.empty()) {
    watch::probe::ProbeHit h;
    uint32_t id = 0;
    uint32_t nargs = 0;
    uint32_t nstack = 0;
    if (!r.Get(h.time_ns) || !r.Get(h.pid) || !r.Get(h.tid) || !r.Get(h.cpu) || !r.Get(id) ||
        !r.Get(h.ip.value) || !r.Get(h.return_address.value) || !r.Get(nargs) ||
        nargs > kMaxCount) {
      return bad();
    }
    auto it = by_id.find(id);
    if (it == by_id.end()) {
      return absl::InvalidArgumentError(absl::StrCat("a hit of probe id ", id, ", not one of its"));
    }
    h.probe = it->second;
    h.args.resize(nargs);
    for (auto& [name, value] : h.args) {
      if (!r.GetString(name) || !r.GetString(value)) {
        return bad();
      }
    }
    if (!r.Get(nstack) || nstack > kMaxCount) {
      return bad();
    }
    h.stack.resize(nstack);
    for (core::RemoteAddr& a : h.stack) {
      if (!r.Get(a.value)) {
        return bad();
      }
    }
    hits.push_back(std::move(h));
  }
  return hits;
}

std::string ProbeJoinEnd::text() const {
  std::string s;
  for (const auto& [id, e] : stats) {
    absl::StrAppend(&s, "stat ", id, " ", e.misses, " ", e.nmissed, " ", e.abandoned, " ", e.faults,
                    "\n");
  }
  if (exit.has_value()) {
    absl::StrAppend(&s, "exit ", exit->signaled ? 1 : 0, " ", exit->code, " ", exit->signal, " ",
                    exit->core_dumped ? 1 : 0, "\n");
  }
  absl::StrAppend(&s, "spurious ", spurious_traps, "\n");
  if (!stop_reason.empty()) {
    absl::StrAppend(&s, "reason ", absl::StrReplaceAll(stop_reason, {{"\n", " "}}), "\n");
  }
  return s;
}

absl::StatusOr<ProbeJoinEnd> ParseProbeJoinEnd(absl::string_view text) {
  ProbeJoinEnd end;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    const std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(line, absl::MaxSplits(' ', 1));
    const std::vector<absl::string_view> f = absl::StrSplit(kv.second, ' ');
    bool ok = false;
    if (kv.first == "reason") {
      end.stop_reason = std::string{kv.second};
      ok = true;
    } else if (kv.first == "spurious") {
      ok = absl::SimpleAtoi(kv.second, &end.spurious_traps);
    } else if (kv.first == "stat" && f.size() == 5) {
      uint32_t id = 0;
      watch::probe::ProbeEndStats e;
      ok = absl::SimpleAtoi(f[0], &id) && absl::SimpleAtoi(f[1], &e.misses) &&
           absl::SimpleAtoi(f[2], &e.nmissed) && absl::SimpleAtoi(f[3], &e.abandoned) &&
           absl::SimpleAtoi(f[4], &e.faults);
      end.stats[id] = e;
    } else if (kv.first == "exit" && f.size() == 4) {
      core::ptrace::ExitInfo x;
      int signaled = 0;
      int core = 0;
      ok = absl::SimpleAtoi(f[0], &signaled) && absl::SimpleAtoi(f[1], &x.code) &&
           absl::SimpleAtoi(f[2], &x.signal) && absl::SimpleAtoi(f[3], &core);
      x.signaled = signaled != 0;
      x.core_dumped = core != 0;
      end.exit = x;
    }
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat("malformed end line '", line, "'"));
    }
  }
  return end;
}

}  // namespace kwatch::cli
