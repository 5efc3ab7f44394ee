// Registers a network interface's counters (lib/net) as a telemetry group:
// frames and bytes each way, ARP activity, back-pressure, and one counter per
// drop reason (drop_<reason>) and per rejected Mercury header (reject_<reason>).
#pragma once

#include <string>

#include "net/interface.h"
#include "telemetry/telemetry.h"

namespace mercury::telemetry {

/// `ifc` must outlive the registry's exposure.
void add_interface(Registry& registry, const std::string& group, const net::Interface& ifc);

}  // namespace mercury::telemetry
