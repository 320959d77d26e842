#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/base/remote_addr.h"
#include "core/symbols/type_layout.h"
#include "watch/profile/site_table.h"

namespace kwatch::watch {
struct Watch;
}  // namespace kwatch::watch

namespace kwatch::watch::profile {

// A watched object, as the profile sees it (plain data).
struct WatchedObject {
  uint32_t id = 0;        // the watch id its events carry (AccessEvent::watch_id)
  std::string expr;       // display name, e.g. "g_stats"; field paths are joined to it
  core::RemoteAddr addr;  // absolute run-time address of its first byte
  uint64_t length = 0;    // bytes
  std::string type_name;  // C spelling, "" if unknown
  // Flattened layout in layout order (core::TypeLayout::fields); only leaves count. Empty (or
  // no leaf): the whole object is one field named `expr`.
  std::vector<core::symbols::FieldLayout> fields;
};

// The object a session watch describes.
WatchedObject ObjectForWatch(const Watch& w);

struct ProfileOptions {
  uint64_t start_ns = 0;                   // CLOCK_MONOTONIC time of time column 0
  uint64_t bucket_ns = 0;                  // time column width; 0 = automatic (TimeBins)
  uint64_t initial_bucket_ns = 1'000'000;  // automatic: the first width
  uint32_t max_buckets = 240;              // columns kept (fixed width: a sliding window)
  uint64_t false_sharing_window_ns = 1'000'000;
  uint64_t false_sharing_min_transfers = 4;  // for a finding (see FindFalseSharing)
  size_t value_history = 256;                // values kept per field
  uint32_t max_sites_per_field = 32;         // exact site counts per field, then "other"
  uint32_t max_sites_per_object = 256;       // ... per object
  uint32_t max_sites_per_line_thread = 8;    // ... per (cache line, writing thread)
  // Per object, per-byte counts and cache lines cover only its first max_tracked_bytes bytes,
  // and all objects together at most max_tracked_total bytes (in object order: later objects
  // get what is left); field counts cover everything.
  uint64_t max_tracked_bytes = uint64_t{64} * 1024;
  uint64_t max_tracked_total = uint64_t{1024} * 1024;
  // Fields placed in cache lines (a field counts once per line it spans), all lines together;
  // fields beyond are left out of the lines (and of false sharing), in field order. Real layouts
  // stay far below (leaves do not overlap, but for unions).
  size_t max_line_members = size_t{1} << 20;
};

// One leaf field of a watched object.
struct FieldInfo {
  uint32_t object = 0;    // index into StorageProfile::objects()
  std::string path;       // expr + layout path: "g_stats.hits", "g_cache.lines[3].tag"
  std::string type_name;  // C spelling
  uint64_t offset = 0;    // bytes from the object's start (bitfields: of the storage unit)
  uint64_t size = 0;      // bytes (bitfields: the storage unit)
  uint32_t bit_offset = 0;
  uint32_t bit_size = 0;  // 0 unless a bitfield
  // Effective bytes [begin, end) from the object's start: the bytes holding the field's bits.
  uint64_t begin = 0;
  uint64_t end = 0;
};

struct ObjectStats {
  RwCounts total;             // read and write events of this watch
  uint64_t execs = 0;         // execute events (counted only here)
  uint64_t unattributed = 0;  // read/write events touching no leaf field (padding, outside)
};

struct ThreadInfo {
  pid_t tid = 0;
  pid_t pid = 0;
  uint64_t first_ns = 0;
  uint64_t last_ns = 0;
  RwCounts total;  // read/write events
  uint64_t execs = 0;
};

}  // namespace kwatch::watch::profile
