#include "core/kernel/btf_types.h"

#include <bpf/btf.h>

#include <array>
#include <cerrno>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "core/base/syscall_status.h"
#include "core/symbols/dwarf_types.h"  // kMaxExpandedElements, kMaxLayoutFields: the same rules
#include "core/symbols/type_layout.h"

namespace kwatch::core::kernel {

namespace {

// libbpf's fixed-layout view of one member, with its bitfield resolved to a storage unit
// (the same rule as core/dwarf_types.cc: the unit is the member type's size).
struct Member {
  std::string name;  // "" for anonymous members
  BtfTypeRef type;
  uint64_t offset = 0;
  uint64_t size = 0;
  uint32_t bit_offset = 0;
  uint32_t bit_size = 0;
};

// Nesting bound for walks over types: real kernel types nest a few dozen levels at most; a
// hostile BTF can make cycles (a const of itself, a struct holding itself).
constexpr int kMaxTypeDepth = 64;
// Anonymous members searched per lookup or layout (real kernels: a few hundred at most).
constexpr size_t kMaxAnonymousMembers = 4096;

// btf__name_by_offset returns nullptr for an offset outside the string section.
std::string NameOf(const struct btf* b, uint32_t off) {
  const char* name = btf__name_by_offset(b, off);
  return name != nullptr ? std::string(name) : std::string();
}

}  // namespace

absl::StatusOr<std::unique_ptr<KernelBtf>> KernelBtf::Load(const std::string& path) {
  errno = 0;
  struct btf* b = btf__parse(path.c_str(), nullptr);
  const int err = errno;
  if (b == nullptr) {  // libbpf 1.x: nullptr and errno on error
    return SyscallError(err != 0 ? err : EINVAL, absl::StrCat("btf__parse(", path, ")"),
                        "the kernel's BTF comes with CONFIG_DEBUG_INFO_BTF");
  }
  return std::unique_ptr<KernelBtf>(new KernelBtf(b, path));
}

KernelBtf::~KernelBtf() {
  btf__free(btf_);
}

uint32_t KernelBtf::type_count() const {
  return btf__type_cnt(btf_);
}

absl::StatusOr<BtfTypeRef> KernelBtf::FindType(absl::string_view name) const {
  struct Try {
    absl::string_view prefix;
    uint32_t kind = 0;
  };
  const std::array<Try, 4> kinds = {{{"struct ", BTF_KIND_STRUCT},
                                     {"union ", BTF_KIND_UNION},
                                     {"enum ", BTF_KIND_ENUM},
                                     {"enum ", static_cast<uint32_t>(BTF_KIND_ENUM64)}}};
  for (const Try& t : kinds) {
    if (absl::StartsWith(name, t.prefix)) {
      const std::string bare(absl::StripAsciiWhitespace(name.substr(t.prefix.size())));
      const int id = btf__find_by_name_kind(btf_, bare.c_str(), t.kind);
      if (id > 0) {
        return BtfTypeRef{static_cast<uint32_t>(id)};
      }
      if (t.kind != BTF_KIND_ENUM) {
        return absl::NotFoundError(
            absl::StrFormat("no type '%s' in the kernel's BTF (%s)", name, path_));
      }
    }
  }
  const std::string bare(name);
  constexpr std::array<uint32_t, 7> kKinds = {BTF_KIND_STRUCT, BTF_KIND_UNION,  BTF_KIND_TYPEDEF,
                                              BTF_KIND_ENUM,   BTF_KIND_ENUM64, BTF_KIND_INT,
                                              BTF_KIND_FLOAT};
  for (const uint32_t kind : kKinds) {
    const int id = btf__find_by_name_kind(btf_, bare.c_str(), kind);
    if (id > 0) {
      return BtfTypeRef{static_cast<uint32_t>(id)};
    }
  }
  return absl::NotFoundError(absl::StrFormat(
      "no struct, union, typedef, enum or base type '%s' in the kernel's BTF (%s)", name, path_));
}

std::optional<BtfTypeRef> KernelBtf::VarType(absl::string_view name) const {
  const std::string bare(name);
  const int id = btf__find_by_name_kind(btf_, bare.c_str(), BTF_KIND_VAR);
  if (id <= 0) {
    return std::nullopt;
  }
  return BtfTypeRef{btf__type_by_id(btf_, static_cast<uint32_t>(id))->type};
}

BtfTypeRef KernelBtf::Strip(BtfTypeRef type) const {
  for (int guard = 0; guard < 64 && type.id != 0; ++guard) {
    const btf_type* t = btf__type_by_id(btf_, type.id);
    if (t == nullptr || !(btf_is_typedef(t) || btf_is_mod(t))) {
      break;
    }
    type.id = t->type;
  }
  return type;
}

std::string KernelBtf::TypeName(BtfTypeRef type) const {
  return TypeNameAt(type, 0);
}

std::string KernelBtf::TypeNameAt(BtfTypeRef type, int depth) const {
  if (depth > kMaxTypeDepth) {
    return "?";
  }
  if (type.id == 0) {
    return "void";
  }
  const btf_type* t = btf__type_by_id(btf_, type.id);
  if (t == nullptr) {
    return "?";
  }
  const std::string name = NameOf(btf_, t->name_off);
  switch (btf_kind(t)) {
    case BTF_KIND_INT:
    case BTF_KIND_FLOAT:
    case BTF_KIND_TYPEDEF:
      return name.empty() ? "?" : name;  // a name outside the string section
    case BTF_KIND_STRUCT:
      return name.empty() ? "struct {...}" : absl::StrCat("struct ", name);
    case BTF_KIND_UNION:
      return name.empty() ? "union {...}" : absl::StrCat("union ", name);
    case BTF_KIND_ENUM:
    case BTF_KIND_ENUM64:
      return name.empty() ? "enum {...}" : absl::StrCat("enum ", name);
    case BTF_KIND_FWD:
      return absl::StrCat(btf_kflag(t) ? "union " : "struct ", name);
    case BTF_KIND_PTR: {
      const std::string pointee = TypeNameAt(BtfTypeRef{t->type}, depth + 1);
      return absl::StrCat(pointee, absl::EndsWith(pointee, "*") ? "*" : " *");
    }
    case BTF_KIND_CONST:
      return absl::StrCat("const ", TypeNameAt(BtfTypeRef{t->type}, depth + 1));
    case BTF_KIND_VOLATILE:
      return absl::StrCat("volatile ", TypeNameAt(BtfTypeRef{t->type}, depth + 1));
    case BTF_KIND_RESTRICT:
    case BTF_KIND_TYPE_TAG:
      return TypeNameAt(BtfTypeRef{t->type}, depth + 1);
    case BTF_KIND_ARRAY: {
      // Nested arrays are arrays of arrays: "int[3][4]".
      std::string dims;
      const btf_type* cur = t;
      BtfTypeRef elem{type.id};
      for (int n = 0; cur != nullptr && btf_is_array(cur) && n < kMaxTypeDepth; ++n) {
        const struct btf_array* a = btf_array(cur);
        absl::StrAppend(&dims, "[", a->nelems, "]");
        elem.id = a->type;
        cur = btf__type_by_id(btf_, elem.id);
      }
      return absl::StrCat(TypeNameAt(elem, depth + 1), dims);
    }
    case BTF_KIND_FUNC_PROTO:
    case BTF_KIND_FUNC:
      return "function";
    default:
      return name.empty() ? "?" : name;
  }
}

std::optional<uint64_t> KernelBtf::TypeSize(BtfTypeRef type) const {
  if (type.id == 0) {
    return std::nullopt;
  }
  const long long size = btf__resolve_size(btf_, type.id);
  if (size < 0) {
    return std::nullopt;
  }
  return static_cast<uint64_t>(size);
}

namespace {

std::vector<Member> MembersOf(const struct btf* b, const KernelBtf& kb, BtfTypeRef type) {
  std::vector<Member> out;
  const btf_type* t = btf__type_by_id(b, type.id);
  if (t == nullptr || !btf_is_composite(t)) {
    return out;
  }
  const struct btf_member* m = btf_members(t);
  const uint16_t n = btf_vlen(t);
  for (uint32_t i = 0; i < n; ++i, ++m) {
    Member mem;
    mem.name = NameOf(b, m->name_off);
    mem.type = BtfTypeRef{m->type};
    const uint32_t bit_off = btf_member_bit_offset(t, i);
    const uint32_t bits = btf_member_bitfield_size(t, i);
    uint64_t unit = kb.TypeSize(mem.type).value_or(1);
    if (unit == 0) {
      unit = 1;
    }
    if (bits == 0) {
      mem.offset = bit_off / 8;
      mem.size = kb.TypeSize(mem.type).value_or(0);
    } else {
      uint64_t offset = (bit_off / (unit * 8)) * unit;
      uint64_t first = bit_off - offset * 8;
      if (first + bits > unit * 8) {  // straddles units (packed structs)
        offset = bit_off / 8;
        first = bit_off % 8;
        unit = (first + bits + 7) / 8;
      }
      mem.offset = offset;
      mem.size = unit;
      mem.bit_offset = static_cast<uint32_t>(first);
      mem.bit_size = bits;
    }
    out.push_back(std::move(mem));
  }
  return out;
}

}  // namespace

std::vector<std::string> KernelBtf::MemberNames(BtfTypeRef type) const {
  size_t budget = kMaxAnonymousMembers;
  return MemberNamesAt(type, 0, budget);
}

std::vector<std::string> KernelBtf::MemberNamesAt(BtfTypeRef type, int depth,
                                                  size_t& budget) const {
  std::vector<std::string> names;
  if (depth > kMaxTypeDepth) {
    return names;
  }
  for (const Member& m : MembersOf(btf_, *this, Strip(type))) {
    if (!m.name.empty()) {
      names.push_back(m.name);
    } else if (budget > 0) {
      --budget;
      for (std::string& n : MemberNamesAt(m.type, depth + 1, budget)) {
        names.push_back(std::move(n));
      }
    }
  }
  return names;
}

absl::StatusOr<BtfMemberRef> KernelBtf::Walk(BtfTypeRef type,
                                             const std::vector<symbols::ExprStep>& steps) const {
  BtfMemberRef ref;
  ref.type = type;
  ref.size = TypeSize(type).value_or(0);
  for (const symbols::ExprStep& step : steps) {
    const BtfTypeRef s = Strip(ref.type);
    const btf_type* t = btf__type_by_id(btf_, s.id);
    switch (step.kind) {
      case symbols::ExprStep::Kind::kArrow:
      case symbols::ExprStep::Kind::kDeref:
        return absl::InvalidArgumentError(absl::StrFormat(
            "'%s' at column %d would follow a kernel pointer: kwatch does not read kernel "
            "memory; watch the object itself (its member path with '.')",
            step.kind == symbols::ExprStep::Kind::kArrow ? "->" : "*", step.column + 1));
      case symbols::ExprStep::Kind::kIndex: {
        if (t == nullptr || !btf_is_array(t)) {
          return absl::InvalidArgumentError(
              absl::StrFormat("'[%d]' at column %d: '%s%s' is a %s, not an array", step.index,
                              step.column + 1, "", ref.path, TypeName(ref.type)));
        }
        const struct btf_array* a = btf_array(t);
        if (step.index < 0 || static_cast<uint64_t>(step.index) >= a->nelems) {
          return absl::InvalidArgumentError(
              absl::StrFormat("index %d at column %d is out of bounds for %s (%d elements)",
                              step.index, step.column + 1, TypeName(ref.type), a->nelems));
        }
        const BtfTypeRef elem{a->type};
        const uint64_t esize = TypeSize(elem).value_or(0);
        ref.offset += static_cast<uint64_t>(step.index) * esize;
        ref.path = absl::StrCat(ref.path, "[", step.index, "]");
        ref.type = elem;
        ref.size = esize;
        ref.bit_size = 0;
        break;
      }
      case symbols::ExprStep::Kind::kMember: {
        if (t == nullptr || !btf_is_composite(t)) {
          return absl::InvalidArgumentError(
              absl::StrFormat("'.%s' at column %d: %s is not a struct or union", step.member,
                              step.column + 1, TypeName(ref.type)));
        }
        // Search named members, then through anonymous members, accumulating offsets.
        std::optional<Member> found;
        std::vector<std::pair<BtfTypeRef, uint64_t>> work = {{s, 0}};
        for (size_t visited = 0; !work.empty() && !found.has_value() && visited < 4096; ++visited) {
          const auto [agg, base] = work.front();
          work.erase(work.begin());
          for (const Member& m : MembersOf(btf_, *this, Strip(agg))) {
            if (m.name == step.member) {
              found = m;
              found->offset += base;
              break;
            }
            if (m.name.empty() && work.size() < kMaxAnonymousMembers) {
              work.emplace_back(m.type, base + m.offset);
            }
          }
        }
        if (!found.has_value()) {
          return absl::InvalidArgumentError(absl::StrFormat(
              "%s has no member '%s' (column %d); its members: %s", TypeName(ref.type), step.member,
              step.column + 1, absl::StrJoin(MemberNames(s), ", ")));
        }
        ref.offset += found->offset;
        ref.path = absl::StrCat(ref.path, ".", step.member);
        ref.type = found->type;
        ref.size = found->size;
        ref.bit_size = found->bit_size;
        break;
      }
    }
  }
  ref.type_name = TypeName(ref.type);
  return ref;
}

namespace {

// Mirrors core/dwarf_types.cc's Flattener over BTF.
class BtfFlattener {
 public:
  BtfFlattener(const struct btf* b, const KernelBtf& kb, std::vector<symbols::FieldLayout>* out)
      : btf_(b), kb_(kb), out_(out) {}

  bool Expandable(BtfTypeRef type) const {
    const BtfTypeRef s = kb_.Strip(type);
    const btf_type* t = btf__type_by_id(btf_, s.id);
    if (t == nullptr) {
      return false;
    }
    if (btf_is_composite(t)) {
      return btf_vlen(t) > 0;
    }
    if (btf_is_array(t)) {
      const struct btf_array* a = btf_array(t);
      if (a->nelems == 0 || a->nelems > symbols::kMaxExpandedElements) {
        return false;
      }
      const BtfTypeRef elem = kb_.Strip(BtfTypeRef{a->type});
      const btf_type* et = btf__type_by_id(btf_, elem.id);
      const bool is_char = et != nullptr && btf_is_int(et) && et->size == 1;
      return !is_char && kb_.TypeSize(elem).has_value();
    }
    return false;
  }

  size_t Count(BtfTypeRef type, int guard = 0) {
    if (guard == 0) {
      count_budget_ = kMaxAnonymousMembers;
    }
    if (guard > kMaxTypeDepth || !Expandable(type)) {
      return 0;
    }
    const BtfTypeRef s = kb_.Strip(type);
    const btf_type* t = btf__type_by_id(btf_, s.id);
    size_t n = 0;
    if (btf_is_composite(t)) {
      for (const Member& m : MembersOf(btf_, kb_, s)) {
        if (m.name.empty()) {
          if (count_budget_ == 0) {
            continue;  // a hostile BTF's self-nested anonymous members: stop counting them
          }
          --count_budget_;
          n += (IsUnion(m.type) ? 1 : 0) + Count(m.type, guard + 1);  // an anonymous union's row
        } else {
          n += 1 + (m.bit_size == 0 ? Count(m.type, guard + 1) : 0);
        }
        if (n > symbols::kMaxLayoutFields) {
          return n;
        }
      }
      return n;
    }
    const struct btf_array* a = btf_array(t);
    return static_cast<size_t>(a->nelems) * (1 + Count(BtfTypeRef{a->type}, guard + 1));
  }

  void FlattenInto(BtfTypeRef type, uint64_t base, const std::string& path, int depth,
                   int guard = 0) {
    if (guard > kMaxTypeDepth) {
      return;
    }
    const BtfTypeRef s = kb_.Strip(type);
    const btf_type* t = btf__type_by_id(btf_, s.id);
    if (t == nullptr) {
      return;
    }
    if (btf_is_composite(t)) {
      for (const Member& m : MembersOf(btf_, kb_, s)) {
        if (m.name.empty()) {
          const btf_type* mt = btf__type_by_id(btf_, kb_.Strip(m.type).id);
          if (mt != nullptr && btf_is_composite(mt) && flatten_budget_ > 0) {
            --flatten_budget_;
            if (btf_is_union(mt)) {
              AddAnonymousUnion(m, base, path, depth, guard);
            } else {
              FlattenInto(m.type, base + m.offset, path, depth, guard + 1);  // anonymous struct
            }
          }
          continue;  // unnamed bitfield padding
        }
        symbols::FieldLayout f;
        f.path = absl::StrCat(path, ".", m.name);
        f.type_name = kb_.TypeName(m.type);
        f.offset = base + m.offset;
        f.size = m.size;
        f.bit_offset = m.bit_offset;
        f.bit_size = m.bit_size;
        f.depth = depth;
        Add(std::move(f), m.bit_size == 0 ? std::optional<BtfTypeRef>(m.type) : std::nullopt);
      }
      return;
    }
    if (btf_is_array(t)) {
      const struct btf_array* a = btf_array(t);
      const BtfTypeRef elem{a->type};
      const uint64_t esize = kb_.TypeSize(elem).value_or(0);
      const std::string elem_name = kb_.TypeName(elem);
      for (uint64_t i = 0; i < a->nelems; ++i) {
        symbols::FieldLayout f;
        f.path = absl::StrCat(path, "[", i, "]");
        f.type_name = elem_name;
        f.offset = base + i * esize;
        f.size = esize;
        f.depth = depth;
        Add(std::move(f), elem);
      }
    }
  }

  bool IsUnion(BtfTypeRef type) const {
    const btf_type* t = btf__type_by_id(btf_, kb_.Strip(type).id);
    return t != nullptr && btf_is_union(t);
  }

 private:
  // An anonymous union member: a row of its own, ".{a,b}" after the parent's path, then its
  // members under the parent's path, one level deeper.
  void AddAnonymousUnion(const Member& m, uint64_t base, const std::string& path, int depth,
                         int guard) {
    std::vector<std::string> names;
    for (const Member& u : MembersOf(btf_, kb_, kb_.Strip(m.type))) {
      names.push_back(u.name.empty() ? "{...}" : u.name);
    }
    symbols::FieldLayout f;
    f.path = absl::StrCat(path, ".", symbols::AnonymousUnionName(names));
    f.type_name = kb_.TypeName(m.type);
    f.offset = base + m.offset;
    f.size = m.size;
    f.depth = depth;
    f.is_union = true;
    const bool expand = out_->size() + 1 + Count(m.type) <= symbols::kMaxLayoutFields;
    f.is_leaf = !expand;
    out_->push_back(std::move(f));
    if (expand) {
      FlattenInto(m.type, base + m.offset, path, depth + 1, guard + 1);
    }
  }

  void Add(symbols::FieldLayout f, std::optional<BtfTypeRef> type) {
    const bool expand = type.has_value() && Expandable(*type) &&
                        out_->size() + 1 + Count(*type) <= symbols::kMaxLayoutFields;
    f.is_leaf = !expand;
    f.is_union = type.has_value() && IsUnion(*type);
    const uint64_t offset = f.offset;
    const std::string path = f.path;
    const int depth = f.depth;
    out_->push_back(std::move(f));
    if (expand) {
      FlattenInto(*type, offset, path, depth + 1, depth + 1);
    }
  }

  const struct btf* btf_;
  const KernelBtf& kb_;
  std::vector<symbols::FieldLayout>* out_;
  size_t count_budget_ = kMaxAnonymousMembers;    // per top-level Count()
  size_t flatten_budget_ = kMaxAnonymousMembers;  // per layout
};

}  // namespace

symbols::TypeLayout KernelBtf::Layout(BtfTypeRef type) const {
  symbols::TypeLayout layout;
  layout.type_name = TypeName(type);
  layout.size = TypeSize(type).value_or(0);
  BtfFlattener flattener(btf_, *this, &layout.fields);
  if (flattener.Expandable(type) &&
      (flattener.IsUnion(type) ? 1 : 0) + flattener.Count(type) <= symbols::kMaxLayoutFields) {
    const int depth = flattener.IsUnion(type) ? layout.AddWholeUnionRow() : 0;
    flattener.FlattenInto(type, 0, "", depth);
  }
  if (layout.fields.empty()) {
    symbols::FieldLayout f;
    f.type_name = layout.type_name;
    f.size = layout.size;
    layout.fields.push_back(std::move(f));
  }
  return layout;
}

}  // namespace kwatch::core::kernel
