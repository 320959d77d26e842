#pragma once

// Helpers shared by the fuzz targets (fuzz/): no libFuzzer API here, only plumbing.

#include <cstddef>
#include <cstdint>
#include <string>

namespace kwatch::fuzz {

// Writes `data` to a new memfd and returns "/proc/self/fd/N" naming it; the fd stays open
// until the MemFile is destroyed. Aborts when memfd_create or write fails (the harness, not
// the code under test, is broken then).
class MemFile {
 public:
  MemFile(const uint8_t* data, size_t size);
  ~MemFile();
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;

  const std::string& path() const { return path_; }

 private:
  int fd_ = -1;
  std::string path_;
};

// Writes `data` to a new regular file under $TMPDIR (SQLite needs a real path for its lock
// and journal files) and removes it, with its -wal/-shm/-journal companions, when destroyed.
class TempFile {
 public:
  TempFile(const uint8_t* data, size_t size);
  ~TempFile();
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Keeps libdw from fetching anything over the network (debuginfod) or from the system's
// debug directories for a hostile file's build-id or debuglink.
void QuietLibdw();

}  // namespace kwatch::fuzz
