// Job files from an allocation (generate.h): the host list's parsers, the
// template's sections written back from what the loader resolved, and the
// nodes laid out host by host.
#include "config/generate.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <set>
#include <sstream>

namespace mercury::config {

namespace {

constexpr uint32_t kLcores = kMaxLcore + 1;

uint32_t whole(std::string_view text, const std::string& source, int line, const std::string& key,
               uint32_t max) {
  uint32_t v = 0;
  const char* end = text.data() + text.size();
  const auto [p, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc() || p != end || v > max) {
    throw ConfigError(
        source, line, key,
        "'" + std::string(text) + "' is not a whole number 0.." + std::to_string(max));
  }
  return v;
}

std::vector<std::string> split(std::string_view text, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t end = std::min(text.find(sep, start), text.size());
    out.emplace_back(text.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

bool valid_host_name(std::string_view s) {
  if (s.empty() || s.size() > 253) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '.' || c == '_';
  });
}

// A YAML double-quoted scalar.
std::string yaml_quoted(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

// The shortest text that reads back as the same double (the loader parses
// with from_chars), so a generated file trains bit for bit like its template.
std::string number(double v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

template <class T>
std::string list(const std::vector<T>& items) {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) {
    out += (i ? ", " : "");
    if constexpr (std::is_same_v<T, std::string>) {
      out += yaml_quoted(items[i]);
    } else {
      out += std::to_string(items[i]);
    }
  }
  return out + "]";
}

// The lines of one section: only what differs from the loader's defaults
// (a key the defaults imply may be refused in that combination, e.g.
// `momentum` under sgd).
class Section {
 public:
  explicit Section(std::string name) : name_(std::move(name)) {}
  template <class T>
  void add(const char* key, const T& value, const T& fallback, const std::string& text) {
    if (!(value == fallback)) lines_ += "  " + std::string(key) + ": " + text + "\n";
  }
  void always(const char* key, const std::string& text) {
    lines_ += "  " + std::string(key) + ": " + text + "\n";
  }
  std::string text() const { return lines_.empty() ? "" : name_ + ":\n" + lines_ + "\n"; }

 private:
  std::string name_;
  std::string lines_;
};

std::string network_section(const NetworkConfig& n, const std::string& template_dir) {
  const NetworkConfig d;
  Section s("network");
  s.add("mtu", n.mtu, d.mtu, std::to_string(n.mtu));
  s.add("udp_port", n.udp_port, d.udp_port, std::to_string(n.udp_port));
  s.add("udp_checksum", n.udp_checksum, d.udp_checksum, std::string(to_string(n.udp_checksum)));
  s.add("poll", n.poll, d.poll, std::string(to_string(n.poll)));
  s.add("window", n.window, d.window, std::to_string(n.window));
  s.add("peer_timeout_ms", n.peer_timeout_ms, d.peer_timeout_ms, std::to_string(n.peer_timeout_ms));
  s.add("scheduler", n.scheduler, d.scheduler, std::string(to_string(n.scheduler)));
  s.add("partition_bytes", n.partition_bytes, d.partition_bytes, std::to_string(n.partition_bytes));
  s.add("credit_bytes", n.credit_bytes, d.credit_bytes, std::to_string(n.credit_bytes));
  if (!n.auth_key_file.empty()) {
    // A relative path is the template's directory's; the result may be written elsewhere.
    std::filesystem::path key(n.auth_key_file);
    if (key.is_relative()) key = std::filesystem::absolute(template_dir / key);
    s.always("auth_key_file", yaml_quoted(key.lexically_normal().string()));
  }
  return s.text();
}

std::string other_sections(const JobConfig& t) {
  std::string out;
  {
    const MempoolConfig d;
    Section s("mempool");
    s.add("mbufs", t.mempool.mbufs, d.mbufs, std::to_string(t.mempool.mbufs));
    s.add("cache", t.mempool.cache, d.cache, std::to_string(t.mempool.cache));
    out += s.text();
  }
  {
    const EalConfig d;
    Section s("eal");
    s.add("memory_mb", t.eal.memory_mb, d.memory_mb, std::to_string(t.eal.memory_mb));
    s.add("hugepages", t.eal.hugepages, d.hugepages, yaml_quoted(to_string(t.eal.hugepages)));
    s.add("extra", t.eal.extra, d.extra, list(t.eal.extra));
    out += s.text();
  }
  {
    const LinkConfig& l = t.link;
    const LinkConfig d;
    Section s("link");
    s.add("rate_gbps", l.rate_gbps, d.rate_gbps, number(l.rate_gbps));
    s.add("delay_us", l.delay_us, d.delay_us, std::to_string(l.delay_us));
    s.add("loss", l.loss, d.loss, number(l.loss));
    s.add("duplicate", l.duplicate, d.duplicate, number(l.duplicate));
    s.add("reorder", l.reorder, d.reorder, number(l.reorder));
    s.add("corrupt", l.corrupt, d.corrupt, number(l.corrupt));
    s.add("seed", l.seed, d.seed, std::to_string(l.seed));
    if (!l.rate_steps.empty()) {
      std::string steps = "[";
      for (size_t i = 0; i < l.rate_steps.size(); ++i) {
        steps += std::string(i ? ", " : "") + "{at_s: " + number(l.rate_steps[i].at_s) +
                 ", rate_gbps: " + number(l.rate_steps[i].rate_gbps) + "}";
      }
      s.always("rate_steps", steps + "]");
    }
    s.add("shared_wire", l.shared_wire, d.shared_wire, l.shared_wire);
    out += s.text();
  }
  {
    const TrainingConfig& tr = t.training;
    const TrainingConfig d;
    Section s("training");
    s.add("sync", tr.sync, d.sync, std::string(to_string(tr.sync)));
    if (tr.sync == Sync::kSsp) s.always("staleness_bound", std::to_string(tr.staleness_bound));
    s.add("staleness_lr", tr.staleness_lr, d.staleness_lr, std::string(to_string(tr.staleness_lr)));
    s.add("aggregation", tr.aggregation, d.aggregation, std::string(to_string(tr.aggregation)));
    s.add("optimizer", tr.optimizer, d.optimizer, std::string(to_string(tr.optimizer)));
    s.add("learning_rate", tr.learning_rate, d.learning_rate, number(tr.learning_rate));
    s.add("momentum", tr.momentum, d.momentum, number(tr.momentum));
    s.add("beta1", tr.beta1, d.beta1, number(tr.beta1));
    s.add("beta2", tr.beta2, d.beta2, number(tr.beta2));
    s.add("epsilon", tr.epsilon, d.epsilon, number(tr.epsilon));
    s.add("weight_decay", tr.weight_decay, d.weight_decay, number(tr.weight_decay));
    out += s.text();
  }
  return out;
}

// Two nodes that let a template without `nodes` load; replaced in the result.
constexpr const char* kPlaceholderNodes =
    "\nnodes:\n"
    "  - {name: placeholder-s, role: server, ipv4: 10.0.0.1, ports: [\"ring:placeholder\"], "
    "lcores: [0, 1], shards: 1}\n"
    "  - {name: placeholder-w, role: worker, ipv4: 10.0.0.2, ports: [\"ring:placeholder\"], "
    "lcores: [0]}\n";

// The template as the loader resolves it (a job file, with or without nodes
// and job; what it lacks is filled in so that it loads).
JobConfig resolve_template(const GenerateOptions& o) {
  if (o.template_text.empty()) {
    JobConfig j;
    j.id = 1;
    return j;
  }
  std::string text = o.template_text;
  bool has_job = false;
  bool has_nodes = false;
  try {
    const YAML::Node doc = YAML::Load(text);
    if (doc.IsMap()) {
      has_job = static_cast<bool>(doc["job"]);
      has_nodes = static_cast<bool>(doc["nodes"]);
    }
  } catch (const YAML::Exception&) {
    // The loader below reports it with the file, line and column.
  }
  if (!text.empty() && text.back() != '\n') text += '\n';
  if (!has_job) text += "\njob: {id: 1, name: template}\n";
  if (!has_nodes) text += kPlaceholderNodes;
  return load_string(text, o.template_source.empty() ? "template" : o.template_source);
}

enum class NicKind { kPci, kAfPacket, kMemif };

struct Nic {
  NicKind kind;
  std::string text;  // PCI address or interface name
};

Nic parse_nic(const std::string& text, const HostSpec& host, const std::string& origin) {
  const auto fail = [&](const std::string& why) -> ConfigError {
    return ConfigError(origin, host.line, "host " + host.name, "NIC '" + text + "': " + why);
  };
  if (text == "memif") return {NicKind::kMemif, ""};
  if (text.starts_with("af_packet:")) {
    const std::string iface = text.substr(10);
    if (iface.empty() || iface.size() > 15 || iface.find_first_of(",= /") != std::string::npos) {
      throw fail(
          "af_packet: wants an interface name (at most 15 characters, no ',', '=', ' ' "
          "or '/')");
    }
    return {NicKind::kAfPacket, iface};
  }
  const bool pci = !text.empty() && text.find(':') != std::string::npos &&
                   text.find('.') != std::string::npos &&
                   std::all_of(text.begin(), text.end(), [](char c) {
                     return std::isxdigit(static_cast<unsigned char>(c)) || c == ':' || c == '.';
                   });
  if (!pci) throw fail("expected a PCI address (0000:03:00.0), af_packet:IFACE or memif");
  return {NicKind::kPci, text};
}

struct Subnet {
  uint32_t base = 0;
  uint32_t hosts = 0;  // addresses base + 1 .. base + hosts
};

Subnet parse_subnet(const std::string& text) {
  const size_t slash = text.find('/');
  const auto fail = [&] {
    return ConfigError("--subnet", "'" + text + "' is not an IPv4 subnet (e.g. 10.0.0.0/24)");
  };
  if (slash == std::string::npos) throw fail();
  const std::optional<Ipv4> a = Ipv4::parse(std::string_view(text).substr(0, slash));
  uint32_t prefix = 0;
  const std::string_view p = std::string_view(text).substr(slash + 1);
  const auto [end, ec] = std::from_chars(p.data(), p.data() + p.size(), prefix);
  if (!a || p.empty() || ec != std::errc() || end != p.data() + p.size() || prefix < 8 ||
      prefix > 30) {
    throw fail();
  }
  const uint32_t size = 1u << (32 - prefix);
  return {a->value & ~(size - 1), size - 2};  // neither the network nor broadcast
}

struct PlannedNode {
  std::string name;
  Role role = Role::kWorker;
  uint32_t rank = 0;
  const HostSpec* host = nullptr;
  Nic nic{NicKind::kPci, ""};
  std::vector<uint32_t> lcores;
  uint32_t shards = 0;
};

}  // namespace

std::vector<HostSpec> parse_hostfile(std::string_view text, std::string_view source_view) {
  const std::string source(source_view);
  std::vector<HostSpec> hosts;
  std::set<std::string> seen;
  int line_no = 0;
  for (const std::string& raw : split(text, '\n')) {
    ++line_no;
    std::string line = raw.substr(0, raw.find('#'));
    std::istringstream words(line);
    std::string word;
    if (!(words >> word)) continue;
    HostSpec h;
    h.name = word;
    h.line = line_no;
    if (!valid_host_name(h.name)) {
      throw ConfigError(source, line_no, "host", "'" + h.name + "' is not a host name");
    }
    if (!seen.insert(h.name).second) {
      throw ConfigError(source, line_no, "host " + h.name, "is listed twice");
    }
    while (words >> word) {
      const size_t eq = word.find('=');
      const std::string key = word.substr(0, eq);
      const std::string value = eq == std::string::npos ? "" : word.substr(eq + 1);
      const std::string where = "host " + h.name + " " + key;
      if (eq == std::string::npos || value.empty()) {
        throw ConfigError(source, line_no, where, "expected key=value, not '" + word + "'");
      }
      if (key == "nic") {
        h.nics = split(value, ',');
      } else if (key == "servers") {
        h.servers = whole(value, source, line_no, where, 64);
      } else if (key == "workers") {
        h.workers = whole(value, source, line_no, where, kMaxWorkers);
      } else if (key == "cpus") {
        h.cpus = whole(value, source, line_no, where, 1u << 20);
      } else {
        throw ConfigError(source, line_no, where,
                          "unknown key (a host takes nic, servers, workers and cpus)");
      }
    }
    hosts.push_back(std::move(h));
  }
  if (hosts.empty()) throw ConfigError(source, "lists no host");
  return hosts;
}

std::vector<HostSpec> parse_host_list(std::string_view text) {
  std::vector<HostSpec> hosts;
  std::set<std::string> seen;
  for (const std::string& name : split(text, ',')) {
    if (!valid_host_name(name)) {
      throw ConfigError("--hosts", "'" + name + "' is not a host name");
    }
    if (!seen.insert(name).second)
      throw ConfigError("--hosts", "host " + name + " is listed twice");
    hosts.push_back(HostSpec{.name = name});
  }
  return hosts;
}

std::vector<uint32_t> parse_slurm_cpus_per_node(std::string_view text) {
  const std::string source = "SLURM_JOB_CPUS_PER_NODE";
  std::vector<uint32_t> out;
  for (const std::string& item : split(text, ',')) {
    // "8" or "8(x2)"
    const size_t paren = item.find('(');
    const std::string count = item.substr(0, paren);
    uint32_t times = 1;
    if (paren != std::string::npos) {
      if (item.size() < paren + 4 || item.compare(paren, 2, "(x") != 0 || item.back() != ')') {
        throw ConfigError(source, "'" + std::string(text) + "' is not Slurm's N(xM),... form");
      }
      times = whole(std::string_view(item).substr(paren + 2, item.size() - paren - 3), source, 0,
                    "", 1u << 20);
    }
    const uint32_t cpus = whole(count, source, 0, "", 1u << 20);
    if (cpus == 0 || times == 0) {
      throw ConfigError(source, "'" + std::string(text) + "' has a count of 0");
    }
    out.insert(out.end(), times, cpus);
  }
  return out;
}

std::string generate_job(std::span<const HostSpec> hosts, const GenerateOptions& o) {
  const std::string origin = o.origin.empty() ? "hosts" : o.origin;
  if (hosts.empty()) throw ConfigError(origin, "no hosts");
  const JobConfig t = resolve_template(o);
  const std::string name = o.name.empty() ? t.name : o.name;
  if (name.empty()) throw ConfigError("--name", "the job needs a name (--name, or a template)");
  const uint32_t id = o.id.value_or(t.id);
  const Subnet subnet = parse_subnet(o.subnet);

  // The nodes, host by host, each host's servers first.
  std::vector<PlannedNode> nodes;
  uint32_t servers = 0, workers = 0;
  bool memif = false, other = false;
  for (const HostSpec& h : hosts) {
    const uint32_t s = h.servers.value_or(o.servers_per_host);
    const uint32_t w = h.workers.value_or(o.workers_per_host);
    const uint32_t cpus = h.cpus.value_or(o.cpus);
    const std::vector<std::string>& nic_texts = h.nics.empty() ? o.nics : h.nics;
    if (s + w == 0) continue;
    if (nic_texts.empty()) {
      throw ConfigError(origin, h.line, "host " + h.name,
                        "has no NIC (nic= in the host file, or --nic)");
    }
    if (cpus == 0) {
      throw ConfigError(origin, h.line, "host " + h.name,
                        "has no CPU count (cpus= in the host file, --cpus, or Slurm's "
                        "SLURM_JOB_CPUS_PER_NODE)");
    }
    std::vector<Nic> nics;
    for (const std::string& text : nic_texts) nics.push_back(parse_nic(text, h, origin));
    const bool host_memif = nics.size() == 1 && nics[0].kind == NicKind::kMemif;
    for (const Nic& n : nics) {
      if (n.kind == NicKind::kMemif && !host_memif) {
        throw ConfigError(origin, h.line, "host " + h.name,
                          "memif is a host's only NIC (it joins every node of the host)");
      }
    }
    if (!host_memif && nics.size() < s + w) {
      throw ConfigError(origin, h.line, "host " + h.name,
                        "runs " + std::to_string(s + w) + " nodes on " +
                            std::to_string(nics.size()) +
                            " NIC(s): a PCI device or an interface serves one node (give each "
                            "node its own: a port, a virtual function, an interface)");
    }
    (host_memif ? memif : other) = true;
    uint32_t shards = 1;
    if (o.shards) {
      shards = *o.shards;
    } else if (s > 0 && cpus > w) {
      shards = std::clamp<uint32_t>((cpus - w) / s, 2, kMaxShards + 1) - 1;
    }
    if (s > 0 && (shards == 0 || shards > kMaxShards)) {
      throw ConfigError("--shards", std::to_string(shards) + " is out of range (1..64)");
    }
    uint32_t lcore = 0;
    for (uint32_t i = 0; i < s + w; ++i) {
      PlannedNode n;
      n.host = &h;
      n.role = i < s ? Role::kServer : Role::kWorker;
      n.rank = n.role == Role::kServer ? servers++ : workers++;
      n.name = (n.role == Role::kServer ? "s" : "w") + std::to_string(n.rank);
      n.nic = host_memif ? nics[0] : nics[i];
      n.shards = n.role == Role::kServer ? shards : 0;
      for (uint32_t k = 0; k < 1 + n.shards; ++k) n.lcores.push_back(lcore++);
      nodes.push_back(std::move(n));
    }
    if (lcore > kLcores) {
      throw ConfigError(origin, h.line, "host " + h.name,
                        "its nodes take " + std::to_string(lcore) + " lcores, more than " +
                            std::to_string(kLcores) + " (fewer shards: --shards)");
    }
  }
  if (servers == 0 || workers == 0) {
    throw ConfigError(origin, "the hosts run " + std::to_string(servers) + " servers and " +
                                  std::to_string(workers) +
                                  " workers; a job needs at least one of each");
  }
  if (memif && (other || hosts.size() > 1)) {
    throw ConfigError(origin,
                      "memif joins the processes of one host: a job over memif lists "
                      "one host");
  }
  if (memif && servers != 1) {
    throw ConfigError(origin,
                      "a job over memif has one server (a worker has one port, and a "
                      "memif link reaches one peer)");
  }
  if (nodes.size() > subnet.hosts) {
    throw ConfigError("--subnet", o.subnet + " holds " + std::to_string(subnet.hosts) +
                                      " addresses, and the job has " +
                                      std::to_string(nodes.size()) + " nodes");
  }

  std::string out = "# Written by ps-job from " + origin + ": " + std::to_string(hosts.size()) +
                    (hosts.size() == 1 ? " host, " : " hosts, ") + std::to_string(servers) +
                    (servers == 1 ? " server, " : " servers, ") + std::to_string(workers) +
                    (workers == 1 ? " worker" : " workers") +
                    ". Rank r of a launcher that starts every node runs the r-th node;\n"
                    "# one that starts the workers alone, worker r (docs/cluster.md).\n\n";
  out += "job:\n  id: " + std::to_string(id) + "\n  name: " + name + "\n\n";
  const std::string template_dir =
      o.template_source.empty() ? std::string(".")
                                : std::filesystem::path(o.template_source).parent_path().string();
  out += network_section(t.network, template_dir.empty() ? "." : template_dir);
  out += other_sections(t);
  // memif buffers hold a whole frame: bsize >= MTU + 14, in whole KiB.
  const uint32_t bsize = (t.network.mtu + 14 + 1023) / 1024 * 1024;
  out += "nodes:\n";
  uint32_t vdev = 0;
  for (size_t index = 0; index < nodes.size(); ++index) {
    const PlannedNode& n = nodes[index];
    out += "  - name: " + n.name + "  # host " + n.host->name + "\n";
    out += "    role: " + std::string(to_string(n.role)) + "\n";
    out += "    ipv4: " + Ipv4{subnet.base + 1 + static_cast<uint32_t>(index)}.to_string() + "\n";
    std::vector<std::string> ports;
    switch (n.nic.kind) {
      case NicKind::kPci:
        ports.push_back(n.nic.text);
        break;
      case NicKind::kAfPacket:
        ports.push_back("net_af_packet" + std::to_string(index) + ",iface=" + n.nic.text);
        break;
      case NicKind::kMemif: {
        const uint32_t mac = static_cast<uint32_t>(index) + 1;
        char text[32];
        std::snprintf(text, sizeof text, "02:00:00:00:%02x:%02x", (mac >> 8) & 0xff, mac & 0xff);
        out += "    mac: " + yaml_quoted(text) + "\n";
        const auto port = [&](const std::string& role, const std::string& worker) {
          return "net_memif" + std::to_string(vdev++) + ",role=" + role +
                 ",id=0,socket=" + o.memif_dir + "/" + name + "-" + worker +
                 ".sock,bsize=" + std::to_string(bsize);
        };
        if (n.role == Role::kServer) {
          for (const PlannedNode& w : nodes) {
            if (w.role == Role::kWorker) ports.push_back(port("server", w.name));
          }
        } else {
          ports.push_back(port("client", n.name));
        }
        break;
      }
    }
    out += "    ports: " + list(ports) + "\n";
    out += "    lcores: " + list(n.lcores) + "\n";
    if (n.role == Role::kServer) out += "    shards: " + std::to_string(n.shards) + "\n";
  }
  // What was written must load: the loader has the last word on every rule.
  load_string(out, "the generated job file");
  return out;
}

std::string multi_prog(const JobConfig& job, std::string_view server_command,
                       std::string_view worker_command) {
  // Consecutive ranks as "a-b", separated by commas.
  const auto ranks = [&](Role role) {
    std::string out;
    for (size_t i = 0; i < job.nodes.size(); ++i) {
      if (job.nodes[i].role != role) continue;
      size_t j = i;
      while (j + 1 < job.nodes.size() && job.nodes[j + 1].role == role) ++j;
      out += (out.empty() ? "" : ",") + std::to_string(i) + (j > i ? "-" + std::to_string(j) : "");
      i = j;
    }
    return out;
  };
  return "# srun --multi-prog: rank r runs node r of " + job.source + "\n" + ranks(Role::kServer) +
         " " + std::string(server_command) + "\n" + ranks(Role::kWorker) + " " +
         std::string(worker_command) + "\n";
}

}  // namespace mercury::config
