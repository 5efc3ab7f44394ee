// Internal to lib/config (not installed): the parsers load_string() runs,
// one per top-level key of the job file, in the order it runs them. Each
// reads its section through the allow-list and typed getters of
// yaml_value.h, fills the struct with the file's values over the defaults,
// and refuses (ConfigError, file:line: key) a bad value or a rule between
// keys that the file breaks. docs/config.md is the reference for every rule.
//
// Control path only: allocates and throws. Reentrant.
#pragma once

#include <optional>
#include <vector>

#include "config/config.h"
#include "config/yaml_value.h"

namespace mercury::config::detail {

// load_sections.cpp: one function per section.
void parse_job(const Section& root, JobConfig& job);
/// Reads network.scheduler before the partition keys, which only it admits.
void parse_network(const Section& root, NetworkConfig& net);
void parse_mempool(const Section& root, MempoolConfig& pool);
/// network.poll and a node's own poll: "adaptive" or "busy".
Poll parse_poll(const Value& v);
void parse_eal(const Section& root, EalConfig& eal);
void parse_link(const Section& root, LinkConfig& link);
void parse_training(const Section& root, TrainingConfig& t);

/// The checkpoint section; after parse_nodes (it counts the server nodes).
void parse_checkpoint(const Section& root, JobConfig& job);
/// network.on_server_loss and server_wait_s; after parse_checkpoint.
void parse_server_loss(const Section& root, JobConfig& job);
/// training.on_worker_loss and spare_grace_s against the nodes; after parse_nodes.
void check_worker_loss(const Section& root, JobConfig& job);

// load_nodes.cpp: the node list, ranks and the rules across nodes. Needs
// job.network (the default udp_port and poll mode).
void parse_nodes(const Section& root, JobConfig& job);

// What the cross-node checks need to point back at the file.
struct NodeSource {
  Value name;
  Value role;
  Value ipv4;
  std::optional<Value> mac;
  std::optional<Value> port_list;  ///< the `ports` key itself
  std::vector<Value> ports;
  std::optional<Value> standby;  ///< a server's `standby` key
  std::optional<Value> lcores;   ///< the `lcores` key
  std::optional<Value> spare;    ///< a worker's `spare` key
};

// load_node.cpp: one entry of the node list and the rules within it; `src`
// keeps where each value came from, for the checks across nodes.
NodeConfig parse_node(const Section& s, const NetworkConfig& net, NodeSource& src);

}  // namespace mercury::config::detail
