// PortScheduler, what goes next: next_slice_st() picks one packet (a queued
// retransmission, a partition start-up, or new data) and carve() cuts it;
// next_slices_st() returns the same sequence a burst at a time, picking once
// per run of slices (carve_run) instead of once per packet. Strict and fifo
// differ only in the level a message queues at; partition mode carves only
// partitions whose start-up completed (port_scheduler_partition.cpp). See
// port_scheduler.h and docs/sched.md.
#include <algorithm>
#include <cassert>

#include "sched/port_scheduler.h"

namespace mercury::sched {

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

bool PortScheduler::next_slice_st(const PeerMask& eligible, uint32_t max_payload, Slice& out) {
  MERCURY_OWNED(consumer_);
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
  MERCURY_OWNED(consumer_);
  if (max_payload == 0) [[unlikely]] {
    return 0;
  }
  PeerMask mask = eligible;
  return carve_burst<false>(mask, max_payload, out, n, nullptr);
}

size_t PortScheduler::next_slices_st(PeerMask& eligible, uint32_t max_payload, Slice* out, size_t n,
                                     uint32_t* room) {
  MERCURY_OWNED(consumer_);
  if (max_payload == 0) [[unlikely]] {
    return 0;
  }
  return carve_burst<true>(eligible, max_payload, out, n, room);
}

}  // namespace mercury::sched
