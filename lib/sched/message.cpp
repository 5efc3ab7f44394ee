#include "sched/message.h"

#include <stdexcept>
#include <string>

namespace mercury::sched {

MessagePool::MessagePool(uint32_t capacity) : capacity_(capacity), head_(pack(kNil, 0)) {
  if (capacity == 0 || capacity == kNil) {
    throw std::invalid_argument("MessagePool: capacity must be in 1.." + std::to_string(kNil - 1) +
                                ", got " + std::to_string(capacity));
  }
  slots_ = HugeArray<Message>(capacity);
  // Thread the free list in index order so the first alloc() returns slot 0:
  // nothing depends on it, but it makes dumps readable.
  for (uint32_t i = 0; i < capacity; ++i) {
    slots_[i].pool_next_.store(i + 1 < capacity ? i + 1 : kNil, std::memory_order_relaxed);
  }
  head_.store(pack(0, 0), std::memory_order_release);
}

bool MessagePool::owns(const Message* msg) const {
  return msg >= slots_.data() && msg < slots_.data() + capacity_;
}

Message* MessagePool::alloc() {
  // Acquire pairs with the release CAS in free() that pushed the descriptor we
  // are about to read, so its pool_next_ and everything its last owner wrote
  // happen-before our use of it.
  uint64_t head = head_.load(std::memory_order_acquire);
  for (;;) {
    const uint32_t index = static_cast<uint32_t>(head);
    if (index == kNil) {
      alloc_failed_.fetch_add(1, std::memory_order_relaxed);
      return nullptr;
    }
    // May be stale if another thread pops `index` meanwhile; the tag in `head`
    // then no longer matches and the CAS below fails.
    const uint32_t next = slots_[index].pool_next_.load(std::memory_order_relaxed);
    const uint64_t popped = pack(next, static_cast<uint32_t>(head >> 32) + 1);
    // Success: acquire, as above. Failure reloads `head`: acquire for the same
    // reason, since we then read the new top's pool_next_.
    if (head_.compare_exchange_weak(head, popped, std::memory_order_acquire,
                                    std::memory_order_acquire)) {
      Message* msg = &slots_[index];
      msg->data = nullptr;
      msg->len = 0;
      msg->peer = 0;
      msg->priority = 0;
      msg->type = 0;
      msg->dtype = 0;
      msg->block_key = 0;
      msg->iteration = 0;
      msg->param_version = 0;
      msg->msg_id = 0;
      msg->base_offset = 0;
      msg->cookie = 0;
      msg->logical_len = 0;
      return msg;
    }
  }
}

void MessagePool::free(Message* msg) {
  const uint32_t index = static_cast<uint32_t>(msg - slots_.data());
  uint64_t head = head_.load(std::memory_order_relaxed);
  for (;;) {
    msg->pool_next_.store(static_cast<uint32_t>(head), std::memory_order_relaxed);
    const uint64_t pushed = pack(index, static_cast<uint32_t>(head >> 32) + 1);
    // Release pairs with the acquire in alloc(): it publishes pool_next_ and
    // every write the freeing thread made to the descriptor.
    if (head_.compare_exchange_weak(head, pushed, std::memory_order_release,
                                    std::memory_order_relaxed)) {
      return;
    }
  }
}

}  // namespace mercury::sched
