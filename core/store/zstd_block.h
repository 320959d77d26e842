#pragma once

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

// The zstd frames of a recording's blocks (event_blocks.cc, hit_blocks.cc): compressed at one
// level, and decompressed only up to a bound the caller knows, so that a crafted block cannot
// make the reader allocate more than that.

namespace kwatch::core::store {

// `raw` compressed as one zstd frame (level 3) that records its content size.
std::string ZstdCompress(absl::string_view raw);

// The content of the zstd frame `data`, which must hold at most `max_bytes` bytes. Errors:
// InvalidArgument "<what> is not zstd data", "... would decompress to N bytes, more than M",
// "... does not decompress: <zstd's reason>".
absl::Status ZstdDecompress(absl::string_view data, size_t max_bytes, absl::string_view what,
                            std::string* raw);

}  // namespace kwatch::core::store
