#pragma once

// Line-table lookups as gdb makes them.

#include <elfutils/libdwfl.h>

namespace kwatch::core::symbols {

// The line-table row naming `addr` (an address of `mod`, as for dwfl_module_getsrc) as gdb
// names it: of the rows at the address libdw finds, the last that begins a statement
// (is_stmt), else libdw's own. Optimized code puts several rows at one address (views of
// inlined or merged lines); libdw returns the last of them even when it is not a statement
// (probe_args.c at -O2: 0x1292 holds lines 53, 54, 56 as statements, then 54 as not one;
// gdb says 56, libdw 54). Null when no row covers `addr`.
Dwfl_Line* StatementLineAt(Dwfl_Module* mod, Dwarf_Addr addr);

}  // namespace kwatch::core::symbols
