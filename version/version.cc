#include "version/version.h"

#include <string>

#include "version/build_version.h"  // generated (version/CMakeLists.txt)

namespace kwatch::version {

std::string Release() {
  return KWATCH_VERSION_RELEASE;
}

std::string Full() {
  return KWATCH_VERSION_FULL;
}

}  // namespace kwatch::version
