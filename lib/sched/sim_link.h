// SimLink: a stand-in for the transport and the wire, for the scheduler's
// tests and benchmarks only (never linked into the datapath; it allocates).
//
// It runs the TX loop exactly as docs/sched.md prescribes — deliver the acks
// that are due, drain the ingress once, then carve a burst of up to B packets
// for peers whose window of W packets is open — on a link that carries one
// packet per time unit and returns each packet's ack D time units after it
// left. A kPartitionStart control's ack is the end of the partition's
// start-up exchange, so it calls partition_ready_st(). Time is counted in
// packets, so figures convert to any line rate: t packets of 1500 bytes take
// t * 12000 / rate_bps seconds.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <vector>

#include "sched/port_scheduler.h"

namespace mercury::sched::sim {

struct LinkParams {
  uint32_t window = 64;     ///< W: packets in flight per peer
  uint32_t burst = 32;      ///< B: packets carved per TX loop pass
  uint32_t ack_delay = 32;  ///< D: packet-times from send to its ack (an RTT)
  uint32_t payload = 1416;  ///< bytes per data packet (MTU 1500 before whole-line payloads)
  bool burst_api = false;   ///< carve with next_slices_st() and per-peer room, not slice by slice
};

class SimLink {
 public:
  /// Called for every slice sent: the slice, the time it left, and its index
  /// in the current burst (a test injects a submit between two of them).
  using OnSlice = std::function<void(const Slice&, uint64_t time, uint32_t index_in_burst)>;

  SimLink(PortScheduler& sched, LinkParams params)
      : sched_(sched), params_(params), in_flight_(sched.config().num_peers, 0) {}

  /// One pass of the TX loop. Returns the number of slices sent.
  uint32_t pass(const OnSlice& on_slice = {}) {
    deliver_acks();
    sched_.drain_ingress_st();
    PeerMask eligible;
    for (unsigned p = 0; p < in_flight_.size(); ++p) {
      if (in_flight_[p] < params_.window) eligible.set(p);
    }
    uint32_t sent = 0;
    if (params_.burst_api) {
      // The same loop in one call: each peer's open window is its room.
      room_.resize(in_flight_.size());
      for (unsigned p = 0; p < in_flight_.size(); ++p) room_[p] = params_.window - in_flight_[p];
      burst_.resize(params_.burst);
      const size_t n = sched_.next_slices_st(eligible, params_.payload, burst_.data(),
                                             burst_.size(), room_.data());
      for (size_t i = 0; i < n; ++i) {
        const Slice& s = burst_[i];
        flight_.push_back({s, now_ + params_.ack_delay});
        ++in_flight_[s.msg->peer];
        if (on_slice) on_slice(s, now_, sent);
        ++now_;
        ++sent;
      }
    } else {
      Slice s;
      while (sent < params_.burst && sched_.next_slice_st(eligible, params_.payload, s)) {
        const uint16_t peer = s.msg->peer;
        flight_.push_back({s, now_ + params_.ack_delay});
        if (++in_flight_[peer] == params_.window) eligible.reset(peer);
        if (on_slice) on_slice(s, now_, sent);
        ++now_;
        ++sent;
      }
    }
    if (sent == 0 && !flight_.empty() && flight_.front().ack_at > now_) {
      now_ = flight_.front().ack_at;  // idle link: jump to the next ack
    }
    return sent;
  }

  /// Runs passes until nothing is queued and nothing is in flight, or until
  /// `max_passes`. Returns true if everything finished.
  bool run_until_idle(const OnSlice& on_slice = {}, uint64_t max_passes = UINT64_MAX) {
    for (uint64_t i = 0; i < max_passes; ++i) {
      const uint32_t sent = pass(on_slice);
      if (sent == 0 && flight_.empty() && !sched_.has_work_st()) return true;
    }
    return false;
  }

  uint64_t now() const { return now_; }
  uint32_t in_flight(unsigned peer) const { return in_flight_[peer]; }
  size_t in_flight_total() const { return flight_.size(); }
  /// Packets in flight (sent, not acked) for which `pred` holds.
  template <typename Pred>
  size_t count_in_flight(Pred pred) const {
    size_t n = 0;
    for (const Flight& f : flight_) n += pred(f.slice) ? 1 : 0;
    return n;
  }

 private:
  struct Flight {
    Slice slice;
    uint64_t ack_at;
  };

  void deliver_acks() {
    while (!flight_.empty() && flight_.front().ack_at <= now_) {
      const Slice s = flight_.front().slice;
      flight_.pop_front();
      --in_flight_[s.msg->peer];
      if (s.kind == SliceKind::kPartitionStart) {
        sched_.partition_ready_st(s.msg);
      } else {
        sched_.on_acked_st(s.msg, s.len);
      }
    }
  }

  PortScheduler& sched_;
  LinkParams params_;
  std::vector<uint32_t> in_flight_;
  std::vector<uint32_t> room_;  // burst_api: per-peer room for next_slices_st()
  std::vector<Slice> burst_;
  std::deque<Flight> flight_;
  uint64_t now_ = 0;
};

}  // namespace mercury::sched::sim
