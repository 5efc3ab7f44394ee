// The ARP cache of one interface: static entries from the configuration and
// entries learned from the wire, plus the rate limit on our own requests.
//
// Fixed capacity, chosen at construction; a full table refuses new dynamic
// entries (counted) rather than evicting, so a flood of ARP cannot push out
// the peers the job needs. Owned by the interface's net core: no locking.
// Lookups are a linear scan over at most a few hundred entries, done once per
// peer when its route is built, not per packet.
#pragma once

#include <cstdint>
#include <vector>

#include "net/frame.h"

namespace mercury::net {

class ArpTable {
 public:
  /// `retry_ticks`: minimum time between two requests for the same address.
  ArpTable(size_t capacity, uint64_t retry_ticks);

  /// A permanent entry (from the configuration); never overwritten by the wire.
  /// Returns false when the table is full.
  bool add_static(uint32_t ip, const MacAddr& mac);
  /// Records what an ARP packet told us. Static entries win. Returns false
  /// when a new entry does not fit.
  bool learn(uint32_t ip, const MacAddr& mac);
  /// The MAC for `ip`, or nullptr when unknown.
  [[nodiscard]] const MacAddr* lookup(uint32_t ip) const;
  /// True when a request for `ip` should go out now (unknown and not asked
  /// within retry_ticks); records the request time when it says so.
  bool should_request(uint32_t ip, uint64_t now);

  [[nodiscard]] size_t size() const { return entries_.size(); }
  [[nodiscard]] uint64_t refused() const { return refused_; }

 private:
  struct Entry {
    uint32_t ip;
    MacAddr mac;
    bool resolved;
    bool is_static;
    uint64_t last_request;
  };
  Entry* find(uint32_t ip);
  std::vector<Entry> entries_;  // reserved at construction; never grows past capacity_
  size_t capacity_;
  uint64_t retry_ticks_;
  uint64_t refused_ = 0;
};

}  // namespace mercury::net
