#pragma once

// The functions of tests/targets/jump_funcs.c as compiled at -O0 and -O2 (jump_funcs_O0,
// jump_funcs_O2): their bytes from the ELF file, at their link-time addresses.

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/probe/jump_optimizer.h"
#include "core/symbols/symbols.h"
#include "core/x86/relocator.h"
#include "tests/test_util.h"

namespace kwatch::core::probe {

// One function of a jump_funcs binary; fails the test (and returns null) when it is missing.
class CompiledFunction {
 public:
  static std::unique_ptr<CompiledFunction> Load(const std::string& binary,
                                                const std::string& name) {
    auto symbols = symbols::Symbols::ForFile(testing::TargetPath(binary));
    EXPECT_TRUE(symbols.ok()) << symbols.status();
    if (!symbols.ok()) {
      return nullptr;
    }
    const auto f = (*symbols)->FindFunction(name);
    EXPECT_TRUE(f.has_value()) << name << " in " << binary;
    if (!f || f->size == 0) {
      return nullptr;
    }
    auto out = std::unique_ptr<CompiledFunction>(new CompiledFunction);
    out->bytes_.resize(f->size);
    const absl::Status read = (*symbols)->ReadCode(f->start, out->bytes_);
    EXPECT_TRUE(read.ok()) << read;
    out->code_ = FunctionCode{name, f->start, out->bytes_};
    out->symbols_ = *std::move(symbols);
    return read.ok() ? std::move(out) : nullptr;
  }

  // JumpOptions::read_image over the binary's file image.
  std::function<absl::Status(RemoteAddr, std::span<uint8_t>)> ReadImage() const {
    const symbols::Symbols* symbols = symbols_.get();
    return
        [symbols](RemoteAddr addr, std::span<uint8_t> out) { return symbols->ReadCode(addr, out); };
  }

  const FunctionCode& code() const { return code_; }
  const std::vector<uint8_t>& bytes() const { return bytes_; }
  // The function's instructions, decoded linearly.
  std::vector<x86::X86Insn> Insns() const {
    std::vector<x86::X86Insn> out;
    for (uint64_t off = 0; off < bytes_.size();) {
      auto d = x86::DecodeX86(std::span(bytes_).subspan(off), code_.start + off);
      EXPECT_TRUE(d.ok()) << d.status();
      if (!d.ok()) {
        break;
      }
      out.push_back(*d);
      off += d->length;
    }
    return out;
  }

 private:
  CompiledFunction() = default;
  std::unique_ptr<symbols::Symbols> symbols_;
  std::vector<uint8_t> bytes_;
  FunctionCode code_;
};

}  // namespace kwatch::core::probe
