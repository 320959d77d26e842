// Probed code for the agent's tests and benchmark (tests/targets/agent_host.cc,
// bench/agent_bench.cc): functions whose probed instruction is known byte for byte, each
// with labels at the instruction (_insn), after it (_next) and at its branch target
// (_target), and a hand-written jump-probe trampoline laid out as docs/agent.md specifies.

#define FN(name) \
  .p2align 4;    \
  .globl name;   \
  .type name, @function; \
  name:
#define LABEL(name) \
  .globl name;      \
  name:

  .text

// uint64_t kwt_args(uint64_t a, uint64_t b, const void* p): a + b. Probed at push %rbp
// (1 byte, out of line).
FN(kwt_args)
  push %rbp
  mov %rsp, %rbp
  lea (%rdi,%rsi), %rax
  pop %rbp
  ret

// uint64_t kwt_inc(uint64_t x): x + 1 (a branch target).
FN(kwt_inc)
  lea 1(%rdi), %rax
  ret

// kwt_jmp(x): x + 1 through a jmp (probed, emulated).
FN(kwt_jmp)
LABEL(kwt_jmp_insn)
  jmp kwt_jmp_target
LABEL(kwt_jmp_next)
  ud2
LABEL(kwt_jmp_target)
  lea 1(%rdi), %rax
  ret

// kwt_j<cc>(flags): 1 when the condition holds with eflags = flags, else 0 (j<cc> probed).
.irp cc, o, no, b, ae, e, ne, be, a, s, ns, p, np, l, ge, le, g
FN(kwt_j\cc)
  push %rdi
  popfq
LABEL(kwt_j\cc\()_insn)
  j\cc kwt_j\cc\()_target
LABEL(kwt_j\cc\()_next)
  xor %eax, %eax
  ret
LABEL(kwt_j\cc\()_target)
  mov $1, %eax
  ret
.endr

// kwt_jrcxz(rcx), kwt_jecxz(rcx): 1 when (r|e)cx is 0.
FN(kwt_jrcxz)
  mov %rdi, %rcx
LABEL(kwt_jrcxz_insn)
  jrcxz kwt_jrcxz_target
LABEL(kwt_jrcxz_next)
  xor %eax, %eax
  ret
LABEL(kwt_jrcxz_target)
  mov $1, %eax
  ret

FN(kwt_jecxz)
  mov %rdi, %rcx
LABEL(kwt_jecxz_insn)
  jecxz kwt_jecxz_target
LABEL(kwt_jecxz_next)
  xor %eax, %eax
  ret
LABEL(kwt_jecxz_target)
  mov $1, %eax
  ret

// kwt_loop*(rcx, flags): iterations in rax, rcx at the end in rdx; flags (ZF) stay constant.
.irp kind, loop, loope, loopne
FN(kwt_\kind)
  mov %rdi, %rcx
  mov $0, %eax
  push %rsi
  popfq
LABEL(kwt_\kind\()_target)
  lea 1(%rax), %eax
LABEL(kwt_\kind\()_insn)
  \kind kwt_\kind\()_target
LABEL(kwt_\kind\()_next)
  mov %rcx, %rdx
  ret
.endr

// kwt_loop32(rcx): loop with a 32-bit address size (0x67): ecx counts.
FN(kwt_loop32)
  mov %rdi, %rcx
  mov $0, %eax
LABEL(kwt_loop32_target)
  lea 1(%rax), %eax
LABEL(kwt_loop32_insn)
  .byte 0x67
  loop kwt_loop32_target
LABEL(kwt_loop32_next)
  mov %rcx, %rdx
  ret

// kwt_call(x): kwt_inc(x) + 10, through a call rel32 (probed).
FN(kwt_call)
  sub $8, %rsp
LABEL(kwt_call_insn)
  call kwt_inc
LABEL(kwt_call_next)
  add $8, %rsp
  add $10, %rax
  ret

// kwt_ret(x): x + 2, its ret probed.
FN(kwt_ret)
  lea 2(%rdi), %rax
LABEL(kwt_ret_insn)
  ret
LABEL(kwt_ret_next)

// kwt_ret8(x): x + 3 through a callee whose `ret $8` (probed) pops the caller's argument word.
FN(kwt_ret8_fn)
  lea 3(%rdi), %rax
LABEL(kwt_ret8_insn)
  ret $8
LABEL(kwt_ret8_next)

FN(kwt_ret8)
  push %rbx
  push $0x55
  call kwt_ret8_fn
  pop %rbx
  ret

// kwt_icall_reg(x, fn): fn(x) through call *%rsi (probed).
FN(kwt_icall_reg)
  sub $8, %rsp
LABEL(kwt_icall_reg_insn)
  call *%rsi
LABEL(kwt_icall_reg_next)
  add $8, %rsp
  ret

// kwt_icall_mem(x): (*kwt_fnptr)(x) through call *kwt_fnptr(%rip) (probed).
FN(kwt_icall_mem)
  sub $8, %rsp
LABEL(kwt_icall_mem_insn)
  call *kwt_fnptr(%rip)
LABEL(kwt_icall_mem_next)
  add $8, %rsp
  ret

// kwt_icall_sib(x, table, i): table[i + 1](x) through call *8(%rsi,%rdx,8) (probed).
FN(kwt_icall_sib)
  sub $8, %rsp
LABEL(kwt_icall_sib_insn)
  call *8(%rsi,%rdx,8)
LABEL(kwt_icall_sib_next)
  add $8, %rsp
  ret

// kwt_ijmp_reg(x, fn): fn(x) as a tail call, jmp *%rsi (probed).
FN(kwt_ijmp_reg)
LABEL(kwt_ijmp_reg_insn)
  jmp *%rsi
LABEL(kwt_ijmp_reg_next)

// kwt_ijmp_fs(x, off): (*(fn*)(fs base + off))(x) as a tail call, jmp *%fs:(%rsi) (probed).
FN(kwt_ijmp_fs)
LABEL(kwt_ijmp_fs_insn)
  jmp *%fs:(%rsi)
LABEL(kwt_ijmp_fs_next)

// uint64_t kwt_fib(n): recursive Fibonacci, probed at push %rbx (out of line).
FN(kwt_fib)
  push %rbx
  push %rbp
  sub $8, %rsp
  mov %rdi, %rbx
  cmp $2, %rdi
  jb 2f
  lea -1(%rbx), %rdi
  call kwt_fib
  mov %rax, %rbp
  lea -2(%rbx), %rdi
  call kwt_fib
  add %rbp, %rax
  jmp 3f
2:
  mov %rdi, %rax
3:
  add $8, %rsp
  pop %rbp
  pop %rbx
  ret

// uint64_t kwt_callback(uint64_t (*cb)(uint64_t), uint64_t arg): cb(arg); probed at push
// %rbx (out of line).
FN(kwt_callback)
  push %rbx
  mov %rdi, %rax
  mov %rsi, %rdi
  call *%rax
  pop %rbx
  ret

// uint64_t kwt_xmm_call(a, b, fn, x): fn(a, b) entered with %xmm0 = x (a tail call).
FN(kwt_xmm_call)
  movq %rcx, %xmm0
  jmp *%rdx

// void kwt_own_int3(void): the program's own breakpoint.
FN(kwt_own_int3)
  int3
  ret

// uint64_t kwt_jfunc(a, b): 2a + b. Its first 6 bytes (two instructions) are displaced into
// kwt_tramp by a jump probe.
FN(kwt_jfunc)
  mov %rdi, %rax
  add %rdi, %rax
LABEL(kwt_jfunc_after)
  add %rsi, %rax
  ret

// The jump probe's trampoline (docs/agent.md "Jump probe"): calls *kwt_jump_entry with
// kwt_tramp_index and the KwRegs it saves, then runs the displaced instructions and jumps
// back to kwt_jfunc_after.
#define R15 0
#define R14 8
#define R13 16
#define R12 24
#define RBP 32
#define RBX 40
#define R11 48
#define R10 56
#define R9 64
#define R8 72
#define RAX 80
#define RCX 88
#define RDX 96
#define RSI 104
#define RDI 112
#define ORIG_RAX 120
#define RIP 128
#define CS 136
#define EFLAGS 144
#define RSP 152
#define SS 160
#define FS_BASE 168
#define GS_BASE 176
#define DS 184
#define ES 192
#define FS 200
#define GS 208
#define KWREGS 216

FN(kwt_tramp)
  lea -128(%rsp), %rsp
  pushfq
  cld
  sub $KWREGS, %rsp
  mov %r15, R15(%rsp)
  mov %r14, R14(%rsp)
  mov %r13, R13(%rsp)
  mov %r12, R12(%rsp)
  mov %rbp, RBP(%rsp)
  mov %rbx, RBX(%rsp)
  mov %r11, R11(%rsp)
  mov %r10, R10(%rsp)
  mov %r9, R9(%rsp)
  mov %r8, R8(%rsp)
  mov %rax, RAX(%rsp)
  mov %rcx, RCX(%rsp)
  mov %rdx, RDX(%rsp)
  mov %rsi, RSI(%rsp)
  mov %rdi, RDI(%rsp)
  mov KWREGS(%rsp), %rax
  mov %rax, EFLAGS(%rsp)
  lea KWREGS + 8 + 128(%rsp), %rax
  mov %rax, RSP(%rsp)
  lea kwt_jfunc(%rip), %rax
  mov %rax, RIP(%rsp)
  movq $-1, ORIG_RAX(%rsp)
  xor %eax, %eax
  mov %rax, CS(%rsp)
  mov %rax, SS(%rsp)
  mov %rax, FS_BASE(%rsp)
  mov %rax, GS_BASE(%rsp)
  mov %rax, DS(%rsp)
  mov %rax, ES(%rsp)
  mov %rax, FS(%rsp)
  mov %rax, GS(%rsp)
  mov %rsp, %rsi
  mov kwt_tramp_index(%rip), %edi
  mov %rsp, %rbx
  and $-16, %rsp
  call *kwt_jump_entry(%rip)
  mov %rbx, %rsp
  mov R15(%rsp), %r15
  mov R14(%rsp), %r14
  mov R13(%rsp), %r13
  mov R12(%rsp), %r12
  mov RBP(%rsp), %rbp
  mov RBX(%rsp), %rbx
  mov R11(%rsp), %r11
  mov R10(%rsp), %r10
  mov R9(%rsp), %r9
  mov R8(%rsp), %r8
  mov RAX(%rsp), %rax
  mov RCX(%rsp), %rcx
  mov RDX(%rsp), %rdx
  mov RSI(%rsp), %rsi
  mov RDI(%rsp), %rdi
  add $KWREGS, %rsp
  popfq
  lea 128(%rsp), %rsp
LABEL(kwt_tramp_displaced)
  mov %rdi, %rax
  add %rdi, %rax
  jmp kwt_jfunc_after

  .data
  .p2align 3
LABEL(kwt_fnptr)
  .quad kwt_inc
LABEL(kwt_jump_entry)
  .quad 0
LABEL(kwt_tramp_index)
  .long 0
  .long 0

  .section .note.GNU-stack, "", @progbits
