#pragma once

// --follow: watch expressions that are evaluated again through their pointers whenever one of
// the pointers is written (gdb's plain `watch`), as opposed to kwatch's default location
// watches (gdb's `watch -l`). The pure part: resolving an expression into the object it reaches
// now and the pointers it went through, and the records of each move. The session
// (watch/session_follow.cc) watches the pointers and moves the object's watch.

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/base/remote_addr.h"
#include "core/symbols/expr.h"
#include "core/symbols/symbols.h"
#include "drmgr/allocator_types.h"

namespace kwatch::watch {

// A reader that makes every pointer point somewhere (0x10000000: not NULL, aligned for any
// type), to resolve an expression's shape (its types, members and pointers) before the
// pointers are set.
core::symbols::MemoryReader AnywhereReader();

// Where a --follow expression leads now.
struct FollowResolution {
  // The object reached; nullopt: the watch is parked (a pointer is NULL or unreadable).
  std::optional<core::symbols::ResolvedExpr> target;
  std::string why;  // parked: why ("'g_p' is NULL")
  // The pointers read, in order, up to and including a NULL one (each is watched: the
  // expression leads elsewhere when any of them is written).
  std::vector<core::symbols::PointerLoad> pointers;
};

// Resolves `expr` reading the target through `read`. A resolution that fails on the way
// (a NULL pointer, a pointer to memory that cannot be read) parks the watch; `shape` (the
// expression resolved through AnywhereReader, which shows its static mistakes) names the
// pointers then.
FollowResolution ResolveFollowed(const core::symbols::Symbols& symbols,
                                 const core::symbols::Expr& expr,
                                 const core::symbols::MemoryReader& read,
                                 const core::symbols::ResolvedExpr& shape);

// How one --follow watch follows its pointers (kept by its session).
struct FollowedWatch {
  core::symbols::Expr expr;
  core::symbols::ResolvedExpr shape;  // resolved through AnywhereReader
  // The pointers watched now (those read the last time it was resolved) and their drmgr
  // requests (once armed; parallel to `pointers`).
  std::vector<core::symbols::PointerLoad> pointers;
  std::vector<drmgr::RequestId> requests;
  std::vector<uint32_t> owners;  // the requests' owner ids in the slot backend
  bool parked = false;           // no object now: its data watch is disarmed
  std::string why;               // parked: why
  int moves = 0;
};

// "'g_p'", "'a', 'a->b'": the pointers a followed watch goes through now.
std::string FollowPointersText(const FollowedWatch& fw);

// One change of a --follow watch's object: moved, parked, or armed again.
struct FollowMove {
  uint32_t watch_id = 0;
  uint64_t time_ns = 0;                  // CLOCK_MONOTONIC, when the watch was moved
  std::optional<core::RemoteAddr> from;  // nullopt: it was parked
  std::optional<core::RemoteAddr> to;    // nullopt: it is parked now
  std::string why;                       // parked now: why
  std::string pointer;                   // the pointer whose write moved it ("g_p")
  pid_t tid = 0;                         // the writing thread
  core::RemoteAddr ip;                   // the writing instruction
};

// "g_p->v moved 0x1000 -> 0x2000 (g_p written at SITE by tid 42)", "g_p->v parked: 'g_p' is
// NULL (...)", "g_p->v moved parked -> 0x2000 (...)"; `display` is the watch's, `site` the
// writing instruction as people read it.
std::string FollowMoveText(const FollowMove& m, const std::string& display,
                           const std::string& site);

}  // namespace kwatch::watch
