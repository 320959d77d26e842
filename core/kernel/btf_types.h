#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/symbols/expr.h"
#include "core/symbols/type_layout.h"

struct btf;  // libbpf

namespace kwatch::core::kernel {

// A BTF type id of one KernelBtf (0 is void).
struct BtfTypeRef {
  uint32_t id = 0;
};

// The place a chain of '.member' / '[index]' steps leads to inside an object.
struct BtfMemberRef {
  std::string path;       // ".se.load.weight", "[3].prio" (relative to the object)
  uint64_t offset = 0;    // bytes from the object's start
  uint64_t size = 0;      // bytes (for a bitfield: its storage unit)
  uint32_t bit_size = 0;  // 0 unless a bitfield
  BtfTypeRef type;
  std::string type_name;  // C spelling
};

// The kernel's types from BTF (/sys/kernel/btf/vmlinux), through libbpf (btf__parse). Owns
// the parsed BTF; immutable after Load, so const calls are safe from several threads.
class KernelBtf {
 public:
  // Parses `path` (raw BTF or an ELF with a .BTF section). The error names libbpf's call,
  // the path and the errno text.
  static absl::StatusOr<std::unique_ptr<KernelBtf>> Load(
      const std::string& path = "/sys/kernel/btf/vmlinux");

  ~KernelBtf();
  KernelBtf(const KernelBtf&) = delete;
  KernelBtf& operator=(const KernelBtf&) = delete;

  const std::string& path() const { return path_; }
  uint32_t type_count() const;

  // A named type: "struct task_struct", "union bpf_attr", "enum pid_type", or a bare name
  // ("task_struct", "pid_t") looked up as struct, union, typedef, enum and base type in
  // that order. NotFound says which kinds were searched.
  absl::StatusOr<BtfTypeRef> FindType(absl::string_view name) const;

  // The type of a variable that BTF describes (a BTF_KIND_VAR: the kernel's BTF lists only
  // per-CPU variables unless pahole encoded global variables too).
  std::optional<BtfTypeRef> VarType(absl::string_view name) const;

  // C spelling: "int", "unsigned long", "struct list_head *", "char[16]", "pid_t".
  std::string TypeName(BtfTypeRef type) const;

  // Size in bytes (nullopt for void, functions and incomplete types).
  std::optional<uint64_t> TypeSize(BtfTypeRef type) const;

  // Follows typedefs and qualifiers (const, volatile, restrict, type tags).
  BtfTypeRef Strip(BtfTypeRef type) const;

  // Member names of a struct/union reachable with '.', in layout order (through anonymous
  // members); empty for other types.
  std::vector<std::string> MemberNames(BtfTypeRef type) const;

  // Applies `steps` (kMember and kIndex only) starting from an object of type `type`.
  // InvalidArgument for an unknown member (listing the members), an index out of bounds,
  // '.' on a non-aggregate, or '->' / '*' (a kernel pointer would have to be read).
  absl::StatusOr<BtfMemberRef> Walk(BtfTypeRef type,
                                    const std::vector<symbols::ExprStep>& steps) const;

  // Flattened layout, with the same rules as core::FlattenLayout for DWARF (parents before
  // members, arrays of up to kMaxExpandedElements elements, char arrays whole, at most
  // kMaxLayoutFields fields; a scalar is one field with path "").
  symbols::TypeLayout Layout(BtfTypeRef type) const;

 private:
  KernelBtf(struct btf* btf, std::string path) : btf_(btf), path_(std::move(path)) {}
  // The recursive parts, bounded in depth (a hostile BTF can make type cycles).
  std::string TypeNameAt(BtfTypeRef type, int depth) const;
  // `budget`: anonymous members still to be searched (a hostile BTF can nest a struct's own
  // type as several anonymous members of itself: without it the search is exponential).
  std::vector<std::string> MemberNamesAt(BtfTypeRef type, int depth, size_t& budget) const;

  struct btf* btf_;
  std::string path_;
};

}  // namespace kwatch::core::kernel
