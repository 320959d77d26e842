// kwatch_agent_init (agent/abi.h): validates the control block kwatch wrote, fills the
// agent's fields, and puts the agent in place: membarrier, signal handlers, hooks, atfork
// (once per process), then the session's watchdog.

#include <sys/auxv.h>
#include <sys/mman.h>
#include <sys/syscall.h>

#include <array>
#include <cerrno>
#include <cstdint>

#include "agent/agent.h"
#include "agent/sys.h"

// The ELF header of this object: its load address.
// NOLINTNEXTLINE(bugprone-reserved-identifier,readability-identifier-naming): the linker's name
extern "C" const char __ehdr_start[] __attribute__((visibility("hidden")));

namespace kwatch::agent {

std::atomic<Session*> g_session{nullptr};
int g_pid;
std::atomic<bool> g_detached{false};
uint64_t g_fsgsbase;

namespace {

constexpr uint32_t kMaxSessions = 16;  // sessions are never freed (a thread may still read one)
std::array<Session, kMaxSessions> g_sessions;
uint32_t g_session_count;
std::atomic<bool> g_in_init{false};
bool g_process_ready;  // handlers, hooks, atfork in place

constexpr uint64_t kHwcap2Fsgsbase = 1U << 1;  // HWCAP2_FSGSBASE

bool PowerOfTwo(uint64_t v) {
  return v != 0 && (v & (v - 1)) == 0;
}

// [offset, offset + count * size) inside the mapping, 64-byte aligned.
bool Fits(uint64_t total, uint64_t offset, uint64_t count, uint64_t size) {
  if (offset % 64 != 0 || offset > total || count > (uint64_t{1} << 32)) {
    return false;
  }
  return count * size <= total - offset;
}

bool Validate(const KwControl& c, uint64_t size, Session& s) {
  if (c.total_size != size || size < sizeof(KwControl)) {
    return false;
  }
  if (c.probe_capacity == 0 || !Fits(size, c.probes_offset, c.probe_capacity, sizeof(KwProbe))) {
    return false;
  }
  if (!PowerOfTwo(c.hash_capacity) ||
      !Fits(size, c.hash_offset, c.hash_capacity, sizeof(KwProbeSlot))) {
    return false;
  }
  if (!Fits(size, c.code_offset, c.code_capacity, sizeof(KwFetchOp))) {
    return false;
  }
  if (c.thread_capacity == 0 ||
      !Fits(size, c.threads_offset, c.thread_capacity, sizeof(KwThread))) {
    return false;
  }
  if (c.ring_count != c.thread_capacity || !PowerOfTwo(c.ring_bytes) || c.ring_bytes < 64 ||
      !Fits(size, c.rings_offset, c.ring_count, sizeof(KwRing) + uint64_t{c.ring_bytes})) {
    return false;
  }
  if (!Fits(size, c.patches_offset, c.patch_capacity, sizeof(KwPatch))) {
    return false;
  }
  if (!Fits(size, c.processes_offset, c.process_capacity, sizeof(KwProcess))) {
    return false;
  }
  if (c.call_watch_capacity > 0 &&
      (!Fits(size, c.call_watches_offset, c.call_watch_capacity, sizeof(KwCallWatch)) ||
       c.call_ring_pages == 0 || (c.call_ring_pages & (c.call_ring_pages - 1)) != 0)) {
    return false;
  }
  if (c.aggs_bytes > 0 && !Fits(size, c.aggs_offset, c.aggs_bytes, 1)) {
    return false;
  }
  auto* base = reinterpret_cast<uint8_t*>(const_cast<KwControl*>(&c));
  s.base = base;
  s.size = size;
  s.ctl = const_cast<KwControl*>(&c);
  s.probes = reinterpret_cast<KwProbe*>(base + c.probes_offset);
  s.slots = reinterpret_cast<KwProbeSlot*>(base + c.hash_offset);
  s.code = reinterpret_cast<KwFetchOp*>(base + c.code_offset);
  s.threads = reinterpret_cast<KwThread*>(base + c.threads_offset);
  s.rings = base + c.rings_offset;
  s.patches = reinterpret_cast<KwPatch*>(base + c.patches_offset);
  s.processes = reinterpret_cast<KwProcess*>(base + c.processes_offset);
  s.aggs = c.aggs_bytes > 0 ? base + c.aggs_offset : nullptr;
  s.aggs_bytes = c.aggs_bytes;
  s.call_watches = c.call_watch_capacity > 0
                       ? reinterpret_cast<KwCallWatch*>(base + c.call_watches_offset)
                       : nullptr;
  s.call_watch_capacity = c.call_watch_capacity;
  s.probe_capacity = c.probe_capacity;
  s.hash_capacity = c.hash_capacity;
  s.hash_shift = 64 - static_cast<uint32_t>(__builtin_ctzll(c.hash_capacity));
  s.code_capacity = c.code_capacity;
  s.thread_capacity = c.thread_capacity;
  s.ring_bytes = c.ring_bytes;
  s.patch_capacity = c.patch_capacity;
  s.process_capacity = c.process_capacity;
  s.ring_stride = sizeof(KwRing) + uint64_t{c.ring_bytes};
  return true;
}

int Fail(KwControl* c, KwInitError error, int err) {
  c->agent_features = 0;
  c->init_error = error;
  return err;
}

int Init(uint64_t shm_addr, uint64_t shm_size) {
  if (shm_addr == 0 || shm_addr % 64 != 0 || shm_size < sizeof(KwControl)) {
    return -EINVAL;
  }
  auto* c = reinterpret_cast<KwControl*>(shm_addr);
  if (c->magic != kKwMagic) {
    return Fail(c, kKwInitBadMagic, -EINVAL);
  }
  if (c->abi_version != kKwAbiVersion) {
    return Fail(c, kKwInitBadVersion, -EPROTO);
  }
  if (Session* prev = CurrentSession();
      prev != nullptr && prev->ctl->state.load(std::memory_order_acquire) != kKwStateRestored) {
    return Fail(c, kKwInitBusy, -EBUSY);
  }
  if (g_session_count == kMaxSessions) {
    return Fail(c, kKwInitBusy, -EBUSY);
  }
  Session& s = g_sessions[g_session_count];
  if (!Validate(*c, shm_size, s)) {
    return Fail(c, kKwInitBadLayout, -EINVAL);
  }
  if (const int r = NoteLifeline(s, static_cast<int>(c->lifeline_fd)); r != 0) {
    return Fail(c, kKwInitLifeline, r);
  }
  // kwatch's rings are not the program's memory: a core dump leaves them out (they can be
  // hundreds of MiB; a dump that writes them delays the exit status kwatch reports). Best
  // effort: an old kernel without MADV_DONTDUMP dumps them.
  (void)Sys(SYS_madvise, static_cast<long>(shm_addr), static_cast<long>(shm_size), MADV_DONTDUMP);
  g_pid = static_cast<int>(SysGetpid());
  g_fsgsbase = getauxval(AT_HWCAP2) & kHwcap2Fsgsbase;
  if (!g_process_ready) {
    if (const int r = RegisterSyncCore(); r != 0) {
      return Fail(c, kKwInitMembarrier, r);
    }
    if (const int r = InstallSignalHandlers(); r != 0) {
      return Fail(c, kKwInitSignals, r);
    }
    if (const int r = InstallSignalHooks(); r != 0) {
      return Fail(c, kKwInitHooks, r);
    }
    if (const int r = InstallAtfork(); r != 0) {
      return Fail(c, kKwInitAtfork, r);
    }
    g_process_ready = true;
  }
  c->agent_base = reinterpret_cast<uint64_t>(&__ehdr_start);
  c->jump_entry = reinterpret_cast<uint64_t>(&kwatch_agent_jump_hit);
  c->return_trampoline = reinterpret_cast<uint64_t>(&kw_return_trampoline);
  c->watchdog_tid = 0;
  if (const int r = StartWatchdog(s, /*publish_tid=*/true); r != 0) {
    return Fail(c, kKwInitWatchdog, r);
  }
  ++g_session_count;
  g_session.store(&s, std::memory_order_release);
  c->init_error = kKwInitOk;
  c->agent_features = kKwFeatureInt3 | kKwFeatureJump | kKwFeatureReturn | kKwFeatureWatchdog |
                      kKwFeatureAtfork | kKwFeatureSignalHooks;
  return 0;
}

}  // namespace

extern "C" KW_EXPORT int kwatch_agent_init(uint64_t shm_addr, uint64_t shm_size) {
  bool expected = false;
  if (!g_in_init.compare_exchange_strong(expected, true, std::memory_order_acquire)) {
    return -EBUSY;
  }
  const int r = Init(shm_addr, shm_size);
  g_in_init.store(false, std::memory_order_release);
  return r;
}

}  // namespace kwatch::agent
