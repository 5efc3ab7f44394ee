// The job file's node list (load_sections.h): each entry read by parse_node()
// (load_node.cpp), ranks in file order per role, and the rules across nodes:
// the worker limit, no name, endpoint, MAC or vdev name used twice, each ring
// link joining exactly two ports of two different nodes, at least one server
// and one worker.
#include <map>
#include <string>
#include <utility>

#include "config/load_sections.h"

namespace mercury::config::detail {

namespace {

// A hot standby (docs/durability.md): `standby: NAME` on a server names a
// node of role standby, which stands by for that server alone; any server
// of a job may have one. What is built: BSP with chunk aggregation, each
// pair on one port each and their shards on their net cores.
void check_standbys(JobConfig& job, const std::vector<NodeSource>& sources) {
  for (size_t i = 0; i < job.nodes.size(); ++i) {
    NodeConfig& n = job.nodes[i];
    const NodeSource& src = sources[i];
    if (n.role != Role::kServer || n.standby.empty()) continue;
    const Value& key = *src.standby;
    const NodeConfig* standby = job.find_node(n.standby);
    if (standby == nullptr) key.fail("no node is called " + quoted(n.standby));
    if (standby->role != Role::kStandby) {
      key.fail(n.standby + " is a " + std::string(to_string(standby->role)) +
               ", not a standby (give it role: standby)");
    }
    if (!standby->standby.empty()) {
      key.fail(n.standby + " stands by for " + standby->standby +
               " already: a standby stands by for one server");
    }
    if (job.training.sync != Sync::kBsp) {
      key.fail("a standby needs training.sync bsp (training.sync is " +
               std::string(to_string(job.training.sync)) +
               "): it holds every version a worker has seen of a chunk, one at a time");
    }
    if (job.training.aggregation != Aggregation::kChunk) {
      key.fail(
          "a standby needs training.aggregation chunk: each chunk's update is replicated "
          "before it goes out");
    }
    if (job.training.on_worker_loss != OnWorkerLoss::kFail) {
      key.fail(std::string("a standby with training.on_worker_loss ") +
               (job.training.on_worker_loss == OnWorkerLoss::kWait ? "wait" : "shrink") +
               " is not built: a promoted standby would not know which ranks were lost");
    }
    for (const NodeConfig* pair : {static_cast<const NodeConfig*>(&n), standby}) {
      const NodeSource& ps = sources[pair->index];
      if (pair->ports.size() != 1) {
        ps.port_list->fail(pair->name + " has " + std::to_string(pair->ports.size()) +
                           " ports: a server with a standby and its standby have one port each "
                           "(it reaches the workers and the other of the pair)");
      }
      if (pair->lcores.size() != 1) {
        ps.lcores->fail(pair->name + " lists " + std::to_string(pair->lcores.size()) +
                        " lcores: a server with a standby and its standby run their shards on "
                        "their net core (one lcore)");
      }
      const PortSpec& port = pair->ports.front();
      if (port.kind == PortSpec::kRing ||
          (port.kind == PortSpec::kVdev && port.vdev_name().rfind("net_memif", 0) == 0)) {
        ps.ports.front().fail(
            "a server with a standby and its standby need a port every other node reaches "
            "(net_af_packet on a bridge, a NIC): a memif or ring link joins two nodes only");
      }
    }
    NodeConfig& s = job.nodes[standby->index];
    s.standby = n.name;
    s.rank = n.rank;  // it runs the same shards
  }
  for (size_t i = 0; i < job.nodes.size(); ++i) {
    const NodeConfig& n = job.nodes[i];
    if (n.role == Role::kStandby && n.standby.empty()) {
      sources[i].role.fail("standby " + n.name +
                           " stands by for no server (name it in a server's `standby:`)");
    }
  }
}

}  // namespace

void parse_nodes(const Section& root, JobConfig& job) {
  Value list = root.require("nodes");
  std::vector<Value> items = list.sequence();
  if (items.empty())
    list.fail("the list is empty (a job needs at least one server and one worker)");

  std::vector<NodeSource> sources;
  uint32_t workers = 0;
  uint32_t spares = 0;
  uint32_t servers = 0;
  for (const Value& item : items) {
    Section s(item, {"name", "role", "ipv4", "udp_port", "mac", "ports", "lcores", "shards", "poll",
                     "spare", "standby"});
    NodeSource src;
    NodeConfig n = parse_node(s, job.network, src);
    n.index = static_cast<uint32_t>(job.nodes.size());
    if (n.role == Role::kWorker) {
      // A spare is no rank: the servers take it in for a removed one
      // (docs/membership.md, "Spare workers"). Ranks and spares together
      // are the servers' worker peers.
      if (workers + spares + 1 > kMaxWorkers) {
        src.role.fail("worker " + std::to_string(workers + spares + 1) + " is over the limit of " +
                      std::to_string(kMaxWorkers) + " workers (spares included)");
      }
      if (n.spare && job.training.sync == Sync::kBsp) {
        src.spare->fail(
            "a spare needs training.sync asp, ssp or psplus (training.sync is bsp): a BSP job "
            "takes no other process in for a rank (training.on_worker_loss wait takes the rank's "
            "own new process)");
      }
      n.rank = n.spare ? spares++ : workers++;
    } else if (n.role == Role::kServer) {
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
  if (workers == 0) {
    list.fail(std::string("no worker") + (spares != 0 ? " but spares" : "") +
              " (a job needs at least one server and one worker)");
  }
  check_standbys(job, sources);

  // Every server reaches every worker: through a ring link to it, through its
  // only port, or through the port of the worker's rank when it has one port
  // per worker, the spares' after the ranks' (job::port_of_worker, which the
  // server uses, follows the same rule).
  for (size_t i = 0; i < job.nodes.size(); ++i) {
    const NodeConfig& server = job.nodes[i];
    if (server.role != Role::kServer || server.ports.size() == 1) continue;
    for (const NodeConfig& w : job.nodes) {
      if (w.role != Role::kWorker) continue;
      bool ring = false;
      for (const PortSpec& p : server.ports) ring = ring || p.ring_peer == w.name;
      if (ring) continue;
      const uint32_t at = w.spare ? workers + w.rank : w.rank;
      if (server.ports.size() == workers + spares && server.ports[at].kind != PortSpec::kRing) {
        continue;
      }
      sources[i].port_list->fail(
          "no port of server " + server.name + " leads to worker " + w.name +
          (w.spare ? " (spare " : " (rank ") + std::to_string(w.rank) +
          "): give the server one port for all workers, one port per worker in rank order (the "
          "spares' after the ranks'), or a ring: link to it");
    }
  }
}

}  // namespace mercury::config::detail
