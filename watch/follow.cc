#include "watch/follow.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace kwatch::watch {

core::symbols::MemoryReader AnywhereReader() {
  return [](core::RemoteAddr /*addr*/, std::span<uint8_t> out) {
    const uint64_t fake = 0x10000000;  // not NULL, aligned for any type
    std::fill(out.begin(), out.end(), 0);
    std::memcpy(out.data(), &fake, std::min(out.size(), sizeof(fake)));
    return absl::OkStatus();
  };
}

FollowResolution ResolveFollowed(const core::symbols::Symbols& symbols,
                                 const core::symbols::Expr& expr,
                                 const core::symbols::MemoryReader& read,
                                 const core::symbols::ResolvedExpr& shape) {
  // The pointers read so far, for a resolution that stops on the way.
  std::vector<core::symbols::PointerLoad> seen;
  const core::symbols::MemoryReader recording = [&](core::RemoteAddr addr, std::span<uint8_t> out) {
    absl::Status s = read(addr, out);
    if (s.ok()) {
      core::symbols::PointerLoad p;
      p.addr = addr;
      p.size = static_cast<uint32_t>(out.size());
      std::memcpy(&p.value, out.data(), std::min(out.size(), sizeof(p.value)));
      seen.push_back(std::move(p));
    }
    return s;
  };
  FollowResolution r;
  absl::StatusOr<core::symbols::ResolvedExpr> now = symbols.Resolve(expr, recording);
  if (now.ok()) {
    r.pointers = now->pointers;
    r.target = *std::move(now);
    return r;
  }
  r.why = std::string{now.status().message()};
  // Same expression, same types: the k-th pointer read is the shape's k-th.
  for (size_t i = 0; i < seen.size() && i < shape.pointers.size(); ++i) {
    seen[i].display = shape.pointers[i].display;
    r.pointers.push_back(seen[i]);
  }
  return r;
}

std::string FollowPointersText(const FollowedWatch& fw) {
  std::vector<std::string> names;
  for (const core::symbols::PointerLoad& p : fw.pointers) {
    names.push_back(absl::StrCat("'", p.display, "'"));
  }
  return absl::StrJoin(names, ", ");
}

std::string FollowMoveText(const FollowMove& m, const std::string& display,
                           const std::string& site) {
  const std::string cause = absl::StrFormat("(%s written at %s by tid %d)", m.pointer, site, m.tid);
  if (!m.to.has_value()) {
    return absl::StrFormat(
        "%s parked: %s %s; it is armed again when the pointers lead to an "
        "object",
        display, m.why, cause);
  }
  const std::string from = m.from.has_value() ? absl::StrFormat("0x%x", m.from->value) : "parked";
  return absl::StrFormat("%s moved %s -> 0x%x %s", display, from, m.to->value, cause);
}

}  // namespace kwatch::watch
