#include "core/symbols/type_names.h"

#include <gtest/gtest.h>

namespace kwatch::core::symbols {
namespace {

// GCC's spellings (the DW_AT_name of template instances, and of base types) and people's.
TEST(CanonicalTypeNameTest, CompilersAndPeopleSpellAlike) {
  struct Case {
    const char* in;
    const char* out;
  };
  const Case cases[] = {
      {"int", "int"},
      {"long int", "long"},
      {"long unsigned int", "unsigned long"},
      {"unsigned long", "unsigned long"},
      {"unsigned", "unsigned int"},
      {"short unsigned int", "unsigned short"},
      {"long long int", "long long"},
      {"long long unsigned int", "unsigned long long"},
      {"signed char", "signed char"},
      {"char", "char"},
      {"__int128 unsigned", "unsigned __int128"},
      {"long double", "long double"},
      {"Box<long unsigned int>", "Box<unsigned long>"},
      {"Box<int,2>", "Box<int, 2>"},
      {"Box < int ,  2 >", "Box<int, 2>"},
      {"Arr<unsigned int, 3u>", "Arr<unsigned int, 3>"},
      {"Box<Box<int>>", "Box<Box<int> >"},
      {"Box<Box<int> >", "Box<Box<int> >"},
      {"Two<Box<int>, const char*>", "Two<Box<int>, char const*>"},
      {"Two<Box<int>, char const*>", "Two<Box<int>, char const*>"},
      {"Two<const ns::Box<int>*, int>", "Two<ns::Box<int> const*, int>"},
      {"ns :: Box<long>::value", "ns::Box<long>::value"},
      {"Neg<-1>", "Neg<-1>"},
      {"calls.0", "calls.0"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(CanonicalTypeName(c.in), c.out) << c.in;
    EXPECT_EQ(CanonicalTypeName(c.out), c.out) << "idempotent: " << c.out;
  }
}

}  // namespace
}  // namespace kwatch::core::symbols
