// In-process networks for PMD tests and benchmarks: a net_ring link between
// two Interfaces, and a software Ethernet switch over rings that joins any
// number of them. Each node's end (LinkEnd) owns its mbuf pool, a copy pool
// for the link emulator's duplicates, its Interface and, when the options
// impair the link, its LinkEmulator on the TX queue.
//
// Threads: everything belongs to the thread that made it (the test's one
// polling thread); RingSwitch::forward() runs there too. Costs: set-up
// allocates and throws freely; forward() copies only what the switch's
// options ask for. Addresses: a ring link's ends are 10.0.<net>.1:47100 (a)
// and 10.0.<net>.2:47101 (b); switch nodes are addressed by their callers.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "net/interface.h"
#include "net/link_emulator.h"
#include "net/mempool.h"
#include "net/port.h"

namespace mercury::pmdtest {

/// How one node's end is built.
struct EndOptions {
  uint32_t mtu = 1500;
  uint32_t mbufs = 2047;  ///< the end's receive and send pool
  uint32_t mbuf_cache = 64;
  bool udp_checksum = true;  ///< InterfaceOptions::udp_checksum
  /// The emulator on the end's TX queue; none when it impairs nothing.
  net::LinkParams impair;
};

/// One node's end of a link or a switch port: pools, Interface, emulator.
class LinkEnd {
 public:
  /// Makes the pools "p<name>" (`mbufs`) and "c<name>" (511, the emulator's
  /// duplicates); attach() adds the Interface.
  LinkEnd(const std::string& name, const EndOptions& options);
  ~LinkEnd();
  LinkEnd(const LinkEnd&) = delete;
  LinkEnd& operator=(const LinkEnd&) = delete;

  /// The Interface on `port` at `ip`:`udp`, behind the emulator when the
  /// options impair the link.
  void attach(net::Port& port, uint32_t ip, uint16_t udp);

  net::Interface& iface() { return *iface_; }
  net::Port& port() { return *port_; }
  /// The emulator's counters; null without one.
  [[nodiscard]] const net::LinkCounters* emulated() const {
    return emulator_ ? &emulator_->counters() : nullptr;
  }
  [[nodiscard]] const net::LinkEmulator* emulator() const { return emulator_.get(); }

  net::Mempool pool;
  net::Mempool copies;

 private:
  EndOptions options_;
  net::Port* port_ = nullptr;
  std::unique_ptr<net::LinkEmulator> emulator_;
  std::optional<net::Interface> iface_;
};

/// What a RingLink is made of. `end.impair` impairs both directions (b's
/// emulator with its own seed, derived from a's).
struct RingLinkOptions {
  EndOptions end;
  bool static_arp = false;  ///< each end knows the other's MAC: no ARP exchange
};

/// Two Interfaces joined by a pair of rings (net::Port::ring_link).
class RingLink {
 public:
  RingLink(const std::string& name, uint8_t net, const RingLinkOptions& options = {});
  ~RingLink();
  RingLink(const RingLink&) = delete;
  RingLink& operator=(const RingLink&) = delete;

  static uint32_t ip_a(uint8_t net) { return 0x0a000001u | uint32_t{net} << 8; }
  static uint32_t ip_b(uint8_t net) { return 0x0a000002u | uint32_t{net} << 8; }
  net::Interface& a() { return a_.iface(); }
  net::Interface& b() { return b_.iface(); }
  net::Port& port_a() { return ports_.first; }
  net::Port& port_b() { return ports_.second; }
  LinkEnd& end_a() { return a_; }
  LinkEnd& end_b() { return b_; }
  [[nodiscard]] const net::LinkCounters* emu_a() const { return a_.emulated(); }
  [[nodiscard]] const net::LinkCounters* emu_b() const { return b_.emulated(); }

  /// Polls both ends until a has a route to b (an ARP request and its reply,
  /// unless static_arp): false after 1000 passes. `delivered` gains every
  /// Mercury packet either end handed up meanwhile (freed; none is expected).
  bool resolve_a_to_b(net::Route& route, uint64_t* delivered = nullptr);

 private:
  LinkEnd a_, b_;
  std::pair<net::Port, net::Port> ports_;
};

/// How a RingSwitch forwards.
struct SwitchOptions {
  uint32_t mtu = 1500;
  /// Broadcasts (ARP requests) are copied to every other port; otherwise
  /// they are dropped and counted like a frame for an unknown MAC.
  bool flood = true;
  /// Every frame is copied into the receiving end's own pool and the
  /// sender's mbuf freed at once, as between two hosts: a receiver whose pool
  /// is empty drops the frame (counted in rx_pool_empty()), as a NIC does.
  /// Otherwise the sender's mbuf itself is delivered.
  bool copy_to_receiver = false;
};

/// An Ethernet switch in software: every attached end has a port whose TX
/// ring the switch empties and whose RX ring it fills, by destination MAC.
class RingSwitch {
 public:
  RingSwitch(const std::string& name, const SwitchOptions& options);
  ~RingSwitch();
  RingSwitch(const RingSwitch&) = delete;
  RingSwitch& operator=(const RingSwitch&) = delete;

  /// A new switch port for a new end ("<id>_<switch name>"), its Interface
  /// at `ip`:`udp`. The reference stays valid for the switch's lifetime.
  LinkEnd& attach(const std::string& id, const EndOptions& end, uint32_t ip, uint16_t udp);
  LinkEnd& end(size_t i) { return *ends_[i]; }
  [[nodiscard]] size_t size() const { return ends_.size(); }

  /// Moves every frame the ends have sent so far to its port (the switch is
  /// faster than the nodes: nothing waits in a TX ring). Returns how many.
  uint32_t forward();
  /// Frames for no attached MAC, broadcasts when not flooding, and frames
  /// a full ring refused.
  [[nodiscard]] uint64_t dropped() const { return dropped_; }
  [[nodiscard]] uint64_t rx_pool_empty() const { return rx_pool_empty_; }

 private:
  // Hands `m` (or, with `keep` or copy_to_receiver, a copy of it) to port
  // `to`; `m` is the caller's again only with `keep`.
  void deliver(rte_mbuf* m, size_t to, bool keep);

  // Destroyed bottom up: the ports, the rings (drained first), then the
  // pools their frames came from.
  std::string name_;
  SwitchOptions options_;
  std::deque<std::unique_ptr<LinkEnd>> ends_;
  net::Mempool flood_copies_;
  std::deque<net::Ring> rx_, tx_;  // per port: switch -> end, end -> switch
  std::deque<net::Port> ports_;
  uint64_t dropped_ = 0;
  uint64_t rx_pool_empty_ = 0;
};

/// Frees whatever waits in RX queue 0 of `port`; returns how many frames.
uint64_t drain_rx(net::Port& port);

}  // namespace mercury::pmdtest
