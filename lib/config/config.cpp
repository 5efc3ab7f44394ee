// Value types and the JobConfig helpers. The YAML loader is in load.cpp (and
// the files it names), EAL argument generation in eal.cpp.
#include "config/config.h"

#include <algorithm>
#include <charconv>
#include <cstdio>

#include "wire/header.h"

namespace mercury::config {

// config must not need the codec at run time, but the sizes must agree.
static_assert(kMercuryHeaderBytes == wire::kHeaderSize);
static_assert(kDefaultUdpPort == wire::kDefaultUdpPort);
static_assert(kAuthBlockBytes == wire::kAuthSize);

namespace {

std::string located_what(const std::string& source, int line, const std::string& key,
                         const std::string& message) {
  // Appends only: GCC 12 warns falsely (-Wrestrict) on "literal" + std::string.
  std::string s = source;
  if (line > 0) s.append(":").append(std::to_string(line));
  s.append(": ");
  if (!key.empty()) s.append(key).append(": ");
  return s.append(message);
}

// Parses a whole decimal field into [0, max]; refuses signs, spaces and
// leading zeros ("010" could mean octal to some readers).
std::optional<uint32_t> parse_decimal_octet(std::string_view s) {
  if (s.empty() || s.size() > 3 || (s.size() > 1 && s[0] == '0')) return std::nullopt;
  uint32_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || v > 255) return std::nullopt;
  return v;
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

ConfigError::ConfigError(std::string source, int line, std::string key, std::string message)
    : std::runtime_error(located_what(source, line, key, message)),
      source_(std::move(source)),
      line_(line),
      key_(std::move(key)),
      message_(std::move(message)) {}

ConfigError::ConfigError(std::string source, std::string message)
    : ConfigError(std::move(source), 0, std::string(), std::move(message)) {}

std::optional<Ipv4> Ipv4::parse(std::string_view text) {
  uint32_t value = 0;
  for (int i = 0; i < 4; ++i) {
    size_t dot = text.find('.');
    if ((i < 3) != (dot != std::string_view::npos)) return std::nullopt;
    auto octet = parse_decimal_octet(text.substr(0, dot));
    if (!octet) return std::nullopt;
    value = (value << 8) | *octet;
    text = i < 3 ? text.substr(dot + 1) : std::string_view();
  }
  return Ipv4{value};
}

std::string Ipv4::to_string() const {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%u.%u.%u.%u", value >> 24, (value >> 16) & 0xff,
                (value >> 8) & 0xff, value & 0xff);
  return buf;
}

std::optional<Mac> Mac::parse(std::string_view text) {
  // "xx:xx:xx:xx:xx:xx" is exactly 17 characters.
  if (text.size() != 17) return std::nullopt;
  Mac mac;
  for (size_t i = 0; i < 6; ++i) {
    int hi = hex_digit(text[i * 3]);
    int lo = hex_digit(text[i * 3 + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    if (i < 5 && text[i * 3 + 2] != ':') return std::nullopt;
    mac.octets[i] = static_cast<uint8_t>(hi * 16 + lo);
  }
  return mac;
}

std::string Mac::to_string() const {
  char buf[18];
  std::snprintf(buf, sizeof buf, "%02x:%02x:%02x:%02x:%02x:%02x", octets[0], octets[1], octets[2],
                octets[3], octets[4], octets[5]);
  return buf;
}

std::string_view to_string(Scheduler v) {
  switch (v) {
    case Scheduler::kStrict:
      return "strict";
    case Scheduler::kFifo:
      return "fifo";
    case Scheduler::kPartition:
      return "partition";
  }
  return "?";
}

std::string_view to_string(Poll v) {
  switch (v) {
    case Poll::kAdaptive:
      return "adaptive";
    case Poll::kBusy:
      return "busy";
  }
  return "?";
}

std::string_view to_string(Checksum v) {
  switch (v) {
    case Checksum::kAuto:
      return "auto";
    case Checksum::kOn:
      return "true";
    case Checksum::kOff:
      return "false";
  }
  return "?";
}

std::string_view to_string(Hugepages v) {
  switch (v) {
    case Hugepages::kAuto:
      return "auto";
    case Hugepages::kOn:
      return "on";
    case Hugepages::kOff:
      return "off";
  }
  return "?";
}

std::string_view to_string(Role v) {
  switch (v) {
    case Role::kServer:
      return "server";
    case Role::kWorker:
      return "worker";
    case Role::kStandby:
      return "standby";
  }
  return "?";
}

std::string_view to_string(Sync v) {
  switch (v) {
    case Sync::kBsp:
      return "bsp";
    case Sync::kAsp:
      return "asp";
    case Sync::kSsp:
      return "ssp";
    case Sync::kPsPlus:
      return "psplus";
  }
  return "?";
}

std::string_view to_string(StalenessLr v) {
  switch (v) {
    case StalenessLr::kInverse:
      return "inverse";
    case StalenessLr::kInverseSqrt:
      return "inverse_sqrt";
    case StalenessLr::kNone:
      return "none";
  }
  return "?";
}

std::string_view to_string(Aggregation v) {
  switch (v) {
    case Aggregation::kChunk:
      return "chunk";
    case Aggregation::kTensor:
      return "tensor";
  }
  return "?";
}

std::string_view to_string(Optimizer v) {
  switch (v) {
    case Optimizer::kSgd:
      return "sgd";
    case Optimizer::kMomentum:
      return "momentum";
    case Optimizer::kAdam:
      return "adam";
    case Optimizer::kSum:
      return "sum";
    case Optimizer::kAdamW:
      return "adamw";
  }
  return "?";
}

std::string_view PortSpec::vdev_name() const {
  std::string_view t = text;
  return t.substr(0, t.find(','));
}

std::optional<std::string_view> devargs_value(std::string_view args, std::string_view key) {
  for (size_t at = 0; at <= args.size();) {
    const size_t end = std::min(args.find(',', at), args.size());
    const std::string_view arg = args.substr(at, end - at);
    if (arg.size() > key.size() && arg.starts_with(key) && arg[key.size()] == '=') {
      return arg.substr(key.size() + 1);
    }
    at = end + 1;
  }
  return std::nullopt;
}

std::optional<std::string_view> PortSpec::vdev_arg(std::string_view key) const {
  const std::string_view t = text;
  const size_t comma = t.find(',');
  return comma == std::string_view::npos ? std::nullopt : devargs_value(t.substr(comma + 1), key);
}

const NodeConfig* JobConfig::find_node(std::string_view name) const {
  for (const NodeConfig& n : nodes) {
    if (n.name == name) return &n;
  }
  return nullptr;
}

const NodeConfig& JobConfig::node(std::string_view name) const {
  if (const NodeConfig* n = find_node(name)) return *n;
  std::string names;
  for (const NodeConfig& n : nodes) names += (names.empty() ? "" : ", ") + n.name;
  throw ConfigError(source,
                    "no node named \"" + std::string(name) + "\" (nodes are: " + names + ")");
}

std::vector<const NodeConfig*> JobConfig::workers() const {
  std::vector<const NodeConfig*> out;
  for (const NodeConfig& n : nodes) {
    if (n.role == Role::kWorker && !n.spare) out.push_back(&n);
  }
  return out;
}

std::vector<const NodeConfig*> JobConfig::spares() const {
  std::vector<const NodeConfig*> out;
  for (const NodeConfig& n : nodes) {
    if (n.spare) out.push_back(&n);
  }
  return out;
}

std::vector<const NodeConfig*> JobConfig::servers() const {
  std::vector<const NodeConfig*> out;
  for (const NodeConfig& n : nodes) {
    if (n.role == Role::kServer) out.push_back(&n);
  }
  return out;
}

uint32_t JobConfig::rank_of(std::string_view name) const { return node(name).rank; }

uint32_t JobConfig::payload_bytes_per_packet() const {
  // network.mtu >= 576 is enforced by the loader, so this cannot wrap.
  const uint32_t auth = network.auth_key ? kAuthBlockBytes : 0;
  return (network.mtu - kIpv4HeaderBytes - kUdpHeaderBytes - kMercuryHeaderBytes - auth) & ~63u;
}

}  // namespace mercury::config
