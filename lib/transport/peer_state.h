// The endpoint's per-peer state, shared by its files (endpoint.cpp,
// endpoint_rx.cpp, endpoint_tx.cpp, endpoint_timers.cpp) and by no one else.
//
// One PeerState per remote: its Peer (the protocol state machine), its route,
// its messages being placed (msg_id -> destination buffer), a ring of hints
// to its lost packets, its error texts (formatted once, at set-up, so a
// failure on the datapath only hands out a string_view) and its counters. It
// is also the SenderSink of its Peer, so every report knows whose it is.
//
// Threads: the endpoint's net core only. Memory: fixed at construction (see
// endpoint.h).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "net/frame.h"
#include "transport/endpoint.h"
#include "transport/flat_map.h"

namespace mercury::transport {

// A slice's token is its Message's address (64-byte aligned, so the low bits
// are free) with bit 0 set for a partition start-up (wire kPartitionStart):
// the ack of a start-up calls partition_ready_st, the ack of data on_acked_st.
inline constexpr uint64_t kPartitionStartTag = 1;
inline uint64_t token_of(const sched::Message* msg, bool start) {
  return reinterpret_cast<uintptr_t>(msg) | (start ? kPartitionStartTag : 0);
}
inline sched::Message* message_of(uint64_t token) {
  return reinterpret_cast<sched::Message*>(static_cast<uintptr_t>(token & ~kPartitionStartTag));
}
inline bool is_partition_start(uint64_t token) { return (token & kPartitionStartTag) != 0; }
inline bool is_partition_start(const sched::Slice& s) {
  return s.kind == sched::SliceKind::kPartitionStart;
}

/// The by_addr_ key of a peer's address (its index goes in the low 16 bits).
inline uint64_t addr_key(uint32_t ip, uint16_t port) {
  return uint64_t{ip} << 32 | uint64_t{port} << 16;
}

struct Endpoint::PeerState final : SenderSink {
  /// Messages being placed: msg_id -> the receiver's buffer (null: refused
  /// by the receiver, its bytes are dropped).
  using RxTable = FlatMap<MsgIdKey<7>, std::byte*>;
  static_assert(sizeof(RxTable::Slot) == 16, "docs/transport.md quotes the receive slot size");

  /// Set-up (endpoint.cpp): formats the error texts.
  PeerState(Endpoint& ep, uint16_t index, const PeerSpec& s, const Config& cfg, Tick now,
            uint32_t rx_messages, uint32_t window);

  // SenderSink (endpoint_tx.cpp, beside what they call).
  void on_acked(const SliceRef& slice) override;
  void on_lost(uint32_t seq, const SliceRef& slice, LossKind kind) override;
  void on_failed(const SliceRef& slice, FailReason why) override;

  /// A lost packet, in the order they were reported, as a hint for the
  /// window-blocked path (Endpoint::resend_blocked_st); the lost map stays
  /// the truth, so a stale or overwritten hint costs nothing but a probe.
  struct LostHint {
    uint64_t token;
    uint32_t offset;
    uint32_t seq;
  };
  void push_hint(const LostHint& h) {
    if (hint_count == hints.size()) {  // overwrite the oldest
      hint_head = (hint_head + 1) & hint_mask;
      --hint_count;
    }
    hints[(hint_head + hint_count) & hint_mask] = h;
    ++hint_count;
  }
  bool pop_hint(LostHint& out) {
    if (hint_count == 0) return false;
    out = hints[hint_head];
    hint_head = (hint_head + 1) & hint_mask;
    --hint_count;
    return true;
  }

  /// Why messages to a dead peer fail.
  SendStatus death() const {
    return peer.sender().dead() ? SendStatus::kPeerTimeout : SendStatus::kPeerUnreachable;
  }

  Endpoint& endpoint;
  uint16_t index;
  PeerSpec spec;
  Peer peer;
  net::Route route;
  bool resolved = false;
  RxTable rx;
  std::vector<LostHint> hints;
  uint32_t hint_mask;
  uint32_t hint_head = 0;
  uint32_t hint_count = 0;
  std::array<std::string, 5> errors;  // [SendStatus]
  EndpointPeerStats stats;
  // With a job key: our next packet counter towards the peer, and the
  // counters taken from it (auth.h).
  uint64_t auth_counter = initial_auth_counter();
  ReplayWindow replay;
};

}  // namespace mercury::transport
