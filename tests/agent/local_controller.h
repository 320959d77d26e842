#pragma once

// An in-process stand-in for kwatch's controller (watch/agent), for the agent's tests and
// benchmarks: the program that loads libkwatch-agent.so builds the shared memory itself,
// writes probes, fetch programs and patches into its own code as kwatch would into a
// target's (INT3 first for multi-byte patches), and drains the rings. No ptrace: the caller
// patches only code no other thread runs yet, as kwatch does with every thread stopped.
//
// The memfd is mapped twice at different addresses: the controller's view and the agent's,
// so that anything addressed by pointer instead of offset in the ABI shows up in tests.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "agent/abi.h"

namespace kwatch::agent::testing {

struct Layout {
  uint32_t probes = 64;
  uint32_t hash = 128;  // power of two
  uint32_t code = 4096;
  uint32_t threads = 16;
  uint32_t ring_bytes = 1 << 16;  // power of two
  uint32_t patches = 64;
  uint32_t processes = 16;  // KwProcess entries (fork children followed)
  uint32_t flags = 0;       // KwControlFlags
  // Per-call watches (abi.h "Per-call watches"): KwCallWatch entries and their breakpoints.
  uint32_t call_watches = 0;
  uint32_t call_ring_pages = 8;
  uint64_t call_sample_type = 0;
  uint64_t call_sample_regs = 0;
};

// A probe as kwatch would describe it (resume fields as in KwProbe).
struct ProbeSpec {
  uint64_t addr = 0;
  uint32_t id = 0;
  uint32_t flags = kKwProbeUsed | kKwProbeEnabled;
  uint32_t resume = kKwResumeXol;
  uint32_t insn_len = 0;
  uint64_t xol_addr = 0;
  uint64_t target = 0;
  uint32_t cond = 0;
  uint32_t ret_imm = 0;
  uint32_t ind_base = 0;
  uint32_t ind_index = 0;
  int64_t ind_disp = 0;
  uint32_t ind_scale = 1;
  uint32_t ind_flags = 0;
  uint32_t maxactive = 0;
  uint32_t record_bytes = 256;
  uint32_t call_watch = 0;  // KwProbe::call_watch
  std::vector<KwFetchOp> fetch;
  std::vector<KwFetchOp> filter;  // a filter program (abi.h "Filter programs"), or none
  bool in_hash = true;            // the head of its address (chained probes: only the first)
};

// A decoded record.
struct Arg {
  uint16_t arg = 0;
  uint16_t status = 0;
  std::vector<uint8_t> bytes;
  uint64_t U64() const;
};
struct Hit {
  KwRecord rec{};
  std::vector<Arg> args;         // hit and return records
  std::vector<uint8_t> payload;  // every record: the bytes after the KwRecord
};

class LocalController {
 public:
  // Creates and maps the shared memory and writes the control block (state Init).
  static std::unique_ptr<LocalController> Create(const Layout& layout);
  ~LocalController();
  LocalController(const LocalController&) = delete;
  LocalController& operator=(const LocalController&) = delete;

  // dlopen(agent_path) and kwatch_agent_init with the agent's view: its return value (or
  // -1000 when the library or the symbol is missing, with dlerror on stderr).
  int LoadAgent(const std::string& agent_path) const;

  KwControl& ctl() { return *ctl_; }
  KwProbe& probe(uint32_t index);
  KwThread& thread(uint32_t index);
  KwRing& ring(uint32_t index);
  KwProcess& process(uint32_t index);
  KwCallWatch& call_watch(uint32_t index);
  uint64_t agent_view() const { return agent_base_; }
  uint64_t size() const { return size_; }

  // Writes a probe (and its fetch program, and its hash slot): its index. Chain: link
  // `next_of` to it (the probe at the same address it follows).
  uint32_t AddProbe(const ProbeSpec& spec);
  void Chain(uint32_t first, uint32_t then);
  void SetState(KwState state);
  void SetEnabled(uint32_t index, bool enabled);

  // Patches into this process's code, journaled first. INT3: one 0xCC. Jump: jmp rel32 to
  // `to` over `len` bytes (0xCC fill), 0xCC first, tail, first byte.
  void PatchInt3(uint64_t addr, uint32_t probe_index);
  void PatchJump(uint64_t addr, uint32_t len, uint64_t to, uint32_t probe_index);
  // kwatch's normal end: state Stopping, every patch restored in reverse, journal cleared,
  // state Restored, lifeline closed.
  void RestoreAll();
  void CloseLifeline();

  // Reads every ring's new records (after the last drain); returns how many.
  size_t Drain(const std::function<void(const Hit&)>& sink);

  // An executable page within +-2 GiB of `near` (for out-of-line copies): its address.
  static uint64_t MapNear(uint64_t near, size_t size);
  // An out-of-line copy of `len` bytes at `from` (no RIP-relative operand) followed by a jmp
  // back to from + len, written at `slot`: its size.
  static size_t WriteXol(uint64_t slot, uint64_t from, uint32_t len);
  // Writes into this process's code through /proc/self/mem.
  static void WriteCode(uint64_t addr, const void* bytes, size_t n);

 private:
  LocalController() = default;
  uint32_t AddPatch(uint32_t state, uint64_t addr, uint32_t len, const uint8_t* patched,
                    uint32_t probe_index);
  void HashInsert(uint64_t addr, uint32_t index);

  int memfd_ = -1;
  int lifeline_write_ = -1;
  uint8_t* base_ = nullptr;  // the controller's view
  uint64_t agent_base_ = 0;  // the agent's view
  uint64_t size_ = 0;
  KwControl* ctl_ = nullptr;
  uint32_t next_probe_ = 0;
  uint32_t next_code_ = 0;
  std::vector<uint32_t> patch_order_;
};

// Fetch program builders.
KwFetchOp OpBegin(uint16_t arg);
KwFetchOp OpReg(KwReg reg, uint32_t bytes = 8);
KwFetchOp OpStore(uint32_t bytes = 8);
KwFetchOp OpAdd(int64_t imm);
KwFetchOp OpDeref();
KwFetchOp OpDerefSize(uint32_t bytes);  // b bytes, zero-extended
KwFetchOp OpStack(uint32_t bytes);
KwFetchOp OpRead(uint32_t bytes);
KwFetchOp OpReadStr(uint32_t max);
KwFetchOp OpXmm(uint16_t index, uint32_t bytes);
KwFetchOp OpEnd();

}  // namespace kwatch::agent::testing
