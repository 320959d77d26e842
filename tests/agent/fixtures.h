#pragma once

// The probed code of tests/agent/fixtures.S (see there for what each function computes and
// which instruction is probed). Labels are declared as byte arrays: only their addresses
// matter.

#include <cstdint>

extern "C" {
uint64_t kwt_args(uint64_t a, uint64_t b, const void* p);
uint64_t kwt_inc(uint64_t x);
uint64_t kwt_jmp(uint64_t x);
uint64_t kwt_jrcxz(uint64_t rcx);
uint64_t kwt_jecxz(uint64_t rcx);
uint64_t kwt_call(uint64_t x);
uint64_t kwt_ret(uint64_t x);
uint64_t kwt_ret8(uint64_t x);
uint64_t kwt_icall_reg(uint64_t x, uint64_t (*fn)(uint64_t));
uint64_t kwt_icall_mem(uint64_t x);
uint64_t kwt_icall_sib(uint64_t x, uint64_t (**table)(uint64_t), uint64_t i);
uint64_t kwt_ijmp_reg(uint64_t x, uint64_t (*fn)(uint64_t));
uint64_t kwt_ijmp_fs(uint64_t x, uint64_t fs_offset);
uint64_t kwt_fib(uint64_t n);
uint64_t kwt_callback(uint64_t (*cb)(uint64_t), uint64_t arg);
void kwt_own_int3();
uint64_t kwt_xmm_call(uint64_t a, uint64_t b, uint64_t (*fn)(uint64_t, uint64_t), uint64_t x);
uint64_t kwt_jfunc(uint64_t a, uint64_t b);
void kwt_tramp();

// Loops return iterations in rax and rcx in rdx.
struct KwtLoop {
  uint64_t iterations;
  uint64_t rcx;
};
KwtLoop kwt_loop(uint64_t rcx, uint64_t flags);
KwtLoop kwt_loope(uint64_t rcx, uint64_t flags);
KwtLoop kwt_loopne(uint64_t rcx, uint64_t flags);
KwtLoop kwt_loop32(uint64_t rcx, uint64_t flags);

#define KWT_LABELS(name)              \
  extern const uint8_t name##_insn[]; \
  extern const uint8_t name##_next[]; \
  extern const uint8_t name##_target[];
KWT_LABELS(kwt_jmp)
KWT_LABELS(kwt_jo)
KWT_LABELS(kwt_jno)
KWT_LABELS(kwt_jb)
KWT_LABELS(kwt_jae)
KWT_LABELS(kwt_je)
KWT_LABELS(kwt_jne)
KWT_LABELS(kwt_jbe)
KWT_LABELS(kwt_ja)
KWT_LABELS(kwt_js)
KWT_LABELS(kwt_jns)
KWT_LABELS(kwt_jp)
KWT_LABELS(kwt_jnp)
KWT_LABELS(kwt_jl)
KWT_LABELS(kwt_jge)
KWT_LABELS(kwt_jle)
KWT_LABELS(kwt_jg)
KWT_LABELS(kwt_jrcxz)
KWT_LABELS(kwt_jecxz)
KWT_LABELS(kwt_loop)
KWT_LABELS(kwt_loope)
KWT_LABELS(kwt_loopne)
KWT_LABELS(kwt_loop32)
#undef KWT_LABELS
// kwt_j<cc>(flags): 1 when the condition holds with eflags = flags.
uint64_t kwt_jo(uint64_t), kwt_jno(uint64_t), kwt_jb(uint64_t), kwt_jae(uint64_t);
uint64_t kwt_je(uint64_t), kwt_jne(uint64_t), kwt_jbe(uint64_t), kwt_ja(uint64_t);
uint64_t kwt_js(uint64_t), kwt_jns(uint64_t), kwt_jp(uint64_t), kwt_jnp(uint64_t);
uint64_t kwt_jl(uint64_t), kwt_jge(uint64_t), kwt_jle(uint64_t), kwt_jg(uint64_t);
#define KWT_INSN(name)                \
  extern const uint8_t name##_insn[]; \
  extern const uint8_t name##_next[];
KWT_INSN(kwt_call)
KWT_INSN(kwt_ret)
KWT_INSN(kwt_ret8)
KWT_INSN(kwt_icall_reg)
KWT_INSN(kwt_icall_mem)
KWT_INSN(kwt_icall_sib)
KWT_INSN(kwt_ijmp_reg)
KWT_INSN(kwt_ijmp_fs)
#undef KWT_INSN
extern const uint8_t kwt_jfunc_after[];
extern const uint8_t kwt_tramp_displaced[];
extern uint64_t (*kwt_fnptr)(uint64_t);
extern uint64_t kwt_jump_entry;
extern uint32_t kwt_tramp_index;
}

// An address as the ABI wants it.
template <typename T>
inline uint64_t Addr(T* p) {
  return reinterpret_cast<uint64_t>(p);
}
