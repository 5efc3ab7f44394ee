#include "net/node.h"

#include <rte_cycles.h>
#include <rte_mbuf.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <optional>
#include <stdexcept>

namespace mercury::net {

uint64_t hugepage_need_bytes(const config::JobConfig& job, const std::vector<std::string>& nodes) {
  // An mbuf: its header, headroom and frame, plus the mempool's own header
  // per object, in cache lines.
  const uint64_t object =
      (sizeof(rte_mbuf) + RTE_PKTMBUF_HEADROOM + frame_bytes_for_mtu(job.network.mtu) + 64 + 63) /
      64 * 64;
  uint64_t ports = 0;
  for (const std::string& name : nodes) ports += job.node(name).ports.size();
  return ports * job.mempool.mbufs * object + kEalHugepageOverhead;
}

LinkParams link_params(const config::LinkConfig& link) {
  LinkParams p;
  p.rate_gbps = link.rate_gbps;
  p.delay_us = link.delay_us;
  p.loss = link.loss;
  p.duplicate = link.duplicate;
  p.reorder = link.reorder;
  p.corrupt = link.corrupt;
  p.seed = link.seed;
  return p;
}

namespace {

// network.udp_checksum for one port: auto leaves them out where frames
// move through shared memory (a ring link, net_memif), which cannot corrupt
// them, and keeps them everywhere else. Both ends of such a link are of the
// same kind, so they agree. A link emulator that corrupts frames (link.corrupt)
// makes any link one that can corrupt.
bool checksums_for(const config::JobConfig& job, const config::PortSpec& spec) {
  switch (job.network.udp_checksum) {
    case config::Checksum::kOn:
      return true;
    case config::Checksum::kOff:
      return false;
    case config::Checksum::kAuto:
      break;
  }
  const bool shared_memory =
      spec.kind == config::PortSpec::kRing ||
      (spec.kind == config::PortSpec::kVdev && spec.vdev_name().starts_with("net_memif"));
  return !shared_memory || job.link.corrupt > 0;
}

MacAddr to_mac(const config::Mac& m) {
  MacAddr out;
  std::copy(m.octets.begin(), m.octets.end(), out.bytes.begin());
  return out;
}

}  // namespace

NodeNetworks::NodeNetworks(const config::JobConfig& job, const std::vector<std::string>& nodes,
                           uint32_t peer_wait_ms) {
  const uint32_t frame = frame_bytes_for_mtu(job.network.mtu);
  std::vector<PortOptions> options;
  std::vector<const config::PortSpec*> specs;

  // Pass 1: a pool and the options for every port. Once the pools exist
  // (or cannot), this process's hugepages are settled: another process may
  // decide on what is left (config::resolve_hugepages).
  struct Settle {
    ~Settle() { config::hugepages_settled(); }
  };
  std::optional<Settle> settle(std::in_place);
  for (const std::string& name : nodes) {
    const config::NodeConfig& node = job.node(name);
    for (const config::PortSpec& spec : node.ports) {
      if (spec.kind == config::PortSpec::kRing &&
          std::find(nodes.begin(), nodes.end(), spec.ring_peer) == nodes.end()) {
        throw std::runtime_error("node " + name + ": port " + spec.text + " links to node " +
                                 spec.ring_peer +
                                 ", which this process does not run; a ring link cannot cross "
                                 "processes (use net_memif)");
      }
      auto np = std::make_unique<NodePort>();
      np->node = name;
      np->spec = spec.text;
      // DPDK names are process-wide: number pools across every NodeNetworks.
      static std::atomic<uint32_t> pools{0};
      np->pool = std::make_unique<Mempool>("mp" + std::to_string(pools++), job.mempool.mbufs,
                                           job.mempool.cache, frame);
      PortOptions o;
      o.mtu = job.network.mtu;
      o.checksum_offload = checksums_for(job, spec);
      o.peer_wait_ms = peer_wait_ms;
      if (node.mac) o.mac = to_mac(*node.mac);
      options.push_back(o);
      specs.push_back(&spec);
      ports_.push_back(std::move(np));
    }
  }

  settle.reset();

  // Pass 2: open them; a ring link is made when its second end is met.
  std::map<std::string, size_t> first_end;
  for (size_t i = 0; i < ports_.size(); ++i) {
    NodePort& np = *ports_[i];
    const config::PortSpec& spec = *specs[i];
    switch (spec.kind) {
      case config::PortSpec::kRing: {
        auto [it, fresh] = first_end.try_emplace(spec.ring_link, i);
        if (fresh) break;
        NodePort& first = *ports_[it->second];
        auto link =
            Port::ring_link(spec.ring_link, *first.pool, *np.pool, options[it->second], options[i]);
        first.port = std::make_unique<Port>(std::move(link.first));
        np.port = std::make_unique<Port>(std::move(link.second));
        break;
      }
      case config::PortSpec::kVdev:
        np.port =
            std::make_unique<Port>(Port::open(std::string(spec.vdev_name()), *np.pool, options[i]));
        break;
      case config::PortSpec::kPci:
        np.port = std::make_unique<Port>(Port::open(spec.text, *np.pool, options[i]));
        break;
    }
  }

  // Pass 3: interfaces, emulators and static ARP entries.
  LinkParams link = link_params(job.link);
  for (auto& p : ports_) {
    // Each port's emulator gets its own stream: the same seed everywhere
    // would give every link the identical loss pattern.
    link.seed = job.link.seed + (&p - ports_.data());
    const config::NodeConfig& node = job.node(p->node);
    LocalAddr local{p->port->mac(), node.ipv4.value, node.udp_port};
    InterfaceOptions io;
    io.udp_checksum = checksums_for(job, *specs[&p - ports_.data()]);
    p->interface = std::make_unique<Interface>(*p->port, *p->pool, local, io);
    for (const config::NodeConfig& other : job.nodes) {
      if (other.mac && other.name != p->node) {
        p->interface->add_static_arp(other.ipv4.value, to_mac(*other.mac));
      }
    }
    if (job.link.enabled()) {
      p->emulator =
          std::make_unique<LinkEmulator>(p->port->id(), 0, link, p->pool->get(), rte_get_tsc_hz());
      p->interface->attach_emulator(p->emulator.get());
      if (!job.link.shared_wire.empty()) {
        size_t k = 0;  // the port's place in its node's ports list
        for (auto q = ports_.begin(); q->get() != p.get(); ++q) k += (*q)->node == p->node;
        p->wire = std::make_unique<SharedWire>(
            job.link.shared_wire + "." + p->node + "." + std::to_string(k), job.link.rate_gbps);
        p->emulator->share_wire(p->wire.get());
      }
      if (!job.link.rate_steps.empty()) {
        std::vector<RateSchedule::Step> steps;
        for (const config::RateStep& r : job.link.rate_steps)
          steps.push_back({r.at_s, r.rate_gbps});
        p->emulator->set_schedule(RateSchedule(std::move(steps), rte_get_tsc_hz()));
      }
    }
  }
}

NodeNetworks::~NodeNetworks() {
  // Interfaces and emulators hold mbufs: free them before ports and pools go.
  for (auto& p : ports_) {
    p->interface.reset();
    p->emulator.reset();
  }
  for (auto& p : ports_) p->port.reset();
}

std::vector<NodePort*> NodeNetworks::ports_of(const std::string& node) {
  std::vector<NodePort*> out;
  for (auto& p : ports_) {
    if (p->node == node) out.push_back(p.get());
  }
  return out;
}

}  // namespace mercury::net
