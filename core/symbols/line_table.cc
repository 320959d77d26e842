#include "core/symbols/line_table.h"

#include <elfutils/libdw.h>

#include <cstddef>

namespace kwatch::core::symbols {
namespace {

// The address of `line` (with its module's bias), or false.
bool AddressOf(Dwfl_Line* line, Dwarf_Addr* addr) {
  return line != nullptr &&
         dwfl_lineinfo(line, addr, nullptr, nullptr, nullptr, nullptr) != nullptr;
}

bool BeginsStatement(Dwfl_Line* line) {
  Dwarf_Addr bias = 0;
  Dwarf_Line* l = dwfl_dwarf_line(line, &bias);
  bool stmt = false;
  bool end = false;
  return l != nullptr && dwarf_linebeginstatement(l, &stmt) == 0 && stmt &&
         dwarf_lineendsequence(l, &end) == 0 && !end;
}

}  // namespace

Dwfl_Line* StatementLineAt(Dwfl_Module* mod, Dwarf_Addr addr) {
  Dwfl_Line* found = dwfl_module_getsrc(mod, addr);
  Dwarf_Addr at = 0;
  if (!AddressOf(found, &at)) {
    return found;
  }
  Dwarf_Die* cu = dwfl_linecu(found);
  size_t n = 0;
  if (cu == nullptr || dwfl_getsrclines(cu, &n) != 0) {
    return found;
  }
  // The rows are sorted by address: the first at `at`, then every row there.
  size_t lo = 0;
  size_t hi = n;
  while (lo < hi) {
    const size_t mid = lo + (hi - lo) / 2;
    Dwarf_Addr a = 0;
    if (!AddressOf(dwfl_onesrcline(cu, mid), &a)) {
      return found;
    }
    if (a < at) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  Dwfl_Line* best = nullptr;
  for (size_t i = lo; i < n; ++i) {
    Dwfl_Line* row = dwfl_onesrcline(cu, i);
    Dwarf_Addr a = 0;
    if (!AddressOf(row, &a) || a != at) {
      break;
    }
    if (BeginsStatement(row)) {
      best = row;
    }
  }
  return best != nullptr ? best : found;
}

}  // namespace kwatch::core::symbols
