#include "base/owner.h"

#include <cinttypes>
#include <cstdio>
#include <cstdlib>

namespace mercury::base {

void wrong_thread(const char* function, uint64_t owner, uint64_t caller) noexcept {
  std::fprintf(stderr,
               "mercury: %s called on thread %#" PRIx64
               ", but its object belongs to thread %#" PRIx64 " (the _st contract, base/owner.h)\n",
               function, caller, owner);
  std::fflush(stderr);
  std::abort();
}

}  // namespace mercury::base
