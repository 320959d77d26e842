#include "core/symbols/dwarf_types.h"

#include <dwarf.h>

#include <array>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/symbols/type_names.h"

namespace kwatch::core::symbols {
namespace {

constexpr int kMaxTypeDepth = 64;

bool IsQualifierOrTypedef(int tag) {
  return tag == DW_TAG_typedef || tag == DW_TAG_const_type || tag == DW_TAG_volatile_type ||
         tag == DW_TAG_restrict_type || tag == DW_TAG_atomic_type;
}

bool IsAggregateTag(int tag) {
  return tag == DW_TAG_structure_type || tag == DW_TAG_union_type || tag == DW_TAG_class_type;
}

bool IsCxx(Dwarf_Die die) {
  Dwarf_Die cu;
  if (dwarf_diecu(&die, &cu, nullptr, nullptr) == nullptr) {
    return false;
  }
  const int lang = dwarf_srclang(&cu);
  return lang == DW_LANG_C_plus_plus || lang == DW_LANG_C_plus_plus_03 ||
         lang == DW_LANG_C_plus_plus_11 || lang == DW_LANG_C_plus_plus_14;
}

std::optional<uint64_t> UdataAttr(Dwarf_Die die, unsigned int name) {
  Dwarf_Attribute attr;
  if (dwarf_attr_integrate(&die, name, &attr) == nullptr) {
    return std::nullopt;
  }
  Dwarf_Word value = 0;
  if (dwarf_formudata(&attr, &value) != 0) {
    return std::nullopt;
  }
  return value;
}

std::string Join(std::string base, const std::string& declarator) {
  if (declarator.empty()) {
    return base;
  }
  if (declarator[0] == '[') {
    return base + declarator;
  }
  return absl::StrCat(base, " ", declarator);
}

// GCC spells base types "long unsigned int"; people write "unsigned long".
std::string CBaseName(const std::string& name) {
  static constexpr std::array<std::pair<const char*, const char*>, 7> kNames = {{
      {"long int", "long"},
      {"long unsigned int", "unsigned long"},
      {"short int", "short"},
      {"short unsigned int", "unsigned short"},
      {"long long int", "long long"},
      {"long long unsigned int", "unsigned long long"},
      {"__int128 unsigned", "unsigned __int128"},
  }};
  for (const auto& [gcc, c] : kNames) {
    if (name == gcc) {
      return c;
    }
  }
  return name.empty() ? "?" : name;
}

std::string DimsText(Dwarf_Die array, int skip) {
  std::string out;
  const auto dims = ArrayDims(array);
  for (auto i = static_cast<size_t>(skip); i < dims.size(); ++i) {
    if (dims[i].has_value()) {
      absl::StrAppend(&out, "[", *dims[i], "]");
    } else {
      absl::StrAppend(&out, "[]");
    }
  }
  if (dims.empty()) {
    out = "[]";
  }
  return out;
}

std::string NameWithDeclarator(Dwarf_Die die, int skip_dims, const std::string& declarator,
                               int depth) {
  if (depth > kMaxTypeDepth) {
    return Join("?", declarator);
  }
  const int tag = dwarf_tag(&die);
  switch (tag) {
    case DW_TAG_base_type:
      return Join(CBaseName(DieName(die)), declarator);
    case DW_TAG_unspecified_type:
    case DW_TAG_typedef: {
      std::string name = DieName(die);
      return Join(name.empty() ? "?" : name, declarator);
    }
    case DW_TAG_structure_type:
    case DW_TAG_union_type:
    case DW_TAG_class_type:
    case DW_TAG_enumeration_type: {
      std::string name = DieName(die);
      const char* keyword = tag == DW_TAG_structure_type ? "struct"
                            : tag == DW_TAG_union_type   ? "union"
                            : tag == DW_TAG_class_type   ? "class"
                                                         : "enum";
      if (name.empty()) {
        return Join(absl::StrCat(keyword, " {...}"), declarator);
      }
      return Join(IsCxx(die) ? name : absl::StrCat(keyword, " ", name), declarator);
    }
    case DW_TAG_pointer_type:
    case DW_TAG_reference_type:
    case DW_TAG_rvalue_reference_type: {
      const char* sym = tag == DW_TAG_pointer_type     ? "*"
                        : tag == DW_TAG_reference_type ? "&"
                                                       : "&&";
      std::string d = absl::StrCat(sym, declarator);
      const std::optional<Dwarf_Die> target = TypeOf(die);
      if (!target.has_value()) {
        return Join("void", d);
      }
      Dwarf_Die t = *target;
      const int ttag = dwarf_tag(&t);
      if (ttag == DW_TAG_array_type || ttag == DW_TAG_subroutine_type) {
        d = absl::StrCat("(", d, ")");
      }
      return NameWithDeclarator(t, 0, d, depth + 1);
    }
    case DW_TAG_const_type:
    case DW_TAG_volatile_type:
    case DW_TAG_restrict_type:
    case DW_TAG_atomic_type: {
      const char* qual = tag == DW_TAG_const_type      ? "const"
                         : tag == DW_TAG_volatile_type ? "volatile"
                         : tag == DW_TAG_restrict_type ? "restrict"
                                                       : "_Atomic";
      const std::optional<Dwarf_Die> target = TypeOf(die);
      if (!target.has_value()) {
        return Join(absl::StrCat(qual, " void"), declarator);
      }
      Dwarf_Die t = *target;
      if (dwarf_tag(&t) == DW_TAG_pointer_type) {
        // `char *const p`: the qualifier binds to the declarator.
        return NameWithDeclarator(
            t, 0, declarator.empty() ? std::string(qual) : absl::StrCat(qual, " ", declarator),
            depth + 1);
      }
      // GCC qualifies both a qualified array and its elements (`volatile struct row a[64]`
      // is volatile -> array -> volatile -> struct): say the qualifier once.
      std::string inner = NameWithDeclarator(t, 0, declarator, depth + 1);
      if (absl::StartsWith(inner, absl::StrCat(qual, " "))) {
        return inner;
      }
      return absl::StrCat(qual, " ", inner);
    }
    case DW_TAG_array_type: {
      const std::string d = absl::StrCat(declarator, DimsText(die, skip_dims));
      const std::optional<Dwarf_Die> elem = TypeOf(die);
      if (!elem.has_value()) {
        return Join("void", d);
      }
      return NameWithDeclarator(*elem, 0, d, depth + 1);
    }
    case DW_TAG_subroutine_type: {
      std::vector<std::string> params;
      Dwarf_Die child;
      if (dwarf_child(&die, &child) == 0) {
        do {
          const int ctag = dwarf_tag(&child);
          if (ctag == DW_TAG_formal_parameter) {
            const std::optional<Dwarf_Die> pt = TypeOf(child);
            params.push_back(pt.has_value() ? NameWithDeclarator(*pt, 0, "", depth + 1) : "?");
          } else if (ctag == DW_TAG_unspecified_parameters) {
            params.emplace_back("...");
          }
        } while (dwarf_siblingof(&child, &child) == 0);
      }
      if (params.empty() && !IsCxx(die)) {
        params.emplace_back("void");
      }
      const std::string d = absl::StrCat(declarator, "(", absl::StrJoin(params, ", "), ")");
      const std::optional<Dwarf_Die> ret = TypeOf(die);
      if (!ret.has_value()) {
        return Join("void", d);
      }
      return NameWithDeclarator(*ret, 0, d, depth + 1);
    }
    default:
      return Join("?", declarator);
  }
}

bool IsCharType(const TypeRef& type) {
  const TypeRef s = StripType(type);
  Dwarf_Die die = s.die;
  if (dwarf_tag(&die) != DW_TAG_base_type) {
    return false;
  }
  const std::optional<uint64_t> enc = UdataAttr(die, DW_AT_encoding);
  const std::optional<uint64_t> size = UdataAttr(die, DW_AT_byte_size);
  return enc.has_value() && size.value_or(0) == 1 &&
         (*enc == DW_ATE_signed_char || *enc == DW_ATE_unsigned_char || *enc == DW_ATE_UTF);
}

std::optional<uint64_t> MemberLocation(Dwarf_Die member) {
  Dwarf_Attribute attr;
  if (dwarf_attr_integrate(&member, DW_AT_data_member_location, &attr) == nullptr) {
    return 0;  // union members, and DWARF 5 bitfields (DW_AT_data_bit_offset)
  }
  Dwarf_Word value = 0;
  if (dwarf_formudata(&attr, &value) == 0) {
    return value;
  }
  Dwarf_Op* ops = nullptr;
  size_t nops = 0;
  if (dwarf_getlocation(&attr, &ops, &nops) == 0 && nops == 1 && ops[0].atom == DW_OP_plus_uconst) {
    return ops[0].number;
  }
  return std::nullopt;
}

// Whether FlattenInto would list members or elements of `type`.
bool Expandable(const TypeRef& type) {
  const TypeRef s = StripType(type);
  Dwarf_Die die = s.die;
  const int tag = dwarf_tag(&die);
  if (IsAggregateTag(tag)) {
    return !Members(die).empty();
  }
  if (tag == DW_TAG_array_type) {
    const auto dims = ArrayDims(die);
    if (static_cast<size_t>(s.skip_dims) >= dims.size() || !dims[s.skip_dims].has_value()) {
      return false;
    }
    const uint64_t n = *dims[s.skip_dims];
    if (n == 0 || n > kMaxExpandedElements) {
      return false;
    }
    const std::optional<TypeRef> elem = ArrayElement(s);
    return elem.has_value() && !IsCharType(*elem) && TypeSize(*elem).has_value();
  }
  return false;
}

bool IsUnion(const TypeRef& type) {
  Dwarf_Die die = StripType(type).die;
  return dwarf_tag(&die) == DW_TAG_union_type;
}

class Flattener {
 public:
  explicit Flattener(std::vector<FieldLayout>* out) : out_(out) {}

  // Fields FlattenInto(type) would add, capped a little above kMaxLayoutFields.
  size_t Count(const TypeRef& type) const {
    if (!Expandable(type)) {
      return 0;
    }
    const TypeRef s = StripType(type);
    Dwarf_Die die = s.die;
    size_t n = 0;
    if (IsAggregateTag(dwarf_tag(&die))) {
      for (const MemberInfo& m : Members(die)) {
        if (m.name.empty()) {
          n += m.has_type ? (IsUnion(m.type) ? 1 : 0) + Count(m.type) : 0;  // a union row
        } else {
          n += 1 + (m.bit_size == 0 && m.has_type ? Count(m.type) : 0);
        }
        if (n > kMaxLayoutFields) {
          return n;
        }
      }
      return n;
    }
    const uint64_t count = *ArrayDims(die)[s.skip_dims];
    const std::optional<TypeRef> elem = ArrayElement(s);
    const size_t per = 1 + Count(*elem);
    return static_cast<size_t>(count) * per;
  }

  void FlattenInto(const TypeRef& type, uint64_t base, const std::string& path, int depth) {
    const TypeRef s = StripType(type);
    Dwarf_Die die = s.die;
    const int tag = dwarf_tag(&die);
    if (IsAggregateTag(tag)) {
      for (const MemberInfo& m : Members(die)) {
        if (m.name.empty()) {
          Dwarf_Die mt = StripType(m.type).die;
          if (m.has_type && dwarf_tag(&mt) == DW_TAG_union_type) {
            AddAnonymousUnion(m, base, path, depth);
          } else if (m.has_type && IsAggregateTag(dwarf_tag(&mt))) {
            FlattenInto(m.type, base + m.offset, path, depth);  // anonymous struct, base class
          }
          continue;  // unnamed bitfield padding
        }
        FieldLayout f;
        f.path = absl::StrCat(path, ".", m.name);
        f.type_name = m.has_type ? TypeName(m.type) : "?";
        f.offset = base + m.offset;
        f.size = m.size;
        f.bit_offset = m.bit_offset;
        f.bit_size = m.bit_size;
        f.depth = depth;
        Add(std::move(f), m.bit_size == 0 && m.has_type ? &m.type : nullptr);
      }
      return;
    }
    if (tag == DW_TAG_array_type) {
      const uint64_t count = *ArrayDims(die)[s.skip_dims];
      const TypeRef elem = *ArrayElement(s);
      const uint64_t esize = TypeSize(elem).value_or(0);
      const std::string elem_name = TypeName(elem);
      for (uint64_t i = 0; i < count; ++i) {
        FieldLayout f;
        f.path = absl::StrCat(path, "[", i, "]");
        f.type_name = elem_name;
        f.offset = base + i * esize;
        f.size = esize;
        f.depth = depth;
        Add(std::move(f), &elem);
      }
    }
  }

 private:
  // An anonymous union member: a row of its own, ".{a,b}" after the parent's path, then its
  // members under the parent's path, one level deeper.
  void AddAnonymousUnion(const MemberInfo& m, uint64_t base, const std::string& path, int depth) {
    Dwarf_Die die = StripType(m.type).die;
    std::vector<std::string> names;
    for (const MemberInfo& u : Members(die)) {
      names.push_back(u.name.empty() ? "{...}" : u.name);
    }
    FieldLayout f;
    f.path = absl::StrCat(path, ".", AnonymousUnionName(names));
    f.type_name = TypeName(m.type);
    f.offset = base + m.offset;
    f.size = m.size;
    f.depth = depth;
    f.is_union = true;
    const bool expand = out_->size() + 1 + Count(m.type) <= kMaxLayoutFields;
    f.is_leaf = !expand;
    out_->push_back(std::move(f));
    if (expand) {
      FlattenInto(m.type, base + m.offset, path, depth + 1);
    }
  }

  // Appends `f`, then its members when `type` is expandable and the budget allows.
  void Add(FieldLayout f, const TypeRef* type) {
    const bool expand =
        type != nullptr && Expandable(*type) && out_->size() + 1 + Count(*type) <= kMaxLayoutFields;
    f.is_leaf = !expand;
    f.is_union = type != nullptr && IsUnion(*type);
    const uint64_t offset = f.offset;
    const std::string path = f.path;
    const int depth = f.depth;
    out_->push_back(std::move(f));
    if (expand) {
      FlattenInto(*type, offset, path, depth + 1);
    }
  }

  std::vector<FieldLayout>* out_;
};

}  // namespace

std::optional<Dwarf_Die> TypeOf(Dwarf_Die die) {
  Dwarf_Attribute attr;
  if (dwarf_attr_integrate(&die, DW_AT_type, &attr) == nullptr) {
    return std::nullopt;
  }
  Dwarf_Die result;
  if (dwarf_formref_die(&attr, &result) == nullptr) {
    return std::nullopt;
  }
  return result;
}

std::string DieName(Dwarf_Die die) {
  Dwarf_Attribute attr;
  if (dwarf_attr_integrate(&die, DW_AT_name, &attr) == nullptr) {
    return "";
  }
  const char* name = dwarf_formstring(&attr);
  return name == nullptr ? "" : name;
}

namespace {

// Complete definitions of the structs, unions and classes a unit only declares (`struct
// ZSTD_CCtx_s;` behind most C library handles), found as gdb finds them: by tag and name in
// the other units of the same debug info; and the named types of the debug info (for casts).
// Units are scanned lazily, in order, until the name turns up, and every type seen on the way
// is remembered (first definition of a name wins, as in gdb); a Dwarf is forgotten with its
// Dwfl (DwflDeleter).
class Definitions {
 public:
  static Definitions& Get() {
    static auto* const kDefinitions = new Definitions();
    return *kDefinitions;
  }

  std::optional<Dwarf_Die> Find(Dwarf_Die declaration) {
    const std::string name = DieName(declaration);
    Dwarf* dwarf = dwarf_cu_getdwarf(declaration.cu);
    if (name.empty() || dwarf == nullptr) {
      return std::nullopt;
    }
    const Key key{dwarf_tag(&declaration), name};
    const std::lock_guard<std::mutex> lock(mu_);
    Scan& scan = scans_[dwarf];
    while (true) {
      if (const auto it = scan.found.find(key); it != scan.found.end()) {
        return it->second;
      }
      if (scan.done) {
        return std::nullopt;
      }
      ScanNextUnit(dwarf, &scan);
    }
  }

  // A named type by its NamedTypeTag and canonical (qualified) name.
  std::optional<Dwarf_Die> FindNamed(Dwarf* dwarf, int tag, const std::string& name,
                                     bool declarations) {
    const Key key{NamedTypeTag(tag), name};
    const std::lock_guard<std::mutex> lock(mu_);
    Scan& scan = scans_[dwarf];
    while (true) {
      if (const auto it = scan.named.find(key); it != scan.named.end()) {
        return it->second;
      }
      if (scan.done) {
        if (const auto it = scan.declared.find(key); declarations && it != scan.declared.end()) {
          return it->second;
        }
        return std::nullopt;
      }
      ScanNextUnit(dwarf, &scan);
    }
  }

  std::vector<std::string> Names(Dwarf* dwarf, int tag) {
    const std::lock_guard<std::mutex> lock(mu_);
    Scan& scan = scans_[dwarf];
    while (!scan.done) {
      ScanNextUnit(dwarf, &scan);
    }
    std::vector<std::string> names;
    for (const auto* map : {&scan.named, &scan.declared}) {
      for (const auto& [key, die] : *map) {
        if (key.first == NamedTypeTag(tag)) {
          names.push_back(key.second);
        }
      }
    }
    return names;
  }

  void Forget(Dwarf* dwarf) {
    const std::lock_guard<std::mutex> lock(mu_);
    scans_.erase(dwarf);
  }

 private:
  using Key = std::pair<int, std::string>;
  struct Scan {
    Dwarf_CU* cu = nullptr;  // the last unit scanned
    bool done = false;
    absl::flat_hash_map<Key, Dwarf_Die> found;     // complete aggregates by tag and DW_AT_name
    absl::flat_hash_map<Key, Dwarf_Die> named;     // types by NamedTypeTag and canonical name
    absl::flat_hash_map<Key, Dwarf_Die> declared;  // aggregates only declared, the same way
  };

  // A class is found as a struct (C++ spells either for both).
  static int NamedTypeTag(int tag) {
    return tag == DW_TAG_class_type ? DW_TAG_structure_type : tag;
  }

  // `nested`: `parent` is a class (its types are named only with their class).
  static void Remember(Dwarf_Die parent, int depth, const std::string& prefix, bool cxx,
                       bool nested, Scan* scan) {
    Dwarf_Die child;
    if (depth > 8 || dwarf_child(&parent, &child) != 0) {
      return;
    }
    do {
      const int tag = dwarf_tag(&child);
      if (tag == DW_TAG_namespace) {
        const std::string name = DieName(child);
        Remember(child, depth + 1, name.empty() ? prefix : absl::StrCat(prefix, name, "::"), cxx,
                 nested, scan);
        continue;
      }
      if (!IsAggregateTag(tag) && tag != DW_TAG_enumeration_type && tag != DW_TAG_typedef &&
          tag != DW_TAG_base_type) {
        continue;
      }
      const std::string name = DieName(child);
      if (name.empty()) {
        continue;
      }
      const Key named{NamedTypeTag(tag), CanonicalTypeName(absl::StrCat(prefix, name))};
      if (!IsAggregateTag(tag)) {
        scan->named.try_emplace(named, child);
        continue;
      }
      if (dwarf_hasattr(&child, DW_AT_declaration) == 0 &&
          dwarf_hasattr(&child, DW_AT_byte_size) != 0) {
        if (!nested) {
          scan->found.try_emplace(Key{tag, name}, child);
        }
        scan->named.try_emplace(named, child);
      } else {
        scan->declared.try_emplace(named, child);
      }
      if (cxx) {
        Remember(child, depth + 1, absl::StrCat(named.second, "::"), cxx, true, scan);
      }
    } while (dwarf_siblingof(&child, &child) == 0);
  }

  static void ScanNextUnit(Dwarf* dwarf, Scan* scan) {
    Dwarf_CU* next = nullptr;
    Dwarf_Half version = 0;
    uint8_t unit_type = 0;
    Dwarf_Die cudie;
    if (dwarf_get_units(dwarf, scan->cu, &next, &version, &unit_type, &cudie, nullptr) != 0) {
      scan->done = true;
      return;
    }
    scan->cu = next;
    Remember(cudie, 0, "", IsCxx(cudie), false, scan);
  }

  std::mutex mu_;
  absl::flat_hash_map<Dwarf*, Scan> scans_;
};

// The definition of an aggregate `die` only declares: through its type signature (type
// units), else by name; `die` itself when it is complete or nothing defines it.
Dwarf_Die CompleteAggregate(Dwarf_Die die) {
  if (!IsAggregateTag(dwarf_tag(&die)) || dwarf_hasattr(&die, DW_AT_declaration) == 0) {
    return die;
  }
  Dwarf_Attribute signature;
  Dwarf_Die defined;
  if (dwarf_attr(&die, DW_AT_signature, &signature) != nullptr &&
      dwarf_formref_die(&signature, &defined) != nullptr &&
      dwarf_hasattr(&defined, DW_AT_declaration) == 0) {
    return defined;
  }
  return Definitions::Get().Find(die).value_or(die);
}

int ForgetModule(Dwfl_Module* module, void** /*userdata*/, const char* /*name*/,
                 Dwarf_Addr /*start*/, void* /*arg*/) {
  Dwarf_Addr dwbias = 0;
  dwfl_module_info(module, nullptr, nullptr, nullptr, &dwbias, nullptr, nullptr, nullptr);
  if (dwbias != static_cast<Dwarf_Addr>(-1)) {  // its DWARF was loaded: it may be remembered
    Dwarf_Addr bias = 0;
    if (Dwarf* dwarf = dwfl_module_getdwarf(module, &bias); dwarf != nullptr) {
      Definitions::Get().Forget(dwarf);
      if (Dwarf* alt = dwarf_getalt(dwarf); alt != nullptr) {
        Definitions::Get().Forget(alt);
      }
    }
  }
  return DWARF_CB_OK;
}

}  // namespace

void DwflDeleter::operator()(Dwfl* dwfl) const {
  dwfl_getmodules(dwfl, ForgetModule, nullptr, 0);
  dwfl_end(dwfl);
}

TypeRef StripType(const TypeRef& type) {
  TypeRef t = type;
  for (int i = 0; i < kMaxTypeDepth; ++i) {
    if (!IsQualifierOrTypedef(dwarf_tag(&t.die))) {
      t.die = CompleteAggregate(t.die);
      return t;
    }
    const std::optional<Dwarf_Die> next = TypeOf(t.die);
    if (!next.has_value()) {
      return t;  // `const void`
    }
    t = TypeRef{*next, 0};
  }
  return t;
}

int StrippedTag(const TypeRef& type) {
  TypeRef s = StripType(type);
  return dwarf_tag(&s.die);
}

std::string TypeName(const TypeRef& type) {
  return NameWithDeclarator(type.die, type.skip_dims, "", 0);
}

std::optional<uint64_t> TypeSize(const TypeRef& type) {
  TypeRef s = StripType(type);
  const int tag = dwarf_tag(&s.die);
  if (tag == DW_TAG_array_type) {
    const auto dims = ArrayDims(s.die);
    const std::optional<Dwarf_Die> elem = TypeOf(s.die);
    if (!elem.has_value()) {
      return std::nullopt;
    }
    std::optional<uint64_t> size = TypeSize(TypeRef{*elem, 0});
    if (!size.has_value()) {
      return std::nullopt;
    }
    for (auto i = static_cast<size_t>(s.skip_dims); i < dims.size(); ++i) {
      if (!dims[i].has_value()) {
        return std::nullopt;
      }
      *size *= *dims[i];
    }
    return size;
  }
  if (tag == DW_TAG_pointer_type || tag == DW_TAG_reference_type ||
      tag == DW_TAG_rvalue_reference_type) {
    return UdataAttr(s.die, DW_AT_byte_size).value_or(8);
  }
  Dwarf_Word size = 0;
  if (dwarf_aggregate_size(&s.die, &size) == 0) {
    return size;
  }
  return UdataAttr(s.die, DW_AT_byte_size);
}

std::vector<std::optional<uint64_t>> ArrayDims(Dwarf_Die array) {
  std::vector<std::optional<uint64_t>> dims;
  Dwarf_Die child;
  if (dwarf_child(&array, &child) != 0) {
    return dims;
  }
  do {
    if (dwarf_tag(&child) != DW_TAG_subrange_type) {
      continue;
    }
    if (const auto count = UdataAttr(child, DW_AT_count); count.has_value()) {
      dims.emplace_back(count);
      continue;
    }
    const auto upper = UdataAttr(child, DW_AT_upper_bound);
    const uint64_t lower = UdataAttr(child, DW_AT_lower_bound).value_or(0);
    if (!upper.has_value() || *upper == UINT64_MAX || *upper == UINT32_MAX) {
      dims.emplace_back(std::nullopt);  // flexible or variable-length array
    } else if (*upper + 1 < lower) {
      dims.emplace_back(0);
    } else {
      dims.emplace_back(*upper + 1 - lower);
    }
  } while (dwarf_siblingof(&child, &child) == 0);
  return dims;
}

std::optional<TypeRef> ArrayElement(const TypeRef& array) {
  const auto dims = ArrayDims(array.die);
  if (static_cast<size_t>(array.skip_dims) + 1 < dims.size()) {
    return TypeRef{array.die, array.skip_dims + 1};
  }
  const std::optional<Dwarf_Die> elem = TypeOf(array.die);
  if (!elem.has_value()) {
    return std::nullopt;
  }
  return TypeRef{*elem, 0};
}

std::vector<MemberInfo> Members(Dwarf_Die aggregate) {
  std::vector<MemberInfo> members;
  Dwarf_Die child;
  if (dwarf_child(&aggregate, &child) != 0) {
    return members;
  }
  do {
    const int tag = dwarf_tag(&child);
    if (tag != DW_TAG_member && tag != DW_TAG_inheritance) {
      continue;
    }
    if (dwarf_hasattr(&child, DW_AT_declaration) != 0 ||
        dwarf_hasattr(&child, DW_AT_external) != 0) {
      continue;  // C++ static data member (DWARF 4)
    }
    MemberInfo m;
    m.name = tag == DW_TAG_member ? DieName(child) : "";
    if (const std::optional<Dwarf_Die> t = TypeOf(child); t.has_value()) {
      m.has_type = true;
      m.type = TypeRef{*t, 0};
      m.size = TypeSize(m.type).value_or(0);
    }
    const std::optional<uint64_t> bit_size = UdataAttr(child, DW_AT_bit_size);
    if (bit_size.has_value() && *bit_size > 0) {
      uint64_t unit = m.size != 0 ? m.size : 1;
      uint64_t first_bit = 0;  // from the start of the enclosing object, little-endian
      if (const auto dbo = UdataAttr(child, DW_AT_data_bit_offset); dbo.has_value()) {
        first_bit = *dbo;
      } else {
        // DWARF 2/3: DW_AT_bit_offset counts from the most significant bit of the storage
        // unit at DW_AT_data_member_location.
        unit = UdataAttr(child, DW_AT_byte_size).value_or(unit);
        const uint64_t msb_offset = UdataAttr(child, DW_AT_bit_offset).value_or(0);
        first_bit = MemberLocation(child).value_or(0) * 8 + unit * 8 - msb_offset - *bit_size;
      }
      uint64_t offset = (first_bit / (unit * 8)) * unit;
      uint64_t bit_offset = first_bit - offset * 8;
      if (bit_offset + *bit_size > unit * 8) {  // straddles units (packed structs)
        offset = first_bit / 8;
        bit_offset = first_bit % 8;
        unit = (bit_offset + *bit_size + 7) / 8;
      }
      m.offset = offset;
      m.size = unit;
      m.bit_offset = static_cast<uint32_t>(bit_offset);
      m.bit_size = static_cast<uint32_t>(*bit_size);
    } else {
      m.offset = MemberLocation(child).value_or(0);
    }
    members.push_back(std::move(m));
  } while (dwarf_siblingof(&child, &child) == 0);
  return members;
}

namespace {

// Anonymous members searched per lookup (all levels together) and nesting depth. A hostile
// file can give a struct an anonymous member of its own type: the search recursed until the
// stack overflowed.
constexpr int kMaxAnonymousSearch = 4096;
constexpr int kMaxAnonymousDepth = 64;

std::optional<MemberInfo> FindMemberIn(Dwarf_Die aggregate, std::string_view name, int* budget,
                                       int depth) {
  for (const MemberInfo& m : Members(aggregate)) {
    if (!m.name.empty()) {
      if (m.name == name) {
        return m;
      }
      continue;
    }
    if (!m.has_type || depth >= kMaxAnonymousDepth || --*budget < 0) {
      continue;
    }
    TypeRef s = StripType(m.type);
    if (!IsAggregateTag(dwarf_tag(&s.die))) {
      continue;
    }
    std::optional<MemberInfo> inner = FindMemberIn(s.die, name, budget, depth + 1);
    if (inner.has_value()) {
      inner->offset += m.offset;
      return inner;
    }
  }
  return std::nullopt;
}

void MemberNamesIn(Dwarf_Die aggregate, std::vector<std::string>* names, int* budget, int depth) {
  for (const MemberInfo& m : Members(aggregate)) {
    if (!m.name.empty()) {
      names->push_back(m.name);
      continue;
    }
    if (!m.has_type || depth >= kMaxAnonymousDepth || --*budget < 0) {
      continue;
    }
    TypeRef s = StripType(m.type);
    if (IsAggregateTag(dwarf_tag(&s.die))) {
      MemberNamesIn(s.die, names, budget, depth + 1);
    }
  }
}

}  // namespace

std::optional<MemberInfo> FindMember(Dwarf_Die aggregate, std::string_view name) {
  int budget = kMaxAnonymousSearch;
  return FindMemberIn(aggregate, name, &budget, 0);
}

std::vector<std::string> MemberNames(Dwarf_Die aggregate) {
  std::vector<std::string> names;
  int budget = kMaxAnonymousSearch;
  MemberNamesIn(aggregate, &names, &budget, 0);
  return names;
}

std::optional<Dwarf_Die> FindNamedType(Dwarf* dwarf, int tag, std::string_view name,
                                       bool declarations) {
  return Definitions::Get().FindNamed(dwarf, tag, CanonicalTypeName(name), declarations);
}

std::vector<std::string> NamedTypeNames(Dwarf* dwarf, int tag) {
  return Definitions::Get().Names(dwarf, tag);
}

TypeLayout FlattenLayout(const TypeRef& type) {
  TypeLayout layout;
  layout.type_name = TypeName(type);
  layout.size = TypeSize(type).value_or(0);
  Flattener flattener(&layout.fields);
  if (Expandable(type) && (IsUnion(type) ? 1 : 0) + flattener.Count(type) <= kMaxLayoutFields) {
    const int depth = IsUnion(type) ? layout.AddWholeUnionRow() : 0;
    flattener.FlattenInto(type, 0, "", depth);
  }
  if (layout.fields.empty()) {
    FieldLayout f;
    f.type_name = layout.type_name;
    f.size = layout.size;
    layout.fields.push_back(std::move(f));
  }
  return layout;
}

}  // namespace kwatch::core::symbols
