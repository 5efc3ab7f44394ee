#include "endpoint_config.h"

#include <rte_cycles.h>

#include <utility>

namespace mercury::pmdtest {

transport::EndpointConfig endpoint_config(uint32_t epoch, uint16_t sender_id,
                                          std::vector<transport::PeerSpec> peers,
                                          const EndpointOptions& options) {
  transport::EndpointConfig c;
  c.transport.tsc_hz = rte_get_tsc_hz();
  c.transport.window_packets = 128;
  c.transport.peer_timeout_us = options.peer_timeout_ms * 1000;
  c.local_epoch = epoch;
  c.sender_id = sender_id;
  c.max_messages = options.messages;
  c.ingress_capacity = options.messages;
  c.peers = std::move(peers);
  return c;
}

}  // namespace mercury::pmdtest
