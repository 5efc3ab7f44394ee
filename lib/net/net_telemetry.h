// Registers a network interface's counters (lib/net) as a telemetry group:
// frames and bytes each way, ARP activity, back-pressure, and one counter per
// drop reason (drop_<reason>: the stack's, then the PMD's own, rx_nombuf,
// imissed, ierrors and oerrors, as of the owner's last
// Interface::refresh_port_stats_st()), per rejected Mercury header
// (reject_<reason>), and the gauges rx_pool_free (the RX pool's free mbufs)
// and link_up (1 or 0).
#pragma once

#include <string>

#include "net/interface.h"
#include "telemetry/telemetry.h"

namespace mercury::net {

/// `ifc` must outlive the registry's exposure.
void add_telemetry(telemetry::Registry& registry, const std::string& group, const Interface& ifc);

}  // namespace mercury::net
