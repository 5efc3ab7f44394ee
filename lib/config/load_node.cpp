// One entry of the job file's node list (load_sections.h): name, role,
// address and MAC, the port forms (ring link, vdev, PCI address, normalised),
// lcores and shards, with the rules within one node (no port or lcore twice,
// enough lcores for the shards). The rules across nodes are load_nodes.cpp's.
#include <algorithm>
#include <cctype>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "config/load_sections.h"

namespace mercury::config::detail {

namespace {

bool is_unicast(Ipv4 a) {
  // 0.0.0.0 is "any"; 224/4 is multicast and 240/4 reserved (with broadcast).
  return a.value != 0 && (a.value >> 28) < 0xe;
}

bool is_hex(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

// "[dddd:]bb:dd.f" -> "dddd:bb:dd.f" in lower case, the form EAL prints and
// sysfs uses, so two spellings of one device compare equal.
std::optional<std::string> normalise_pci(std::string_view s) {
  std::string domain = "0000";
  if (s.size() == 12) {
    if (s[4] != ':') return std::nullopt;
    domain = std::string(s.substr(0, 4));
    s = s.substr(5);
  }
  // bus(2) ':' device(2) '.' function(1); device is 5 bits, function 3.
  if (s.size() != 7 || s[2] != ':' || s[5] != '.') return std::nullopt;
  for (char c : domain) {
    if (!is_hex(c)) return std::nullopt;
  }
  for (size_t i : {0, 1, 3, 4}) {
    if (!is_hex(s[i])) return std::nullopt;
  }
  if (s[3] > '1' || s[6] < '0' || s[6] > '7') return std::nullopt;
  std::string out = domain + ":" + std::string(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool looks_like_pci(std::string_view s) {
  if (s.find(':') == std::string_view::npos || s.find('.') == std::string_view::npos) return false;
  for (char c : s) {
    if (!is_hex(c) && c != ':' && c != '.') return false;
  }
  return true;
}

// net_<driver><n>[,key=value...]
bool is_vdev(std::string_view s) {
  std::string_view name = s.substr(0, s.find(','));
  if (!name.starts_with("net_") || name.size() < 6) return false;
  std::string_view rest = name.substr(4);
  if (rest.front() < 'a' || rest.front() > 'z') return false;
  if (rest.back() < '0' || rest.back() > '9') return false;
  for (char c : rest) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  }
  if (name.size() == s.size()) return true;
  std::string_view args = s.substr(name.size() + 1);
  while (true) {
    std::string_view kv = args.substr(0, args.find(','));
    size_t eq = kv.find('=');
    if (eq == 0 || eq == std::string_view::npos || eq + 1 == kv.size()) return false;
    if (kv.size() == args.size()) return true;
    args = args.substr(kv.size() + 1);
  }
}

const char* const kPortForms =
    "expected ring:<link>, net_<driver><n>[,key=value...] or a PCI address such as 0000:03:00.0";

PortSpec parse_port(const Value& v) {
  std::string text = v.string();
  PortSpec p;
  if (text.starts_with("ring:")) {
    p.kind = PortSpec::kRing;
    p.ring_link = text.substr(5);
    if (!is_name(p.ring_link)) v.fail(quoted(text) + ": the ring link name " + name_rule());
    p.text = std::move(text);
  } else if (text.starts_with("net_")) {
    if (!is_vdev(text)) {
      v.fail(quoted(text) +
             " is not a vdev string (expected net_<driver><n>[,key=value...], e.g. "
             "net_memif0,role=server,socket=/tmp/mercury/w0.sock)");
    }
    p.kind = PortSpec::kVdev;
    p.text = std::move(text);
  } else if (auto pci = normalise_pci(text)) {
    p.kind = PortSpec::kPci;
    p.text = *pci;
  } else if (looks_like_pci(text)) {
    v.fail(quoted(text) +
           " is not a PCI address (expected [domain:]bus:device.function, e.g. 0000:03:00.0: "
           "domain 4 hex digits, bus 00..ff, device 00..1f, function 0..7)");
  } else {
    // In a flow list, [net_memif0,role=server] splits at the comma and
    // leaves "role=server" here: say so rather than just "not a port".
    std::string hint = text.find('=') != std::string::npos
                           ? "; quote vdev strings that hold commas inside [ ]"
                           : "";
    v.fail(quoted(text) + " is not a port (" + kPortForms + hint + ")");
  }
  return p;
}

// The device arguments DPDK 22.11's PMDs accept, for the drivers Mercury
// uses; a PMD rejects any other key only when EAL probes it, with a message
// that names neither the file nor the line. Drivers not listed are left to
// their PMD.
constexpr std::string_view kMemifKeys[] = {
    "id",  "role",      "bsize",     "rsize",     "socket", "socket-abstract",
    "mac", "zero-copy", "owner-uid", "owner-gid", "secret"};
constexpr std::string_view kAfPacketKeys[] = {"iface",   "qpairs",   "blocksz",
                                              "framesz", "framecnt", "qdisc_bypass"};
constexpr std::string_view kPcapKeys[] = {"rx_pcap",  "tx_pcap", "rx_iface", "rx_iface_in",
                                          "tx_iface", "iface",   "phy_mac",  "infinite_rx"};
constexpr std::string_view kNullKeys[] = {"size", "copy", "no-rx"};
constexpr std::string_view kTapKeys[] = {"iface", "mac", "remote", "persist"};

// The driver of a vdev is its name less the instance number: net_memif12 -> net_memif.
std::string_view driver_of(std::string_view vdev_name) {
  return vdev_name.substr(0, vdev_name.find_last_not_of("0123456789") + 1);
}

std::span<const std::string_view> known_keys(std::string_view vdev_name) {
  const std::string_view driver = driver_of(vdev_name);
  if (driver == "net_memif") return kMemifKeys;
  if (driver == "net_af_packet") return kAfPacketKeys;
  if (driver == "net_pcap") return kPcapKeys;
  if (driver == "net_null") return kNullKeys;
  if (driver == "net_tap") return kTapKeys;
  return {};
}

// Every key=value of a vdev string of a known driver must be one its PMD
// takes, and net_memif's role one of its two.
void check_vdev_args(const Value& v, const PortSpec& port) {
  if (port.kind != PortSpec::kVdev) return;
  const std::span<const std::string_view> keys = known_keys(port.vdev_name());
  if (keys.empty()) return;
  std::string_view args(port.text);
  for (size_t at = args.find(','); at != std::string_view::npos; at = args.find(',', at + 1)) {
    const std::string_view arg = args.substr(at + 1, args.find(',', at + 1) - at - 1);
    const std::string_view key = arg.substr(0, arg.find('='));
    const std::string_view value = arg.substr(key.size() + 1);
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) {
      std::string known;
      for (std::string_view k : keys)
        known += std::string(known.empty() ? "" : ", ") + std::string(k);
      v.fail(quoted(port.text) + ": " + quoted(std::string(key)) + " is not an argument of " +
             std::string(driver_of(port.vdev_name())) + " (it takes " + known + ")");
    }
    if (key == "role" && value != "server" && value != "client") {
      v.fail(quoted(port.text) + ": role " + quoted(std::string(value)) +
             " is neither server nor client");
    }
    if (key == "zero-copy" && value != "yes" && value != "no") {
      v.fail(quoted(port.text) + ": zero-copy " + quoted(std::string(value)) +
             " is neither yes nor no");
    }
  }
  // memif copies on its server side: only a client can be zero-copy.
  if (port.vdev_arg("zero-copy") == "yes" && port.vdev_arg("role") != "client") {
    v.fail(quoted(port.text) +
           ": zero-copy=yes needs role=client (net_memif's server side "
           "always copies)");
  }
}

// A net_memif port carries each frame in one buffer of the vdev's bsize
// (2048 unless given): DPDK 22.11's memif (copy mode) splits a larger frame
// over several buffers but does not clear the continuation flag of the first
// one it reuses, so a later frame that fits one buffer can be joined to the
// next (seen here: 9476-byte "frames" at MTU 9000). The job's frames (MTU +
// the 14-byte Ethernet header; memif carries no FCS) must fit one buffer.
void check_memif_bsize(const Value& v, const PortSpec& port, const NetworkConfig& net) {
  if (port.kind != PortSpec::kVdev || !port.vdev_name().starts_with("net_memif")) return;
  uint64_t bsize = 2048;
  std::string_view args(port.text);
  for (size_t at = args.find(','); at != std::string_view::npos; at = args.find(',', at + 1)) {
    const std::string_view arg = args.substr(at + 1, args.find(',', at + 1) - at - 1);
    if (!arg.starts_with("bsize=")) continue;
    const std::string_view n = arg.substr(6);
    bsize = 0;
    for (char c : n) bsize = c >= '0' && c <= '9' && bsize < 100000 ? bsize * 10 + (c - '0') : 0;
    if (n.empty() || bsize == 0 || bsize > 65535) {
      v.fail(quoted(port.text) + ": bsize " + quoted(std::string(n)) +
             " is not a buffer size (1..65535 bytes)");
    }
  }
  const uint64_t frame = uint64_t{net.mtu} + 14;
  if (frame > bsize) {
    v.fail(quoted(port.text) + ": network.mtu " + std::to_string(net.mtu) + " makes frames of " +
           std::to_string(frame) + " bytes, which net_memif must carry in one buffer: add bsize=" +
           std::to_string(frame) + " or more (e.g. bsize=9216) to both ends of the link (now " +
           std::to_string(bsize) + ")");
  }
}

}  // namespace

// Reads one node, key by key in the order of the reference, filling `src`.
NodeConfig parse_node(const Section& s, const NetworkConfig& net, NodeSource& src) {
  NodeConfig n;
  src.name = s.require("name");
  n.name = src.name.string();
  if (!is_name(n.name)) src.name.fail(quoted(n.name) + " " + name_rule());
  src.role = s.require("role");
  n.role = src.role.choice<Role>(
      {{"server", Role::kServer}, {"worker", Role::kWorker}, {"standby", Role::kStandby}});

  src.ipv4 = s.require("ipv4");
  std::string ip = src.ipv4.string();
  auto addr = Ipv4::parse(ip);
  if (!addr)
    src.ipv4.fail(quoted(ip) + " is not an IPv4 address (expected a dotted quad, e.g. 10.0.0.1)");
  if (!is_unicast(*addr)) {
    src.ipv4.fail(ip + " is not a unicast address (0.0.0.0 and 224.0.0.0 and above are refused)");
  }
  n.ipv4 = *addr;

  n.udp_port = net.udp_port;
  if (auto v = s.get("udp_port")) n.udp_port = static_cast<uint16_t>(v->integer(1, 65535));

  src.mac = s.get("mac");
  if (src.mac) {
    std::string text = src.mac->string();
    auto mac = Mac::parse(text);
    if (!mac) {
      src.mac->fail(quoted(text) +
                    " is not a MAC address (expected six hex bytes, e.g. 02:00:00:00:00:01)");
    }
    if (mac->is_multicast() || *mac == Mac{}) {
      src.mac->fail(text + " is not a unicast address (the first byte must be even and the " +
                    "address not all zero)");
    }
    n.mac = *mac;
  }

  Value ports = s.require("ports");
  src.port_list = ports;
  src.ports = ports.sequence();
  if (src.ports.empty()) ports.fail("the list is empty (a node needs at least one port)");
  for (size_t i = 0; i < src.ports.size(); ++i) {
    n.ports.push_back(parse_port(src.ports[i]));
    const PortSpec& port = n.ports.back();
    check_vdev_args(src.ports[i], port);
    check_memif_bsize(src.ports[i], port, net);
    for (size_t j = 0; j < i; ++j) {
      if (port.kind == PortSpec::kPci && n.ports[j].kind == PortSpec::kPci &&
          n.ports[j].text == port.text) {
        src.ports[i].fail("PCI device " + port.text + " is already used by " + src.ports[j].path());
      }
      if (port.kind == PortSpec::kVdev && n.ports[j].kind == PortSpec::kVdev &&
          n.ports[j].vdev_name() == port.vdev_name()) {
        src.ports[i].fail("vdev name " + std::string(port.vdev_name()) + " is already used by " +
                          src.ports[j].path() + " (vdev names must be unique in the file)");
      }
    }
  }

  Value lcores = s.require("lcores");
  src.lcores = lcores;
  std::vector<Value> items = lcores.sequence();
  if (items.empty()) lcores.fail("the list is empty (the first lcore is the node's net core)");
  for (size_t i = 0; i < items.size(); ++i) {
    uint32_t id = static_cast<uint32_t>(items[i].integer(0, kMaxLcore));
    for (size_t j = 0; j < i; ++j) {
      if (n.lcores[j] == id) {
        items[i].fail("lcore " + std::to_string(id) + " is listed twice (also " + items[j].path() +
                      ")");
      }
    }
    n.lcores.push_back(id);
  }

  n.poll = net.poll;
  if (auto v = s.get("poll")) n.poll = parse_poll(*v);

  src.spare = s.get("spare");
  if (src.spare) {
    // A worker outside the ranks that takes a removed one over
    // (docs/membership.md, "Spare workers"); the sync mode is checked with
    // the nodes (parse_nodes).
    if (n.role != Role::kWorker) {
      src.spare->fail("only a worker is a spare (this node is a " + std::string(to_string(n.role)) +
                      ")");
    }
    n.spare = src.spare->boolean();
  }
  src.standby = s.get("standby");
  if (src.standby) {
    if (n.role != Role::kServer) {
      src.standby->fail("only a server names a standby (this node is a " +
                        std::string(to_string(n.role)) + ")");
    }
    n.standby = src.standby->string();
  }
  auto shards = s.get("shards");
  if (n.role == Role::kWorker) {
    if (shards) shards->fail("only servers have shards (this node is a worker)");
  } else if (n.role == Role::kStandby) {
    if (shards) shards->fail("a standby runs its server's shards (the server's `shards`)");
  } else if (src.standby) {
    // The replication gates each update's fan-out on the standby's
    // acknowledgement, which arrives on the net core: the shards run there.
    if (!shards) {
      throw ConfigError(s.source(), s.line(), join(s.path(), "shards"),
                        "required for a server (1.." + std::to_string(kMaxShards) + ")");
    }
    n.shards = static_cast<uint32_t>(shards->integer(1, kMaxShards));
  } else {
    if (!shards) {
      throw ConfigError(s.source(), s.line(), join(s.path(), "shards"),
                        "required for a server (1.." + std::to_string(kMaxShards) + ")");
    }
    n.shards = static_cast<uint32_t>(shards->integer(1, kMaxShards));
    if (n.shards > n.lcores.size() - 1) {
      shards->fail(std::to_string(n.shards) + " shards need " + std::to_string(n.shards) +
                   " lcores after the net core, but " + lcores.path() + " has " +
                   std::to_string(n.lcores.size() - 1));
    }
  }
  return n;
}

}  // namespace mercury::config::detail
