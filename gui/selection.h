#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "watch/profile/storage_profile.h"

namespace kwatch::gui {

// What the user looks at: one watched object, a set of its fields, a time range and
// optionally one thread (plain data).
struct Selection {
  uint32_t object = 0;           // index into the profile's objects()
  std::vector<uint32_t> fields;  // global field indices, ascending; empty: all of the object's
  // Nanoseconds after the session start, [from_ns, to_ns); unset: unbounded.
  std::optional<uint64_t> from_ns;
  std::optional<uint64_t> to_ns;
  std::optional<pid_t> tid;  // only this thread

  bool has_time_range() const { return from_ns.has_value() || to_ns.has_value(); }
  // Whether the selection needs its own slice of the recording (a time range or a thread).
  bool needs_slice() const { return has_time_range() || tid.has_value(); }
  bool operator==(const Selection&) const = default;
};

// The selected fields that exist in `p`: `sel.fields`, or all fields of `sel.object`.
std::vector<uint32_t> SelectedFields(const Selection& sel, const watch::profile::StorageProfile& p);

}  // namespace kwatch::gui
