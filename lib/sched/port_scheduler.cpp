// PortScheduler: set-up and the end of a message's life. Mode names, the
// config check and construction; the consumer-thread check; acknowledgements
// (returning a partition's credit in partition mode), completion and release;
// the state queries. The other concerns live beside it, one file each:
// port_scheduler_levels.cpp (the level x peer queues and their bitmaps),
// port_scheduler_queue.cpp (ingress and the retransmission queue),
// port_scheduler_carve.cpp (what goes next: picking and carving slices),
// port_scheduler_partition.cpp (the partition baseline's start-ups and
// credit). See port_scheduler.h.
#include "sched/port_scheduler.h"

#include <algorithm>
#include <cassert>
#include <stdexcept>
#include <string>

namespace mercury::sched {

std::optional<Mode> parse_mode(std::string_view name) {
  if (name == "strict") return Mode::kStrict;
  if (name == "fifo") return Mode::kFifo;
  if (name == "partition") return Mode::kPartition;
  return std::nullopt;
}

std::string_view to_string(Mode mode) {
  switch (mode) {
    case Mode::kStrict:
      return "strict";
    case Mode::kFifo:
      return "fifo";
    case Mode::kPartition:
      return "partition";
  }
  return "?";
}

namespace {
SchedulerConfig validated(const SchedulerConfig& c) {
  auto fail = [](const std::string& what) { throw std::invalid_argument("sched: " + what); };
  if (c.num_peers == 0 || c.num_peers > kMaxPeers) {
    fail("num_peers must be in 1.." + std::to_string(kMaxPeers) + ", got " +
         std::to_string(c.num_peers));
  }
  if (c.ingress_capacity == 0 || c.ingress_capacity > (1u << 30)) {
    fail("ingress_capacity must be in 1..2^30, got " + std::to_string(c.ingress_capacity));
  }
  if (c.max_retransmits == 0 || c.max_retransmits >= UINT32_MAX) {
    fail("max_retransmits must be at least 1, got " + std::to_string(c.max_retransmits));
  }
  if (c.mode == Mode::kPartition) {
    if (c.partition_bytes == 0) fail("partition_bytes must be > 0 in partition mode");
    if (c.credit_bytes < c.partition_bytes) {
      fail("credit_bytes (" + std::to_string(c.credit_bytes) + ") must be >= partition_bytes (" +
           std::to_string(c.partition_bytes) + "): a partition must fit the credit");
    }
  }
  return c;
}
}  // namespace

PortScheduler::PortScheduler(const SchedulerConfig& config, MessagePool& pool,
                             CompletionFn on_complete, void* context)
    : config_(validated(config)),
      pool_(pool),
      on_complete_(on_complete),
      context_(context),
      // Partition mode links ready messages through ready_next_ because a
      // message can sit in pending_ (partitions not started) and in tx_
      // (partitions ready to carve) at once.
      tx_(config_.num_peers,
          config_.mode == Mode::kPartition ? &Message::ready_next_ : &Message::next_),
      pending_(config_.mode == Mode::kPartition ? config_.num_peers : 1, &Message::next_),
      rtx_slots_(config_.max_retransmits) {
  for (uint32_t i = config_.max_retransmits; i-- > 0;) {
    rtx_slots_[i].next = rtx_free_;
    rtx_free_ = i;
  }
}

bool PortScheduler::on_acked_st(Message* msg, uint32_t bytes) {
  MERCURY_OWNED(consumer_);
  msg->acked_ = static_cast<uint32_t>(std::min<uint64_t>(uint64_t{msg->acked_} + bytes, msg->len));
  if (msg->len == 0) msg->empty_acked_ = 1;  // the ack (or failure) of its one empty packet
  if (config_.mode == Mode::kPartition) {
    // A partition's credit returns when its last byte is acknowledged, as
    // ByteScheduler returns credit when a partition's push completes. Acks
    // are counted in bytes, so out-of-order acks within a message return
    // credit a little early or late, never twice.
    while (msg->parts_acked_ < msg->parts_sent_ &&
           msg->acked_ >= partition_end(*msg, msg->parts_acked_)) {
      credit_used_ -= partition_size(*msg, msg->parts_acked_);
      ++msg->parts_acked_;
    }
  }
  if (msg->state_ == kCarved && all_acked(*msg)) return try_release(msg);
  return false;
}

bool PortScheduler::try_release(Message* msg) {
  if (msg->rtx_queued_ != 0) return false;  // the last dequeued resend releases it
  msg->state_ = kIdle;
  if (on_complete_ != nullptr) on_complete_(context_, *msg);
  pool_.free(msg);
  ++stats_.released;
  return true;
}

bool PortScheduler::release_st(Message* msg) {
  MERCURY_OWNED(consumer_);
  if (msg->state_ != kCarved || msg->rtx_queued_ != 0) {
    ++stats_.release_refused;
    return false;
  }
  if (config_.mode == Mode::kPartition) {
    // Give back the credit of partitions that will never be acked.
    while (msg->parts_acked_ < msg->parts_sent_) {
      credit_used_ -= partition_size(*msg, msg->parts_acked_);
      ++msg->parts_acked_;
    }
  }
  return try_release(msg);
}

bool PortScheduler::has_work_st() const {
  MERCURY_OWNED(consumer_);
  return !tx_.empty() || !pending_.empty();
}

SchedulerStats PortScheduler::stats_st() const {
  MERCURY_OWNED(consumer_);
  SchedulerStats s = stats_;
  s.submit_full = producer_stats_.full.load(std::memory_order_relaxed);
  s.submit_invalid = producer_stats_.invalid.load(std::memory_order_relaxed);
  return s;
}

}  // namespace mercury::sched
