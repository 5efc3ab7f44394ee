// PeerReceiver, the receive half of a peer: epochs, the duplicate window,
// the SACK bitmap, message completion and the ACK policy. Part of the
// transport component: transport.h says what it is for, its threads and its
// costs; docs/transport.md gives the protocol. Implemented in receiver.cpp.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>
#include <vector>

#include "base/counter_list.h"
#include "transport/config.h"
#include "transport/flat_map.h"
#include "wire/header.h"

namespace mercury::transport {

// ---------------------------------------------------------------------------
// Receiver side.

/// What to do with a received packet.
enum class RxVerdict : uint8_t {
  kNew,               ///< first copy: place payload at (msg_id, offset)
  kDuplicate,         ///< already received (below the cumulative ack or SACKed): drop
  kOutOfWindow,       ///< beyond the receive window: drop (the sender will resend)
  kStaleEpoch,        ///< from an older incarnation of the peer: drop, ack ignored
  kUnsynced,          ///< not in any stream the peer may have started towards us: drop
  kMessageTableFull,  ///< no room to track another message in progress: drop, not acked
  kBadMessage,        ///< contradicts the message in progress (msg_len, byte count): drop
  kAckOnly,           ///< a pure ACK (Peer::on_packet): nothing to place
  kChallenged,        ///< a newer epoch, its peer's incarnation challenged: drop
  kCount,
};
inline constexpr size_t kRxVerdictCount = static_cast<size_t>(RxVerdict::kCount);
std::string_view verdict_name(RxVerdict v);

struct RxResult {
  RxVerdict verdict = RxVerdict::kNew;
  /// With kNew: this packet completed its message (every byte of msg_len has
  /// now been placed). Reported exactly once per message. Never for a packet
  /// carrying wire::flags::kSlice: slices get no message accounting.
  bool message_complete = false;
  /// The peer came back with a newer epoch, and its old incarnation is gone
  /// (Peer: the challenge): every message in progress from it was abandoned
  /// (the glue frees their buffers). Peer also restarts the send stream
  /// towards it.
  bool peer_restarted = false;
  uint8_t reserved = 0;  ///< makes the result one 32-bit word (of())

  /// The result in one register. Built field by field in memory, GCC reads
  /// it back as one wider load, which cannot be forwarded from the narrow
  /// stores: the load then waits for every store before it to drain, the
  /// payload copies of the packets before included (a tenth of a memif
  /// receiver's time went there).
  static RxResult of(RxVerdict verdict, bool message_complete, bool peer_restarted) {
    const uint32_t bits = uint32_t{static_cast<uint8_t>(verdict)} |
                          uint32_t{message_complete} << 8 | uint32_t{peer_restarted} << 16;
    return std::bit_cast<RxResult>(bits);
  }
};
static_assert(sizeof(RxResult) == 4 && std::is_trivially_copyable_v<RxResult>);

/// How a packet's epoch relates to what the receiver knows of its peer.
enum class EpochCheck : uint8_t {
  kCurrent,  ///< the known incarnation
  kAdopted,  ///< first packet ever from this peer: now known
  kNewer,    ///< a newer incarnation: nothing changed yet (Peer decides: restart())
  kStale,    ///< an older incarnation (or the invalid epoch 0): drop
};

#define MERCURY_RECEIVER_COUNTERS(X)                                                      \
  X(packets_accepted, "kNew verdicts")                                                    \
  X(bytes_accepted, "payload bytes of kNew packets")                                      \
  X(slice_packets, "kNew verdicts for wire::flags::kSlice packets (no message count)")    \
  X(duplicates, "copies already received")                                                \
  X(spurious_retransmits, "duplicates with one copy a retransmission: it was not needed") \
  X(out_of_window, "beyond the receive window")                                           \
  X(stale_epoch, "from an older incarnation of the peer")                                 \
  X(unsynced, "in no stream the peer may have started towards us")                        \
  X(message_table_full, "no room to track another message in progress")                   \
  X(bad_message, "contradicts the message in progress")                                   \
  X(messages_completed, "messages whose every byte arrived")                              \
  X(messages_abandoned, "in progress when the peer restarted")                            \
  X(peer_restarts, "the peer came back with a newer epoch")                               \
  X(acks_sent, "acknowledgements written (piggybacked or pure)")                          \
  X(window_updates, "ACKs made due because the credit grew for a sender it had stopped")

struct ReceiverCounters {
  MERCURY_RECEIVER_COUNTERS(MERCURY_COUNTER_DECLARE)

  template <class F>
  void for_each(F&& f) const {MERCURY_RECEIVER_COUNTERS(MERCURY_COUNTER_VISIT)} ReceiverCounters&
  operator+=(const ReceiverCounters& o) {
    MERCURY_RECEIVER_COUNTERS(MERCURY_COUNTER_ADD)
    return *this;
  }
};

/// The receive half of a peer: epoch tracking, the duplicate window, the
/// SACK bitmap, message completion and the ACK policy.
class PeerReceiver {
 public:
  /// Control path. `local_epoch` (non-zero) is our own incarnation;
  /// `peer_epoch` the peer's if already known (0: adopt the first one seen).
  PeerReceiver(const Params& params, uint32_t local_epoch, uint32_t peer_epoch = 0);

  /// Checks a packet's epoch against the peer's known incarnation, adopting
  /// the first one seen. A newer one changes nothing (the caller restarts,
  /// or not). Peer::on_packet calls it before on_data(). Counts stale epochs.
  EpochCheck observe_epoch(uint32_t epoch);
  /// The peer restarted as `epoch` (newer than the known one): its old
  /// stream and every message in progress from it are dropped.
  void restart(uint32_t epoch);

  /// A data, aggregated-data or control packet from the peer of the known
  /// epoch (observe_epoch() said kCurrent or kAdopted, or restart() took
  /// it), already decoded and validated by wire::decode.
  RxResult on_data(const wire::HeaderFields& h, Tick now);

  /// An acknowledgement should go out now (as a pure ACK unless data to the
  /// peer is about to carry it): k packets unacked, an ack-request, a gap, a
  /// duplicate, or the ack delay expired.
  bool ack_due(Tick now) const;
  /// When ack_due() turns true if nothing else arrives: 0 if nothing is
  /// waiting to be acknowledged, 1 if it is due already.
  Tick ack_deadline() const;
  /// Writes ack/sack/credit and sets kAckValid in `h`, clearing the due
  /// state. Returns false (h untouched) if there is no stream to acknowledge yet.
  bool fill_ack(wire::HeaderFields& h);

  /// The room the glue has for this peer's packets now (e.g. its share of
  /// the free RX buffers), in packets: the credit the next ACKs advertise,
  /// at most the receive window. When it has grown enough that a sender
  /// stopped by the last credit may go on (from below half the window by a
  /// quarter of it or more), an ACK is due at once (a window update).
  void set_credit(uint32_t packets);
  /// The credit the last ACK advertised.
  uint32_t advertised_credit() const { return advertised_; }

  /// Next cumulative ack value (every seq below was received); meaningful
  /// once synced(), i.e. once a packet of the peer's stream has arrived.
  uint32_t cumulative_ack() const { return rcv_nxt_; }
  uint64_t sack_bits() const;
  bool synced() const { return synced_; }
  /// We became a new incarnation (Peer::reincarnate): forget the peer's
  /// stream (it restarts towards our new epoch), keep its epoch.
  void reincarnate(uint32_t new_local_epoch);
  uint32_t peer_epoch() const { return peer_epoch_; }
  uint32_t messages_in_progress() const { return static_cast<uint32_t>(msgs_.size()); }
  const ReceiverCounters& counters() const { return counters_; }

 private:
  /// on_data() past the epoch check: the verdict, and whether the packet
  /// completed its message.
  RxVerdict accept(const wire::HeaderFields& h, Tick now, bool& message_complete);

  // A message in progress, keyed by msg_id.
  struct MsgProgress {
    uint32_t msg_len = 0;
    uint32_t received = 0;
  };
  using MsgTable = FlatMap<MsgIdKey<0>, MsgProgress>;
  using MsgSlot = MsgTable::Slot;
  static_assert(sizeof(MsgSlot) == 16, "docs/transport.md quotes the message slot size");

  bool try_sync(uint32_t seq);
  void sync(uint32_t base);
  void reset_messages();
  bool bit(const std::vector<uint64_t>& v, uint32_t seq) const {
    uint32_t i = seq & ring_mask_;
    return (v[i >> 6] >> (i & 63)) & 1u;
  }
  void put_bit(std::vector<uint64_t>& v, uint32_t seq, bool on) {
    uint32_t i = seq & ring_mask_;
    uint64_t m = uint64_t{1} << (i & 63);
    v[i >> 6] = on ? (v[i >> 6] | m) : (v[i >> 6] & ~m);
  }
  void duplicate(const wire::HeaderFields& h, bool history_known);

  Params p_;
  uint32_t local_epoch_;
  uint32_t peer_epoch_ = 0;  // 0: never heard from the peer
  bool synced_ = false;
  uint32_t rcv_nxt_ = 0;
  uint32_t history_ = 0;  // seqs below rcv_nxt_ whose ring bits are still meaningful
  // Bit rings of ring_bits_ (pow2 >= 2 x rx_window) bits indexed by seq: got_
  // is valid for [rcv_nxt_, rcv_nxt_ + rx_window); rtx_ (the accepted copy
  // carried kRetransmit) also for history_ seqs below rcv_nxt_.
  uint32_t ring_mask_;
  std::vector<uint64_t> got_;
  std::vector<uint64_t> rtx_;
  // Messages in progress: pow2 >= 2 x rx_messages slots, at most rx_messages used.
  MsgTable msgs_;
  // ACK policy.
  uint32_t unacked_ = 0;
  bool ack_now_ = false;
  bool report_duplicate_ = false;  // a spurious resend arrived: the next ACK says so
  // Nothing is owed to the peer any more (an ACK went out, or the stream restarted).
  void forget_owed_ack() {
    unacked_ = 0;
    ack_now_ = false;
    report_duplicate_ = false;
  }
  Tick ack_deadline_ = 0;
  // Flow control: the room the glue reports, and what the last ACK said.
  // The most a credit says: the receive window bounds what is accepted, and
  // the wire field is 16 bits.
  uint32_t credit_cap() const { return std::min<uint32_t>(p_.rx_window, UINT16_MAX); }
  uint32_t credit_;
  uint32_t advertised_;
  ReceiverCounters counters_;
};

}  // namespace mercury::transport
