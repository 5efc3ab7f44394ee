// Endpoint, the slow work of a pass (every EndpointConfig::timer_every
// passes): each peer's credit (its share of the port's receive room), the
// route of peers that have none yet, and each Peer's timers
// (RTO, tail probe, liveness, connect timeout), whose losses and failures come
// back through the SenderSink reports (endpoint_tx.cpp). See endpoint.h.
#include "transport/endpoint.h"
#include "transport/peer_state.h"

namespace mercury::transport {

void Endpoint::run_timers_st(Tick now) {
  if (peers_.empty()) return;
  // Flow control: each peer's credit is its share of the port's room to
  // receive, so no peer is sent more than the receiver can take.
  const uint32_t share = port_.rx_room() / static_cast<uint32_t>(peers_.size());
  for (auto& ptr : peers_) {
    ptr->peer.set_credit(share);
    PeerState& ps = *ptr;
    if (!ps.resolved) {
      ps.resolved = port_.resolve_st(ps.spec.ip, ps.spec.udp_port, ps.route, now);
    }
    // A challenged incarnation that never answered: the newer one is the
    // peer now, as when a packet shows a restart (endpoint_rx.cpp).
    if (ps.peer.on_timer(now, ps)) peer_restarted_st(ps, ps.index);
  }
}

Tick Endpoint::next_deadline_st() const {
  MERCURY_OWNED(owner_);
  Tick next = 0;
  for (const auto& ptr : peers_) {
    const Tick t = ptr->peer.next_deadline();
    if (t != 0 && (next == 0 || t < next)) next = t;
  }
  return next;
}

}  // namespace mercury::transport
