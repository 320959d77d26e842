// Probe specs and fetch arguments (core/probe/probe_spec.h, core/probe/fetch.h), perf probe
// syntax: the input is one spec "POINT ARG ARG...". It is parsed whole and piece by piece;
// a spec that parses is resolved against a fixed ELF with DWARF (tests/targets/probe_args.c),
// its arguments compiled for each resolved point and evaluated against registers and memory
// derived from the input. Errors are fine; crashes and sanitizer reports are bugs.

#include <sys/user.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "core/probe/fetch.h"
#include "core/probe/probe_spec.h"
#include "core/probe/probe_target.h"
#include "fuzz/fuzz_util.h"

namespace {

using kwatch::core::probe::ProbeTarget;

const ProbeTarget& Fixture() {
  static const ProbeTarget* target = [] {
    kwatch::fuzz::QuietLibdw();
    auto t = ProbeTarget::Open(KWATCH_FUZZ_FIXTURE);
    if (!t.ok()) {
      std::abort();  // the harness is broken: the fixture must load
    }
    return t->release();
  }();
  return *target;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  // Each parser on its own, as the CLI calls them for -a/--arg style options.
  (void)kwatch::core::probe::ParseProbePoint(text);
  (void)kwatch::core::probe::ParseProbeArg(text);
  (void)kwatch::core::probe::ParseArgType(text);
  auto spec = kwatch::core::probe::ParseProbeSpec(text);
  if (!spec.ok()) {
    return 0;
  }
  for (const kwatch::core::probe::ProbeArgSpec& arg : spec->args) {
    if (arg.type.has_value()) {
      (void)arg.type->Name();
    }
  }
  const ProbeTarget& target = Fixture();
  auto points = target.Resolve(spec->point);
  if (!points.ok()) {
    return 0;
  }
  if (spec->point.kind == kwatch::core::probe::ProbePoint::Kind::kFunction &&
      !spec->point.is_return && !spec->point.line.has_value() && spec->point.pattern.empty() &&
      spec->point.offset == 0) {
    (void)target.ListLines(spec->point);
  }
  (void)target.ListVars(spec->point);

  // Registers and memory for evaluation: from the input, so values differ between inputs.
  user_regs_struct regs{};
  std::memcpy(&regs, data, std::min(size, sizeof(regs)));
  user_fpregs_struct fpregs{};
  const std::string bytes(text);
  kwatch::core::probe::FetchContext ctx;
  ctx.regs = &regs;
  ctx.fpregs = &fpregs;
  ctx.load_bias = 0;
  ctx.read = [&bytes](kwatch::core::RemoteAddr addr, std::span<uint8_t> out) -> absl::Status {
    if (bytes.empty() || addr.value % 5 == 1) {
      return absl::NotFoundError("unmapped");
    }
    for (size_t i = 0; i < out.size(); ++i) {
      out[i] = static_cast<uint8_t>(bytes[(addr.value + i) % bytes.size()]);
    }
    return absl::OkStatus();
  };
  size_t compiled = 0;
  for (const kwatch::core::probe::ResolvedPoint& point : *points) {
    (void)point.Where();
    auto args = kwatch::core::probe::CompileArgs(target, point, spec->args);
    if (!args.ok() || ++compiled > 4) {
      continue;
    }
    for (const bool at_return : {false, true}) {
      ctx.at_return = at_return;
      (void)kwatch::core::probe::EvaluateAll(*args, ctx);
    }
  }
  return 0;
}
