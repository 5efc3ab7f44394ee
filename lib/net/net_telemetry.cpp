#include "net/net_telemetry.h"

namespace mercury::net {

void add_telemetry(telemetry::Registry& registry, const std::string& group, const Interface& ifc) {
  using telemetry::read_counter;
  using telemetry::Values;
  registry.add(group, [&ifc](Values& v) {
    const net::InterfaceCounters& c = ifc.counters();
    v.emplace_back("rx_frames", read_counter(c.rx_frames));
    v.emplace_back("rx_mercury", read_counter(c.rx_mercury));
    v.emplace_back("rx_bytes", read_counter(c.rx_bytes));
    v.emplace_back("tx_frames", read_counter(c.tx_frames));
    v.emplace_back("tx_bytes", read_counter(c.tx_bytes));
    v.emplace_back("tx_no_mbuf", read_counter(c.tx_no_mbuf));
    v.emplace_back("tx_stage_full", read_counter(c.tx_stage_full));
    v.emplace_back("tx_by_reference", read_counter(c.tx_by_reference));
    v.emplace_back("tx_no_shell", read_counter(c.tx_no_shell));
    v.emplace_back("tx_taken_in", read_counter(c.tx_taken_in));
    v.emplace_back("tx_detached", read_counter(c.tx_detached));
    v.emplace_back("arp_requests_sent", read_counter(c.arp_requests_sent));
    v.emplace_back("arp_replies_sent", read_counter(c.arp_replies_sent));
    v.emplace_back("arp_learned", read_counter(c.arp_learned));
    uint64_t drops = 0;
    for (size_t i = 0; i < net::kDropReasonCount; ++i) {
      const uint64_t d = read_counter(c.drops[i]);
      drops += d;
      v.emplace_back("drop_" + std::string(net::drop_reason_name(static_cast<net::DropReason>(i))),
                     d);
    }
    // The PMD's own drops, as of the owner's last refresh_port_stats_st():
    // frames the stack never saw.
    ifc.pmd_drops().for_each([&](std::string_view, std::string_view name, uint64_t d) {
      drops += d;
      v.emplace_back("drop_" + std::string(name), d);
    });
    v.emplace_back("drops", drops);
    v.emplace_back("rx_pool_free", ifc.rx_pool_free());
    v.emplace_back("link_up", ifc.link_up());
    v.emplace_back("detached", ifc.detached());
    for (size_t i = 1; i < wire::kRejectCount; ++i) {
      v.emplace_back("reject_" + std::string(wire::reject_name(static_cast<wire::Reject>(i))),
                     read_counter(c.rejects[i]));
    }
  });
}

}  // namespace mercury::net
