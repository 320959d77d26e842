// libkwatch-agent.so's assembly (docs/agent.md): the safe memory routines and their exception
// table, the return trampoline, the raw thread clone, and the agent's own mem* functions (the
// compiler may emit calls to them; the agent must not call libc's on a hit's path).

// Offsets in KwRegs (agent/abi.h, the layout of user_regs_struct).
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
#define KWREGS_SIZE 216

#define FUNCTION(name) \
  .p2align 4;          \
  .globl name;         \
  .hidden name;        \
  .type name, @function; \
  name:

#define END(name) .size name, .- name

  .text

// long kw_safe_copy(void* dst, const void* src, size_t n): 0, or -1 on a fault.
FUNCTION(kw_safe_copy)
  .cfi_startproc
  mov %rdx, %rcx
  cld
.Lcopy_insn:
  rep movsb
  xor %eax, %eax
  ret
.Lcopy_fixup:
  mov $-1, %rax
  ret
  .cfi_endproc
END(kw_safe_copy)

// long kw_safe_strcopy(void* dst, const void* src, size_t max): bytes before the first NUL
// (max when none), or on a fault ~(the bytes copied before it), which is negative.
FUNCTION(kw_safe_strcopy)
  .cfi_startproc
  xor %eax, %eax
1:
  cmp %rdx, %rax
  je 2f
.Lstr_insn:
  movzbl (%rsi,%rax), %ecx
  test %ecx, %ecx
  jz 2f
  mov %cl, (%rdi,%rax)
  inc %rax
  jmp 1b
2:
  ret
.Lstr_fixup:
  not %rax  // %rax still counts the bytes copied (the faulting load wrote nothing)
  ret
  .cfi_endproc
END(kw_safe_strcopy)

// long kw_safe_read8(const void* src, uint64_t* out)
FUNCTION(kw_safe_read8)
  .cfi_startproc
.Lread8_insn:
  mov (%rdi), %rax
  mov %rax, (%rsi)
  xor %eax, %eax
  ret
.Lread8_fixup:
  mov $-1, %rax
  ret
  .cfi_endproc
END(kw_safe_read8)

// long kw_safe_write8(void* dst, uint64_t value)
FUNCTION(kw_safe_write8)
  .cfi_startproc
.Lwrite8_insn:
  mov %rsi, (%rdi)
  xor %eax, %eax
  ret
.Lwrite8_fixup:
  mov $-1, %rax
  ret
  .cfi_endproc
END(kw_safe_write8)

// The exception table: a fault at the first address goes on at the second (signals.cc).
  .section .rodata
  .p2align 2
  .globl kw_extable
  .hidden kw_extable
kw_extable:
  .long .Lcopy_insn - ., .Lcopy_fixup - .
  .long .Lstr_insn - ., .Lstr_fixup - .
  .long .Lread8_insn - ., .Lread8_fixup - .
  .long .Lwrite8_insn - ., .Lwrite8_fixup - .
  .globl kw_extable_end
  .hidden kw_extable_end
kw_extable_end:
  .text

// A tracked call returns here (its return address was replaced at the entry hit). Saves the
// registers as a KwRegs, asks kw_return_hit for the real return address, restores every
// register and flag, and returns there. Uses no vector register (rax/rdx and xmm0/xmm1 carry
// the return value through).
FUNCTION(kw_return_trampoline)
  .cfi_startproc
  .cfi_undefined rip
  sub $8, %rsp  // the real return address goes here
  sub $KWREGS_SIZE, %rsp
  .cfi_adjust_cfa_offset 8 + KWREGS_SIZE
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
  pushfq
  pop %rax
  mov %rax, EFLAGS(%rsp)
  cld
  movq $-1, ORIG_RAX(%rsp)
  movq $0, RIP(%rsp)
  lea KWREGS_SIZE + 8(%rsp), %rax  // rsp as the `ret` left it
  mov %rax, RSP(%rsp)
  xor %eax, %eax
  mov %rax, CS(%rsp)
  mov %rax, SS(%rsp)
  mov %rax, FS_BASE(%rsp)
  mov %rax, GS_BASE(%rsp)
  mov %rax, DS(%rsp)
  mov %rax, ES(%rsp)
  mov %rax, FS(%rsp)
  mov %rax, GS(%rsp)
  mov %rsp, %rdi
  mov %rsp, %rbx
  and $-16, %rsp
  call kw_return_hit
  mov %rbx, %rsp
  mov %rax, KWREGS_SIZE(%rsp)
  mov EFLAGS(%rsp), %rax
  push %rax
  popfq
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
  add $KWREGS_SIZE, %rsp
  .cfi_adjust_cfa_offset -KWREGS_SIZE
  ret
  .cfi_endproc
END(kw_return_trampoline)

// long kw_clone_thread(unsigned long flags, void* stack_top, void* tls, void (*fn)(void*),
//                      void* arg): the child's tid, or -errno. The child runs fn(arg) on
// stack_top (16-byte aligned) and exits with 0 if fn returns.
FUNCTION(kw_clone_thread)
  .cfi_startproc
  sub $16, %rsi
  mov %rcx, 0(%rsi)
  mov %r8, 8(%rsi)
  mov %rdx, %r8  // tls
  xor %edx, %edx  // parent_tid
  xor %r10d, %r10d  // child_tid
  mov $56, %eax  // SYS_clone
  syscall
  test %rax, %rax
  jz 1f
  ret  // the parent: the child's tid, or -errno
1:
  // The child, on its own stack: the end of its call chain.
  .cfi_undefined rip
  xor %ebp, %ebp
  pop %rax
  pop %rdi
  call *%rax
  xor %edi, %edi
  mov $60, %eax  // SYS_exit: this thread only
  syscall
  hlt
  .cfi_endproc
END(kw_clone_thread)

// void kw_unmap_and_exit(void* base, size_t len)
FUNCTION(kw_unmap_and_exit)
  .cfi_startproc
  mov $11, %eax  // SYS_munmap
  syscall
  xor %edi, %edi
  mov $60, %eax  // SYS_exit
  syscall
  hlt
  .cfi_endproc
END(kw_unmap_and_exit)

// The mem* functions the compiler may call, hidden: calls inside the agent bind to these.
FUNCTION(memcpy)
  .cfi_startproc
  mov %rdi, %rax
  mov %rdx, %rcx
  cld
  rep movsb
  ret
  .cfi_endproc
END(memcpy)

FUNCTION(memmove)
  .cfi_startproc
  mov %rdi, %rax
  mov %rdx, %rcx
  cmp %rsi, %rdi
  jbe 1f
  lea -1(%rsi,%rdx), %rsi
  lea -1(%rdi,%rdx), %rdi
  std
  rep movsb
  cld
  ret
1:
  cld
  rep movsb
  ret
  .cfi_endproc
END(memmove)

FUNCTION(memset)
  .cfi_startproc
  mov %rdi, %r9
  mov %esi, %eax
  mov %rdx, %rcx
  cld
  rep stosb
  mov %r9, %rax
  ret
  .cfi_endproc
END(memset)

FUNCTION(memcmp)
  .cfi_startproc
  xor %eax, %eax
  xor %ecx, %ecx
1:
  cmp %rdx, %rcx
  je 2f
  movzbl (%rdi,%rcx), %eax
  movzbl (%rsi,%rcx), %r8d
  inc %rcx
  sub %r8d, %eax
  jz 1b
2:
  ret
  .cfi_endproc
END(memcmp)

  .section .note.GNU-stack, "", @progbits
