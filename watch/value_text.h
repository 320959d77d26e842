#pragma once

// How a field's value reads in C, for people: the report's values and the live lines.

#include <cstdint>
#include <string>
#include <string_view>

namespace kwatch::watch {

// `bits`: the field's value zero-extended to 64 bits (a bitfield's shifted down), `size` its
// bytes, `bit_size` its bits when it is a bitfield (else 0), `type_name` its C spelling.
// Signed integer types (IsSignedType) and enums are sign-extended from the field's width;
// float and double print as numbers ("1.5", %.9g and %.17g: they read back to the same bits);
// pointers, and what is not one number (structures, unions, arrays, more than 8 bytes), in
// hex; other integers unsigned.
std::string FieldValueText(std::string_view type_name, uint64_t size, uint32_t bit_size,
                           uint64_t bits);

}  // namespace kwatch::watch
