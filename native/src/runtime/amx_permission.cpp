#include "runtime/amx_permission.hpp"

#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

namespace kt {

namespace {
constexpr long kArchReqXcompPerm = 0x1023;
constexpr long kXfeatureXtiledata = 18;
}  // namespace

int request_amx_permission() {
  static const int result = [] {
    const long rc = syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata);
    return rc == 0 ? 0 : errno;
  }();
  return result;
}

}  // namespace kt
