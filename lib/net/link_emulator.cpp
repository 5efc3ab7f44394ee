#include "net/link_emulator.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>

#include "net/payload_ref.h"

namespace mercury::net {

namespace {

void check_probability(double p, const char* name) {
  // Written so that NaN fails too.
  if (!(p >= 0.0 && p <= 1.0)) {
    throw std::invalid_argument(std::string("link: ") + name +
                                " must be a probability in [0, 1], got " + std::to_string(p));
  }
}

void check_rate(double gbps) {
  if (gbps == 0) return;
  if (!(gbps >= LinkParams::kMinRateGbps && gbps <= LinkParams::kMaxRateGbps)) {
    throw std::invalid_argument(
        "link: rate_gbps must be 0 (unlimited) or in [" + std::to_string(LinkParams::kMinRateGbps) +
        ", " + std::to_string(LinkParams::kMaxRateGbps) + "], got " + std::to_string(gbps));
  }
}

uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint32_t effective_queue_packets(const LinkParams& p) {
  return p.queue_packets != 0 ? p.queue_packets : LinkParams::kDefaultQueuePackets;
}

uint32_t effective_reorder_gap(const LinkParams& p) {
  return p.reorder_gap != 0 ? p.reorder_gap : LinkParams::kDefaultReorderGap;
}

// Whole TSC ticks in `us` microseconds, rounded down (128-bit: no overflow).
uint64_t us_to_ticks(uint64_t us, uint64_t tsc_hz) {
  return static_cast<uint64_t>(static_cast<unsigned __int128>(us) * tsc_hz / 1'000'000u);
}

}  // namespace

void validate(const LinkParams& p) {
  check_rate(p.rate_gbps);
  if (p.delay_us > LinkParams::kMaxDelayUs) {
    throw std::invalid_argument("link: delay_us must be at most " +
                                std::to_string(LinkParams::kMaxDelayUs) + ", got " +
                                std::to_string(p.delay_us));
  }
  check_probability(p.loss, "loss");
  check_probability(p.duplicate, "duplicate");
  check_probability(p.reorder, "reorder");
  check_probability(p.corrupt, "corrupt");
  const uint32_t queue = effective_queue_packets(p);
  if (queue < 2 || queue > LinkParams::kMaxQueuePackets) {
    throw std::invalid_argument("link: queue_packets must be in [2, " +
                                std::to_string(LinkParams::kMaxQueuePackets) + "], got " +
                                std::to_string(p.queue_packets));
  }
  if (effective_reorder_gap(p) > queue) {
    throw std::invalid_argument("link: reorder_gap (" + std::to_string(p.reorder_gap) +
                                ") must not exceed queue_packets (" + std::to_string(queue) + ")");
  }
}

Xoshiro256::Xoshiro256(uint64_t seed) {
  // splitmix64 spreads any seed, 0 included, over the whole state; the
  // state can then never be all zero.
  for (auto& s : s_) s = splitmix64(seed);
}

// ---------------------------------------------------------------------------
// LinkModel

LinkModel::LinkModel(const LinkParams& p, uint64_t tsc_hz)
    : rng_(p.seed), params_(p), tsc_hz_(tsc_hz) {
  validate(p);
  // Above 10 GHz the fixed-point wire time of a jumbo frame at the slowest
  // rate would overflow 64 bits; no TSC runs that fast.
  if (tsc_hz == 0 || tsc_hz > 10'000'000'000ull) {
    throw std::invalid_argument("link: tsc_hz must be in (0, 10 GHz], got " +
                                std::to_string(tsc_hz));
  }
  loss_threshold_ = threshold(p.loss);
  duplicate_threshold_ = threshold(p.duplicate);
  corrupt_threshold_ = threshold(p.corrupt);
  reorder_threshold_ = threshold(p.reorder);
  delay_ticks_ = us_to_ticks(p.delay_us, tsc_hz);
  set_rate_gbps(p.rate_gbps);
}

uint64_t LinkModel::threshold(double p) {
  if (p <= 0) return 0;
  if (p >= 1) return kAlways;
  // A draw below p * 2^64 happens with probability p (to 2^-64).
  return static_cast<uint64_t>(std::ldexp(p, 64));
}

void LinkModel::set_rate_gbps(double gbps) {
  check_rate(gbps);
  if (wire_ != nullptr && gbps != params_.rate_gbps) {
    throw std::invalid_argument("link: the rate of shared wire " + wire_->name() +
                                " cannot change");
  }
  params_.rate_gbps = gbps;
  if (gbps == 0) {
    ticks_per_byte_q32_ = 0;
  } else {
    // ticks per byte = tsc_hz * 8 / (gbps * 1e9), kept in 32.32 fixed point
    // so that 10^5 frames accumulate no rounding drift worth a tick.
    const double ticks_per_byte = static_cast<double>(tsc_hz_) * 8.0 / (gbps * 1e9);
    ticks_per_byte_q32_ = static_cast<uint64_t>(std::llround(std::ldexp(ticks_per_byte, 32)));
  }
  update_passthrough();
}

void LinkModel::share_wire(SharedWire* wire) {
  if (ticks_per_byte_q32_ == 0) {
    throw std::invalid_argument("link: a shared wire needs a rate (rate_gbps > 0)");
  }
  if (wire->rate_gbps() != params_.rate_gbps) {
    throw std::invalid_argument("link: shared wire " + wire->name() + " runs at " +
                                std::to_string(wire->rate_gbps()) + " Gbit/s, this link at " +
                                std::to_string(params_.rate_gbps));
  }
  wire_ = wire;
}

// ---------------------------------------------------------------------------
// LinkEmulator

LinkEmulator::LinkEmulator(uint16_t port, uint16_t queue, const LinkParams& p,
                           rte_mempool* copy_pool, uint64_t tsc_hz)
    : port_(port),
      queue_(queue),
      hold_ticks_(us_to_ticks(kMaxHoldUs, tsc_hz)),
      copy_pool_(copy_pool),
      model_(p, tsc_hz) {
  // The sizes are derived here, after model_ has validated the parameters.
  if (p.duplicate > 0 && copy_pool == nullptr) {
    throw std::invalid_argument("link: duplicate > 0 needs a mempool for the copies");
  }
  line_limit_ = effective_queue_packets(p);
  line_mask_ = std::bit_ceil(line_limit_) - 1;
  held_mask_ = std::bit_ceil(effective_reorder_gap(p) + 1) - 1;
  line_mbufs_.assign(line_mask_ + 1u, nullptr);
  line_due_.assign(line_mask_ + 1u, 0);
  held_.assign(held_mask_ + 1u, Held{});
  passthrough_ = model_.passthrough();
}

LinkEmulator::~LinkEmulator() {
  for (uint32_t i = 0; i < line_count_; ++i) {
    rte_pktmbuf_free(line_mbufs_[(line_head_ + i) & line_mask_]);
  }
  for (uint32_t i = 0; i < held_count_; ++i) {
    rte_pktmbuf_free(held_[(held_head_ + i) & held_mask_].m);
  }
}

void LinkEmulator::set_rate_gbps(double gbps) {
  model_.set_rate_gbps(gbps);
  passthrough_ = model_.passthrough();
}

void LinkEmulator::set_schedule(RateSchedule schedule) { schedule_ = std::move(schedule); }

void LinkEmulator::anchor_schedule(uint64_t now) { schedule_.anchor(now); }

void LinkEmulator::apply_schedule(uint64_t now) {
  if (const std::optional<double> rate = schedule_.due(now)) {
    set_rate_gbps(*rate);  // validated by the schedule: cannot throw
    ++counters_.rate_changes;
  }
}

// ---------------------------------------------------------------------------
// RateSchedule

RateSchedule::RateSchedule(std::vector<Step> steps, uint64_t tsc_hz) : steps_(std::move(steps)) {
  double last = 0;
  for (size_t i = 0; i < steps_.size(); ++i) {
    const Step& s = steps_[i];
    const std::string which = "link: rate step " + std::to_string(i + 1) + ": ";
    if (!(s.at_s > last) || s.at_s > 1e6) {
      throw std::invalid_argument(which +
                                  "at_s must be after the previous step's (and > 0, "
                                  "<= 1e6 s)");
    }
    LinkParams p;
    p.rate_gbps = s.rate_gbps;
    try {
      validate(p);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(which + e.what());
    }
    last = s.at_s;
    after_.push_back(static_cast<uint64_t>(s.at_s * static_cast<double>(tsc_hz)));
  }
}

void RateSchedule::anchor(uint64_t now) {
  if (anchored_) return;
  anchored_ = true;
  anchor_ = now;
  refresh_next_at();
}

void RateSchedule::refresh_next_at() {
  next_at_ = anchored_ && next_ < after_.size() ? anchor_ + after_[next_]
                                                : std::numeric_limits<uint64_t>::max();
}

std::optional<double> RateSchedule::due(uint64_t now) {
  // next_at_ is UINT64_MAX unanchored or with every step applied.
  if (now < next_at_ || next_ >= after_.size()) return std::nullopt;
  while (next_ + 1 < after_.size() && now >= anchor_ + after_[next_ + 1]) ++next_;
  const double rate = steps_[next_].rate_gbps;
  ++next_;
  refresh_next_at();
  return rate;
}

uint64_t LinkEmulator::next_due() const {
  uint64_t due = std::numeric_limits<uint64_t>::max();
  if (line_count_ != 0) due = line_due_[line_head_];
  if (held_count_ != 0) due = std::min(due, held_[held_head_].deadline);
  return due;
}

void LinkEmulator::flip_bit(rte_mbuf* m, uint32_t offset, uint8_t mask) {
  // Walk the segments: the chosen byte may sit past the first one.
  for (rte_mbuf* seg = m; seg != nullptr; seg = seg->next) {
    if (offset < seg->data_len) {
      *rte_pktmbuf_mtod_offset(seg, uint8_t*, offset) ^= mask;
      return;
    }
    offset -= seg->data_len;
  }
}

void LinkEmulator::release_held(uint64_t now) {
  // Held frames leave in the order they were held: both their count and
  // time limits grow in that order, so only the head needs checking.
  while (held_count_ != 0 && line_count_ < line_limit_) {
    const Held& h = held_[held_head_];
    if (taken_ <= h.release_after && now < h.deadline) break;
    rte_mbuf* m = h.m;
    held_head_ = (held_head_ + 1) & held_mask_;
    --held_count_;
    --queued_;
    enqueue(m, now);
  }
}

uint16_t LinkEmulator::tx_burst_emulated(rte_mbuf** pkts, uint16_t n, uint64_t now) {
  const uint32_t reorder_gap = effective_reorder_gap(model_.params());
  // A frame may need two slots (itself and its copy); refusing it when only
  // one is free keeps the check to one comparison.
  const uint32_t slots = model_.params().duplicate > 0 ? 2 : 1;
  uint16_t taken = 0;
  for (; taken < n; ++taken) {
    if (held_count_ != 0) release_held(now);
    if (line_count_ + slots > line_limit_ || held_count_ > held_mask_) break;
    rte_mbuf* m = pkts[taken];
    const uint32_t len = rte_pktmbuf_pkt_len(m);
    const LinkFate fate = model_.decide(len);
    ++taken_;
    if (fate.lost) {
      ++counters_.lost;
      rte_pktmbuf_free(m);
      continue;
    }
    rte_mbuf* copy = nullptr;
    if (fate.duplicate) {
      // A deep copy: the stack may reuse or modify the original's data, and
      // the copy must stay intact when the original is corrupted.
      copy = rte_pktmbuf_copy(m, copy_pool_, 0, UINT32_MAX);
      if (copy == nullptr) {
        ++counters_.duplicate_no_mbuf;
      } else {
        ++counters_.duplicated;
      }
    }
    if (fate.corrupt) {
      // Never a bit of the sender's memory (payload_ref.h).
      take_payload_in(m);
      flip_bit(m, fate.corrupt_offset, fate.corrupt_mask);
      ++counters_.corrupted;
    }
    if (fate.reorder) {
      take_payload_in(m);  // held past this call
      ++counters_.reordered;
      const uint32_t slot = (held_head_ + held_count_) & held_mask_;
      held_[slot] = Held{m, taken_ - 1 + reorder_gap, now + hold_ticks_};
      ++held_count_;
      ++queued_;
    } else {
      enqueue(m, now);
    }
    if (copy != nullptr) enqueue(copy, now);
  }
  counters_.queue_full += n - taken;
  if (held_count_ != 0) release_held(now);
  poll_emulated(now);
  // What this call put on the line and the PMD has not taken stays past it:
  // a payload still in the sender's memory comes in now (payload_ref.h). The
  // line is FIFO, so those frames are its newest `appended_` at most; frames
  // sent at once (no delay, no rate limit) keep their payload by reference.
  const uint32_t kept = std::min(appended_, line_count_);
  for (uint32_t i = 0; i < kept; ++i) {
    take_payload_in(line_mbufs_[(line_head_ + line_count_ - 1 - i) & line_mask_]);
  }
  appended_ = 0;
  return taken;
}

uint16_t LinkEmulator::poll_emulated(uint64_t now) {
  if (held_count_ != 0) release_held(now);
  uint16_t sent_total = 0;
  while (line_count_ != 0) {
    // Due frames form a prefix of the line (due times never decrease), sent
    // straight from the ring up to its wrap point.
    const uint32_t contiguous = std::min(line_count_, line_mask_ + 1 - line_head_);
    const uint32_t limit = std::min<uint32_t>(contiguous, kBurst);
    uint16_t due = 0;
    while (due < limit && line_due_[line_head_ + due] <= now) ++due;
    if (due == 0) break;
    const uint16_t sent = rte_eth_tx_burst(port_, queue_, &line_mbufs_[line_head_], due);
    line_head_ = (line_head_ + sent) & line_mask_;
    line_count_ -= sent;
    queued_ -= sent;
    sent_total += sent;
    counters_.sent += sent;
    if (sent < due) {
      counters_.pmd_refused += due - sent;
      break;
    }
  }
  return sent_total;
}

}  // namespace mercury::net
