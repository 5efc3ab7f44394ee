// The network side of the nodes one process runs, built from the job file:
// a mempool, a port and an Interface per configured port, with the link
// emulator attached when the job's `link:` section asks for one.
//
// `ring:<link>` ports whose two ends both run in this process are created as
// in-process ring links; an end whose peer runs elsewhere is refused (a ring
// cannot cross processes: use net_memif). vdev and PCI ports are opened by
// name (EAL must have been started with config::eal_args for these nodes).
// Static ARP entries are added for every node of the job that has a `mac`.
//
// Control path: the constructor throws std::runtime_error / ConfigError with
// a message naming the node and port. Each Interface then belongs to the
// lcore that polls it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "config/config.h"
#include "net/interface.h"
#include "net/link_emulator.h"
#include "net/mempool.h"
#include "net/port.h"

namespace mercury::net {

/// One configured port of a node, ready to poll.
struct NodePort {
  std::string node;  ///< the node it belongs to
  std::string spec;  ///< as written in the job file
  std::unique_ptr<Mempool> pool;
  std::unique_ptr<Port> port;
  /// link.shared_wire: the wire this port's TX direction shares with other jobs
  /// ("<name>.<node>.<k>", k its place in the node's ports list); null otherwise.
  /// Declared before the emulator, which points to it, so it goes after it.
  std::unique_ptr<SharedWire> wire;
  std::unique_ptr<LinkEmulator> emulator;  ///< null when the link is not emulated
  std::unique_ptr<Interface> interface;
};

class NodeNetworks {
 public:
  /// Opens every port of `nodes` (names from the job). EAL must be up. A
  /// net_memif client port waits up to `peer_wait_ms` for its server to
  /// listen (PortOptions::peer_wait_ms).
  NodeNetworks(const config::JobConfig& job, const std::vector<std::string>& nodes,
               uint32_t peer_wait_ms = 0);
  ~NodeNetworks();
  NodeNetworks(const NodeNetworks&) = delete;
  NodeNetworks& operator=(const NodeNetworks&) = delete;

  /// The ports of `node`, in the order of its `ports` list.
  std::vector<NodePort*> ports_of(const std::string& node);
  std::vector<std::unique_ptr<NodePort>>& all() { return ports_; }

 private:
  std::vector<std::unique_ptr<NodePort>> ports_;
};

/// What a process running `nodes` allocates in hugepages, about: the
/// mempools NodeNetworks creates (a pool of job.mempool.mbufs per port)
/// plus kEalHugepageOverhead for EAL's own structures, rings and the
/// smaller pools. config::resolve_hugepages weighs it under eal.hugepages
/// auto. Needs no EAL.
uint64_t hugepage_need_bytes(const config::JobConfig& job, const std::vector<std::string>& nodes);
inline constexpr uint64_t kEalHugepageOverhead = 64ull << 20;

/// LinkParams for the job's `link:` section.
LinkParams link_params(const config::LinkConfig& link);

}  // namespace mercury::net
