// node::ControlChannel: a node's control messages (agg/control.h), one
// implementation for the server and the worker. Outbound: encode, keep the
// bytes until the transport settles the message (the outbox), send as a
// reliable kControl message. Inbound: receive whole (the node's
// transport::MessageReceiver hands each message's begin, completion or
// abandonment here), decode, hand the message to the node. And the two
// duties that keep a job's failures bounded: heartbeats (a kHeartbeat to
// every active peer every keepalive interval, so the transport's liveness
// clock runs even when nothing else is outstanding) and liveness (the first
// active peer the transport named dead).
//
// Peers. The channel's peers are the node's, in the node's numbering (a
// server's ranks; a worker's servers): each one's endpoint and transport
// peer index. A node with several ports has several endpoints.
//
// Threads: everything belongs to the node's net core (the thread that polls
// the endpoints), whose owner token it shares (`owner`). Completions and
// the receiver's calls run there, inside Endpoint::poll_st().
//
// Costs: control path. Sending encodes into a new buffer; receiving keeps
// one buffer per message in progress; nothing here is on the gradient path.
// Memory: the messages in flight each way, each bounded by max_bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "agg/control.h"
#include "base/counter_list.h"
#include "base/owner.h"
#include "transport/endpoint.h"

namespace mercury::node {

/// One peer of the channel: the endpoint it is reached through and its
/// transport peer index there.
struct ControlPeer {
  transport::Endpoint* endpoint = nullptr;
  uint16_t peer = 0;
};

#define MERCURY_CONTROL_CHANNEL_COUNTERS(X)                                       \
  X(sent, "control messages queued")                                              \
  X(not_queued, "control messages the endpoint refused (descriptors or ingress)") \
  X(failed, "control messages the transport could not deliver")                   \
  X(received, "control messages received whole and decoded")                      \
  X(too_big, "control messages refused at their start: empty or over max_bytes")  \
  X(malformed, "control messages that did not decode")                            \
  X(heartbeats, "heartbeats sent")

struct ControlChannelCounters {
  MERCURY_CONTROL_CHANNEL_COUNTERS(MERCURY_COUNTER_DECLARE)
  template <class F>
  void for_each(F&& f) const {
    MERCURY_CONTROL_CHANNEL_COUNTERS(MERCURY_COUNTER_VISIT)
  }
};

class ControlChannel {
 public:
  /// What the node does with the channel's events (on its net core).
  class Handler {
   public:
    /// A whole, decoded message from peer `from`.
    virtual void on_control_st(uint32_t from, agg::ControlMessage&& m) = 0;
    /// A message to `to` that the transport could not deliver (r names why).
    virtual void on_control_failed_st(uint32_t to, const transport::SendResult& r) = 0;
    /// A message of `kind` sent to `to` with `report` (a probe_st()'s is a
    /// kHeartbeat) was acknowledged: the peer has it, and was there after
    /// it was sent.
    virtual void on_control_delivered_st(uint32_t /*to*/, agg::ControlKind /*kind*/) {}

   protected:
    ~Handler() = default;
  };

  struct Options {
    uint32_t max_bytes = 16 << 20;  ///< the largest message accepted
    /// Between heartbeats (transport::keepalive_interval of the endpoints' config).
    transport::Tick heartbeat_every = 0;
  };

  /// Control path. `handler` must outlive the channel; so must the endpoints.
  ControlChannel(std::vector<ControlPeer> peers, Handler& handler, const Options& options);
  ControlChannel(const ControlChannel&) = delete;
  ControlChannel& operator=(const ControlChannel&) = delete;

  /// Queues `m` to peer `to`; false (counted) when the endpoint refused it.
  /// With `report`, its acknowledgement is reported too
  /// (Handler::on_control_delivered_st), as every failure is.
  bool send_st(uint32_t to, const agg::ControlMessage& m, bool report = false);
  /// Queues a kHeartbeat to `to` whose acknowledgement the handler hears,
  /// or its failure: is the peer there now? False (counted) when the
  /// endpoint refused it.
  bool probe_st(uint32_t to);
  /// Whether every message sent has been settled (delivered or failed).
  [[nodiscard]] bool settled_st() const { return outbox_.empty(); }
  /// Whether every message sent to peer `to` has been settled (a scan of
  /// the messages in flight: control path).
  [[nodiscard]] bool settled_st(uint32_t to) const {
    for (const auto& [cookie, out] : outbox_) {
      if (out.to == to) return false;
    }
    return true;
  }

  /// When a heartbeat interval has passed since the last: a kHeartbeat to
  /// every peer for which active(peer) holds. `active` is any callable
  /// bool(uint32_t). Slow path (the node's periodic work).
  template <class Active>
  void heartbeat_st(transport::Tick now, Active&& active) {
    MERCURY_OWNED(*owner_);
    if (now < heartbeat_at_) return;
    heartbeat_at_ = now + options_.heartbeat_every;
    for (uint32_t p = 0; p < peers_.size(); ++p) {
      if (active(p)) send_heartbeat_st(p);
    }
  }
  /// The first peer with active(peer) whose transport peer is dead
  /// (Endpoint::peer_stats_st), if any. Slow path.
  template <class Active>
  [[nodiscard]] std::optional<uint32_t> lost_st(Active&& active) const {
    MERCURY_OWNED(*owner_);
    for (uint32_t p = 0; p < peers_.size(); ++p) {
      if (active(p) && peers_[p].endpoint->peer_stats_st(peers_[p].peer).dead) return p;
    }
    return std::nullopt;
  }

  // The node's MessageReceiver calls these for kControl messages from peer
  // `from` (in the channel's numbering).
  std::byte* begin_st(uint32_t from, const wire::HeaderFields& h);
  void complete_st(uint32_t from, const wire::HeaderFields& h);
  void abandon_st(uint32_t from, uint32_t msg_id);

  [[nodiscard]] const ControlChannelCounters& counters() const { return counters_; }
  [[nodiscard]] uint32_t peers() const { return static_cast<uint32_t>(peers_.size()); }
  /// The owner token the channel asserts: its node's net core's.
  void share_owner(const base::Owner& owner) { owner_ = &owner; }

 private:
  void send_heartbeat_st(uint32_t to);
  static void on_sent(void* self, const transport::SendResult& r);
  [[nodiscard]] static uint64_t key(uint32_t from, uint32_t msg_id) {
    return uint64_t{from} << 32 | msg_id;
  }

  std::vector<ControlPeer> peers_;
  Handler& handler_;
  Options options_;
  transport::Tick heartbeat_at_ = 0;
  // The bytes of each message in flight, by completion cookie; its
  // destination beside it (the completion names the transport peer only).
  struct Outgoing {
    std::vector<std::byte> bytes;
    uint32_t to;
    agg::ControlKind kind;
    bool report;  // its acknowledgement is reported
  };
  std::unordered_map<uint64_t, Outgoing> outbox_;
  uint64_t next_cookie_ = 1;
  std::unordered_map<uint64_t, std::vector<std::byte>> inbox_;  // by (from, msg_id)
  ControlChannelCounters counters_;
  base::Owner own_owner_;
  const base::Owner* owner_ = &own_owner_;
};

}  // namespace mercury::node
