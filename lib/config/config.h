// The job description: one YAML file that every process of a training job
// reads (ps-server, each worker, the all-in-one demo), and the DPDK EAL
// arguments generated from it.
//
// load_file()/load_string() parse the YAML with an allow-list of keys, check
// every value's type and range and every cross-field rule, and return plain
// structs with defaults filled in. Anything wrong is refused with a
// ConfigError whose what() names the file, the 1-based line and the key path:
//
//   ring.yaml:14: nodes[1].mac: "zz:00" is not a MAC address (expected six hex
//   bytes, e.g. 02:00:00:00:00:01)
//
// eal_args() turns the job plus the names of the nodes one process runs into
// an EAL argv (file prefix, lcores, memory, vdevs, PCI allow-list).
// docs/config.md is the reference for every key and rule.
//
// Control path only: loading allocates, throws and reads files; call it at
// start-up, never from a poll loop. Nothing here depends on DPDK. Every
// function is reentrant (no shared state); a loaded JobConfig is immutable
// by convention and may be read from any thread. Cost: about 0.5 ms to load
// one of the example files (yaml-cpp parsing dominates); eal_args() takes
// microseconds.
#pragma once

#include <array>
#include <compare>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace mercury::config {

/// At most this many workers: a chunk's contributions are one 64-bit bitmap.
inline constexpr uint32_t kMaxWorkers = 64;
/// At most this many shards (aggregation cores) per server.
inline constexpr uint32_t kMaxShards = 64;
/// lcore ids must be below DPDK's RTE_MAX_LCORE (128 in Debian 12's build).
inline constexpr uint32_t kMaxLcore = 127;
/// Bytes the Mercury header takes in each packet (wire::kHeaderSize).
inline constexpr uint32_t kMercuryHeaderBytes = 64;
inline constexpr uint32_t kIpv4HeaderBytes = 20;
inline constexpr uint32_t kUdpHeaderBytes = 8;
/// Bytes of the authentication block after the Mercury header in a job with
/// a key (wire::kAuthSize).
inline constexpr uint32_t kAuthBlockBytes = 24;
/// The UDP port of nodes that name none (wire::kDefaultUdpPort).
inline constexpr uint16_t kDefaultUdpPort = 47100;
/// What hugepages_available() needs free before `auto` chooses hugepages
/// when the process does not say what it needs.
inline constexpr uint64_t kMinHugepageBytes = 256ull << 20;

/// A refused configuration. what() is "<source>:<line>: <key>: <message>";
/// errors with no position (a file that cannot be opened, an unknown node
/// name asked of a loaded job) are "<source>: <message>".
class ConfigError : public std::runtime_error {
 public:
  ConfigError(std::string source, int line, std::string key, std::string message);
  ConfigError(std::string source, std::string message);

  const std::string& source() const { return source_; }
  /// 1-based; 0 when the error has no position.
  int line() const { return line_; }
  /// Key path such as "nodes[1].mac"; empty when the error concerns no key.
  const std::string& key() const { return key_; }
  /// The message without the "<source>:<line>: <key>: " prefix.
  const std::string& message() const { return message_; }

 private:
  std::string source_;
  int line_ = 0;
  std::string key_;
  std::string message_;
};

/// An IPv4 address, host byte order.
struct Ipv4 {
  uint32_t value = 0;

  /// Strict dotted quad: four decimal octets 0..255, no leading zeros
  /// (which some parsers read as octal).
  static std::optional<Ipv4> parse(std::string_view text);
  std::string to_string() const;
  auto operator<=>(const Ipv4&) const = default;
};

/// An Ethernet address.
struct Mac {
  std::array<uint8_t, 6> octets{};

  /// Six colon-separated hex bytes, either case: 02:00:00:00:00:01.
  static std::optional<Mac> parse(std::string_view text);
  /// Lower-case, colon-separated.
  std::string to_string() const;
  bool is_multicast() const { return (octets[0] & 1u) != 0; }
  auto operator<=>(const Mac&) const = default;
};

enum class Scheduler : uint8_t {
  kStrict,     ///< Mercury: per-packet strict priority in the transport
  kFifo,       ///< baseline: messages in arrival order
  kPartition,  ///< baseline: tensor partitioning with priority and credit (P3, ByteScheduler)
};
enum class Hugepages : uint8_t { kAuto, kOn, kOff };
enum class Checksum : uint8_t { kAuto, kOn, kOff };
/// How a node's poll loops wait when they find nothing to do (net/idle_backoff.h).
enum class Poll : uint8_t {
  kAdaptive,  ///< yield the CPU to runnable threads, then sleep: CPUs shared with others
  kBusy,      ///< spin without yielding or sleeping: dedicated cores
};
/// A node's role. A standby (docs/durability.md, "A hot standby") is a
/// server node of its own kind: it runs its server's shards as a copy fed by
/// that server and serves them only once the server is lost.
enum class Role : uint8_t { kServer, kWorker, kStandby };
enum class Sync : uint8_t { kBsp, kAsp, kSsp, kPsPlus };
enum class Optimizer : uint8_t { kSgd, kMomentum, kAdam, kSum, kAdamW };
/// PS+'s learning rate for an update s versions stale: lr / (1 + s),
/// lr / sqrt(1 + s), or lr.
enum class StalenessLr : uint8_t { kInverse, kInverseSqrt, kNone };
/// When the server sends an aggregate back: each chunk as soon as its set is
/// complete (Mercury), or a tensor's (a partition's, under the partition
/// scheduler) only once all of it is (the classical PS's store-and-forward).
enum class Aggregation : uint8_t { kChunk, kTensor };
/// What a BSP job does when a worker is lost (`training.on_worker_loss`):
/// end (kFail), go on without it (kShrink), or hold the round until its new
/// process joins (kWait, at most `training.worker_wait_s`;
/// docs/membership.md).
enum class OnWorkerLoss : uint8_t { kFail, kWait, kShrink };

/// What a worker does when liveness names a server lost
/// (`network.on_server_loss`): fail (every call fails, naming it), or wait
/// for it to come back from its checkpoint and roll back to its version.
enum class OnServerLoss : uint8_t { kFail, kWait };

/// The YAML spelling of each enum value ("strict", "psplus", ...).
std::string_view to_string(Scheduler v);
std::string_view to_string(Hugepages v);
std::string_view to_string(Checksum v);  ///< "auto", "true", "false"
std::string_view to_string(Poll v);
std::string_view to_string(Role v);
std::string_view to_string(Sync v);
std::string_view to_string(Optimizer v);
std::string_view to_string(StalenessLr v);
std::string_view to_string(Aggregation v);

/// A job's authentication key: 32 bytes (transport/auth.h uses it).
using AuthKey = std::array<uint8_t, 32>;

/// Reads a key file: 64 hex digits, then optional whitespace. Returns the key
/// (wiped from memory when the last reference goes), or throws
/// std::runtime_error saying what is wrong with the file: unreadable,
/// readable or writable by group or others, or anything but the digits.
std::shared_ptr<const AuthKey> read_auth_key(const std::string& path);

struct NetworkConfig {
  uint32_t mtu = 1500;                  ///< IP MTU, 576..9000
  uint16_t udp_port = kDefaultUdpPort;  ///< default for nodes that set none
  /// UDP checksums: kAuto computes and verifies them (offloaded where the
  /// PMD can) except on ports that move frames through shared memory
  /// (net_memif, ring links), which cannot corrupt them, as Linux's loopback.
  Checksum udp_checksum = Checksum::kAuto;
  /// Every node's poll loops (a node's own `poll` overrides it).
  Poll poll = Poll::kAdaptive;
  uint32_t window = 0;  ///< packets in flight per peer; 0 = derive from rate x RTT
  uint32_t peer_timeout_ms = 1500;
  Scheduler scheduler = Scheduler::kStrict;
  uint32_t partition_bytes = 4194304;  ///< meaningful for kPartition only
  uint32_t credit_bytes = 8388608;     ///< meaningful for kPartition only
  /// network.auth_key_file as written ("" = no authentication), and the key
  /// read from it at load (relative paths are from the job file's
  /// directory). Null when off. docs/security.md.
  std::string auth_key_file;
  std::shared_ptr<const AuthKey> auth_key;
  /// The workers' rule for a lost server, and how long they wait (seconds).
  OnServerLoss on_server_loss = OnServerLoss::kFail;
  double server_wait_s = 60;
};

struct MempoolConfig {
  uint32_t mbufs = 16383;  ///< per port
  uint32_t cache = 256;    ///< per-lcore mempool cache
};

struct EalConfig {
  uint32_t memory_mb = 512;  ///< -m when running without hugepages
  Hugepages hugepages = Hugepages::kAuto;
  std::vector<std::string> extra;  ///< appended verbatim to the EAL argv
};

/// The link emulator applied on every TX queue.
/// A change of the emulated line rate during the job (link.rate_steps).
struct RateStep {
  double at_s = 0;       ///< seconds after the node saw the job start
  double rate_gbps = 0;  ///< the new rate; 0 = unlimited
};

struct LinkConfig {
  double rate_gbps = 0;  ///< 0 = unlimited
  uint32_t delay_us = 0;
  double loss = 0;
  double duplicate = 0;
  double reorder = 0;
  double corrupt = 0;
  uint64_t seed = 1;
  std::vector<RateStep> rate_steps;  ///< in increasing at_s
  /// Non-empty: each TX direction shares its wire (one serialiser at rate_gbps) with the
  /// same node's same port in every other job on this host naming the same wire.
  std::string shared_wire;

  /// True when the emulator has anything to do.
  bool enabled() const {
    return rate_gbps > 0 || delay_us > 0 || loss > 0 || duplicate > 0 || reorder > 0 ||
           corrupt > 0 || !rate_steps.empty();
  }
};

/// Only the fields of the chosen sync policy and optimizer are meaningful;
/// the others keep their defaults (the loader refuses setting them).
struct TrainingConfig {
  Sync sync = Sync::kBsp;
  /// ssp: how many iterations a worker may be ahead of the slowest (0 for the others).
  uint32_t staleness_bound = 0;
  /// psplus: the learning rate of an update s versions stale.
  StalenessLr staleness_lr = StalenessLr::kInverse;
  /// bsp only: kTensor holds a tensor's aggregate until all of it is in.
  Aggregation aggregation = Aggregation::kChunk;
  /// bsp only: a lost worker ends the job.
  OnWorkerLoss on_worker_loss = OnWorkerLoss::kFail;
  /// A spare worker node takes a removed rank over when no new process of
  /// the rank joined within this many seconds (docs/membership.md, "Spare
  /// workers"); only with a node that has `spare: true`.
  double spare_grace_s = 2;
  /// on_worker_loss wait: how long the round waits for a lost rank's new
  /// process before the job ends as under fail (seconds, > 0).
  double worker_wait_s = 60;
  Optimizer optimizer = Optimizer::kSgd;
  double learning_rate = 0.01;
  double momentum = 0.9;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double epsilon = 1.0e-8;
  /// sgd, momentum, adam: an L2 term; adamw: decoupled. 0 = none.
  double weight_decay = 0.0;
};

/// Background checkpoints of the servers' state (the `checkpoint` section;
/// docs/server.md, "Durability"). Off when `dir` is empty.
struct CheckpointConfig {
  /// As written; relative paths are from the job file's directory (resolved
  /// in `path`).
  std::string dir;
  std::string path;
  /// A checkpoint at every version that is a multiple of this (0: none by
  /// version). Every server snapshots the same versions without talking.
  uint32_t every_versions = 0;
  /// A checkpoint at the first version after this many seconds since the
  /// last (0: none by time). One server node only: a time is not a version
  /// another server could agree on.
  double every_s = 0;
  uint32_t keep = 2;  ///< the newest checkpoints kept per server; older ones are deleted

  [[nodiscard]] bool enabled() const { return !dir.empty(); }
};

/// The value of the first `key=value` entry with this key in a comma-separated
/// argument list ("role=client,id=0,socket=/tmp/w0.sock"), or nullopt.
std::optional<std::string_view> devargs_value(std::string_view args, std::string_view key);

/// One entry of a node's `ports` list.
struct PortSpec {
  enum Kind : uint8_t {
    kRing,  ///< "ring:<link>": an in-process link built by lib/net from two rte_rings
    kVdev,  ///< "net_<driver><n>[,k=v...]": passed to EAL as --vdev=
    kPci,   ///< a PCI address, normalised to 0000:03:00.0; passed to EAL as -a
  };
  Kind kind = kRing;
  /// As written for kRing and kVdev; the normalised address for kPci.
  std::string text;
  /// kRing only: the link name, and the node holding the other end.
  std::string ring_link;
  std::string ring_peer;

  /// kVdev: the device name before the first comma ("net_memif0").
  std::string_view vdev_name() const;
  /// kVdev: the value of the first `key=value` argument with this key, or
  /// nullopt when there is none.
  std::optional<std::string_view> vdev_arg(std::string_view key) const;
};

struct NodeConfig {
  std::string name;
  Role role = Role::kWorker;
  uint32_t index = 0;  ///< position in the file's nodes list
  /// Position among the nodes of the same role, in file order; a spare
  /// worker's among the spares (it is no rank of the job).
  uint32_t rank = 0;
  /// A worker that is no rank at the start and takes a removed rank over
  /// (`spare: true`; docs/membership.md, "Spare workers").
  bool spare = false;
  Ipv4 ipv4;
  uint16_t udp_port = 0;  ///< the node's own, else network.udp_port
  std::optional<Mac> mac;
  std::vector<PortSpec> ports;
  std::vector<uint32_t> lcores;  ///< lcores[0] is the net core
  uint32_t shards = 0;           ///< servers only; 0 for workers
  /// A server: its standby node's name ("" for none). A standby: the
  /// server it stands by for.
  std::string standby;
  Poll poll = Poll::kAdaptive;  ///< its poll loops: its own `poll`, else network.poll

  uint32_t net_lcore() const { return lcores.front(); }
  /// Servers: the lcores after the net core, which run the shards.
  std::span<const uint32_t> shard_lcores() const {
    return std::span<const uint32_t>(lcores).subspan(1);
  }
};

struct JobConfig {
  uint32_t id = 0;
  std::string name;
  NetworkConfig network;
  MempoolConfig mempool;
  EalConfig eal;
  LinkConfig link;
  TrainingConfig training;
  CheckpointConfig checkpoint;
  std::vector<NodeConfig> nodes;
  std::string source;  ///< the file name (or source_name) it was loaded from

  /// The node called `name`; throws ConfigError listing the valid names.
  const NodeConfig& node(std::string_view name) const;
  /// nullptr when there is no such node.
  const NodeConfig* find_node(std::string_view name) const;
  /// Workers (servers) in rank order; workers() leaves the spares out,
  /// servers() the standbys. The pointers live as long as this job.
  std::vector<const NodeConfig*> workers() const;
  std::vector<const NodeConfig*> servers() const;
  /// The spare workers (`spare: true`), in file order.
  std::vector<const NodeConfig*> spares() const;
  /// The rank of a worker among workers, or of a server among servers.
  /// Throws ConfigError for an unknown name.
  uint32_t rank_of(std::string_view name) const;
  /// Payload bytes one packet carries: mtu - IPv4 - UDP - Mercury header
  /// (and its authentication block when the job has a key), rounded down to
  /// whole 64-byte cache lines (net::payload_per_packet).
  uint32_t payload_bytes_per_packet() const;
};

/// Reads and validates a job file. Throws ConfigError, naming the path and
/// strerror when the file cannot be read.
JobConfig load_file(const std::string& path);

/// Validates YAML text; errors name `source_name` as the file.
JobConfig load_string(std::string_view yaml, std::string_view source_name = "<inline>");

/// How one process starts EAL, beyond what the job file says.
struct EalRunOptions {
  /// Resolved: true = use hugepages (see resolve_hugepages()).
  bool hugepages = false;
  /// Appended to the file prefix; tests use it to keep runs apart.
  std::string file_prefix_suffix;
  /// Appended after eal.extra.
  std::vector<std::string> extra;
  /// CPUs that lcores are mapped onto (lcore i runs on cpus[i % size]).
  /// Empty = the CPUs this process may run on (allowed_cpus()).
  std::vector<uint32_t> cpus;
};

/// The EAL argv for a process running `node_names` (the first one names the
/// file prefix):
///   mercury --file-prefix=<job>-<first node><suffix> --lcores=<l>@<cpu>,...
///   (--huge-unlink | --no-huge -m <memory_mb>) (--no-pci | -a <pci>...)
///   --vdev=<vdev>... [--no-shconf] <eal.extra...> <options.extra...>
/// --lcores holds the union of the nodes' lcores in ascending order, so
/// DPDK's main lcore is the lowest. Throws ConfigError for an empty or
/// repeated node name, an unknown node, or a PCI device claimed by two of
/// the nodes.
std::vector<std::string> eal_args(const JobConfig& job, std::span<const std::string> node_names,
                                  const EalRunOptions& options);

/// The CPUs this process may run on (sched_getaffinity), ascending.
std::vector<uint32_t> allowed_cpus();

/// The CPU eal_args() maps `lcore` to: cpus[lcore % cpus.size()] (cpus not
/// empty).
inline uint32_t cpu_of_lcore(uint32_t lcore, std::span<const uint32_t> cpus) {
  return cpus[lcore % cpus.size()];
}

/// True when at least need_bytes (0: kMinHugepageBytes) of hugepages are
/// free and a hugetlbfs file system is mounted (e.g. on /dev/hugepages).
bool hugepages_available(uint64_t need_bytes = 0);
/// The same, reading `sysfs_dir` (normally /sys/kernel/mm/hugepages) and
/// `mounts_path` (normally /proc/mounts); for tests.
bool hugepages_available(const std::string& sysfs_dir, const std::string& mounts_path,
                         uint64_t need_bytes = 0);

/// The ledger of hugepages decided on and not yet allocated, and how long
/// resolve_hugepages waits for another process to let go of it.
inline constexpr const char* kHugepageLedger = "/run/lock/mercury-hugepages";
inline constexpr uint32_t kHugepageLockWaitMs = 10'000;

/// The hugepage decision for eal.hugepages: on -> true, off -> false, auto ->
/// hugepages_available(need_bytes plus what other processes have decided on
/// and not yet allocated), `need_bytes` being what this process will take
/// in hugepages (net::hugepage_need_bytes). Those others are in a ledger,
/// kHugepageLedger, read and written under an exclusive flock (waiting up to
/// kHugepageLockWaitMs): a process choosing hugepages adds its need there,
/// hugepages_settled() takes it out once its pools exist, and the entry of
/// a process that died counts no more. So processes of one machine starting
/// together cannot all take the same free pages. When auto falls back to no
/// hugepages and `notice` is not null, sets it to a one-line explanation for
/// the operator (otherwise clears it).
bool resolve_hugepages(const EalConfig& eal, uint64_t need_bytes, std::string* notice);
/// The process has allocated what it decided on (its mempools exist, or
/// it failed): takes its entry out of the ledger. Idempotent;
/// net::NodeNetworks calls it once its pools exist.
void hugepages_settled();

}  // namespace mercury::config
