#include "fuzz/fuzz_util.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace kwatch::fuzz {
namespace {

void WriteAll(int fd, const uint8_t* data, size_t size, const char* what) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n <= 0) {
      std::perror(what);
      std::abort();
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
}

}  // namespace

MemFile::MemFile(const uint8_t* data, size_t size) {
  fd_ = ::memfd_create("kwatch-fuzz", MFD_CLOEXEC);
  if (fd_ < 0) {
    std::perror("memfd_create");
    std::abort();
  }
  WriteAll(fd_, data, size, "write(memfd)");
  path_ = "/proc/self/fd/" + std::to_string(fd_);
}

MemFile::~MemFile() {
  ::close(fd_);
}

TempFile::TempFile(const uint8_t* data, size_t size) {
  const char* dir = std::getenv("TMPDIR");  // NOLINT(concurrency-mt-unsafe): one thread
  std::string tmpl =
      std::string(dir != nullptr && *dir != '\0' ? dir : "/tmp") + "/kwatch-fuzz-XXXXXX";
  const int fd = ::mkstemp(tmpl.data());
  if (fd < 0) {
    std::perror("mkstemp");
    std::abort();
  }
  WriteAll(fd, data, size, "write(temp file)");
  ::close(fd);
  path_ = tmpl;
}

TempFile::~TempFile() {
  for (const char* suffix : {"", "-wal", "-shm", "-journal"}) {
    ::unlink((path_ + suffix).c_str());
  }
}

void QuietLibdw() {
  ::unsetenv("DEBUGINFOD_URLS");  // NOLINT(concurrency-mt-unsafe): before any thread
}

}  // namespace kwatch::fuzz
