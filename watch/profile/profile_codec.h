#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "watch/profile/storage_profile.h"

namespace kwatch::watch::profile {

// The state of a StorageProfile as bytes, for the profile a recording keeps while it is written
// (core/store/trace_summary.h): counts, sites, values, threads, (thread, field) pairs, cache
// lines and their writers: everything but the time columns, which the recording keeps in
// profile_bins. Little-endian base-128 varints after a magic and a version.
//
// Decode treats the bytes as untrusted (a recording is a file people share): every index and
// length is checked against the profile the objects make, and any mismatch is DataLoss; what it
// returns is a profile whose accessors and Add behave as the encoded one's (time columns
// empty). Stateless; thread-safe.
class ProfileCodec {
 public:
  static std::string Encode(const StorageProfile& p);

  // The profile of `objects` with `opts` holding the state `bytes` encodes, its time rows
  // created (as Add would have) but all zero. FailedPrecondition when the encoded profile was
  // made with other options than `opts` (time columns apart) or other objects; DataLoss for
  // bytes that are not an encoding of such a profile.
  static absl::StatusOr<StorageProfile> Decode(std::vector<WatchedObject> objects,
                                               const ProfileOptions& opts, absl::string_view bytes);

  // The time columns of `p`, to fill after Decode.
  static TimeBins& Bins(StorageProfile& p) { return p.bins_; }
  // The reads row of thread `thread`'s accesses to `field` in Bins (writes: + 1), or
  // StorageProfile::kNone when it has none.
  static uint32_t ThreadFieldRow(const StorageProfile& p, uint32_t thread, uint32_t field);

 private:
  class In;  // the bytes being decoded
  // Reads a site table Encode wrote into `t`, which must have been made with `capacity`.
  static bool DecodeSites(In& in, SiteTable& t, uint32_t capacity);
};

}  // namespace kwatch::watch::profile
