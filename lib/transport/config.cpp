// Control-path parts of the transport: configuration, names, the initial
// sequence number rule.
#include <stdexcept>
#include <string>

#include "transport/transport.h"

namespace mercury::transport {

namespace {

// murmur3's 32-bit finaliser: a bijection with good avalanche.
constexpr uint32_t mix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  h ^= h >> 16;
  return h;
}

[[noreturn]] void bad(const std::string& field, const std::string& why) {
  throw std::invalid_argument("transport config: " + field + " " + why);
}

Tick us_to_ticks(uint64_t us, uint64_t hz) {
  // 128-bit product: us * hz overflows 64 bits for long timeouts at GHz rates.
  return static_cast<Tick>((static_cast<unsigned __int128>(us) * hz) / 1'000'000u);
}

}  // namespace

uint32_t initial_seq(uint32_t sender_epoch, uint32_t receiver_epoch, uint32_t salt) {
  // Two 32-bit epochs do not fit one 32-bit origin, so no mix is a bijection
  // of the pair. What a restart needs is weaker: with one end's epoch fixed,
  // distinct epochs of the other give distinct origins. mix32 of the sender's
  // epoch XOR the receiver's is a bijection of each while the other is fixed,
  // and the outer mix32 keeps it one (the composition of bijections), while
  // spreading epochs a millisecond apart across the whole sequence space.
  return mix32(mix32(sender_epoch) ^ receiver_epoch) + salt;
}

uint32_t challenge_token(uint32_t local_epoch, uint64_t n, Tick now) {
  const uint32_t h = mix32(mix32(static_cast<uint32_t>(now) ^ static_cast<uint32_t>(n)) ^
                           static_cast<uint32_t>(now >> 32) ^ local_epoch);
  return kChallengeToken | h;
}

uint32_t bdp_window(uint64_t link_bits_per_sec, uint32_t base_rtt_us, uint32_t packet_bytes,
                    uint32_t floor, uint32_t ceiling) {
  if (packet_bytes == 0) return floor;
  const unsigned __int128 bits = static_cast<unsigned __int128>(link_bits_per_sec) * base_rtt_us;
  const unsigned __int128 per_packet =
      static_cast<unsigned __int128>(packet_bytes) * 8u * 1'000'000u;
  unsigned __int128 w = (bits + per_packet - 1) / per_packet;
  if (w < floor) w = floor;
  if (w > ceiling) w = ceiling;
  return static_cast<uint32_t>(w);
}

Tick keepalive_interval(const Config& c) { return us_to_ticks(c.peer_timeout_us / 8, c.tsc_hz); }

Params resolve(const Config& c) {
  if (c.tsc_hz == 0) bad("tsc_hz", "must be > 0");
  if (c.window_floor == 0) bad("window_floor", "must be >= 1");
  if (c.window_floor > c.window_ceiling) bad("window_floor", "must be <= window_ceiling");
  if (c.window_ceiling > kMaxWindow) bad("window_ceiling", "must be <= 65536");
  if (c.window_packets > kMaxWindow) bad("window_packets", "must be <= 65536");
  if (c.window_packets == 0 && (c.link_bits_per_sec == 0 || c.base_rtt_us == 0)) {
    bad("window_packets", "is 0 (derive from the link) but link_bits_per_sec or base_rtt_us is 0");
  }
  if (c.window_packets == 0 && c.packet_bytes == 0) {
    bad("packet_bytes", "must be > 0 to derive the window");
  }
  Params p;
  p.window = c.window_packets != 0 ? c.window_packets
                                   : bdp_window(c.link_bits_per_sec, c.base_rtt_us, c.packet_bytes,
                                                c.window_floor, c.window_ceiling);
  if (c.cwnd_floor == 0) bad("cwnd_floor", "must be >= 1");
  if (c.cwnd_floor > p.window) bad("cwnd_floor", "must be <= the window");
  p.cwnd_floor = c.cwnd_floor;
  if (c.max_reorder_threshold > kMaxReorderThreshold) bad("max_reorder_threshold", "must be <= 32");
  if (c.reorder_threshold == 0) bad("reorder_threshold", "must be >= 1");
  if (c.reorder_threshold > c.max_reorder_threshold) {
    bad("reorder_threshold", "must be <= max_reorder_threshold");
  }
  p.reorder_threshold = c.reorder_threshold;
  p.max_reorder_threshold = c.max_reorder_threshold;
  if (c.min_rto_us == 0) bad("min_rto_us", "must be > 0");
  if (c.min_rto_us > c.initial_rto_us) bad("min_rto_us", "must be <= initial_rto_us");
  if (c.initial_rto_us > c.max_rto_us) bad("initial_rto_us", "must be <= max_rto_us");
  if (c.peer_timeout_us <= c.min_rto_us) bad("peer_timeout_us", "must be > min_rto_us");
  if (c.ack_every == 0) bad("ack_every", "must be >= 1");
  p.ack_every = c.ack_every;
  p.rx_window = c.rx_window_packets != 0 ? c.rx_window_packets : p.window;
  if (p.rx_window > kMaxWindow) bad("rx_window_packets", "must be <= 65536");
  p.rx_messages = c.rx_messages != 0 ? c.rx_messages : p.window + 64;
  if (p.rx_messages > (1u << 24)) bad("rx_messages", "must be <= 16777216");
  p.seq_salt = c.seq_salt;
  p.initial_rto = us_to_ticks(c.initial_rto_us, c.tsc_hz);
  p.min_rto = us_to_ticks(c.min_rto_us, c.tsc_hz);
  p.max_rto = us_to_ticks(c.max_rto_us, c.tsc_hz);
  p.peer_timeout = us_to_ticks(c.peer_timeout_us, c.tsc_hz);
  p.connect_timeout = us_to_ticks(c.connect_timeout_us, c.tsc_hz);
  p.ack_delay = us_to_ticks(c.ack_delay_us, c.tsc_hz);
  if (c.challenge_timeout_us != 0 && c.challenge_timeout_us >= c.peer_timeout_us) {
    bad("challenge_timeout_us", "must be < peer_timeout_us");
  }
  p.challenge_timeout = us_to_ticks(
      c.challenge_timeout_us != 0 ? c.challenge_timeout_us : c.peer_timeout_us / 4, c.tsc_hz);
  p.epochs_authenticated = c.epochs_authenticated;
  if (p.min_rto == 0) bad("min_rto_us", "is below one tick at tsc_hz");
  return p;
}

std::string_view fail_reason_name(FailReason r) {
  switch (r) {
    case FailReason::kPeerTimeout:
      return "peer_timeout";
    case FailReason::kPeerRestarted:
      return "peer_restarted";
    case FailReason::kReset:
      return "reset";
  }
  return "unknown";
}

std::string_view verdict_name(RxVerdict v) {
  switch (v) {
    case RxVerdict::kNew:
      return "new";
    case RxVerdict::kDuplicate:
      return "duplicate";
    case RxVerdict::kOutOfWindow:
      return "out_of_window";
    case RxVerdict::kStaleEpoch:
      return "stale_epoch";
    case RxVerdict::kUnsynced:
      return "unsynced";
    case RxVerdict::kMessageTableFull:
      return "message_table_full";
    case RxVerdict::kBadMessage:
      return "bad_message";
    case RxVerdict::kAckOnly:
      return "ack_only";
    case RxVerdict::kChallenged:
      return "challenged";
    case RxVerdict::kCount:
      break;
  }
  return "unknown";
}

}  // namespace mercury::transport
