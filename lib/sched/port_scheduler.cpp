#include "sched/port_scheduler.h"

#include <algorithm>
#include <bit>
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

// ---------------------------------------------------------------- LevelTable

PortScheduler::LevelTable::LevelTable(unsigned num_peers, Message* Message::*link)
    : num_peers_(num_peers),
      num_words_((num_peers + 63) / 64),
      link_(link),
      data_peers_(kPriorityLevels),
      rtx_peers_(kPriorityLevels),
      cursor_(kPriorityLevels, static_cast<uint16_t>(num_peers - 1)),
      queues_(size_t{kPriorityLevels} * num_peers) {}

int PortScheduler::LevelTable::round_robin(const PeerMask& work, const PeerMask& eligible,
                                           unsigned level) const {
  // The first peer after the level's cursor that has work and is eligible,
  // wrapping around; word by word over the words that can hold a peer (one
  // word up to 64 peers), so this is a few instructions, not a 256-bit scan.
  unsigned start = cursor_[level] + 1u;
  if (start >= num_words_ * 64) start = 0;
  const unsigned w0 = start / 64;
  const uint64_t first = work.word(w0) & eligible.word(w0) & (~uint64_t{0} << (start % 64));
  if (first != 0) return static_cast<int>(w0 * 64 + std::countr_zero(first));
  // Then the following words, ending on w0 again for its bits below start.
  for (unsigned i = 1; i <= num_words_; ++i) {
    unsigned w = w0 + i;
    if (w >= num_words_) w -= num_words_;
    const uint64_t bits = work.word(w) & eligible.word(w);
    if (bits != 0) return static_cast<int>(w * 64 + std::countr_zero(bits));
  }
  return -1;
}

std::optional<PortScheduler::Pick> PortScheduler::LevelTable::pick(const PeerMask& eligible) const {
  // Most urgent first: lowest set bit. A level is skipped only when every peer
  // it holds work for is ineligible, so this loop runs at most once per
  // non-empty level (<= 64) and usually exactly once.
  for (uint64_t levels = active_; levels != 0; levels &= levels - 1) {
    const unsigned level = static_cast<unsigned>(std::countr_zero(levels));
    if ((rtx_levels_ >> level) & 1) {
      const int peer = round_robin(rtx_peers_[level], eligible, level);
      if (peer >= 0) return Pick{level, static_cast<unsigned>(peer), true};
    }
    const int peer = round_robin(data_peers_[level], eligible, level);
    if (peer >= 0) return Pick{level, static_cast<unsigned>(peer), false};
  }
  return std::nullopt;
}

bool PortScheduler::LevelTable::sole_data_peer(unsigned level, unsigned peer,
                                               const PeerMask& eligible) const {
  const PeerMask& work = data_peers_[level];
  uint64_t others = 0;
  for (unsigned w = 0; w < num_words_; ++w) {
    uint64_t bits = work.word(w) & eligible.word(w);
    if (w == peer / 64) bits &= ~(uint64_t{1} << (peer % 64));
    others |= bits;
  }
  return others == 0;
}

unsigned PortScheduler::LevelTable::rotation(unsigned level, unsigned first,
                                             const PeerMask& eligible, uint16_t* peers,
                                             unsigned max, bool& all) const {
  // As round_robin(): first's word from first on, the following words
  // wrapping around, then first's word below first.
  const PeerMask& work = data_peers_[level];
  const unsigned w0 = first / 64;
  unsigned k = 0;
  for (unsigned i = 0; i <= num_words_; ++i) {
    unsigned w = w0 + i;
    if (w >= num_words_) w -= num_words_;
    uint64_t bits = work.word(w) & eligible.word(w);
    if (i == 0) {
      bits &= ~uint64_t{0} << (first % 64);
    } else if (i == num_words_) {
      bits &= (uint64_t{1} << (first % 64)) - 1;
    }
    for (; bits != 0; bits &= bits - 1) {
      if (k == max) {
        all = false;
        return k;
      }
      peers[k++] = static_cast<uint16_t>(w * 64 + std::countr_zero(bits));
    }
  }
  all = true;
  return k;
}

void PortScheduler::LevelTable::refresh(unsigned level) {
  const uint64_t bit = uint64_t{1} << level;
  const bool rtx = rtx_peers_[level].any();
  rtx_levels_ = rtx ? rtx_levels_ | bit : rtx_levels_ & ~bit;
  active_ = rtx || data_peers_[level].any() ? active_ | bit : active_ & ~bit;
}

void PortScheduler::LevelTable::push_message(unsigned level, Message* msg) {
  PeerQueue& q = at(level, msg->peer);
  msg->*link_ = nullptr;
  if (q.tail != nullptr) {
    q.tail->*link_ = msg;
  } else {
    q.head = msg;
    data_peers_[level].set(msg->peer);
    active_ |= uint64_t{1} << level;
  }
  q.tail = msg;
}

void PortScheduler::LevelTable::pop_message(unsigned level, unsigned peer) {
  PeerQueue& q = at(level, peer);
  Message* msg = q.head;
  q.head = msg->*link_;
  msg->*link_ = nullptr;
  if (q.head == nullptr) {
    q.tail = nullptr;
    data_peers_[level].reset(peer);
    refresh(level);
  }
}

void PortScheduler::LevelTable::push_retransmit(unsigned level, unsigned peer, uint32_t slot,
                                                std::vector<RetransmitSlot>& slots) {
  PeerQueue& q = at(level, peer);
  slots[slot].next = kNil;
  if (q.rtx_tail != kNil) {
    slots[q.rtx_tail].next = slot;
  } else {
    q.rtx_head = slot;
    rtx_peers_[level].set(peer);
    active_ |= uint64_t{1} << level;
    rtx_levels_ |= uint64_t{1} << level;
  }
  q.rtx_tail = slot;
}

uint32_t PortScheduler::LevelTable::pop_retransmit(unsigned level, unsigned peer,
                                                   std::vector<RetransmitSlot>& slots) {
  PeerQueue& q = at(level, peer);
  const uint32_t slot = q.rtx_head;
  q.rtx_head = slots[slot].next;
  if (q.rtx_head == kNil) {
    q.rtx_tail = kNil;
    rtx_peers_[level].reset(peer);
    refresh(level);
  }
  return slot;
}

// ------------------------------------------------------------- PortScheduler

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

void PortScheduler::check_consumer() const {
#ifndef NDEBUG
  // The first _st call binds the consumer; any other thread is a contract bug.
  std::thread::id expected{};
  const std::thread::id self = std::this_thread::get_id();
  if (!consumer_.compare_exchange_strong(expected, self, std::memory_order_relaxed)) {
    assert(expected == self && "PortScheduler _st function called from a second thread");
  }
#endif
}

unsigned PortScheduler::tx_level(const Message& msg) const {
  return config_.mode == Mode::kStrict ? msg.priority : 0;
}

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
  check_consumer();
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

void PortScheduler::carve(const Pick& pick, uint32_t max_payload, Slice& out) {
  Message* msg = tx_.head(pick.level, pick.peer);
  const uint32_t offset = msg->carved_;
  if (config_.mode != Mode::kPartition) {
    const uint32_t len = std::min(max_payload, msg->len - offset);
    msg->carved_ = offset + len;
    if (msg->carved_ == msg->len) {
      tx_.pop_message(pick.level, pick.peer);
      msg->state_ = kCarved;
    }
    out = Slice{msg, offset, len, false, SliceKind::kData, msg->peer};
  } else {
    // A started partition is sent whole: the message stays at the head of its
    // peer's ready FIFO until every ready partition of it is carved.
    const uint64_t end = partition_end(*msg, msg->parts_sent_);
    const uint32_t len = static_cast<uint32_t>(std::min<uint64_t>(max_payload, end - offset));
    msg->carved_ = offset + len;
    if (msg->carved_ == end) {
      ++msg->parts_sent_;
      if (msg->parts_sent_ == msg->parts_ready_) tx_.pop_message(pick.level, pick.peer);
      if (msg->parts_sent_ == partitions(*msg)) msg->state_ = kCarved;
    }
    out = Slice{msg, offset, len, false, SliceKind::kData, msg->peer};
  }
  tx_.commit(pick);
  ++stats_.data_slices;
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

bool PortScheduler::take_retransmit(const Pick& pick, Slice& out) {
  const uint32_t slot = tx_.pop_retransmit(pick.level, pick.peer, rtx_slots_);
  const Slice slice = rtx_slots_[slot].slice;
  rtx_slots_[slot].next = rtx_free_;
  rtx_free_ = slot;
  tx_.commit(pick);
  Message* msg = slice.msg;
  --msg->rtx_queued_;
  if (msg->state_ == kCarved && msg->acked_ >= msg->len) {
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

bool PortScheduler::next_slice_st(const PeerMask& eligible, uint32_t max_payload, Slice& out) {
  check_consumer();
  if (max_payload == 0) [[unlikely]] {
    return false;
  }
  for (;;) {
    const std::optional<Pick> pick = tx_.pick(eligible);
    if (pick && pick->retransmit) {
      if (take_retransmit(*pick, out)) return true;
      continue;
    }
    // Partition mode: hand the most urgent unstarted partition to the "engine"
    // as soon as credit allows, ahead of data already started (ByteScheduler
    // starts a partition the moment credit frees).
    if (config_.mode == Mode::kPartition && start_partition(eligible, out)) return true;
    if (!pick) return false;
    carve(*pick, max_payload, out);
    return true;
  }
}

// Carves, in one go, the data slices that consecutive next_slice_st() calls
// would return from `pick.level` before anything but its own messages'
// progress changes their outcome. Those calls serve the level's eligible peers
// with messages ("lanes") in round-robin order, one slice each per round, from
// the head message of each, and this stays so while (a) nothing more urgent is
// eligible: true for the whole burst, since the levels above were empty or
// ineligible at the pick and nothing adds work during a burst; (b) no
// retransmission of the level is eligible: ruled out by the pick, and none is
// added; (c) in partition mode, no start-up can go first: start_partition()
// has just failed and neither credit nor the pending table changes while data
// is carved — nor `eligible` while no room runs out; (d) every lane's head
// message (partition) has bytes left and its peer has room. So R full rounds
// are exact, R being the fewest slices left in a lane's message or room: the
// round in which a message ends (or a room runs out) still serves the lanes
// after it, which have not changed — except in partition mode, where a peer
// leaving `eligible` can change what start_partition() picks, so the run
// stops at the first room that runs out. When more peers are queued than
// gathered, one partial round is carved and the caller picks again.
template <bool kRoom>
size_t PortScheduler::carve_run(const Pick& pick, PeerMask& eligible, uint32_t max_payload,
                                Slice* out, size_t n, uint32_t* room) {
  const bool partition = config_.mode == Mode::kPartition;
  auto end_of = [&](const Message& msg) {
    return partition ? partition_end(msg, msg.parts_sent_) : uint64_t{msg.len};
  };
  // Slices left in msg (partition), capped at n; a 0-byte one is one empty
  // slice. The division is only for the in-between case: one-packet messages
  // and long ones (the common cases) cost a compare.
  const uint64_t cap = std::min<uint64_t>(n, uint64_t{1} << 32);
  auto slices_left = [&](const Message& msg) {
    const uint64_t left = end_of(msg) - msg.carved_;
    if (left <= max_payload) return uint64_t{1};
    if (left >= cap * max_payload) return cap;
    return (left + max_payload - 1) / max_payload;
  };
  // Marks msg carved up to `offset`: it leaves its FIFO when its message (in
  // partition mode: every ready partition) is carved to the end.
  auto finish = [&](Message* msg, unsigned peer, uint32_t offset, size_t count) {
    const bool ended = offset == end_of(*msg);
    msg->carved_ = offset;
    if (ended) {
      if (!partition) {
        tx_.pop_message(pick.level, peer);
        msg->state_ = kCarved;
      } else {
        ++msg->parts_sent_;
        if (msg->parts_sent_ == msg->parts_ready_) tx_.pop_message(pick.level, peer);
        if (msg->parts_sent_ == partitions(*msg)) msg->state_ = kCarved;
      }
    }
    if constexpr (kRoom) {
      assert(room[peer] >= count && "next_slices_st: an eligible peer had no room");
      room[peer] -= static_cast<uint32_t>(count);
      if (room[peer] == 0) eligible.reset(peer);
    }
  };

  uint16_t peers[kMaxLanes];
  bool all = true;
  unsigned lanes = 1;
  peers[0] = static_cast<uint16_t>(pick.peer);
  // One peer at the level (or one slice wanted) is the common case: no gathering.
  if (n > 1 && !tx_.sole_data_peer(pick.level, pick.peer, eligible)) {
    lanes = tx_.rotation(pick.level, pick.peer, eligible, peers,
                         static_cast<unsigned>(std::min<size_t>(n, kMaxLanes)), all);
  }
  Message* heads[kMaxLanes];
  uint64_t rounds = all ? UINT64_MAX : 1;  // a partial rotation: one slice per gathered peer
  for (unsigned i = 0; i < lanes; ++i) {
    heads[i] = tx_.head(pick.level, peers[i]);
    rounds = std::min(rounds, slices_left(*heads[i]));
    if constexpr (kRoom) rounds = std::min<uint64_t>(rounds, room[peers[i]]);
  }
  size_t total = static_cast<size_t>(std::min<uint64_t>(rounds * lanes, n));
  if constexpr (kRoom) {
    // Partition mode: a peer whose room runs out leaves `eligible`, and that
    // can let start_partition() pick a partition it could not before (one of
    // another peer that fits the credit). Stop right after that slice.
    if (partition && lanes > 1) {
      for (unsigned i = 0; i < lanes; ++i) {
        const uint64_t r = room[peers[i]];
        if (r <= rounds) total = std::min<size_t>(total, (r - 1) * lanes + i + 1);
      }
    }
  }
  // Lane i's slices are out[i], out[i + lanes], ...: each lane is written in
  // one strided pass with its cursor in a register. Every slice but a
  // message's last is a full max_payload, so a packet is a few stores.
  auto write_lane = [&](unsigned i, size_t count, size_t stride) {
    // A lane after the end of a run cut short (partition mode, a room ran
    // out) gets nothing; above all, a 0-byte head must not be taken as carved.
    if (count == 0) return;
    Message* msg = heads[i];
    const uint16_t peer = peers[i];
    const uint64_t end = end_of(*msg);
    uint32_t offset = msg->carved_;
    // count <= slices left, so all but possibly the last are full.
    const size_t full = end - offset >= uint64_t{count} * max_payload ? count : count - 1;
    Slice* o = out + i;
    for (Slice* const stop = o + full * stride; o != stop; o += stride) {
      *o = Slice{msg, offset, max_payload, false, SliceKind::kData, peer};
      offset += max_payload;
    }
    if (full < count) {  // the message's (partition's) last, short or empty, slice
      *o = Slice{msg, offset, static_cast<uint32_t>(end - offset), false, SliceKind::kData, peer};
      offset = static_cast<uint32_t>(end);
    }
    finish(msg, peer, offset, count);
  };
  if (lanes == 1) {
    write_lane(0, total, 1);
    tx_.commit(pick);
  } else {
    const size_t rounds_done = total / lanes, extra = total % lanes;
    for (unsigned i = 0; i < lanes; ++i) write_lane(i, rounds_done + (i < extra ? 1 : 0), lanes);
    tx_.commit(Pick{pick.level, peers[extra == 0 ? lanes - 1 : extra - 1], false});
  }
  stats_.data_slices += total;
  return total;
}

template <bool kRoom>
size_t PortScheduler::carve_burst(PeerMask& eligible, uint32_t max_payload, Slice* out, size_t n,
                                  uint32_t* room) {
  // Takes `count` packets from the peer's room; a full peer leaves `eligible`.
  auto charge = [&](unsigned peer, size_t count) {
    if constexpr (kRoom) {
      assert(room[peer] >= count && "next_slices_st: an eligible peer had no room");
      room[peer] -= static_cast<uint32_t>(count);
      if (room[peer] == 0) eligible.reset(peer);
    }
  };
  size_t k = 0;
  while (k < n) {
    // The same decision, in the same order, as next_slice_st().
    const std::optional<Pick> pick = tx_.pick(eligible);
    if (pick && pick->retransmit) {
      if (take_retransmit(*pick, out[k])) charge(out[k++].peer, 1);
      continue;
    }
    if (config_.mode == Mode::kPartition && start_partition(eligible, out[k])) {
      charge(out[k++].peer, 1);
      continue;
    }
    if (!pick) break;
    k += carve_run<kRoom>(*pick, eligible, max_payload, out + k, n - k, room);
  }
  return k;
}

size_t PortScheduler::next_slices_st(const PeerMask& eligible, uint32_t max_payload, Slice* out,
                                     size_t n) {
  check_consumer();
  if (max_payload == 0) [[unlikely]] {
    return 0;
  }
  PeerMask mask = eligible;
  return carve_burst<false>(mask, max_payload, out, n, nullptr);
}

size_t PortScheduler::next_slices_st(PeerMask& eligible, uint32_t max_payload, Slice* out, size_t n,
                                     uint32_t* room) {
  check_consumer();
  if (max_payload == 0) [[unlikely]] {
    return 0;
  }
  return carve_burst<true>(eligible, max_payload, out, n, room);
}

bool PortScheduler::requeue_st(const Slice& slice) {
  check_consumer();
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

void PortScheduler::partition_ready_st(Message* msg) {
  check_consumer();
  if (config_.mode != Mode::kPartition || msg->parts_ready_ >= msg->parts_started_) return;
  // In tx_ iff it has ready partitions not yet fully carved.
  const bool listed = msg->parts_sent_ < msg->parts_ready_;
  ++msg->parts_ready_;
  if (!listed) tx_.push_message(0, msg);
}

bool PortScheduler::on_acked_st(Message* msg, uint32_t bytes) {
  check_consumer();
  msg->acked_ = static_cast<uint32_t>(std::min<uint64_t>(uint64_t{msg->acked_} + bytes, msg->len));
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
  if (msg->state_ == kCarved && msg->acked_ >= msg->len) return try_release(msg);
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
  check_consumer();
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
  check_consumer();
  return !tx_.empty() || !pending_.empty();
}

SchedulerStats PortScheduler::stats_st() const {
  check_consumer();
  SchedulerStats s = stats_;
  s.submit_full = producer_stats_.full.load(std::memory_order_relaxed);
  s.submit_invalid = producer_stats_.invalid.load(std::memory_order_relaxed);
  return s;
}

}  // namespace mercury::sched
