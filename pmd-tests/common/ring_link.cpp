#include "ring_link.h"

#include <rte_cycles.h>
#include <rte_eth_ring.h>
#include <rte_ether.h>
#include <rte_mbuf.h>
#include <rte_ring.h>

#include <cstring>
#include <stdexcept>

namespace mercury::pmdtest {

namespace {

constexpr uint16_t kBurst = 32;

void drain(rte_ring* r) {
  void* m;
  while (rte_ring_dequeue(r, &m) == 0) rte_pktmbuf_free(static_cast<rte_mbuf*>(m));
}

}  // namespace

LinkEnd::LinkEnd(const std::string& name, const EndOptions& options)
    : pool("p" + name, options.mbufs, options.mbuf_cache, net::frame_bytes_for_mtu(options.mtu)),
      copies("c" + name, 511, 32, net::frame_bytes_for_mtu(options.mtu)),
      options_(options) {}

LinkEnd::~LinkEnd() {
  if (iface_) iface_->attach_emulator(nullptr);
  iface_.reset();
  emulator_.reset();
}

void LinkEnd::attach(net::Port& port, uint32_t ip, uint16_t udp) {
  port_ = &port;
  iface_.emplace(port, pool, net::LocalAddr{port.mac(), ip, udp},
                 net::InterfaceOptions{.udp_checksum = options_.udp_checksum});
  if (options_.impair.impairs()) {
    emulator_ = std::make_unique<net::LinkEmulator>(port.id(), 0, options_.impair, copies.get(),
                                                    rte_get_tsc_hz());
    iface_->attach_emulator(emulator_.get());
  }
}

namespace {

// b's end: a's options with the emulator's seed of its own.
EndOptions other_direction(EndOptions o) {
  o.impair.seed = o.impair.seed * 31 + 7;
  return o;
}

}  // namespace

RingLink::RingLink(const std::string& name, uint8_t net, const RingLinkOptions& options)
    : a_("a_" + name, options.end),
      b_("b_" + name, other_direction(options.end)),
      ports_(
          net::Port::ring_link(name, a_.pool, b_.pool, net::PortOptions{.mtu = options.end.mtu})) {
  a_.attach(ports_.first, ip_a(net), 47100);
  b_.attach(ports_.second, ip_b(net), 47101);
  if (options.static_arp) {
    a().add_static_arp(ip_b(net), ports_.second.mac());
    b().add_static_arp(ip_a(net), ports_.first.mac());
  }
}

RingLink::~RingLink() = default;

bool RingLink::resolve_a_to_b(net::Route& route, uint64_t* delivered) {
  net::RxPacket rx[net::Interface::kBurst];
  const auto take = [&](net::Interface& i, uint64_t now) {
    const uint16_t n = i.poll_rx_st(rx, net::Interface::kBurst, now);
    for (uint16_t k = 0; k < n; ++k) rte_pktmbuf_free(net::mbuf_of(rx[k].buf));
    if (delivered != nullptr) *delivered += n;
  };
  for (int i = 0; i < 1000; ++i) {
    const uint64_t now = rte_rdtsc();
    if (a().resolve_st(b().local().ip, b().local().udp_port, route, now)) return true;
    a().flush_st(now);
    take(b(), now);
    b().flush_st(now);
    take(a(), now);
  }
  return false;
}

RingSwitch::RingSwitch(const std::string& name, const SwitchOptions& options)
    : name_(name),
      options_(options),
      flood_copies_("sc_" + name, 1023, 32, net::frame_bytes_for_mtu(options.mtu)) {}

RingSwitch::~RingSwitch() {
  for (net::Ring& r : rx_) drain(r.get());
  for (net::Ring& r : tx_) drain(r.get());
}

LinkEnd& RingSwitch::attach(const std::string& id, const EndOptions& end, uint32_t ip,
                            uint16_t udp) {
  const std::string n = id + "_" + name_;
  ends_.push_back(std::make_unique<LinkEnd>(n, end));
  rx_.emplace_back("sr" + n, 8192, RING_F_SP_ENQ | RING_F_SC_DEQ);
  tx_.emplace_back("st" + n, 8192, RING_F_SP_ENQ | RING_F_SC_DEQ);
  rte_ring* rx = rx_.back().get();
  rte_ring* tx = tx_.back().get();
  const std::string port = "sw" + n;
  if (rte_eth_from_rings(port.c_str(), &rx, 1, &tx, 1, rte_socket_id()) < 0) {
    throw std::runtime_error("switch " + name_ + ": port " + port);
  }
  ports_.push_back(
      net::Port::open("net_ring_" + port, ends_.back()->pool, net::PortOptions{.mtu = end.mtu}));
  ends_.back()->attach(ports_.back(), ip, udp);
  return *ends_.back();
}

void RingSwitch::deliver(rte_mbuf* m, size_t to, bool keep) {
  rte_mbuf* d = m;
  if (options_.copy_to_receiver || keep) {
    d = rte_pktmbuf_copy(m, options_.copy_to_receiver ? ends_[to]->pool.get() : flood_copies_.get(),
                         0, UINT32_MAX);
    if (!keep) rte_pktmbuf_free(m);
    if (d == nullptr) {
      // A NIC with no mbuf to receive into drops the frame.
      ++(options_.copy_to_receiver ? rx_pool_empty_ : dropped_);
      return;
    }
  }
  if (rte_ring_sp_enqueue(rx_[to].get(), d) != 0) {
    rte_pktmbuf_free(d);
    ++dropped_;
  }
}

uint32_t RingSwitch::forward() {
  uint32_t moved = 0;
  rte_mbuf* m[kBurst];
  for (size_t from = 0; from < ports_.size(); ++from) {
    unsigned n;
    while ((n = rte_ring_sc_dequeue_burst(tx_[from].get(), reinterpret_cast<void**>(m), kBurst,
                                          nullptr)) > 0) {
      moved += n;
      for (unsigned i = 0; i < n; ++i) {
        const auto* eth = rte_pktmbuf_mtod(m[i], const rte_ether_hdr*);
        if (rte_is_broadcast_ether_addr(&eth->dst_addr)) {
          for (size_t to = 0; to < ports_.size() && options_.flood; ++to) {
            if (to != from) deliver(m[i], to, true);
          }
          if (!options_.flood) ++dropped_;
          rte_pktmbuf_free(m[i]);
          continue;
        }
        size_t to = 0;
        while (to < ports_.size() &&
               std::memcmp(eth->dst_addr.addr_bytes, ports_[to].mac().bytes.data(), 6) != 0) {
          ++to;
        }
        if (to == ports_.size()) {
          rte_pktmbuf_free(m[i]);
          ++dropped_;
        } else {
          deliver(m[i], to, false);
        }
      }
    }
  }
  return moved;
}

uint64_t drain_rx(net::Port& port) {
  uint64_t n = 0;
  rte_mbuf* m[kBurst];
  while (const uint16_t got = port.rx_burst(0, m, kBurst)) {
    rte_pktmbuf_free_bulk(m, got);
    n += got;
  }
  return n;
}

}  // namespace mercury::pmdtest
