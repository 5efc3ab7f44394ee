#include "node/doorbell.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <ctime>

namespace mercury::node {

// The futex is the atomic's own 32-bit word.
static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t) &&
              std::atomic<uint32_t>::is_always_lock_free);

void Doorbell::sleep(uint32_t ticket, uint32_t timeout_us) {
  const timespec ts{static_cast<time_t>(timeout_us / 1'000'000),
                    static_cast<long>(timeout_us % 1'000'000) * 1000};
  // Returns at once (EAGAIN) if the word is no longer `ticket`: rung meanwhile.
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word_), FUTEX_WAIT_PRIVATE, ticket, &ts, nullptr,
          0);
  disarm();
}

void Doorbell::wake() {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word_), FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr,
          0);
}

}  // namespace mercury::node
