#include "core/kernel/bpf_kernel_reader.h"

#include <bpf/bpf.h>
#include <linux/bpf.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "core/base/syscall_status.h"
#include "core/kernel/bpf_insn.h"

namespace kwatch::core::kernel {
namespace {

// The program's context, copied in and back out by BPF_PROG_TEST_RUN.
struct ReadContext {
  uint64_t addr = 0;
  int64_t result = 0;  // bpf_probe_read_kernel's return: 0, or -errno
};

// r6 = ctx; key = 0; r0 = map_lookup_elem(map, &key); if !r0 goto out;
// ctx->result = probe_read_kernel(r0, kChunk, ctx->addr); out: return 0.
std::array<bpf_insn, 17> Program(int map_fd) {
  using namespace bpf;  // NOLINT(google-build-using-namespace): the instruction names
  return {
      Insn(BPF_ALU64 | BPF_MOV | BPF_X, kR6, kR1, 0, 0),            // r6 = r1
      Insn(BPF_ST | BPF_MEM | BPF_W, kR10, 0, -4, 0),               // *(u32 *)(fp - 4) = 0
      Insn(kLdImm64, kR1, BPF_PSEUDO_MAP_FD, 0, map_fd),            // r1 = map
      Insn(0, 0, 0, 0, 0),                                          // (second half)
      Insn(BPF_ALU64 | BPF_MOV | BPF_X, kR2, kR10, 0, 0),           // r2 = fp
      Insn(kAddImm, kR2, 0, 0, -4),                                 // r2 -= 4
      Insn(BPF_JMP | BPF_CALL, 0, 0, 0, BPF_FUNC_map_lookup_elem),  // r0 = lookup
      Insn(BPF_JMP | BPF_JEQ | BPF_K, kR0, 0, 7, 0),                // if r0 == 0 goto out
      Insn(BPF_ALU64 | BPF_MOV | BPF_X, kR1, kR0, 0, 0),            // r1 = value
      Insn(BPF_ALU64 | BPF_MOV | BPF_K, kR2, 0, 0,
           static_cast<int32_t>(BpfKernelReader::kChunk)),                         // r2 = size
      Insn(BPF_LDX | BPF_MEM | BPF_DW, kR3, kR6, offsetof(ReadContext, addr), 0),  // r3 = addr
      Insn(BPF_JMP | BPF_CALL, 0, 0, 0, BPF_FUNC_probe_read_kernel),               // r0 = read
      Insn(BPF_STX | BPF_MEM | BPF_DW, kR6, kR0, offsetof(ReadContext, result), 0),
      Insn(BPF_ALU64 | BPF_MOV | BPF_K, kR0, 0, 0, 0),  // return 0
      Insn(BPF_JMP | BPF_EXIT, 0, 0, 0, 0),
      Insn(BPF_ALU64 | BPF_MOV | BPF_K, kR0, 0, 0, 0),  // out: return 0
      Insn(BPF_JMP | BPF_EXIT, 0, 0, 0, 0),
  };
}

std::string Advice(int err) {
  if (err == EPERM || err == EACCES) {
    return "loading a BPF program that reads kernel memory needs root, or CAP_BPF with "
           "CAP_PERFMON (a kernel in lockdown refuses it to everyone)";
  }
  if (err == EINVAL || err == EOPNOTSUPP) {
    return "this kernel runs no BPF_PROG_TYPE_SYSCALL program (Linux >= 5.14, "
           "CONFIG_BPF_SYSCALL)";
  }
  return "";
}

}  // namespace

absl::StatusOr<std::unique_ptr<BpfKernelReader>> BpfKernelReader::Open() {
  UniqueFd map(
      bpf_map_create(BPF_MAP_TYPE_ARRAY, "kwatch_kread", sizeof(uint32_t), kChunk, 1, nullptr));
  if (!map.valid()) {
    const int err = errno;
    return SyscallError(err, "bpf(BPF_MAP_CREATE)", Advice(err));
  }
  const std::array<bpf_insn, 17> insns = Program(map.get());
  std::array<char, 4096> log{};
  LIBBPF_OPTS(bpf_prog_load_opts, opts, .prog_flags = BPF_F_SLEEPABLE, .log_level = 1,
              .log_size = log.size(), .log_buf = log.data());
  UniqueFd prog(bpf_prog_load(BPF_PROG_TYPE_SYSCALL, "kwatch_kread", "GPL", insns.data(),
                              insns.size(), &opts));
  if (!prog.valid()) {
    const int err = errno;
    std::string why = Advice(err);
    if (log[0] != '\0') {  // the verifier's word
      absl::StrAppend(&why, why.empty() ? "" : "; ",
                      "verifier: ", absl::StripTrailingAsciiWhitespace(log.data()));
    }
    return SyscallError(err, "bpf(BPF_PROG_LOAD, BPF_PROG_TYPE_SYSCALL)", why);
  }
  return std::unique_ptr<BpfKernelReader>(new BpfKernelReader(std::move(map), std::move(prog)));
}

absl::Status BpfKernelReader::Read(uint64_t addr, std::span<uint8_t> out) const {
  std::array<uint8_t, kChunk> value{};
  for (size_t done = 0; done < out.size();) {
    ReadContext ctx{.addr = addr + done, .result = 0};
    // The context is copied back into ctx_in (a syscall program takes no ctx_out).
    LIBBPF_OPTS(bpf_test_run_opts, run, .ctx_in = &ctx, .ctx_size_in = sizeof(ctx));
    if (bpf_prog_test_run_opts(prog_.get(), &run) != 0) {
      const int err = errno;
      return SyscallError(err, "bpf(BPF_PROG_TEST_RUN)");
    }
    if (ctx.result != 0) {
      return absl::NotFoundError(
          absl::StrFormat("kernel memory at 0x%x: bpf_probe_read_kernel returned %d (%s)",
                          addr + done, ctx.result, ErrnoText(static_cast<int>(-ctx.result))));
    }
    const uint32_t key = 0;
    if (bpf_map_lookup_elem(map_.get(), &key, value.data()) != 0) {
      const int err = errno;
      return SyscallError(err, "bpf(BPF_MAP_LOOKUP_ELEM)");
    }
    const size_t n = std::min(kChunk, out.size() - done);
    std::memcpy(out.data() + done, value.data(), n);
    done += n;
  }
  return absl::OkStatus();
}

}  // namespace kwatch::core::kernel
