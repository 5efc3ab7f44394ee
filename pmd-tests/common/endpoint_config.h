// The transport endpoint configuration every PMD test and benchmark starts
// from, so that a change to the endpoint's settings is made in one place.
#pragma once

#include <cstdint>
#include <vector>

#include "transport/endpoint.h"

namespace mercury::pmdtest {

/// What the tests and benchmarks vary.
struct EndpointOptions {
  /// Long: a loaded 2-CPU machine can stall a polling thread for seconds,
  /// which must not pass for a dead peer.
  uint32_t peer_timeout_ms = 20'000;
  uint32_t messages = 4096;  ///< max_messages and ingress_capacity
};

/// The TSC as the clock, a window of 128 packets, incarnation `epoch`,
/// index `sender_id` in the job, `peers`, and `options`; every other field
/// the library's default (strict scheduler). Callers change what their case
/// needs afterwards.
transport::EndpointConfig endpoint_config(uint32_t epoch, uint16_t sender_id,
                                          std::vector<transport::PeerSpec> peers = {},
                                          const EndpointOptions& options = {});

}  // namespace mercury::pmdtest
