// PortScheduler, the partition baseline (P3 / ByteScheduler): a message is
// cut into partitions of partition_bytes; each partition is started by a
// start-up control slice, only while the credit (credit_bytes started and not
// acknowledged) allows, and its bytes may be carved once partition_ready_st()
// reports its start-up complete. The credit comes back in on_acked_st() and
// release_st() (port_scheduler.cpp). See port_scheduler.h and docs/sched.md.
#include <algorithm>

#include "sched/port_scheduler.h"

namespace mercury::sched {

uint32_t PortScheduler::partitions(const Message& msg) const {
  // A 0-byte message is one (empty) partition, so it still pays a start-up.
  if (msg.len == 0) return 1;
  return static_cast<uint32_t>((uint64_t{msg.len} + config_.partition_bytes - 1) /
                               config_.partition_bytes);
}

uint64_t PortScheduler::partition_end(const Message& msg, uint32_t k) const {
  return std::min<uint64_t>(uint64_t{k + 1} * config_.partition_bytes, msg.len);
}

uint64_t PortScheduler::partition_size(const Message& msg, uint32_t k) const {
  return partition_end(msg, k) - std::min<uint64_t>(uint64_t{k} * config_.partition_bytes, msg.len);
}

bool PortScheduler::start_partition(const PeerMask& eligible, Slice& out) {
  const std::optional<Pick> pick = pending_.pick(eligible);
  if (!pick) return false;
  Message* msg = pending_.head(pick->level, pick->peer);
  const uint32_t k = msg->parts_started_;
  const uint64_t size = partition_size(*msg, k);
  // ByteScheduler's credit: start only what fits, but never wait on an empty
  // credit (a partition can always start alone; C >= S makes that moot).
  // It waits for credit rather than starting a less urgent, smaller partition.
  if (credit_used_ != 0 && credit_used_ + size > config_.credit_bytes) return false;
  credit_used_ += size;
  msg->parts_started_ = k + 1;
  if (msg->parts_started_ == partitions(*msg)) pending_.pop_message(pick->level, pick->peer);
  pending_.commit(*pick);
  out = Slice{msg,
              static_cast<uint32_t>(uint64_t{k} * config_.partition_bytes),
              0,
              false,
              SliceKind::kPartitionStart,
              msg->peer};
  ++stats_.partition_starts;
  return true;
}

void PortScheduler::partition_ready_st(Message* msg) {
  MERCURY_OWNED(consumer_);
  if (config_.mode != Mode::kPartition || msg->parts_ready_ >= msg->parts_started_) return;
  // In tx_ iff it has ready partitions not yet fully carved.
  const bool listed = msg->parts_sent_ < msg->parts_ready_;
  ++msg->parts_ready_;
  if (!listed) tx_.push_message(0, msg);
}

}  // namespace mercury::sched
