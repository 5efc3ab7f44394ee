// PortScheduler, what enters the queues: submit() from any thread onto the
// lock-free ingress (a Treiber stack), drain_ingress_st() moving it into the
// per-level, per-peer FIFOs in submission order, and the retransmission
// queue: requeue_st() puts a sent slice back, take_retransmit() serves it
// again (or drops it when its message was acknowledged meanwhile). See
// port_scheduler.h.
#include "sched/port_scheduler.h"

namespace mercury::sched {

unsigned PortScheduler::tx_level(const Message& msg) const {
  return config_.mode == Mode::kStrict ? msg.priority : 0;
}

bool PortScheduler::submit(Message* msg) {
  if (msg == nullptr || msg->priority >= kPriorityLevels || msg->peer >= config_.num_peers)
      [[unlikely]] {
    producer_stats_.invalid.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  // Reserve a place first. Relaxed: the count only bounds memory, it publishes
  // nothing. Concurrent reservations can make a submit near the limit fail
  // although a racing one is about to give its place back: "full" is judged
  // conservatively, never optimistically.
  if (ingress_.count.fetch_add(1, std::memory_order_relaxed) >= config_.ingress_capacity)
      [[unlikely]] {
    ingress_.count.fetch_sub(1, std::memory_order_relaxed);
    producer_stats_.full.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  // Treiber push: no step can be held up by a preempted thread, because the
  // only shared write is this one CAS. Release pairs with the acquire exchange
  // in drain_ingress_st(): the message's fields and next_ become visible to
  // the consumer. Every write to head is a read-modify-write, so the release
  // sequence of each push is never broken and one acquire exchange
  // synchronises with every push in the list it takes. No ABA: pushes do not
  // depend on the value of head->next, and the consumer takes the whole list.
  Message* head = ingress_.head.load(std::memory_order_relaxed);
  do {
    msg->next_ = head;
  } while (!ingress_.head.compare_exchange_weak(head, msg, std::memory_order_release,
                                                std::memory_order_relaxed));
  return true;
}

size_t PortScheduler::drain_ingress_st() {
  MERCURY_OWNED(consumer_);
  if (ingress_.head.load(std::memory_order_relaxed) == nullptr) return 0;
  // Acquire pairs with every producer's release CAS (see submit()).
  Message* stack = ingress_.head.exchange(nullptr, std::memory_order_acquire);
  // The stack is newest first; reverse it into submission order.
  Message* fifo = nullptr;
  size_t n = 0;
  while (stack != nullptr) {
    Message* next = stack->next_;
    stack->next_ = fifo;
    fifo = stack;
    stack = next;
    ++n;
  }
  ingress_.count.fetch_sub(static_cast<uint32_t>(n), std::memory_order_relaxed);
  while (fifo != nullptr) {
    Message* msg = fifo;
    fifo = msg->next_;
    msg->carved_ = 0;
    msg->acked_ = 0;
    msg->empty_acked_ = 0;
    msg->parts_started_ = 0;
    msg->parts_ready_ = 0;
    msg->parts_sent_ = 0;
    msg->parts_acked_ = 0;
    msg->rtx_queued_ = 0;
    msg->ready_next_ = nullptr;
    msg->state_ = kQueued;
    if (config_.mode == Mode::kPartition) {
      pending_.push_message(msg->priority, msg);
    } else {
      tx_.push_message(tx_level(*msg), msg);
    }
  }
  stats_.drained += n;
  return n;
}

bool PortScheduler::requeue_st(const Slice& slice) {
  MERCURY_OWNED(consumer_);
  Message* msg = slice.msg;
  if (msg == nullptr || msg->state_ == kIdle) [[unlikely]] {
    ++stats_.requeue_invalid;
    return false;
  }
  if (rtx_free_ == kNil) [[unlikely]] {
    ++stats_.requeue_full;
    return false;
  }
  const uint32_t slot = rtx_free_;
  rtx_free_ = rtx_slots_[slot].next;
  rtx_slots_[slot].slice = slice;
  ++msg->rtx_queued_;
  tx_.push_retransmit(tx_level(*msg), msg->peer, slot, rtx_slots_);
  return true;
}

bool PortScheduler::take_retransmit(const Pick& pick, Slice& out) {
  const uint32_t slot = tx_.pop_retransmit(pick.level, pick.peer, rtx_slots_);
  const Slice slice = rtx_slots_[slot].slice;
  rtx_slots_[slot].next = rtx_free_;
  rtx_free_ = slot;
  tx_.commit(pick);
  Message* msg = slice.msg;
  --msg->rtx_queued_;
  if (msg->state_ == kCarved && all_acked(*msg)) {
    // Acked while the resend waited (a spurious timeout): drop it, and
    // complete the message if this was the last thing holding it.
    ++stats_.retransmit_skipped;
    try_release(msg);
    return false;
  }
  out = slice;
  out.retransmit = true;
  out.peer = msg->peer;
  ++stats_.retransmit_slices;
  return true;
}

}  // namespace mercury::sched
