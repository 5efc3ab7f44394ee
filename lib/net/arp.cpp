#include "net/arp.h"

namespace mercury::net {

ArpTable::ArpTable(size_t capacity, uint64_t retry_ticks)
    : capacity_(capacity), retry_ticks_(retry_ticks) {
  entries_.reserve(capacity);
}

ArpTable::Entry* ArpTable::find(uint32_t ip) {
  for (auto& e : entries_) {
    if (e.ip == ip) return &e;
  }
  return nullptr;
}

const MacAddr* ArpTable::lookup(uint32_t ip) const {
  for (const auto& e : entries_) {
    if (e.ip == ip && e.resolved) return &e.mac;
  }
  return nullptr;
}

bool ArpTable::add_static(uint32_t ip, const MacAddr& mac) {
  if (Entry* e = find(ip)) {
    *e = Entry{ip, mac, true, true, 0};
    return true;
  }
  if (entries_.size() == capacity_) {
    ++refused_;
    return false;
  }
  entries_.push_back(Entry{ip, mac, true, true, 0});
  return true;
}

bool ArpTable::learn(uint32_t ip, const MacAddr& mac) {
  if (ip == 0 || mac.is_zero() || mac.is_broadcast()) return false;
  if (Entry* e = find(ip)) {
    if (!e->is_static) {
      e->mac = mac;
      e->resolved = true;
    }
    return true;
  }
  if (entries_.size() == capacity_) {
    ++refused_;
    return false;
  }
  entries_.push_back(Entry{ip, mac, true, false, 0});
  return true;
}

bool ArpTable::should_request(uint32_t ip, uint64_t now) {
  Entry* e = find(ip);
  if (e == nullptr) {
    if (entries_.size() == capacity_) {
      ++refused_;
      return false;
    }
    entries_.push_back(Entry{ip, MacAddr{}, false, false, now});
    return true;
  }
  if (e->resolved) return false;
  if (now - e->last_request < retry_ticks_) return false;
  e->last_request = now;
  return true;
}

}  // namespace mercury::net
