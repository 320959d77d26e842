#pragma once

#include <linux/bpf.h>

#include <cstdint>

// Building blocks of the small BPF programs kwatch assembles itself (no compiler at run time):
// bpf_kernel_reader.cc, bpf_access_values.cc.
namespace kwatch::core::kernel::bpf {

inline constexpr uint8_t kR0 = 0;
inline constexpr uint8_t kR1 = 1;
inline constexpr uint8_t kR2 = 2;
inline constexpr uint8_t kR3 = 3;
inline constexpr uint8_t kR4 = 4;
inline constexpr uint8_t kR6 = 6;
inline constexpr uint8_t kR7 = 7;
inline constexpr uint8_t kR10 = 10;  // the frame pointer

// Some opcode parts are 0 (BPF_LD, BPF_IMM, BPF_ADD, BPF_K): spelt out all the same.
inline constexpr uint8_t kLdImm64 = BPF_LD | BPF_DW | BPF_IMM;  // NOLINT(misc-redundant-expression)
inline constexpr uint8_t kAddImm =
    BPF_ALU64 | BPF_ADD | BPF_K;  // NOLINT(misc-redundant-expression)
inline constexpr uint8_t kMovImm = BPF_ALU64 | BPF_MOV | BPF_K;
inline constexpr uint8_t kMovReg = BPF_ALU64 | BPF_MOV | BPF_X;
inline constexpr uint8_t kStoreDw = BPF_ST | BPF_MEM | BPF_DW;
inline constexpr uint8_t kStoreRegDw = BPF_STX | BPF_MEM | BPF_DW;
inline constexpr uint8_t kCall = BPF_JMP | BPF_CALL;
inline constexpr uint8_t kExit = BPF_JMP | BPF_EXIT;

// One instruction. A 64-bit immediate (kLdImm64) takes two: the second holds its high half.
constexpr bpf_insn Insn(uint8_t code, uint8_t dst, uint8_t src, int16_t off, int32_t imm) {
  return bpf_insn{.code = code,
                  .dst_reg = static_cast<uint8_t>(dst & 0xf),
                  .src_reg = static_cast<uint8_t>(src & 0xf),
                  .off = off,
                  .imm = imm};
}

}  // namespace kwatch::core::kernel::bpf
