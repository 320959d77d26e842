#include "tests/agent/local_controller.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace kwatch::agent::testing {

namespace {

uint64_t Align64(uint64_t v) {
  return (v + 63) & ~uint64_t{63};
}

[[noreturn]] void Die(const char* what) {
  const int err = errno;
  std::fprintf(stderr, "local controller: %s: %s\n", what,
               std::strerror(err));  // NOLINT(concurrency-mt-unsafe): then abort
  std::abort();
}

KwFetchOp Op(uint16_t op, uint16_t a, uint32_t b, int64_t imm) {
  KwFetchOp o{};
  o.op = op;
  o.a = a;
  o.b = b;
  o.imm = imm;
  return o;
}

}  // namespace

uint64_t Arg::U64() const {
  uint64_t v = 0;
  for (size_t i = 0; i < bytes.size() && i < 8; ++i) {
    v |= uint64_t{bytes[i]} << (8 * i);
  }
  return v;
}

std::unique_ptr<LocalController> LocalController::Create(const Layout& layout) {
  std::unique_ptr<LocalController> c(new LocalController());
  uint64_t off = Align64(sizeof(KwControl));
  const uint64_t probes = off;
  off = Align64(off + uint64_t{layout.probes} * sizeof(KwProbe));
  const uint64_t hash = off;
  off = Align64(off + uint64_t{layout.hash} * sizeof(KwProbeSlot));
  const uint64_t code = off;
  off = Align64(off + uint64_t{layout.code} * sizeof(KwFetchOp));
  const uint64_t threads = off;
  off = Align64(off + uint64_t{layout.threads} * sizeof(KwThread));
  const uint64_t rings = off;
  off = Align64(off + uint64_t{layout.threads} * (sizeof(KwRing) + layout.ring_bytes));
  const uint64_t patches = off;
  off = Align64(off + uint64_t{layout.patches} * sizeof(KwPatch));
  const uint64_t processes = off;
  off = Align64(off + uint64_t{layout.processes} * sizeof(KwProcess));
  const uint64_t call_watches = off;
  off = Align64(off + uint64_t{layout.call_watches} * sizeof(KwCallWatch));
  c->size_ = off;
  c->memfd_ = memfd_create("kwatch-agent-test", MFD_CLOEXEC);
  if (c->memfd_ < 0) {
    Die("memfd_create");
  }
  if (ftruncate(c->memfd_, static_cast<off_t>(c->size_)) != 0) {
    Die("ftruncate");
  }
  void* mine = mmap(nullptr, c->size_, PROT_READ | PROT_WRITE, MAP_SHARED, c->memfd_, 0);
  void* agents = mmap(nullptr, c->size_, PROT_READ | PROT_WRITE, MAP_SHARED, c->memfd_, 0);
  if (mine == MAP_FAILED || agents == MAP_FAILED) {
    Die("mmap");
  }
  c->base_ = static_cast<uint8_t*>(mine);
  c->agent_base_ = reinterpret_cast<uint64_t>(agents);
  c->ctl_ = reinterpret_cast<KwControl*>(c->base_);
  KwControl& k = *c->ctl_;
  k.magic = kKwMagic;
  k.abi_version = kKwAbiVersion;
  k.flags = layout.flags;
  k.total_size = c->size_;
  k.controller_pid = getpid();
  k.target_pid = getpid();
  k.probes_offset = probes;
  k.probe_capacity = layout.probes;
  k.hash_capacity = layout.hash;
  k.hash_offset = hash;
  k.code_offset = code;
  k.code_capacity = layout.code;
  k.thread_capacity = layout.threads;
  k.threads_offset = threads;
  k.rings_offset = rings;
  k.ring_count = layout.threads;
  k.ring_bytes = layout.ring_bytes;
  k.patches_offset = patches;
  k.patch_capacity = layout.patches;
  k.processes_offset = processes;
  k.process_capacity = layout.processes;
  k.call_watches_offset = call_watches;
  k.call_watch_capacity = layout.call_watches;
  k.call_ring_pages = layout.call_ring_pages;
  k.call_sample_type = layout.call_sample_type;
  k.call_sample_regs = layout.call_sample_regs;
  std::array<int, 2> fds{};
  if (pipe2(fds.data(), O_CLOEXEC) != 0) {
    Die("pipe2");
  }
  const int high = fcntl(fds[0], F_DUPFD_CLOEXEC, 1000);
  if (high < 0) {
    Die("fcntl(F_DUPFD_CLOEXEC)");
  }
  close(fds[0]);
  k.lifeline_fd = static_cast<uint32_t>(high);
  c->lifeline_write_ = fds[1];
  return c;
}

LocalController::~LocalController() {
  if (lifeline_write_ >= 0) {
    close(lifeline_write_);
  }
  // The mappings stay: the agent keeps its view (as in a target), and so may records.
  if (memfd_ >= 0) {
    close(memfd_);
  }
}

int LocalController::LoadAgent(const std::string& agent_path) const {
  void* h = dlopen(agent_path.c_str(), RTLD_NOW);
  if (h == nullptr) {
    std::fprintf(stderr, "dlopen: %s\n", dlerror());
    return -1000;
  }
  auto* init = reinterpret_cast<int (*)(uint64_t, uint64_t)>(dlsym(h, "kwatch_agent_init"));
  if (init == nullptr) {
    std::fprintf(stderr, "dlsym: %s\n", dlerror());
    return -1000;
  }
  return init(agent_base_, size_);
}

KwProbe& LocalController::probe(uint32_t index) {
  return reinterpret_cast<KwProbe*>(base_ + ctl_->probes_offset)[index];
}
KwThread& LocalController::thread(uint32_t index) {
  return reinterpret_cast<KwThread*>(base_ + ctl_->threads_offset)[index];
}
KwRing& LocalController::ring(uint32_t index) {
  return *reinterpret_cast<KwRing*>(base_ + ctl_->rings_offset +
                                    index * (sizeof(KwRing) + ctl_->ring_bytes));
}

KwProcess& LocalController::process(uint32_t index) {
  return reinterpret_cast<KwProcess*>(base_ + ctl_->processes_offset)[index];
}

void LocalController::HashInsert(uint64_t addr, uint32_t index) {
  auto* slots = reinterpret_cast<KwProbeSlot*>(base_ + ctl_->hash_offset);
  const uint32_t cap = ctl_->hash_capacity;
  const uint32_t shift = 64 - __builtin_ctz(cap);
  const uint64_t h = shift >= 64 ? 0 : (addr * 0x9E3779B97F4A7C15ULL) >> shift;
  for (uint32_t n = 0; n < cap; ++n) {
    KwProbeSlot& s = slots[(h + n) & (cap - 1)];
    const uint64_t a = s.addr.load(std::memory_order_relaxed);
    if (a == 0 || a == addr) {
      ctl_->generation.fetch_add(1, std::memory_order_release);
      s.probe_index = index;
      s.addr.store(addr, std::memory_order_release);
      ctl_->generation.fetch_add(1, std::memory_order_release);
      return;
    }
  }
  std::fprintf(stderr, "local controller: hash full\n");
  std::abort();
}

uint32_t LocalController::AddProbe(const ProbeSpec& spec) {
  const uint32_t index = next_probe_++;
  if (index >= ctl_->probe_capacity ||
      next_code_ + spec.fetch.size() + spec.filter.size() > ctl_->code_capacity) {
    std::fprintf(stderr, "local controller: probe table or code pool full\n");
    std::abort();
  }
  auto* code = reinterpret_cast<KwFetchOp*>(base_ + ctl_->code_offset);
  uint32_t at = next_code_;
  for (const KwFetchOp& op : spec.fetch) {
    code[at++] = op;
  }
  for (const KwFetchOp& op : spec.filter) {
    code[at++] = op;
  }
  KwProbe& p = probe(index);
  p.id = spec.id;
  p.addr = spec.addr;
  p.xol_addr = spec.xol_addr;
  p.resume = spec.resume;
  p.insn_len = spec.insn_len;
  p.target = spec.target;
  p.cond = spec.cond;
  p.ret_imm = spec.ret_imm;
  p.ind_base = spec.ind_base;
  p.ind_index = spec.ind_index;
  p.ind_disp = spec.ind_disp;
  p.ind_scale = spec.ind_scale;
  p.ind_flags = spec.ind_flags;
  p.fetch_offset = next_code_;
  p.fetch_len = static_cast<uint32_t>(spec.fetch.size());
  p.filter_offset = next_code_ + p.fetch_len;
  p.filter_len = static_cast<uint32_t>(spec.filter.size());
  p.record_bytes = spec.record_bytes;
  p.maxactive = spec.maxactive;
  p.call_watch = spec.call_watch;
  p.next = 0;
  next_code_ += static_cast<uint32_t>(spec.fetch.size() + spec.filter.size());
  p.flags.store(spec.flags, std::memory_order_release);
  if (spec.in_hash) {
    HashInsert(spec.addr, index);
  }
  return index;
}

KwCallWatch& LocalController::call_watch(uint32_t index) {
  return reinterpret_cast<KwCallWatch*>(base_ + ctl_->call_watches_offset)[index];
}

void LocalController::Chain(uint32_t first, uint32_t then) {
  probe(first).next = then + 1;
}

void LocalController::SetState(KwState state) {
  ctl_->state.store(state, std::memory_order_release);
}

void LocalController::SetEnabled(uint32_t index, bool enabled) {
  if (enabled) {
    probe(index).flags.fetch_or(kKwProbeEnabled, std::memory_order_release);
  } else {
    probe(index).flags.fetch_and(~uint32_t{kKwProbeEnabled}, std::memory_order_release);
  }
}

void LocalController::WriteCode(uint64_t addr, const void* bytes, size_t n) {
  const int fd = open("/proc/self/mem", O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    Die("open /proc/self/mem");
  }
  if (pwrite(fd, bytes, n, static_cast<off_t>(addr)) != static_cast<ssize_t>(n)) {
    Die("pwrite /proc/self/mem");
  }
  close(fd);
}

uint32_t LocalController::AddPatch(uint32_t state, uint64_t addr, uint32_t len,
                                   const uint8_t* patched, uint32_t probe_index) {
  auto* patches = reinterpret_cast<KwPatch*>(base_ + ctl_->patches_offset);
  for (uint32_t i = 0; i < ctl_->patch_capacity; ++i) {
    KwPatch& p = patches[i];
    if (p.state.load(std::memory_order_relaxed) != kKwPatchFree) {
      continue;
    }
    p.addr = addr;
    p.len = len;
    std::memcpy(p.original.data(), reinterpret_cast<const void*>(addr), len);
    std::memcpy(p.patched.data(), patched, len);
    p.probe_index = probe_index;
    p.state.store(state, std::memory_order_release);
    patch_order_.push_back(i);
    return i;
  }
  std::fprintf(stderr, "local controller: patch journal full\n");
  std::abort();
}

void LocalController::PatchInt3(uint64_t addr, uint32_t probe_index) {
  const uint8_t int3 = 0xCC;
  AddPatch(kKwPatchInt3, addr, 1, &int3, probe_index);
  WriteCode(addr, &int3, 1);
}

void LocalController::PatchJump(uint64_t addr, uint32_t len, uint64_t to, uint32_t probe_index) {
  std::array<uint8_t, 16> patched{};
  patched.fill(0xCC);
  patched[0] = 0xE9;
  const auto rel = static_cast<int32_t>(static_cast<int64_t>(to - (addr + 5)));
  std::memcpy(patched.data() + 1, &rel, 4);
  AddPatch(kKwPatchJump, addr, len, patched.data(), probe_index);
  const uint8_t int3 = 0xCC;
  WriteCode(addr, &int3, 1);
  WriteCode(addr + 1, patched.data() + 1, len - 1);
  WriteCode(addr, patched.data(), 1);
}

void LocalController::RestoreAll() {
  SetState(kKwStateStopping);
  auto* patches = reinterpret_cast<KwPatch*>(base_ + ctl_->patches_offset);
  for (size_t k = patch_order_.size(); k-- > 0;) {  // in reverse
    KwPatch& p = patches[patch_order_[k]];
    if (p.state.load() == kKwPatchInt3) {
      WriteCode(p.addr, p.original.data(), 1);
    } else if (p.state.load() == kKwPatchJump) {
      const uint8_t int3 = 0xCC;
      WriteCode(p.addr, &int3, 1);
      WriteCode(p.addr + 1, p.original.data() + 1, p.len - 1);
      WriteCode(p.addr, p.original.data(), 1);
    }
    p.state.store(kKwPatchFree, std::memory_order_release);
  }
  patch_order_.clear();
  SetState(kKwStateRestored);
  CloseLifeline();
}

void LocalController::CloseLifeline() {
  if (lifeline_write_ >= 0) {
    close(lifeline_write_);
    lifeline_write_ = -1;
  }
}

size_t LocalController::Drain(const std::function<void(const Hit&)>& sink) {
  size_t n = 0;
  const uint64_t size = ctl_->ring_bytes;
  for (uint32_t i = 0; i < ctl_->ring_count; ++i) {
    KwRing& r = ring(i);
    const uint8_t* data = reinterpret_cast<const uint8_t*>(&r) + sizeof(KwRing);
    const uint64_t head = r.head.load(std::memory_order_acquire);
    uint64_t pos = r.tail.load(std::memory_order_relaxed);
    while (pos < head) {
      const uint64_t off = pos & (size - 1);
      uint64_t word = 0;
      std::memcpy(&word, data + off, 8);
      const auto type = static_cast<uint16_t>(word);
      const auto rsize = static_cast<uint32_t>(word >> 32);
      if (rsize == 0 || rsize % 8 != 0) {
        std::fprintf(stderr, "local controller: ring %u: bad record size %u\n", i, rsize);
        std::abort();
      }
      if (type != kKwRecordPad) {
        Hit hit;
        std::memcpy(&hit.rec, data + off, sizeof(KwRecord));
        uint32_t at = sizeof(KwRecord);
        hit.payload.assign(data + off + at, data + off + rsize);
        const bool args = type == kKwRecordHit || type == kKwRecordReturn;
        while (args && at + sizeof(KwArgHeader) <= rsize) {
          KwArgHeader h{};
          std::memcpy(&h, data + off + at, sizeof(h));
          at += sizeof(h);
          Arg a;
          a.arg = h.arg;
          a.status = h.status;
          a.bytes.assign(data + off + at, data + off + at + h.len);
          at += (h.len + 7) & ~7U;
          hit.args.push_back(std::move(a));
        }
        sink(hit);
        ++n;
      }
      pos += rsize;
    }
    r.tail.store(pos, std::memory_order_release);
  }
  return n;
}

uint64_t LocalController::MapNear(uint64_t near, size_t size) {
  const uint64_t step = uint64_t{1} << 24;
  for (uint64_t k = 1; k < 64; ++k) {
    for (const int64_t sign : {1, -1}) {
      const uint64_t hint = ((near + sign * static_cast<int64_t>(k * step)) & ~uint64_t{4095});
      void* p = mmap(reinterpret_cast<void*>(hint), size, PROT_READ | PROT_WRITE | PROT_EXEC,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
      if (p != MAP_FAILED) {
        return reinterpret_cast<uint64_t>(p);
      }
    }
  }
  Die("mmap near the code");
}

size_t LocalController::WriteXol(uint64_t slot, uint64_t from, uint32_t len) {
  auto* s = reinterpret_cast<uint8_t*>(slot);
  std::memcpy(s, reinterpret_cast<const void*>(from), len);
  s[len] = 0xE9;
  const auto rel = static_cast<int32_t>(static_cast<int64_t>((from + len) - (slot + len + 5)));
  std::memcpy(s + len + 1, &rel, 4);
  return len + 5;
}

KwFetchOp OpBegin(uint16_t arg) {
  return Op(kKwOpBeginArg, arg, 0, 0);
}
KwFetchOp OpReg(KwReg reg, uint32_t bytes) {
  return Op(kKwOpReg, reg, bytes, 0);
}
KwFetchOp OpStore(uint32_t bytes) {
  return Op(kKwOpStoreAcc, 0, bytes, 0);
}
KwFetchOp OpAdd(int64_t imm) {
  return Op(kKwOpAdd, 0, 0, imm);
}
KwFetchOp OpDeref() {
  return Op(kKwOpDeref, 0, 0, 0);
}
KwFetchOp OpDerefSize(uint32_t bytes) {
  return Op(kKwOpDeref, 0, bytes, 0);
}
KwFetchOp OpStack(uint32_t bytes) {
  return Op(kKwOpStack, 0, bytes, 0);
}
KwFetchOp OpRead(uint32_t bytes) {
  return Op(kKwOpRead, 0, bytes, 0);
}
KwFetchOp OpReadStr(uint32_t max) {
  return Op(kKwOpReadStr, 0, max, 0);
}
KwFetchOp OpXmm(uint16_t index, uint32_t bytes) {
  return Op(kKwOpXmm, index, bytes, 0);
}
KwFetchOp OpEnd() {
  return Op(kKwOpEnd, 0, 0, 0);
}

}  // namespace kwatch::agent::testing
