// The YAML loader: walks the document once, checking each key against an
// allow-list and each value's type and range as it goes, then the rules that
// span several nodes. Every refusal names file, line and key path.
//
// yaml-cpp's own conversions are avoided on purpose: as<bool>() takes "yes"
// and "on", as<int>() takes "0x10" and quoted numbers. Scalars are read as
// text and parsed strictly here, so a file means one thing.
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <system_error>
#include <utility>

#include "config/config.h"

namespace mercury::config {
namespace {

constexpr size_t kMaxNameLength = 32;
constexpr uint64_t kU32Max = std::numeric_limits<uint32_t>::max();
constexpr uint64_t kU64Max = std::numeric_limits<uint64_t>::max();
constexpr uint64_t kMinMbufs = 1023;
constexpr uint64_t kMaxCache = 512;  // RTE_MEMPOOL_CACHE_MAX_SIZE

std::string quoted(std::string_view s) {
  // Long values are cut: the message should point, not repeat the file.
  constexpr size_t kMax = 80;
  // Control characters are escaped so a message stays on one line.
  std::string out = "\"";
  for (char c : s.substr(0, kMax)) {
    if (c == '\n') {
      out += "\\n";
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += '?';
    } else {
      out += c;
    }
  }
  if (s.size() > kMax) out += "...";
  return out + "\"";
}

std::string join(const std::string& parent, std::string_view key) {
  return parent.empty() ? std::string(key) : parent + "." + std::string(key);
}

std::string element(const std::string& parent, size_t i) {
  return parent + "[" + std::to_string(i) + "]";
}

int line_of(const YAML::Node& n) { return n.Mark().is_null() ? 0 : n.Mark().line + 1; }

bool is_name(std::string_view s) {
  if (s.empty() || s.size() > kMaxNameLength) return false;
  for (char c : s) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

std::string name_rule() {
  return "must match [a-z0-9_-]+ and be at most " + std::to_string(kMaxNameLength) + " characters";
}

// One value of the document and where it came from.
class Value {
 public:
  Value() = default;
  Value(const std::string* source, YAML::Node node, std::string path, int line)
      : source_(source), node_(std::move(node)), path_(std::move(path)), line_(line) {}

  const YAML::Node& node() const { return node_; }
  const std::string& path() const { return path_; }
  int line() const { return line_; }
  /// The scalar as written (empty for non-scalars); for messages.
  std::string text() const { return node_.IsScalar() ? node_.Scalar() : std::string(); }

  [[noreturn]] void fail(const std::string& message) const {
    throw ConfigError(*source_, line_, path_, message);
  }

  uint64_t integer(uint64_t lo, uint64_t hi) const {
    std::string_view s = plain_scalar("an integer");
    bool negative = !s.empty() && s[0] == '-';
    std::string_view digits = negative ? s.substr(1) : s;
    uint64_t v = 0;
    auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
    if (digits.empty() || end != digits.data() + digits.size() ||
        (ec != std::errc() && ec != std::errc::result_out_of_range)) {
      fail("expected an integer, got " + describe());
    }
    if (negative || ec == std::errc::result_out_of_range || v < lo || v > hi) {
      fail(std::string(s) + " is out of range (" + std::to_string(lo) + ".." + std::to_string(hi) +
           ")");
    }
    return v;
  }

  /// A finite number; the caller checks the range (ranges differ in shape).
  double number() const {
    std::string_view s = plain_scalar("a number");
    double v = 0;
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || end != s.data() + s.size() || !std::isfinite(v)) {
      fail("expected a number, got " + describe());
    }
    return v;
  }

  bool boolean() const {
    std::string_view s = plain_scalar("true or false");
    if (s == "true") return true;
    if (s == "false") return false;
    fail("expected true or false, got " + describe());
  }

  std::string string() const {
    if (!node_.IsScalar()) fail("expected a string, got " + describe());
    return node_.Scalar();
  }

  template <typename E>
  E choice(std::initializer_list<std::pair<std::string_view, E>> options) const {
    std::string s = string();
    std::string names;
    for (const auto& [name, value] : options) {
      if (s == name) return value;
      names += (names.empty() ? "" : ", ") + std::string(name);
    }
    fail(quoted(s) + " is not one of " + names);
  }

  std::vector<Value> sequence() const {
    if (!node_.IsSequence()) fail("expected a list, got " + describe());
    std::vector<Value> out;
    for (size_t i = 0; i < node_.size(); ++i) {
      YAML::Node item = node_[i];
      int line = line_of(item);
      out.emplace_back(source_, item, element(path_, i), line > 0 ? line : line_);
    }
    return out;
  }

  std::string describe() const {
    switch (node_.Type()) {
      case YAML::NodeType::Null:
      case YAML::NodeType::Undefined:
        return "no value";
      case YAML::NodeType::Sequence:
        return "a list";
      case YAML::NodeType::Map:
        return "a mapping";
      case YAML::NodeType::Scalar:
        break;
    }
    if (node_.Tag() == "?") return quoted(node_.Scalar());
    if (node_.Tag() == "!") return "the quoted string " + quoted(node_.Scalar());
    return quoted(node_.Scalar()) + " tagged " + node_.Tag();
  }

  const std::string& source() const { return *source_; }

 private:
  // Numbers and booleans must be plain scalars: a quoted "1500" is a string,
  // and accepting it would hide a mistake in a generated file.
  std::string_view plain_scalar(const char* expected) const {
    if (!node_.IsScalar() || node_.Tag() != "?") {
      fail(std::string("expected ") + expected + ", got " + describe());
    }
    return node_.Scalar();
  }

  const std::string* source_ = nullptr;
  YAML::Node node_;
  std::string path_;
  int line_ = 0;
};

// A mapping whose keys have been checked against an allow-list.
class Section {
 public:
  Section(const Value& v, std::initializer_list<std::string_view> allowed)
      : source_(&v.source()), path_(v.path()), line_(v.line()) {
    if (v.node().IsNull()) return;  // "network:" with nothing under it: all defaults
    if (!v.node().IsMap()) v.fail("expected a mapping, got " + v.describe());
    std::string valid;
    for (std::string_view k : allowed) valid += (valid.empty() ? "" : ", ") + std::string(k);
    for (const auto& pair : v.node()) {
      // Copies, not references: yaml-cpp's iterator hands out a temporary pair.
      const YAML::Node key = pair.first;
      const YAML::Node value = pair.second;
      int key_line = line_of(key);
      std::string name =
          key.IsScalar() ? key.Scalar() : "<" + Value(source_, key, "", 0).describe() + ">";
      std::string path = join(path_, name);
      bool known = false;
      for (std::string_view k : allowed) known = known || k == name;
      if (!known) {
        // yaml-cpp 0.7 does not implement merge keys: "<<" arrives as a key.
        std::string hint = name == "<<" ? "; YAML merge keys are not supported" : "";
        throw ConfigError(*source_, key_line, path,
                          "unknown key (valid keys here: " + valid + ")" + hint);
      }
      for (const Entry& e : entries_) {
        if (e.key == name) {
          throw ConfigError(*source_, key_line, path,
                            "key given twice (first on line " + std::to_string(e.key_line) + ")");
        }
      }
      // Point at the key unless the value is a scalar: a null value has no
      // useful position, and a block mapping or list starts on the line
      // after its key, where "nodes: no server" would look misplaced.
      int value_line = value.IsScalar() ? line_of(value) : key_line;
      entries_.push_back(Entry{name, key_line, Value(source_, value, path, value_line)});
    }
  }

  std::optional<Value> get(std::string_view key) const {
    for (const Entry& e : entries_) {
      if (e.key == key) return e.value;
    }
    return std::nullopt;
  }

  Value require(std::string_view key) const {
    if (auto v = get(key)) return *v;
    throw ConfigError(*source_, line_, join(path_, key), "required key is missing");
  }

  int line() const { return line_; }
  const std::string& path() const { return path_; }
  const std::string& source() const { return *source_; }

 private:
  struct Entry {
    std::string key;
    int key_line;
    Value value;
  };
  const std::string* source_;
  std::string path_;
  int line_;
  std::vector<Entry> entries_;
};

Section optional_section(const Section& parent, std::string_view key,
                         std::initializer_list<std::string_view> allowed) {
  if (auto v = parent.get(key)) return Section(*v, allowed);
  return Section(Value(&parent.source(), YAML::Node(), join(parent.path(), key), parent.line()),
                 allowed);
}

// Reads a probability or similar: lo <= v < hi.
double half_open(const Value& v, double lo, double hi) {
  double x = v.number();
  if (!(x >= lo && x < hi)) {
    v.fail(v.text() + " is out of range [" + std::to_string(static_cast<int>(lo)) + ", " +
           std::to_string(static_cast<int>(hi)) + ")");
  }
  return x;
}

double positive(const Value& v) {
  double x = v.number();
  if (!(x > 0)) v.fail(v.text() + " is out of range (must be > 0)");
  return x;
}

void parse_job(const Section& root, JobConfig& job) {
  Section s(root.require("job"), {"id", "name"});
  job.id = static_cast<uint32_t>(s.require("id").integer(0, kU32Max));
  Value name = s.require("name");
  job.name = name.string();
  if (!is_name(job.name)) name.fail(quoted(job.name) + " " + name_rule());
}

void parse_network(const Section& root, NetworkConfig& net) {
  Section s = optional_section(root, "network",
                               {"mtu", "udp_port", "udp_checksum", "window", "peer_timeout_ms",
                                "scheduler", "partition_bytes", "credit_bytes"});
  if (auto v = s.get("mtu")) net.mtu = static_cast<uint32_t>(v->integer(576, 9000));
  if (auto v = s.get("udp_port")) net.udp_port = static_cast<uint16_t>(v->integer(1, 65535));
  if (auto v = s.get("udp_checksum")) net.udp_checksum = v->boolean();
  if (auto v = s.get("window")) net.window = static_cast<uint32_t>(v->integer(0, kU32Max));
  if (auto v = s.get("peer_timeout_ms")) {
    net.peer_timeout_ms = static_cast<uint32_t>(v->integer(100, 600000));
  }
  if (auto v = s.get("scheduler")) {
    net.scheduler = v->choice<Scheduler>({{"strict", Scheduler::kStrict},
                                          {"fifo", Scheduler::kFifo},
                                          {"partition", Scheduler::kPartition}});
  }
  for (const char* key : {"partition_bytes", "credit_bytes"}) {
    auto v = s.get(key);
    if (v && net.scheduler != Scheduler::kPartition) {
      v->fail("only used by scheduler partition (network.scheduler is " +
              std::string(to_string(net.scheduler)) + ")");
    }
  }
  if (auto v = s.get("partition_bytes")) {
    net.partition_bytes = static_cast<uint32_t>(v->integer(4096, kU32Max));
  }
  if (auto v = s.get("credit_bytes")) {
    net.credit_bytes = static_cast<uint32_t>(v->integer(4096, kU32Max));
  }
  if (net.scheduler == Scheduler::kPartition && net.credit_bytes < net.partition_bytes) {
    // The credit must admit at least one whole partition, or nothing is ever sent.
    Value at = s.get("credit_bytes") ? *s.get("credit_bytes") : *s.get("partition_bytes");
    at.fail(std::to_string(net.credit_bytes) + " credit bytes are fewer than " +
            "network.partition_bytes (" + std::to_string(net.partition_bytes) +
            "): the credit must hold at least one partition");
  }
}

void parse_mempool(const Section& root, MempoolConfig& pool) {
  Section s = optional_section(root, "mempool", {"mbufs", "cache"});
  if (auto v = s.get("mbufs")) pool.mbufs = static_cast<uint32_t>(v->integer(kMinMbufs, kU32Max));
  if (auto v = s.get("cache")) pool.cache = static_cast<uint32_t>(v->integer(0, kMaxCache));
  // rte_mempool_create() refuses a pool whose cache flush threshold (cache *
  // 1.5, truncated) exceeds the pool size. The two ranges already rule that
  // out; should either range change, this stops the build rather than
  // leaving a rule untested.
  static_assert(kMaxCache * 3 / 2 <= kMinMbufs, "add a cache <= mbufs / 1.5 check");
}

// EAL options the generator writes itself; a second copy in eal.extra would
// contradict the file (and EAL takes the last one silently).
const char* generated_option_source(std::string_view arg) {
  if (arg.starts_with("--file-prefix")) return "job.name";
  if (arg.starts_with("--lcores") || arg.starts_with("-l") || arg.starts_with("-c")) {
    return "nodes[].lcores";
  }
  if (arg == "--no-huge") return "eal.hugepages";
  if (arg.starts_with("-m")) return "eal.memory_mb";
  return nullptr;
}

void parse_eal(const Section& root, EalConfig& eal) {
  Section s = optional_section(root, "eal", {"memory_mb", "hugepages", "extra"});
  if (auto v = s.get("memory_mb")) eal.memory_mb = static_cast<uint32_t>(v->integer(64, 65536));
  if (auto v = s.get("hugepages")) {
    eal.hugepages = v->choice<Hugepages>(
        {{"auto", Hugepages::kAuto}, {"on", Hugepages::kOn}, {"off", Hugepages::kOff}});
  }
  if (auto v = s.get("extra")) {
    for (const Value& item : v->sequence()) {
      std::string arg = item.string();
      if (const char* from = generated_option_source(arg)) {
        item.fail(quoted(arg) + " is generated from " + from + "; set it there, not in eal.extra");
      }
      eal.extra.push_back(std::move(arg));
    }
  }
}

void parse_link(const Section& root, LinkConfig& link) {
  Section s = optional_section(
      root, "link", {"rate_gbps", "delay_us", "loss", "duplicate", "reorder", "corrupt", "seed"});
  if (auto v = s.get("rate_gbps")) {
    link.rate_gbps = v->number();
    if (link.rate_gbps != 0 && !(link.rate_gbps >= 0.001 && link.rate_gbps <= 400)) {
      v->fail(v->text() + " is out of range (0 for unlimited, else 0.001..400)");
    }
  }
  if (auto v = s.get("delay_us")) link.delay_us = static_cast<uint32_t>(v->integer(0, 1000000));
  if (auto v = s.get("loss")) link.loss = half_open(*v, 0, 1);
  if (auto v = s.get("duplicate")) link.duplicate = half_open(*v, 0, 1);
  if (auto v = s.get("reorder")) link.reorder = half_open(*v, 0, 1);
  if (auto v = s.get("corrupt")) link.corrupt = half_open(*v, 0, 1);
  if (auto v = s.get("seed")) link.seed = v->integer(0, kU64Max);
}

void parse_training(const Section& root, TrainingConfig& t) {
  Section s = optional_section(
      root, "training",
      {"sync", "staleness", "optimizer", "learning_rate", "momentum", "beta1", "beta2", "epsilon"});
  if (auto v = s.get("sync")) {
    t.sync = v->choice<Sync>(
        {{"bsp", Sync::kBsp}, {"asp", Sync::kAsp}, {"ssp", Sync::kSsp}, {"psplus", Sync::kPsPlus}});
    if (t.sync != Sync::kBsp) {
      // lib/agg has these policies, but the server and the worker run BSP
      // only: accepting the key would silently train with BSP.
      v->fail(v->text() +
              " is not run end to end yet: the server and the worker library run bsp only "
              "(use sync: bsp)");
    }
  }
  if (auto v = s.get("optimizer")) {
    t.optimizer = v->choice<Optimizer>({{"sgd", Optimizer::kSgd},
                                        {"momentum", Optimizer::kMomentum},
                                        {"adam", Optimizer::kAdam},
                                        {"sum", Optimizer::kSum}});
  }
  const std::string opt_name(to_string(t.optimizer));
  if (auto v = s.get("staleness")) {
    if (v->integer(0, kU32Max) != 0) {
      v->fail(v->text() + " must be 0 or absent with training.sync " +
              std::string(to_string(t.sync)) + " (a staleness bound belongs to ssp and psplus)");
    }
  }

  if (auto v = s.get("learning_rate")) {
    if (t.optimizer == Optimizer::kSum) {
      v->fail("not used by optimizer sum (it only adds the gradients); remove it");
    }
    t.learning_rate = positive(*v);
  }
  auto only_for = [&](const char* key, Optimizer owner) -> std::optional<Value> {
    auto v = s.get(key);
    if (v && t.optimizer != owner) {
      v->fail("only used by optimizer " + std::string(to_string(owner)) +
              " (training.optimizer is " + opt_name + ")");
    }
    return v;
  };
  if (auto v = only_for("momentum", Optimizer::kMomentum)) t.momentum = half_open(*v, 0, 1);
  if (auto v = only_for("beta1", Optimizer::kAdam)) t.beta1 = half_open(*v, 0, 1);
  if (auto v = only_for("beta2", Optimizer::kAdam)) t.beta2 = half_open(*v, 0, 1);
  if (auto v = only_for("epsilon", Optimizer::kAdam)) t.epsilon = positive(*v);
}

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

// What the cross-node checks need to point back at the file.
struct NodeSource {
  Value name;
  Value role;
  Value ipv4;
  std::optional<Value> mac;
  std::vector<Value> ports;
};

// Reads one node, key by key in the order of the reference, filling `src`.
NodeConfig parse_node(const Section& s, const NetworkConfig& net, NodeSource& src) {
  NodeConfig n;
  src.name = s.require("name");
  n.name = src.name.string();
  if (!is_name(n.name)) src.name.fail(quoted(n.name) + " " + name_rule());
  src.role = s.require("role");
  n.role = src.role.choice<Role>({{"server", Role::kServer}, {"worker", Role::kWorker}});

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
  src.ports = ports.sequence();
  if (src.ports.empty()) ports.fail("the list is empty (a node needs at least one port)");
  for (size_t i = 0; i < src.ports.size(); ++i) {
    n.ports.push_back(parse_port(src.ports[i]));
    const PortSpec& port = n.ports.back();
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

  auto shards = s.get("shards");
  if (n.role == Role::kWorker) {
    if (shards) shards->fail("only servers have shards (this node is a worker)");
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

void parse_nodes(const Section& root, JobConfig& job) {
  Value list = root.require("nodes");
  std::vector<Value> items = list.sequence();
  if (items.empty())
    list.fail("the list is empty (a job needs at least one server and one worker)");

  std::vector<NodeSource> sources;
  uint32_t workers = 0;
  uint32_t servers = 0;
  for (const Value& item : items) {
    Section s(item, {"name", "role", "ipv4", "udp_port", "mac", "ports", "lcores", "shards"});
    NodeSource src;
    NodeConfig n = parse_node(s, job.network, src);
    n.index = static_cast<uint32_t>(job.nodes.size());
    if (n.role == Role::kWorker) {
      if (++workers > kMaxWorkers) {
        src.role.fail("worker " + std::to_string(workers) + " is over the limit of " +
                      std::to_string(kMaxWorkers) + " workers");
      }
      n.rank = workers - 1;
    } else {
      n.rank = servers++;
    }

    for (size_t j = 0; j < job.nodes.size(); ++j) {
      const NodeConfig& other = job.nodes[j];
      const std::string other_path = element(list.path(), j);
      if (other.name == n.name) {
        src.name.fail(quoted(n.name) + " is already used by " + other_path);
      }
      if (other.ipv4 == n.ipv4 && other.udp_port == n.udp_port) {
        src.ipv4.fail(n.ipv4.to_string() + ":" + std::to_string(n.udp_port) +
                      " is already used by " + other_path);
      }
      if (n.mac && other.mac == n.mac) {
        src.mac->fail(n.mac->to_string() + " is already used by " + other_path);
      }
      // vdev names are unique in the whole file, not just per process: then
      // any set of nodes can share one process (the demo runs them all).
      for (size_t p = 0; p < n.ports.size(); ++p) {
        if (n.ports[p].kind != PortSpec::kVdev) continue;
        for (size_t q = 0; q < other.ports.size(); ++q) {
          if (other.ports[q].kind == PortSpec::kVdev &&
              other.ports[q].vdev_name() == n.ports[p].vdev_name()) {
            src.ports[p].fail("vdev name " + std::string(n.ports[p].vdev_name()) +
                              " is already used by " + sources[j].ports[q].path() +
                              " (vdev names must be unique in the file)");
          }
        }
      }
    }
    job.nodes.push_back(std::move(n));
    sources.push_back(std::move(src));
  }

  // Each ring link joins exactly two ports on two different nodes.
  struct End {
    size_t node;
    size_t port;
  };
  std::map<std::string, std::vector<End>> links;
  for (size_t i = 0; i < job.nodes.size(); ++i) {
    for (size_t p = 0; p < job.nodes[i].ports.size(); ++p) {
      const PortSpec& port = job.nodes[i].ports[p];
      if (port.kind != PortSpec::kRing) continue;
      std::vector<End>& ends = links[port.ring_link];
      const Value& at = sources[i].ports[p];
      for (const End& e : ends) {
        if (e.node == i) {
          at.fail("ring link " + port.ring_link + " has both ends on node " + job.nodes[i].name +
                  " (also " + sources[e.node].ports[e.port].path() + ")");
        }
      }
      if (ends.size() == 2) {
        at.fail("ring link " + port.ring_link + " already joins " +
                sources[ends[0].node].ports[ends[0].port].path() + " and " +
                sources[ends[1].node].ports[ends[1].port].path() +
                " (a link has exactly two ends)");
      }
      ends.push_back(End{i, p});
    }
  }
  for (size_t i = 0; i < job.nodes.size(); ++i) {
    for (size_t p = 0; p < job.nodes[i].ports.size(); ++p) {
      PortSpec& port = job.nodes[i].ports[p];
      if (port.kind != PortSpec::kRing) continue;
      const std::vector<End>& ends = links[port.ring_link];
      if (ends.size() == 1) {
        sources[i].ports[p].fail("ring link " + port.ring_link +
                                 " has only one end (name it on exactly two ports of different "
                                 "nodes)");
      }
      const End& peer = ends[0].node == i ? ends[1] : ends[0];
      port.ring_peer = job.nodes[peer.node].name;
    }
  }

  if (servers == 0) list.fail("no server (a job needs at least one server and one worker)");
  if (workers == 0) list.fail("no worker (a job needs at least one server and one worker)");
}

std::string error_text(int err) { return std::error_code(err, std::generic_category()).message(); }

}  // namespace

JobConfig load_string(std::string_view yaml, std::string_view source_name) {
  JobConfig job;
  job.source = std::string(source_name);
  const std::string& source = job.source;

  std::vector<YAML::Node> docs;
  try {
    docs = YAML::LoadAll(std::string(yaml));
  } catch (const YAML::Exception& e) {
    int line = e.mark.is_null() ? 0 : e.mark.line + 1;
    std::string where =
        e.mark.is_null() ? "" : " (column " + std::to_string(e.mark.column + 1) + ")";
    throw ConfigError(source, line, "", "YAML syntax error: " + e.msg + where);
  }
  if (docs.empty() || (docs.size() == 1 && docs[0].IsNull())) {
    throw ConfigError(source, 1, "",
                      "the document is empty (expected a mapping with job and nodes)");
  }
  if (docs.size() > 1) {
    throw ConfigError(source, std::max(line_of(docs[1]), 1), "",
                      "a second YAML document (a job file holds exactly one)");
  }
  Value root_value(&source, docs[0], "", std::max(line_of(docs[0]), 1));
  if (!docs[0].IsMap())
    root_value.fail("expected a mapping at the top, got " + root_value.describe());
  Section root(root_value, {"job", "network", "mempool", "eal", "link", "training", "nodes"});

  parse_job(root, job);
  parse_network(root, job.network);
  parse_mempool(root, job.mempool);
  parse_eal(root, job.eal);
  parse_link(root, job.link);
  parse_training(root, job.training);
  parse_nodes(root, job);
  return job;
}

JobConfig load_file(const std::string& path) {
  struct Closer {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };
  std::unique_ptr<std::FILE, Closer> file(std::fopen(path.c_str(), "rb"));
  if (!file) throw ConfigError(path, "cannot open: " + error_text(errno));
  std::string text;
  char buf[16384];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, file.get())) > 0) text.append(buf, n);
  if (std::ferror(file.get())) throw ConfigError(path, "cannot read: " + error_text(errno));
  return load_string(text, path);
}

}  // namespace mercury::config
