// Capturing a parameter-server job as a pcap trace of what the server
// receives, for replay into a server that is not the one that ran the job
// (ps-server over net_pcap, or a ServerNode in a benchmark).
//
// The job is a job file (4 workers, 1 server node with 2 shards) whose nodes
// all run in this process: NodeNetworks builds every port from the file, so
// each server port carries the node's MAC and IP, as a single replay port
// will. The server is a control-plane ServerNode (shards inline), built as
// ps-server builds it; the workers are the library's own
// (worker::PolledWorker over net_core_config(): the public Worker, its net
// core polled by this thread). They run the real protocol: every worker
// declares (agg::ControlKind::kDeclare), the server answers kReady, rank 0
// pushes its initial parameters (kInit, version 0), then BSP rounds of
// push_pull with deterministic gradients (gradient(), initial_value()).
// PcapRecorder, an Interface RX tap on every server port, writes each frame
// the server receives, in arrival order, into one pcap file (libpcap).
//
// Why a replay is accepted at all: a transport stream's sequence numbers
// start at initial_seq(sender epoch, receiver epoch), so the workers'
// packets in the trace only make sense to a server of the capture's epoch
// (kServerEpoch). The replaying server must be started with it
// (`ps-server --epoch`, or ServerNodeConfig::endpoint.local_epoch); any other
// epoch counts every data packet as unsynced.
//
// Test and benchmark code (pmd-tests/replay, benchmarks/replay): it
// allocates and throws freely; its users build with pmd_replay_dep.
#pragma once

#include <pcap/pcap.h>
#include <rte_cycles.h>
#include <rte_mbuf.h>
#include <sys/time.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "agg/control.h"
#include "agg/placement.h"
#include "config/config.h"
#include "job/job.h"
#include "net/node.h"
#include "node/loop.h"
#include "server/server_node.h"
#include "worker/attach.h"
#include "worker/tensor_table.h"

namespace mercury::replay {

inline constexpr uint32_t kWorkers = 4;
inline constexpr uint32_t kShards = 2;
/// The capture server's transport epoch; a replaying server must use it.
inline constexpr uint32_t kServerEpoch = 0x5a17;
inline constexpr float kLearningRate = 0.25f;

/// A worker's epoch in the capture (any non-zero value; the server adopts it).
inline uint32_t worker_epoch(uint32_t rank) { return 0x2100 + rank; }

/// How the job file's ports are laid out.
struct JobLayout {
  std::string name;  ///< job.name: the EAL file prefix of a ps-server run
  /// The server's ports. Empty: one ring:wN link per worker (the capture).
  std::vector<std::string> server_ports;
  uint32_t window = 4096;    ///< network.window (packets in flight per peer)
  uint32_t mbufs = 4095;     ///< mempool.mbufs per port
  uint32_t memory_mb = 512;  ///< eal.memory_mb
};

/// The job file. Workers have static MACs, so nobody needs ARP. With ring
/// links the workers' ports are the other ends; otherwise they get net_null
/// vdevs that no process of the replay opens (a worker needs a port in the
/// file, and ps-server opens only its own node's).
inline std::string job_yaml(const JobLayout& l) {
  const bool rings = l.server_ports.empty();
  std::string y;
  y += "job:\n  id: 77\n  name: " + l.name + "\n";
  // Checksums on even over the capture's ring links (where auto leaves them
  // out): the trace is replayed into a server over net_pcap, which checks them.
  y += "network:\n  mtu: 1500\n  udp_checksum: true\n  window: " + std::to_string(l.window) +
       "\n  peer_timeout_ms: 60000\n  scheduler: strict\n";
  y += "mempool:\n  mbufs: " + std::to_string(l.mbufs) + "\n  cache: 64\n";
  y += "eal:\n  memory_mb: " + std::to_string(l.memory_mb) + "\n  hugepages: off\n";
  y += "training:\n  sync: bsp\n  optimizer: sgd\n  learning_rate: 0.25\n";
  y += "nodes:\n";
  y += "  - name: server0\n    role: server\n    ipv4: 10.9.0.1\n    mac: 02:00:00:00:09:01\n";
  y += "    ports: [";
  for (uint32_t w = 0; w < kWorkers && rings; ++w) {
    y += std::string(w ? ", " : " ") + "\"ring:w" + std::to_string(w) + "\"";
  }
  for (size_t p = 0; p < l.server_ports.size(); ++p) {
    y += std::string(p ? ", " : " ") + "\"" + l.server_ports[p] + "\"";
  }
  y += " ]\n    lcores: [0, 1, 2]\n    shards: 2\n";
  for (uint32_t w = 0; w < kWorkers; ++w) {
    const std::string n = std::to_string(w);
    y += "  - name: w" + n + "\n    role: worker\n    ipv4: 10.9.0." + std::to_string(11 + w) +
         "\n    mac: 02:00:00:00:09:1" + n + "\n";
    y += rings ? "    ports: [ \"ring:w" + n + "\" ]\n" : "    ports: [ \"net_null1" + n + "\" ]\n";
    y += "    lcores: [" + std::to_string(3 + w) + "]\n";
  }
  return y;
}

/// A small synthetic model: a few tensors of assorted sizes (one spans
/// several blocks on both shards, some are a single short chunk).
inline std::vector<agg::TensorDecl> small_model() {
  return {{"conv1.weight", 1728, 0}, {"conv1.bias", 64, 1},  {"block.weight", 9216, 2},
          {"block.bias", 37, 3},     {"fc.weight", 5120, 4}, {"fc.bias", 10, 5}};
}

// Deterministic values: a hash of the coordinates mapped to [-1, 1).
inline float unit_hash(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  x ^= x >> 31;
  return static_cast<float>(static_cast<int32_t>(x >> 32)) * (1.0f / 2147483648.0f);
}
inline float initial_value(uint32_t tensor, uint64_t i) {
  return unit_hash((uint64_t{0x17} << 56) ^ (uint64_t{tensor} << 40) ^ i);
}
/// Rank `rank`'s gradient in round `round` (iteration `round`).
inline float gradient(uint32_t round, uint32_t rank, uint32_t tensor, uint64_t i) {
  return unit_hash((uint64_t{round} << 52) ^ (uint64_t{rank} << 48) ^ (uint64_t{tensor} << 40) ^ i);
}

/// Every tensor's parameters at versions 0..rounds, as the server must send
/// them: version 0 is rank 0's initial values; version v + 1 is version v
/// minus lr x (the rank-order sum of the gradients of iteration v) x 1/n,
/// with lib/agg's rounding (build with -ffp-contract=off).
inline std::vector<std::vector<std::vector<float>>> reference(
    const std::vector<agg::TensorDecl>& decls, uint32_t rounds) {
  std::vector<std::vector<std::vector<float>>> v(rounds + 1);
  v[0].resize(decls.size());
  for (uint32_t t = 0; t < decls.size(); ++t) {
    v[0][t].resize(decls[t].elements);
    for (uint64_t i = 0; i < decls[t].elements; ++i) v[0][t][i] = initial_value(t, i);
  }
  const float inv_n = 1.0f / static_cast<float>(kWorkers);
  for (uint32_t r = 0; r < rounds; ++r) {
    v[r + 1] = v[r];
    for (uint32_t t = 0; t < decls.size(); ++t) {
      for (uint64_t i = 0; i < decls[t].elements; ++i) {
        float s = gradient(r, 0, t, i);
        for (uint32_t k = 1; k < kWorkers; ++k) s = s + gradient(r, k, t, i);
        const float g = s * inv_n;
        v[r + 1][t][i] = v[r][t][i] - kLearningRate * g;
      }
    }
  }
  return v;
}

/// Writes every frame of the bursts it is given into a pcap file
/// (Ethernet link type), in order: an Interface RX tap.
class PcapRecorder {
 public:
  explicit PcapRecorder(const std::string& path) : dead_(pcap_open_dead(DLT_EN10MB, 65535)) {
    if (dead_ == nullptr) throw std::runtime_error("pcap_open_dead failed");
    dumper_ = pcap_dump_open(dead_, path.c_str());
    if (dumper_ == nullptr) {
      const std::string why = pcap_geterr(dead_);
      pcap_close(dead_);
      throw std::runtime_error("cannot write " + path + ": " + why);
    }
  }
  ~PcapRecorder() {
    pcap_dump_close(dumper_);
    pcap_close(dead_);
  }
  PcapRecorder(const PcapRecorder&) = delete;
  PcapRecorder& operator=(const PcapRecorder&) = delete;

  static void tap(void* self, rte_mbuf* const* frames, uint16_t count, uint64_t) {
    auto* r = static_cast<PcapRecorder*>(self);
    pcap_pkthdr h{};
    gettimeofday(&h.ts, nullptr);
    for (uint16_t i = 0; i < count; ++i) {
      const rte_mbuf* m = frames[i];
      h.caplen = h.len = rte_pktmbuf_pkt_len(m);
      const auto* data =
          static_cast<const u_char*>(rte_pktmbuf_read(m, 0, h.caplen, r->bounce_.data()));
      pcap_dump(reinterpret_cast<u_char*>(r->dumper_), &h, data);
      ++r->frames_;
    }
  }
  [[nodiscard]] uint64_t frames() const { return frames_; }

 private:
  pcap_t* dead_;
  pcap_dumper_t* dumper_ = nullptr;
  uint64_t frames_ = 0;
  std::array<std::byte, 65536> bounce_{};  // a chained mbuf is read into it
};

/// What a capture produced.
struct Capture {
  uint64_t frames = 0;       ///< frames written to the trace
  uint64_t chunks = 0;       ///< chunks of the model (every block, every shard)
  uint64_t retransmits = 0;  ///< worker retransmissions during the capture
};

/// Runs the job of `job` (every node in this process, ring links; EAL up)
/// over `decls` for `rounds` BSP rounds and writes what the server received
/// into `trace`. Every worker's parameters are checked against reference()
/// after each version (a capture of a broken run would be worthless).
/// Throws with the reason on any failure or after `limit_s` seconds.
inline Capture capture(const config::JobConfig& job, const std::vector<agg::TensorDecl>& decls,
                       uint32_t rounds, const std::string& trace, double limit_s = 120) {
  const uint64_t hz = rte_get_tsc_hz();
  std::vector<std::string> names;
  for (const auto& n : job.nodes) names.push_back(n.name);
  net::NodeNetworks nets(job, names);
  const config::NodeConfig& srv = *job.servers().front();
  const auto workers = job.workers();
  if (workers.size() != kWorkers) throw std::runtime_error("the capture job has 4 workers");
  const uint32_t chunk = job.payload_bytes_per_packet();

  // The server: a port per worker, its shards inline.
  std::vector<net::Interface*> ports;
  std::vector<server::JobWorker> job_workers;
  for (net::NodePort* p : nets.ports_of(srv.name)) ports.push_back(p->interface.get());
  for (uint32_t r = 0; r < kWorkers; ++r) {
    const config::NodeConfig& w = *workers[r];
    const std::string link = "ring:" + w.name;
    uint32_t port = UINT32_MAX;
    for (uint32_t p = 0; p < srv.ports.size(); ++p) {
      if (srv.ports[p].text == link) port = p;
    }
    if (port == UINT32_MAX) throw std::runtime_error("no server port " + link);
    job_workers.push_back({{w.name, w.ipv4.value, w.udp_port}, port});
  }
  server::ServerNodeConfig sc;
  sc.chunk_bytes = chunk;
  sc.optimizer = job::optimizer_config(job.training);
  sc.layout = job::shard_layout(job);
  sc.server_index = 0;
  sc.endpoint = job::endpoint_config(job, static_cast<uint16_t>(srv.index), kServerEpoch, hz);
  sc.endpoint.max_messages = 1 << 17;
  sc.endpoint.ingress_capacity = 1 << 17;
  node::Loop loop({.tick_hz = hz});  // every node of the capture, one pass at a time
  server::ServerNode server(std::vector<net::PacketPort*>(ports.begin(), ports.end()), job_workers,
                            sc, rte_rdtsc());
  server.attach(loop);

  // The workers: the library's, each over its own buffers; rank 0's hold the
  // initial values, which become version 0 everywhere.
  const auto want = reference(decls, rounds);
  struct Trainer {
    std::vector<std::vector<float>> params, grads;
    std::unique_ptr<worker::PolledWorker> worker;
  };
  std::vector<std::unique_ptr<Trainer>> trainers;
  for (uint32_t r = 0; r < kWorkers; ++r) {
    auto t = std::make_unique<Trainer>();
    worker::NetCoreConfig c = worker::net_core_config(job, workers[r]->name);
    c.endpoint.local_epoch = worker_epoch(r);
    c.endpoint.max_messages = 1 << 17;
    c.endpoint.ingress_capacity = 1 << 17;
    t->worker = std::make_unique<worker::PolledWorker>(
        *nets.ports_of(workers[r]->name).front()->interface, c);
    t->worker->attach(loop);
    t->params.resize(decls.size());
    t->grads.resize(decls.size());
    for (size_t k = 0; k < decls.size(); ++k) {
      t->params[k] = r == 0 ? want[0][k] : std::vector<float>(decls[k].elements, 0.0f);
      t->grads[k].assign(decls[k].elements, 0.0f);
      t->worker->worker().declare(decls[k].name, t->params[k], static_cast<int>(decls[k].priority));
    }
    trainers.push_back(std::move(t));
  }

  PcapRecorder recorder(trace);
  for (net::Interface* i : ports) i->set_rx_tap_st(&PcapRecorder::tap, &recorder);

  const uint64_t deadline = rte_rdtsc() + static_cast<uint64_t>(limit_s * static_cast<double>(hz));
  auto wait = [&](const std::vector<worker::Handle>& hs, const std::string& what) {
    for (;;) {
      const uint64_t now = rte_rdtsc();
      loop.pass_st(now);
      bool done = true;
      for (const worker::Handle& h : hs) done = done && h.ready();
      if (done) break;
      if (now > deadline) throw std::runtime_error("capture: timed out waiting for " + what);
    }
    for (const worker::Handle& h : hs) {
      if (!h.ok()) throw std::runtime_error("capture: " + what + ": " + std::string(h.error()));
    }
  };
  auto check = [&](uint32_t version) {
    for (uint32_t r = 0; r < kWorkers; ++r) {
      for (size_t k = 0; k < decls.size(); ++k) {
        if (std::memcmp(trainers[r]->params[k].data(), want[version][k].data(),
                        decls[k].elements * sizeof(float)) != 0) {
          throw std::runtime_error("capture: worker " + std::to_string(r) + " tensor " +
                                   decls[k].name + " differs from the reference at version " +
                                   std::to_string(version));
        }
      }
    }
  };

  // 1. Declare; 2. ready; 3. rank 0's initial parameters, version 0 everywhere.
  std::vector<worker::Handle> started;
  for (auto& t : trainers) started.push_back(t->worker->worker().start_async());
  wait(started, "the start (ready, version 0)");
  check(0);
  // 4. Rounds.
  for (uint32_t round = 0; round < rounds; ++round) {
    std::vector<worker::Handle> pending;
    for (uint32_t r = 0; r < kWorkers; ++r) {
      Trainer& t = *trainers[r];
      for (uint32_t k = 0; k < decls.size(); ++k) {
        for (uint64_t i = 0; i < decls[k].elements; ++i) t.grads[k][i] = gradient(round, r, k, i);
        pending.push_back(t.worker->worker().push_pull(k, t.grads[k], t.params[k]));
      }
    }
    wait(pending, "version " + std::to_string(round + 1));
    check(round + 1);
  }
  for (net::Interface* i : ports) i->set_rx_tap_st(nullptr, nullptr);
  // The tap saw every frame the server's ports took from their queues.
  uint64_t received = 0;
  for (net::Interface* i : ports) received += i->counters().rx_frames;
  if (recorder.frames() != received) {
    throw std::runtime_error("capture: the tap recorded " + std::to_string(recorder.frames()) +
                             " frames, the server's ports received " + std::to_string(received));
  }

  Capture c;
  c.frames = recorder.frames();
  for (const agg::Block& p : server.placement_st()->blocks()) {
    c.chunks += (p.bytes() + chunk - 1) / chunk;
  }
  for (auto& t : trainers) {
    t->worker->worker().shutdown();  // its counters, published in full
    c.retransmits += t->worker->worker().stats().retransmits;
  }
  return c;
}

}  // namespace mercury::replay
