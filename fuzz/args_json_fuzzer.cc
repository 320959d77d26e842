// The probe-argument JSON of a recording's hits table (core/store/args_json.h): a file feeds
// it. DecodeArgsJson on any bytes; whatever decodes must survive a round trip through
// EncodeArgsJson unchanged (its documented contract).

#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "absl/strings/string_view.h"
#include "core/store/args_json.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view json(reinterpret_cast<const char*>(data), size);
  auto args = kwatch::core::store::DecodeArgsJson(json);
  if (!args.ok()) {
    return 0;
  }
  const std::string encoded = kwatch::core::store::EncodeArgsJson(*args);
  auto again = kwatch::core::store::DecodeArgsJson(encoded);
  if (!again.ok() || *again != *args) {
    std::abort();  // Decode(Encode(a)) == a is the contract of args_json.h
  }
  return 0;
}
