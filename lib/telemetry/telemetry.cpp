#include "telemetry/telemetry.h"

#include <rte_telemetry.h>

#include <algorithm>
#include <stdexcept>

namespace mercury::telemetry {

namespace {

// rte_telemetry callbacks carry no context pointer: the exposed registry.
std::atomic<Registry*> g_exposed{nullptr};

bool valid_name(const std::string& n) {
  return !n.empty() && std::all_of(n.begin(), n.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  });
}

int stats_cmd(const char*, const char*, struct rte_tel_data* d) {
  Registry* r = g_exposed.load(std::memory_order_acquire);
  if (r == nullptr) return -1;
  rte_tel_data_start_dict(d);
  for (const auto& [group, values] : r->snapshot()) {
    rte_tel_data* inner = rte_tel_data_alloc();
    if (inner == nullptr) return -1;
    rte_tel_data_start_dict(inner);
    for (const auto& [name, value] : values) rte_tel_data_add_dict_u64(inner, name.c_str(), value);
    rte_tel_data_add_dict_container(d, group.c_str(), inner, 0);
  }
  return 0;
}

int groups_cmd(const char*, const char*, struct rte_tel_data* d) {
  Registry* r = g_exposed.load(std::memory_order_acquire);
  if (r == nullptr) return -1;
  rte_tel_data_start_array(d, RTE_TEL_STRING_VAL);
  for (const auto& [group, values] : r->snapshot()) {
    rte_tel_data_add_array_string(d, group.c_str());
  }
  return 0;
}

}  // namespace

Registry::~Registry() {
  if (exposed_) {
    // rte_telemetry cannot unregister a command; make it answer an error.
    Registry* self = this;
    g_exposed.compare_exchange_strong(self, nullptr);
  }
}

void Registry::add(const std::string& group, GroupReader read) {
  if (!valid_name(group)) throw std::invalid_argument("telemetry group name '" + group + "'");
  std::lock_guard lock(mu_);
  for (const auto& g : groups_) {
    if (g.name == group) throw std::invalid_argument("telemetry group '" + group + "' twice");
  }
  groups_.push_back(Group{group, std::move(read)});
}

void Registry::expose() {
  Registry* expected = nullptr;
  if (!g_exposed.compare_exchange_strong(expected, this)) {
    throw std::logic_error("a telemetry registry is already exposed in this process");
  }
  exposed_ = true;
  // Registration fails only for bad names or a full table; both are bugs here.
  if (rte_telemetry_register_cmd("/mercury/stats", stats_cmd,
                                 "Every Mercury counter, by group. Takes no parameters") != 0 ||
      rte_telemetry_register_cmd("/mercury/groups", groups_cmd,
                                 "Names of the Mercury counter groups. Takes no parameters") != 0) {
    throw std::runtime_error("cannot register the /mercury telemetry commands");
  }
}

std::vector<std::pair<std::string, Values>> Registry::snapshot() const {
  std::lock_guard lock(mu_);
  std::vector<std::pair<std::string, Values>> out;
  out.reserve(groups_.size());
  for (const auto& g : groups_) {
    Values v;
    g.read(v);
    out.emplace_back(g.name, std::move(v));
  }
  return out;
}

uint64_t Registry::total(const std::string& name) const {
  uint64_t sum = 0;
  for (const auto& [group, values] : snapshot()) {
    for (const auto& [n, v] : values) {
      if (n == name) sum += v;
    }
  }
  return sum;
}

std::string Registry::line(const std::vector<std::string>& names) const {
  std::string s;
  for (const auto& [group, values] : snapshot()) {
    for (const auto& [n, v] : values) {
      if (std::find(names.begin(), names.end(), n) == names.end()) continue;
      if (!s.empty()) s += ' ';
      s += group + '.' + n + '=' + std::to_string(v);
    }
  }
  return s;
}

}  // namespace mercury::telemetry
