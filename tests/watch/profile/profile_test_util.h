#pragma once

#include <cstdint>
#include <optional>

#include "core/base/remote_addr.h"
#include "core/event.h"

namespace kwatch::watch::testing {

// A page-mode style event: the exact bytes [addr, addr+size) were accessed.
inline core::AccessEvent Access(uint64_t time_ns, pid_t tid, uint64_t addr, uint32_t size,
                                core::AccessKind kind, uint64_t ip = 0x401000,
                                uint32_t watch_id = 0) {
  core::AccessEvent ev;
  ev.time_ns = time_ns;
  ev.pid = 100;
  ev.tid = tid;
  ev.watch_id = watch_id;
  ev.trap_ip = core::RemoteAddr{ip + 4};
  ev.ip = core::RemoteAddr{ip};
  ev.addr = core::RemoteAddr{addr};
  ev.len = size;
  ev.access_addr = core::RemoteAddr{addr};
  ev.access_size = size;
  ev.kind = kind;
  return ev;
}

inline core::AccessEvent Write(uint64_t time_ns, pid_t tid, uint64_t addr, uint32_t size,
                               uint64_t ip = 0x401000, uint32_t watch_id = 0) {
  return Access(time_ns, tid, addr, size, core::AccessKind::kWrite, ip, watch_id);
}

inline core::AccessEvent Read(uint64_t time_ns, pid_t tid, uint64_t addr, uint32_t size,
                              uint64_t ip = 0x401000, uint32_t watch_id = 0) {
  return Access(time_ns, tid, addr, size, core::AccessKind::kRead, ip, watch_id);
}

}  // namespace kwatch::watch::testing
