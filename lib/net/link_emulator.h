// The link emulator: a seeded, deterministic impairment stage in front of one
// TX queue (this kernel has no netem, so this is how Mercury is tested under
// loss, duplication, reordering, corruption, delay and a slower wire).
//
// Two layers:
//   * LinkModel is the pure model. Per frame it decides the frame's fate
//     (lost, duplicated, corrupted at which bit, held back for reordering)
//     from a seeded xoshiro256** generator, and when the frame may leave: a
//     serialising line-rate limiter on the TSC plus a fixed one-way delay.
//     It touches no DPDK state, so it is unit-tested without EAL and with a
//     fake clock. The same seed and the same sequence of calls give the same
//     decisions.
//   * LinkEmulator is the mbuf stage. tx_burst() has rte_eth_tx_burst
//     semantics (returns how many frames it took; the caller keeps the rest:
//     back-pressure, never loss, when the bounded delay line is full);
//     poll() hands frames whose time has come to rte_eth_tx_burst() and keeps
//     those the PMD refuses, in order. With every parameter off, tx_burst()
//     is rte_eth_tx_burst() behind one branch.
//
// Threading: a LinkEmulator belongs to the lcore that owns its TX queue;
// every call comes from that lcore (the `_st`-style contract of the TX queue
// itself). Nothing is locked, nothing allocates after construction, nothing
// logs; the constructor may throw std::invalid_argument on bad parameters.
//
// Costs: pass-through is one predictable branch plus a counter add. With
// impairments on, each frame costs one to four PRNG draws (only for the
// impairments that are on), a 16-byte slot in the delay line, and a copy for
// a duplicate; poll() sends due frames in bursts straight from the line.
//
// docs/link-emulator.md is the guide: model, formulas, counters, and how to
// emulate 10/25/100 Gbit/s links with scaled compute.
#pragma once

#include <rte_ethdev.h>
#include <rte_mbuf.h>

#include "shared_wire.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

namespace mercury::net {

/// The impairments of one emulated link. Every field at 0 means "off" (or
/// "default" for the sizes), so a value-initialised LinkParams is a perfect
/// wire. Probabilities are per frame, independent draws.
struct LinkParams {
  double rate_gbps = 0;        ///< line rate in Gbit/s on the wire; 0 = unlimited
  uint64_t delay_us = 0;       ///< fixed one-way delay added to every frame
  double loss = 0;             ///< probability a frame is dropped
  double duplicate = 0;        ///< probability a frame is sent twice
  double reorder = 0;          ///< probability a frame is held back behind later ones
  double corrupt = 0;          ///< probability one bit of the frame is flipped
  uint64_t seed = 0;           ///< PRNG seed (any value, 0 included)
  uint32_t queue_packets = 0;  ///< bound of the delay line; 0 = kDefaultQueuePackets
  uint32_t reorder_gap = 0;    ///< a held frame leaves after this many later ones; 0 = default

  static constexpr uint32_t kDefaultQueuePackets = 4096;
  static constexpr uint32_t kDefaultReorderGap = 3;
  static constexpr uint32_t kMaxQueuePackets = 1u << 20;
  /// Slowest rate accepted: keeps the fixed-point serialisation time in range.
  static constexpr double kMinRateGbps = 0.001;
  static constexpr double kMaxRateGbps = 10000;
  static constexpr uint64_t kMaxDelayUs = 10'000'000;

  /// True when any impairment (rate, delay, loss, ...) is on.
  [[nodiscard]] bool impairs() const {
    return rate_gbps != 0 || delay_us != 0 || loss != 0 || duplicate != 0 || reorder != 0 ||
           corrupt != 0;
  }
};

/// Throws std::invalid_argument naming the first field that is out of range
/// (probabilities outside [0, 1], NaN, a rate outside [kMinRateGbps,
/// kMaxRateGbps], a delay above kMaxDelayUs, sizes out of bounds).
void validate(const LinkParams& p);

/// Bytes a frame occupies on the wire beyond what the mbuf holds: preamble
/// and start delimiter (8), inter-frame gap (12) and FCS (4).
inline constexpr uint32_t kWireOverheadBytes = 24;
/// Frames shorter than this (without FCS) are padded on the wire.
inline constexpr uint32_t kMinWireFrame = 60;
/// Corruption never touches the Ethernet header, so a corrupted frame still
/// reaches its receiver and is caught there by the IPv4/UDP checksums.
inline constexpr uint32_t kCorruptFrom = 14;

/// xoshiro256** seeded through splitmix64: fast, 2^256-1 period, and fully
/// determined by the seed.
class Xoshiro256 {
 public:
  explicit Xoshiro256(uint64_t seed);
  uint64_t operator()() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

/// What the model decided for one frame.
struct LinkFate {
  bool lost = false;       ///< drop it (nothing else applies)
  bool duplicate = false;  ///< send an unmodified copy as well
  bool reorder = false;    ///< hold it back until reorder_gap later frames were taken
  bool corrupt = false;    ///< flip bit `corrupt_mask` of byte `corrupt_offset`
  uint8_t corrupt_mask = 0;
  uint32_t corrupt_offset = 0;  ///< in [kCorruptFrom, frame_len)
};

/// The pure model of one link direction. Single-threaded; no allocation.
class LinkModel {
 public:
  /// `tsc_hz` is the tick rate of the `now` values given to schedule().
  /// Throws std::invalid_argument on invalid parameters (see validate()).
  LinkModel(const LinkParams& p, uint64_t tsc_hz);

  /// The fate of the next frame, of `frame_len` bytes (without FCS). Draws
  /// from the PRNG only for the impairments that are on, in the order loss,
  /// duplicate, corrupt (+1 draw for the position), reorder; a lost frame
  /// draws nothing further.
  LinkFate decide(uint32_t frame_len);

  /// Puts a frame of `frame_len` bytes on the link at TSC `now` and returns
  /// the TSC at which it has arrived at the far end: when its last bit has
  /// been serialised at the line rate behind the frames before it, plus the
  /// fixed delay. Departures never decrease while `now` does not.
  uint64_t schedule(uint32_t frame_len, uint64_t now);

  /// Changes the line rate for frames scheduled from now on (0 = unlimited);
  /// for emulating time-varying bandwidth. Throws on a bad rate, and on any
  /// change while the model shares a wire (its users agreed on one rate).
  void set_rate_gbps(double gbps);

  /// Control path: from now on frames are serialised on `wire` (which must
  /// outlive the model), behind every other user's frames, instead of on
  /// this model's own wire. Wire time is then counted in whole ticks per
  /// frame (rounded up; under 1e-4 of a 1500-byte frame's time at 10
  /// Gbit/s). Throws std::invalid_argument when the rate is unlimited or is
  /// not the wire's.
  void share_wire(SharedWire* wire);
  [[nodiscard]] const SharedWire* shared_wire() const { return wire_; }

  /// True when no impairment is on: frames may bypass the model entirely.
  [[nodiscard]] bool passthrough() const { return passthrough_; }
  [[nodiscard]] const LinkParams& params() const { return params_; }
  [[nodiscard]] uint64_t tsc_hz() const { return tsc_hz_; }
  [[nodiscard]] uint64_t delay_ticks() const { return delay_ticks_; }
  /// TSC ticks per byte on the wire, scaled by 2^32; 0 when unlimited.
  [[nodiscard]] uint64_t ticks_per_byte_q32() const { return ticks_per_byte_q32_; }
  /// Wire time of a frame, in TSC ticks scaled by 2^32; 0 when unlimited.
  [[nodiscard]] uint64_t serialisation_q32(uint32_t frame_len) const;

 private:
  static uint64_t threshold(double p);
  bool chance(uint64_t threshold) {
    // Only called for a threshold that is on; kAlways makes p = 1 exact.
    return threshold == kAlways || rng_() < threshold;
  }
  void update_passthrough() { passthrough_ = !params_.impairs(); }

  static constexpr uint64_t kAlways = std::numeric_limits<uint64_t>::max();

  Xoshiro256 rng_;
  uint64_t loss_threshold_;
  uint64_t duplicate_threshold_;
  uint64_t corrupt_threshold_;
  uint64_t reorder_threshold_;
  uint64_t ticks_per_byte_q32_ = 0;  ///< 0 = unlimited rate
  uint64_t delay_ticks_;
  uint64_t free_at_ = 0;  ///< the link is busy until free_at_ + free_at_frac_ / 2^32
  uint32_t free_at_frac_ = 0;
  SharedWire* wire_ = nullptr;  ///< null: the model's own wire (free_at_)
  bool passthrough_ = true;
  LinkParams params_;
  uint64_t tsc_hz_;
};

/// Changes of the line rate at set times after an anchor (the moment the
/// owning node saw its job start): time-varying bandwidth. Pure: the caller
/// passes the clock. Control path: the constructor validates and allocates.
class RateSchedule {
 public:
  struct Step {
    double at_s;       ///< seconds after the anchor, > 0, increasing
    double rate_gbps;  ///< the new line rate; 0 = unlimited
  };

  RateSchedule() = default;
  /// Throws std::invalid_argument naming the step that is out of order or
  /// whose rate LinkParams would refuse.
  RateSchedule(std::vector<Step> steps, uint64_t tsc_hz);

  /// Starts the clock at TSC `now`; later calls change nothing.
  void anchor(uint64_t now);
  /// The rate of the last step due at `now` that no earlier call returned,
  /// or nothing (steps that came due together collapse into the last one).
  std::optional<double> due(uint64_t now);
  /// When the next step is due: UINT64_MAX before the anchor and after the
  /// last step.
  [[nodiscard]] uint64_t next_at() const { return next_at_; }
  [[nodiscard]] size_t applied() const { return next_; }

 private:
  std::vector<uint64_t> after_;  ///< ticks after the anchor, per step
  std::vector<Step> steps_;
  size_t next_ = 0;
  uint64_t anchor_ = 0;
  bool anchored_ = false;
  uint64_t next_at_ = std::numeric_limits<uint64_t>::max();
  // next_at_ from the anchor and the next step.
  void refresh_next_at();
};

/// What the emulator did, by reason. Plain counters owned by the TX lcore.
struct LinkCounters {
  uint64_t sent = 0;               ///< frames the PMD accepted (copies included)
  uint64_t lost = 0;               ///< frames dropped by the model (freed)
  uint64_t duplicated = 0;         ///< copies made and queued
  uint64_t duplicate_no_mbuf = 0;  ///< copies skipped: the copy pool was empty
  uint64_t corrupted = 0;          ///< frames with one bit flipped
  uint64_t reordered = 0;          ///< frames held back behind later ones
  uint64_t delayed = 0;            ///< frames that waited in the delay line
  uint64_t queue_full = 0;         ///< frames refused by tx_burst(): the caller kept them
  uint64_t pmd_refused = 0;        ///< frames the PMD refused in poll(): kept, retried
  uint64_t rate_changes = 0;       ///< steps of the rate schedule applied
};

/// The mbuf stage for one (port, TX queue). Owned by that queue's lcore.
class LinkEmulator {
 public:
  /// The reorder hold is also bounded in time, so a held frame still leaves
  /// when its sender falls silent.
  static constexpr uint64_t kMaxHoldUs = 100;
  /// Most frames handed to the PMD in one rte_eth_tx_burst() call.
  static constexpr uint16_t kBurst = 32;

  /// `copy_pool` supplies duplicates and may be null when `p.duplicate` is 0.
  /// `tsc_hz` is the rate of the `now` values passed in (rte_get_tsc_hz() in
  /// production, anything in tests). Control path: allocates the delay line
  /// and throws std::invalid_argument on bad parameters.
  LinkEmulator(uint16_t port, uint16_t queue, const LinkParams& p, rte_mempool* copy_pool,
               uint64_t tsc_hz);
  /// Frees every frame still held or queued.
  ~LinkEmulator();
  LinkEmulator(const LinkEmulator&) = delete;
  LinkEmulator& operator=(const LinkEmulator&) = delete;

  /// Takes up to `n` frames at TSC `now` and returns how many it took; the
  /// caller still owns pkts[ret..n). Frames taken are lost (freed), or
  /// queued to leave at their departure time; whatever is due is handed to
  /// the PMD before returning. Refuses (back-pressure) when the delay line
  /// is full. Never blocks, allocates (beyond a copy mbuf) or fails.
  uint16_t tx_burst(rte_mbuf** pkts, uint16_t n, uint64_t now) {
    if (passthrough_ && queued_ == 0) [[likely]] {
      const uint16_t sent = rte_eth_tx_burst(port_, queue_, pkts, n);
      counters_.sent += sent;
      return sent;
    }
    return tx_burst_emulated(pkts, n, now);
  }

  /// Hands the frames due at TSC `now` to the PMD, in order; returns how many
  /// it accepted. Call it every pass of the poll loop.
  uint16_t poll(uint64_t now) {
    if (now >= schedule_.next_at()) [[unlikely]]
      apply_schedule(now);
    if (queued_ == 0) [[likely]]
      return 0;
    return poll_emulated(now);
  }

  /// Changes the emulated line rate from now on (see LinkModel).
  void set_rate_gbps(double gbps);
  /// Control path, before the loop runs: serialise on `wire` (see LinkModel).
  void share_wire(SharedWire* wire) { model_.share_wire(wire); }
  /// Control path, before the loop runs: the rate changes poll() applies
  /// once anchor_schedule() started their clock.
  void set_schedule(RateSchedule schedule);
  /// Starts the schedule's clock at TSC `now` (the first call only).
  void anchor_schedule(uint64_t now);

  /// Frames in the delay line or held for reordering.
  [[nodiscard]] uint32_t queued() const { return queued_; }
  /// The TSC at which the next queued frame is due, or UINT64_MAX when none
  /// is queued: lets an idle loop sleep until then.
  [[nodiscard]] uint64_t next_due() const;
  [[nodiscard]] const LinkCounters& counters() const { return counters_; }
  [[nodiscard]] const LinkModel& model() const { return model_; }

 private:
  struct Held {
    rte_mbuf* m;
    uint64_t release_after;  ///< leaves once taken_ exceeds this
    uint64_t deadline;       ///< or once `now` reaches this
  };

  uint16_t tx_burst_emulated(rte_mbuf** pkts, uint16_t n, uint64_t now);
  void apply_schedule(uint64_t now);
  uint16_t poll_emulated(uint64_t now);
  void enqueue(rte_mbuf* m, uint64_t now);
  void release_held(uint64_t now);
  static void flip_bit(rte_mbuf* m, uint32_t offset, uint8_t mask);

  // Hot fields first: the pass-through branch touches only the first 24
  // bytes (flag, port, queue, queued_ and counters_.sent).
  bool passthrough_ = true;
  uint16_t port_;
  uint16_t queue_;
  uint32_t queued_ = 0;  ///< line_count_ + held_count_
  LinkCounters counters_;
  uint32_t line_head_ = 0;
  uint32_t line_count_ = 0;
  uint32_t appended_ = 0;    ///< frames put on the line since tx_burst_emulated last looked
  uint32_t line_limit_ = 0;  ///< queue_packets: frames the line may hold
  uint32_t line_mask_ = 0;   ///< capacity - 1 (capacity a power of two >= limit)
  uint32_t held_head_ = 0;
  uint32_t held_count_ = 0;
  uint32_t held_mask_ = 0;
  uint64_t taken_ = 0;  ///< frames taken by tx_burst() so far
  uint64_t hold_ticks_;
  rte_mempool* copy_pool_;
  // The line is two parallel arrays so that due frames are handed to the PMD
  // straight from line_mbufs_, without copying pointers.
  std::vector<rte_mbuf*> line_mbufs_;
  std::vector<uint64_t> line_due_;
  std::vector<Held> held_;
  RateSchedule schedule_;
  LinkModel model_;
};

// ---------------------------------------------------------------------------
// The per-frame path, inline: called for every frame the emulator takes.

inline uint64_t LinkModel::serialisation_q32(uint32_t frame_len) const {
  const uint64_t wire = std::max(frame_len, kMinWireFrame) + uint64_t{kWireOverheadBytes};
  return wire * ticks_per_byte_q32_;
}

inline LinkFate LinkModel::decide(uint32_t frame_len) {
  LinkFate f;
  if (loss_threshold_ != 0 && chance(loss_threshold_)) {
    f.lost = true;
    return f;
  }
  if (duplicate_threshold_ != 0) f.duplicate = chance(duplicate_threshold_);
  if (corrupt_threshold_ != 0 && chance(corrupt_threshold_) && frame_len > kCorruptFrom) {
    const uint64_t r = rng_();
    const uint64_t span = frame_len - kCorruptFrom;
    // Multiply-shift maps the high 32 bits uniformly onto [0, span).
    f.corrupt = true;
    f.corrupt_offset = kCorruptFrom + static_cast<uint32_t>(((r >> 32) * span) >> 32);
    f.corrupt_mask = static_cast<uint8_t>(1u << (r & 7));
  }
  if (reorder_threshold_ != 0) f.reorder = chance(reorder_threshold_);
  return f;
}

inline uint64_t LinkModel::schedule(uint32_t frame_len, uint64_t now) {
  // The link is a serialising server: a frame starts when both it and the
  // link are ready, and the link is busy for the frame's wire time. An idle
  // link does not bank credit, so bursts never exceed the line rate.
  if (wire_ != nullptr) [[unlikely]] {
    const uint64_t ser = serialisation_q32(frame_len);
    return wire_->reserve(now, (ser >> 32) + ((ser & 0xffffffffu) != 0)) + delay_ticks_;
  }
  uint64_t ticks = free_at_;
  uint64_t frac = free_at_frac_;
  if (now > free_at_ || (now == free_at_ && free_at_frac_ == 0)) {
    ticks = now;
    frac = 0;
  }
  if (ticks_per_byte_q32_ != 0) {
    const uint64_t ser = serialisation_q32(frame_len);
    frac += ser & 0xffffffffu;
    ticks += (ser >> 32) + (frac >> 32);
    frac &= 0xffffffffu;
    free_at_ = ticks;
    free_at_frac_ = static_cast<uint32_t>(frac);
  }
  // The last bit is out at the end of a partial tick: round up. (With an
  // unlimited rate this still keeps a frame behind one on the wire.)
  return ticks + (frac != 0) + delay_ticks_;
}

inline void LinkEmulator::enqueue(rte_mbuf* m, uint64_t now) {
  const uint64_t due = model_.schedule(rte_pktmbuf_pkt_len(m), now);
  const uint32_t slot = (line_head_ + line_count_) & line_mask_;
  line_mbufs_[slot] = m;
  line_due_[slot] = due;
  ++line_count_;
  ++appended_;
  ++queued_;
  counters_.delayed += due > now;
}

}  // namespace mercury::net
