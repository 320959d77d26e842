#include "core/zydis_context.h"

namespace kwatch::core {

namespace {

uint64_t Low32(uint64_t v) {
  return v & 0xffffffffu;
}

}  // namespace

void FillZydisContext(const user_regs_struct& r, ZydisRegisterContext& ctx) {
  auto& v = ctx.values;
  v[ZYDIS_REGISTER_RAX] = r.rax;
  v[ZYDIS_REGISTER_RBX] = r.rbx;
  v[ZYDIS_REGISTER_RCX] = r.rcx;
  v[ZYDIS_REGISTER_RDX] = r.rdx;
  v[ZYDIS_REGISTER_RSI] = r.rsi;
  v[ZYDIS_REGISTER_RDI] = r.rdi;
  v[ZYDIS_REGISTER_RBP] = r.rbp;
  v[ZYDIS_REGISTER_RSP] = r.rsp;
  v[ZYDIS_REGISTER_R8] = r.r8;
  v[ZYDIS_REGISTER_R9] = r.r9;
  v[ZYDIS_REGISTER_R10] = r.r10;
  v[ZYDIS_REGISTER_R11] = r.r11;
  v[ZYDIS_REGISTER_R12] = r.r12;
  v[ZYDIS_REGISTER_R13] = r.r13;
  v[ZYDIS_REGISTER_R14] = r.r14;
  v[ZYDIS_REGISTER_R15] = r.r15;
  v[ZYDIS_REGISTER_RIP] = r.rip;
  // addr32 forms use the low halves.
  v[ZYDIS_REGISTER_EAX] = Low32(r.rax);
  v[ZYDIS_REGISTER_EBX] = Low32(r.rbx);
  v[ZYDIS_REGISTER_ECX] = Low32(r.rcx);
  v[ZYDIS_REGISTER_EDX] = Low32(r.rdx);
  v[ZYDIS_REGISTER_ESI] = Low32(r.rsi);
  v[ZYDIS_REGISTER_EDI] = Low32(r.rdi);
  v[ZYDIS_REGISTER_EBP] = Low32(r.rbp);
  v[ZYDIS_REGISTER_ESP] = Low32(r.rsp);
  v[ZYDIS_REGISTER_R8D] = Low32(r.r8);
  v[ZYDIS_REGISTER_R9D] = Low32(r.r9);
  v[ZYDIS_REGISTER_R10D] = Low32(r.r10);
  v[ZYDIS_REGISTER_R11D] = Low32(r.r11);
  v[ZYDIS_REGISTER_R12D] = Low32(r.r12);
  v[ZYDIS_REGISTER_R13D] = Low32(r.r13);
  v[ZYDIS_REGISTER_R14D] = Low32(r.r14);
  v[ZYDIS_REGISTER_R15D] = Low32(r.r15);
  v[ZYDIS_REGISTER_EIP] = Low32(r.rip);
}

}  // namespace kwatch::core
