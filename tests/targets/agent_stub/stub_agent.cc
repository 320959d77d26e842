// A test fixture standing in for libkwatch-agent.so in the controller's tests
// (tests/watch/agent/): a real shared library whose kwatch_agent_init checks the control block
// as the agent does, fills the agent's fields and returns 0. It installs nothing (no signal
// handler, no watchdog, no hook) and takes no hit: it is not an agent. Built without
// sanitizers, exceptions or RTTI, like the agent.
//
// Test knobs: control flags bit 31 makes init fail with -ENOTSUP (the loader's undo);
// stub_inits counts successful inits; stub_close_lifeline() closes the lifeline's read end (the
// agent gone, as kwatch sees it). Built a second time with KWATCH_STUB_UNRESOLVED as
// libkwatch-stub-unresolved.so, which calls a function defined nowhere: dlopen(RTLD_NOW)
// refuses it.
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>

#include "agent/abi.h"

using kwatch::agent::KwControl;

extern "C" {

extern const char __ehdr_start;  // the linker's: this library's ELF header, its load address

__attribute__((visibility("default"))) int stub_inits = 0;

__attribute__((visibility("default"))) void kwatch_agent_jump_hit(uint32_t probe_index,
                                                                  kwatch::agent::KwRegs* regs) {
  (void)probe_index;
  (void)regs;
}

static KwControl* g_control = nullptr;

#ifdef KWATCH_STUB_UNRESOLVED
int kwatch_stub_missing();  // defined nowhere
#endif

__attribute__((visibility("default"))) int stub_close_lifeline() {
  return g_control == nullptr ? -1 : close(static_cast<int>(g_control->lifeline_fd));
}

__attribute__((visibility("default"))) int kwatch_agent_init(uint64_t shm_addr, uint64_t shm_size) {
  auto* c = reinterpret_cast<KwControl*>(shm_addr);
  if (c->magic != kwatch::agent::kKwMagic) {
    return -EINVAL;
  }
  if (c->abi_version != kwatch::agent::kKwAbiVersion) {
    return -EPROTO;
  }
  if (c->total_size != shm_size) {
    return -EINVAL;
  }
  if ((c->flags & (1u << 31)) != 0) {
    return -ENOTSUP;
  }
  const int fd_flags = fcntl(static_cast<int>(c->lifeline_fd), F_GETFD);
  if (fd_flags < 0 || (fd_flags & FD_CLOEXEC) == 0) {
    return -EBADF;
  }
  c->agent_base = reinterpret_cast<uint64_t>(&__ehdr_start);
  c->jump_entry = reinterpret_cast<uint64_t>(&kwatch_agent_jump_hit);
  c->return_trampoline = 0;
  c->watchdog_tid = 0;
  c->agent_features = 0;
  c->init_error = kwatch::agent::kKwInitOk;
  g_control = c;
  ++stub_inits;
#ifdef KWATCH_STUB_UNRESOLVED
  return kwatch_stub_missing();
#endif
  return 0;
}

}  // extern "C"
