// BTF blobs (core/kernel/btf_types.h): the input is a file of raw BTF (or an ELF with a .BTF
// section), loaded through libbpf as /sys/kernel/btf/vmlinux is, then queried the way a
// kernel watch expression uses it: types by name, names, sizes, members, walks of member
// and index steps, flattened layouts. Errors are fine; crashes and sanitizer reports are bugs.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/kernel/btf_types.h"
#include "core/symbols/expr.h"
#include "fuzz/fuzz_util.h"

namespace {

using kwatch::core::kernel::BtfTypeRef;
using kwatch::core::kernel::KernelBtf;
using kwatch::core::symbols::ExprStep;

// Types visited per input: enough for the seeds, bounded for a huge hostile count.
constexpr uint32_t kMaxTypes = 256;

ExprStep Member(const std::string& name) {
  ExprStep s;
  s.kind = ExprStep::Kind::kMember;
  s.member = name;
  return s;
}

ExprStep Index(int64_t i) {
  ExprStep s;
  s.kind = ExprStep::Kind::kIndex;
  s.index = i;
  return s;
}

void Visit(const KernelBtf& btf, BtfTypeRef type) {
  (void)btf.TypeName(type);
  (void)btf.TypeSize(type);
  const BtfTypeRef stripped = btf.Strip(type);
  (void)btf.TypeName(stripped);
  (void)btf.Layout(type);
  const std::vector<std::string> members = btf.MemberNames(type);
  for (const std::string& m : members) {
    (void)btf.Walk(type, {Member(m)});
    (void)btf.Walk(type, {Member(m), Index(0)});
    (void)btf.Walk(type, {Member(m), Member(m)});
  }
  for (const int64_t i : {int64_t{0}, int64_t{1}, int64_t{-1}, INT64_MAX}) {
    (void)btf.Walk(type, {Index(i)});
  }
  (void)btf.Walk(type, {Member("x")});
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const kwatch::fuzz::MemFile file(data, size);
  auto btf = KernelBtf::Load(file.path());
  if (!btf.ok()) {
    return 0;
  }
  const KernelBtf& b = **btf;
  for (const char* name : {"int", "struct stats", "cache_t", "union value", "struct item",
                           "task_struct", "enum pid_type", "", "struct", "struct "}) {
    if (auto t = b.FindType(name); t.ok()) {
      Visit(b, *t);
    }
  }
  (void)b.VarType("g_stats");
  const uint32_t count = b.type_count();
  for (uint32_t id = 0; id <= count && id < kMaxTypes; ++id) {
    Visit(b, BtfTypeRef{id});
  }
  return 0;
}
