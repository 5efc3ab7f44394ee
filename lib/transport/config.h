// The transport's time, sequence arithmetic and configuration: what the
// sender, the receiver and the Peer (transport.h) share. Config is what the
// operator sets; resolve() checks it and turns it into Params, in ticks.
// Pure functions and plain structs; resolve() is control path (it throws
// std::invalid_argument naming the field). Implemented in config.cpp.
#pragma once

#include <cstdint>

#include "base/serial.h"

namespace mercury::transport {

/// Time in TSC ticks (Config::tsc_hz per second).
using Tick = uint64_t;

// ---------------------------------------------------------------------------
// Sequence-number and epoch arithmetic (RFC 1982 serial numbers).

/// Signed distance a - b on the 32-bit sequence circle (base/serial.h).
constexpr int32_t seq_diff(uint32_t a, uint32_t b) { return base::serial_diff(a, b); }
constexpr bool seq_before(uint32_t a, uint32_t b) { return seq_diff(a, b) < 0; }
/// True if epoch `a` is a later incarnation than `b` (32-bit serial compare).
/// Epochs are milliseconds of the wall clock (job::fresh_epoch), so this is
/// right for incarnations less than 2^31 ms (24.8 days) apart.
constexpr bool epoch_newer(uint32_t a, uint32_t b) { return seq_diff(a, b) > 0; }

/// The first sequence number of the stream that a sender of epoch
/// `sender_epoch` runs towards a receiver of epoch `receiver_epoch`. Both ends
/// compute it once they know each other's epoch, so no sequence number is
/// negotiated. With either epoch fixed, the mix is a bijection of the other,
/// with good avalanche: a new incarnation of one end, the other unchanged,
/// always gets a stream origin of its own, spread across the sequence space
/// (however close the two epochs are), so the leftovers of a stream meant for
/// an earlier incarnation fall outside the new stream's window. `salt` is
/// job-wide (Config::seq_salt).
uint32_t initial_seq(uint32_t sender_epoch, uint32_t receiver_epoch, uint32_t salt);

// ---------------------------------------------------------------------------
// Configuration.

/// The tokens of epoch challenges (Peer) have this bit; the retransmission
/// timer's probes (PeerSender::on_probe_sent) never do, so an answer's echo
/// says which of the two it answers.
inline constexpr uint32_t kChallengeToken = 0x80000000u;

/// The token of the `n`th epoch challenge of a Peer of epoch `local_epoch`,
/// begun at `now`: kChallengeToken and 31 bits mixed from the clock's, so a
/// forger off the path cannot echo it (and end the challenge) by guessing.
uint32_t challenge_token(uint32_t local_epoch, uint64_t n, Tick now);

/// Largest window (send or receive) in packets.
inline constexpr uint32_t kMaxWindow = 1u << 16;
/// Largest reordering threshold (packets), adaptive or configured.
inline constexpr uint32_t kMaxReorderThreshold = 32;
static_assert((kMaxReorderThreshold & (kMaxReorderThreshold - 1)) == 0, "a ring of pow2 size");

/// What the operator sets. Durations are in microseconds; resolve() turns them
/// into ticks. Both ends of a job must use the same seq_salt.
struct Config {
  uint64_t tsc_hz = 0;  ///< required: TSC ticks per second

  // Window: packets in flight per peer. 0 derives it from the link:
  // ceil(link_bits_per_sec * base_rtt / (8 * packet_bytes)), clamped to
  // [window_floor, window_ceiling].
  uint32_t window_packets = 0;
  uint64_t link_bits_per_sec = 10'000'000'000;
  uint32_t base_rtt_us = 50;
  uint32_t packet_bytes = 9000;  ///< bytes on the wire of a full packet
  uint32_t window_floor = 8;
  uint32_t window_ceiling = 512;
  uint32_t cwnd_floor = 2;  ///< the congestion response never cuts the congestion window below this

  // Loss detection.
  uint32_t reorder_threshold = 3;       ///< lost once this many later transmissions are acked
  uint32_t max_reorder_threshold = 16;  ///< adaptive ceiling (<= kMaxReorderThreshold)
  uint32_t initial_rto_us = 5'000;      ///< RTO before the first RTT sample
  uint32_t min_rto_us = 1'000;
  uint32_t max_rto_us = 200'000;
  uint32_t peer_timeout_us = 3'000'000;  ///< no progress this long with data out: peer dead
  /// A Peer that has not learnt its peer's epoch this long after creation is
  /// dead. 0: wait for ever (a server waiting for its workers).
  uint32_t connect_timeout_us = 0;
  /// A packet with a newer epoch is a restart only once the peer's current
  /// incarnation is shown gone and the new one has echoed the challenge (a
  /// pure ACK with a token) sent to the peer's address: the current one is
  /// gone if dead or silent this long (0: a quarter of peer_timeout), and an
  /// epoch that never echoes is forgotten then. Meanwhile the new epoch's
  /// packets are dropped (RxVerdict::kChallenged). Not used with
  /// epochs_authenticated.
  uint32_t challenge_timeout_us = 0;
  /// Every packet the Peer sees was authenticated under the job key before
  /// (the endpoint sets it with a key): a newer epoch is a restart at once.
  bool epochs_authenticated = false;

  // Acknowledgements.
  uint32_t ack_every = 4;      ///< ack at least every k packets received
  uint32_t ack_delay_us = 20;  ///< ... and no later than this after the first unacked one

  // Receive side. 0 = same as the resolved send window.
  uint32_t rx_window_packets = 0;
  /// Messages in progress per peer; 0 = window + 64. Must cover the sender's
  /// window plus the messages it can leave partly sent (one per priority level
  /// for the strict scheduler), or packets are refused (kMessageTableFull).
  uint32_t rx_messages = 0;

  uint32_t seq_salt = 0;  ///< job-wide; see initial_seq()
};

/// Config resolved into ticks and sizes; what the state machines read.
struct Params {
  uint32_t window = 0;
  uint32_t cwnd_floor = 0;
  uint32_t reorder_threshold = 0;
  uint32_t max_reorder_threshold = 0;
  uint32_t ack_every = 0;
  uint32_t rx_window = 0;
  uint32_t rx_messages = 0;
  uint32_t seq_salt = 0;
  Tick initial_rto = 0;
  Tick min_rto = 0;
  Tick max_rto = 0;
  Tick peer_timeout = 0;
  Tick connect_timeout = 0;  ///< 0: none
  Tick challenge_timeout = 0;
  bool epochs_authenticated = false;
  Tick ack_delay = 0;
  /// The first expiry of the retransmission timer asks the peer for an
  /// answer (a pure ACK with kAckRequest and a token) instead of resending;
  /// only what the answer shows missing, or a second expiry, is resent.
  /// resolve() sets it: the Peer sends the probe. A PeerSender alone has no
  /// way to send one, so its unit tests of the resend path turn it off.
  bool rto_probe = true;
};

/// Window in packets for a link: the bandwidth-delay product in packets,
/// rounded up, clamped to [floor, ceiling].
uint32_t bdp_window(uint64_t link_bits_per_sec, uint32_t base_rtt_us, uint32_t packet_bytes,
                    uint32_t floor, uint32_t ceiling);

/// Control path: validates and converts. Throws std::invalid_argument naming
/// the offending field.
Params resolve(const Config& config);

/// How often a user of the transport sends each peer something (Mercury's
/// nodes: a heartbeat control message) so that a peer dying while nothing
/// else is outstanding is still declared dead: liveness only runs with data
/// out. An eighth of peer_timeout, so a peer is named at most 1.125 x the
/// timeout after it died, idle or not.
Tick keepalive_interval(const Config& config);

}  // namespace mercury::transport
