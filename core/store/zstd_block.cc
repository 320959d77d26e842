#include "core/store/zstd_block.h"

#include <zstd.h>

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"

namespace kwatch::core::store {
namespace {

constexpr int kZstdLevel = 3;

}  // namespace

std::string ZstdCompress(absl::string_view raw) {
  std::string out(ZSTD_compressBound(raw.size()), '\0');
  const size_t n = ZSTD_compress(out.data(), out.size(), raw.data(), raw.size(), kZstdLevel);
  KW_CHECK(ZSTD_isError(n) == 0);  // the bound holds
  out.resize(n);
  return out;
}

absl::Status ZstdDecompress(absl::string_view data, size_t max_bytes, absl::string_view what,
                            std::string* raw) {
  const unsigned long long size = ZSTD_getFrameContentSize(data.data(), data.size());
  if (size == ZSTD_CONTENTSIZE_ERROR || size == ZSTD_CONTENTSIZE_UNKNOWN) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is not zstd data"));
  }
  if (size > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " would decompress to ", size, " bytes, more than ", max_bytes));
  }
  raw->assign(static_cast<size_t>(size), '\0');
  const size_t n = ZSTD_decompress(raw->data(), raw->size(), data.data(), data.size());
  if (ZSTD_isError(n) != 0 || n != raw->size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " does not decompress: ", ZSTD_isError(n) != 0 ? ZSTD_getErrorName(n) : "short"));
  }
  return absl::OkStatus();
}

}  // namespace kwatch::core::store
