#pragma once

// One spelling for C and C++ type and template names, so that what people write matches what
// compilers record: GCC names `Box<unsigned long>` "Box<long unsigned int>", `Two<int,const
// char*>` "Two<int, char const*>", and nested templates "Box<Box<int> >". Pure functions.

#include <string>
#include <string_view>

namespace kwatch::core::symbols {

// The canonical spelling of `name` (a type, or a C++ qualified name with template argument
// lists): integer type words reordered and shortened as people write them ("long unsigned
// int" is "unsigned long", "unsigned" is "unsigned int", "short int" is "short"), a leading
// `const` of a template argument moved after its type ("const char*" is "char const*"),
// integer literal suffixes dropped ("3u" is "3"), and spaces as GCC and gdb print them: one
// after a ',', between two words, and after a '>' before a '>' or a word; none elsewhere.
// Idempotent.
std::string CanonicalTypeName(std::string_view name);

}  // namespace kwatch::core::symbols
