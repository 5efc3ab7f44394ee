// A whole parameter-server job in one process, for the PMD tests: a
// ServerNode built from the job (control-plane constructor) and N in-process
// workers, each a worker::WorkerNode driven by hand, that speak the protocol
// of agg/control.h from the worker side (declare, wait for ready, rank 0's
// kInit push, gradient pushes, barrier); the node's PullTracker places the
// server's chunks into each worker's parameter buffers.
//
// Topologies: one net_ring link per worker (the server has a port per
// worker), or a hub (the server has one port; the workers' ports all send
// into its RX ring, and the test forwards its TX ring to the worker whose
// MAC a frame is for, broadcasts to all: the bridge of the multi-host test,
// in one process).
//
// Test-only code: it allocates and throws freely.
#pragma once

#include <rte_cycles.h>
#include <rte_eth_ring.h>
#include <rte_ether.h>
#include <rte_mbuf.h>
#include <rte_ring.h>

#include <cstring>
#include <deque>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "agg/control.h"
#include "agg/placement.h"
#include "fixture.h"
#include "net/frame.h"
#include "net/interface.h"
#include "net/mempool.h"
#include "net/port.h"
#include "server/server_node.h"
#include "transport/endpoint.h"
#include "worker/pull_tracker.h"
#include "worker/tensor_table.h"
#include "worker/worker_node.h"

namespace mercury::pstest {

using transport::EndpointConfig;
using transport::PeerSpec;
using transport::testing::RingLink;

inline std::string read_model(const char* name) {
  std::ifstream in(std::string(MERCURY_MODELS_DIR) + "/" + name);
  if (!in) throw std::runtime_error(std::string("no model file ") + name);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

/// The model's shapes with every tensor divided by `divisor` (at least 1
/// element): the same tensor count, names and priorities, less data.
inline std::vector<agg::TensorDecl> scaled(std::vector<agg::TensorDecl> d, uint64_t divisor) {
  for (auto& t : d) t.elements = std::max<uint64_t>(1, t.elements / divisor);
  return d;
}

inline EndpointConfig endpoint_config(uint16_t epoch, uint16_t sender_id) {
  EndpointConfig c;
  c.transport.tsc_hz = rte_get_tsc_hz();
  c.transport.window_packets = 128;
  c.transport.peer_timeout_us = 20'000'000;
  c.local_epoch = epoch;
  c.sender_id = sender_id;
  // Every chunk update is one slice to each worker: many descriptors in flight.
  c.max_messages = 1 << 17;
  c.ingress_capacity = 1 << 17;
  return c;
}

/// One worker: its parameters and gradients, its tensor table, and a
/// worker::WorkerNode (endpoint + pull tracker) driven by hand: control
/// messages are encoded and sent here, the server's answers collected.
class TestWorker final : public transport::MessageReceiver {
 public:
  TestWorker(uint32_t rank, const std::vector<agg::TensorDecl>& decls, uint32_t shards,
             uint32_t chunk_bytes, net::Interface& iface, const PeerSpec& server,
             transport::Tick now)
      : rank_(rank) {
    params_.resize(decls.size());
    grads_.resize(decls.size());
    for (size_t t = 0; t < decls.size(); ++t) {
      params_[t].assign(decls[t].elements, 0.0f);
      grads_[t].assign(decls[t].elements, 0.0f);
      table_.declare(decls[t].name, params_[t], decls[t].priority);
    }
    table_.freeze(shards, chunk_bytes);
    worker::WorkerNodeConfig wc;
    wc.endpoint = endpoint_config(5, static_cast<uint16_t>(rank + 1));
    wc.endpoint.peers = {server};
    wc.pulls.first_version = 0;  // rank 0's initial parameters
    wc.control = this;
    node_ = std::make_unique<worker::WorkerNode>(table_, iface, wc, now);
  }

  uint32_t rank() const { return rank_; }
  worker::TensorTable& table() { return table_; }
  worker::PullTracker& tracker() { return node_->tracker(); }
  worker::WorkerNode& node() { return *node_; }
  std::vector<std::vector<float>>& params() { return params_; }
  std::vector<std::vector<float>>& grads() { return grads_; }
  /// Control messages received so far, decoded.
  std::vector<agg::ControlMessage>& control() { return control_; }

  /// Sends a control message to the server (kept alive: the test is short).
  void send_control(const agg::ControlMessage& m) {
    out_.push_back(agg::encode_control(m));
    if (node_->send_control_st(0, out_.back(), {}) != transport::SubmitStatus::kQueued) {
      throw std::runtime_error("control send refused");
    }
  }
  void declare(std::vector<agg::TensorDecl> tensors, uint32_t claimed_rank) {
    agg::ControlMessage m;
    m.kind = agg::ControlKind::kDeclare;
    m.rank = claimed_rank;
    m.tensors = std::move(tensors);
    send_control(m);
  }
  void declare() { declare(table_.declarations(), rank_); }
  void barrier(uint64_t generation) {
    agg::ControlMessage m;
    m.kind = agg::ControlKind::kBarrier;
    m.rank = rank_;
    m.generation = generation;
    send_control(m);
  }

  /// Queues every partition of every tensor: gradients (kData, `iteration`)
  /// or, for rank 0 at start, its parameters (kInit, iteration 0).
  void push_all(wire::PacketType type, uint32_t iteration) {
    for (uint32_t t = 0; t < table_.tensors(); ++t) {
      const auto& src = type == wire::PacketType::kInit ? params_[t] : grads_[t];
      if (node_->push_partitions_st(t, src.data(), iteration, type, 0, {}) !=
          table_.partitions(t).size()) {
        throw std::runtime_error("push refused");
      }
    }
  }

  /// Every tensor's version `v` is complete.
  bool has_version(uint32_t v) {
    for (uint32_t t = 0; t < table_.tensors(); ++t) {
      if (node_->tracker().awaited_st(t) <= v) return false;
    }
    return true;
  }

  std::byte* on_message_begin(uint16_t, const wire::HeaderFields& h) override {
    in_.emplace_back(h.msg_len);
    return in_.back().data();
  }
  void on_message_complete(uint16_t, const wire::HeaderFields& h, std::byte* buffer) override {
    control_.push_back(agg::decode_control({buffer, h.msg_len}));
  }

 private:
  uint32_t rank_;
  std::vector<std::vector<float>> params_, grads_;
  worker::TensorTable table_;
  std::unique_ptr<worker::WorkerNode> node_;
  std::deque<std::vector<std::byte>> out_, in_;
  std::vector<agg::ControlMessage> control_;
};

/// One server port and N worker ports over rings: every worker port sends
/// into the server's RX ring; forward() moves the server's TX frames to the
/// worker whose MAC they are for (broadcasts to every worker).
class Hub {
 public:
  Hub(const std::string& name, uint32_t workers, uint32_t mtu, uint8_t net)
      : copies_("hc_" + name, 1023, 32, net::frame_bytes_for_mtu(mtu)),
        up_("hu_" + name, 8192, RING_F_SC_DEQ),
        down_("hd_" + name, 8192, RING_F_SP_ENQ | RING_F_SC_DEQ) {
    rte_ring* up = up_.get();
    rte_ring* down = down_.get();
    pools_.emplace_back("hps_" + name, 8191, 64, net::frame_bytes_for_mtu(mtu));
    for (uint32_t w = 0; w < workers; ++w) {
      pools_.emplace_back("hpw" + std::to_string(w) + "_" + name, 4095, 64,
                          net::frame_bytes_for_mtu(mtu));
      worker_down_.emplace_back("hw" + std::to_string(w) + "_" + name, 8192,
                                RING_F_SP_ENQ | RING_F_SC_DEQ);
    }
    const std::string sname = "hs_" + name;
    if (rte_eth_from_rings(sname.c_str(), &up, 1, &down, 1, rte_socket_id()) < 0) {
      throw std::runtime_error("hub: server port");
    }
    ports_.push_back(net::Port::open("net_ring_" + sname, pools_[0], net::PortOptions{.mtu = mtu}));
    for (uint32_t w = 0; w < workers; ++w) {
      rte_ring* wd = worker_down_[w].get();
      const std::string wname = "hw" + std::to_string(w) + "p_" + name;
      if (rte_eth_from_rings(wname.c_str(), &wd, 1, &up, 1, rte_socket_id()) < 0) {
        throw std::runtime_error("hub: worker port");
      }
      ports_.push_back(
          net::Port::open("net_ring_" + wname, pools_[w + 1], net::PortOptions{.mtu = mtu}));
    }
    ifaces_.emplace_back(std::make_unique<net::Interface>(
        ports_[0], pools_[0], net::LocalAddr{ports_[0].mac(), server_ip(net), 47100},
        net::InterfaceOptions{}));
    for (uint32_t w = 0; w < workers; ++w) {
      ifaces_.emplace_back(std::make_unique<net::Interface>(
          ports_[w + 1], pools_[w + 1],
          net::LocalAddr{ports_[w + 1].mac(), worker_ip(net, w), 47101}, net::InterfaceOptions{}));
    }
  }

  static uint32_t server_ip(uint8_t net) { return 0x0a010001u | uint32_t{net} << 8; }
  static uint32_t worker_ip(uint8_t net, uint32_t w) {
    return (0x0a010000u | uint32_t{net} << 8) + 10 + w;
  }
  net::Interface& server() { return *ifaces_[0]; }
  net::Interface& worker(uint32_t w) { return *ifaces_[w + 1]; }

  /// Moves the server's sent frames to their workers; returns how many.
  uint32_t forward() {
    rte_mbuf* m[32];
    const unsigned n =
        rte_ring_sc_dequeue_burst(down_.get(), reinterpret_cast<void**>(m), 32, nullptr);
    for (unsigned i = 0; i < n; ++i) {
      const auto* eth = rte_pktmbuf_mtod(m[i], const rte_ether_hdr*);
      bool sent = false;
      for (uint32_t w = 0; w < worker_down_.size(); ++w) {
        const auto& mac = ports_[w + 1].mac().bytes;
        const bool bcast = rte_is_broadcast_ether_addr(&eth->dst_addr);
        if (!bcast && std::memcmp(eth->dst_addr.addr_bytes, mac.data(), 6) != 0) continue;
        rte_mbuf* c = bcast ? rte_pktmbuf_copy(m[i], copies_.get(), 0, UINT32_MAX) : m[i];
        if (c != nullptr && rte_ring_sp_enqueue(worker_down_[w].get(), c) != 0) {
          rte_pktmbuf_free(c);
        }
        sent = !bcast;
        if (sent) break;
      }
      if (!sent) rte_pktmbuf_free(m[i]);
    }
    return n;
  }

 private:
  net::Mempool copies_;
  std::deque<net::Mempool> pools_;
  net::Ring up_, down_;
  std::deque<net::Ring> worker_down_;
  std::deque<net::Port> ports_;
  std::vector<std::unique_ptr<net::Interface>> ifaces_;
};

struct JobOptions {
  const char* model = "mobilenet_v2.txt";
  uint64_t scale_down = 1;  ///< tensors divided by this
  uint32_t workers = 4;
  std::vector<uint32_t> job_shards = {2};
  uint32_t server_index = 0;  ///< which of the job's server nodes the node is
  bool hub = false;           ///< one server port for every worker
  net::LinkParams impair;
  std::vector<unsigned> shard_lcores;
  server::ShardCoreOptions shard_core = {.ring_entries = 1 << 15};  ///< more than every RX pool
  agg::OptimizerConfig optimizer = {.kind = agg::OptimizerKind::kSgd, .learning_rate = 0.1f};
  uint32_t server_max_messages = 1 << 17;  ///< per server endpoint (descriptors and ingress)
  double round_limit_s = 60;  ///< a round that takes longer fails, with the transport's state
  uint32_t server_peer_timeout_ms = 20'000;  ///< the server gives up on a silent worker after this
};

inline constexpr uint32_t kMtu = 1500;

/// A server node and its workers, wired up and polled from this thread.
class Job {
 public:
  explicit Job(const JobOptions& o) : options_(o) {
    static int serial = 0;
    const int id = serial++;
    decls_ = scaled(agg::parse_model_shapes(read_model(o.model)), o.scale_down);
    chunk_ = net::payload_per_packet(kMtu);
    uint32_t total = 0;
    for (uint32_t s : o.job_shards) total += s;
    std::vector<net::Interface*> ports;
    std::vector<server::JobWorker> jw;
    std::vector<net::Interface*> worker_if;
    std::vector<PeerSpec> server_at;
    const auto net = static_cast<uint8_t>(100 + id);
    if (o.hub) {
      hub_ = std::make_unique<Hub>("job" + std::to_string(id), o.workers, kMtu, net);
      ports.push_back(&hub_->server());
      for (uint32_t w = 0; w < o.workers; ++w) {
        jw.push_back({{"w" + std::to_string(w), Hub::worker_ip(net, w), 47101}, 0});
        worker_if.push_back(&hub_->worker(w));
        server_at.push_back({"ps", Hub::server_ip(net), 47100});
      }
    } else {
      for (uint32_t w = 0; w < o.workers; ++w) {
        net::LinkParams p = o.impair;
        p.seed = o.impair.seed + w;
        const auto n = static_cast<uint8_t>(w);
        links_.push_back(std::make_unique<RingLink>(
            "job" + std::to_string(id) + "_" + std::to_string(w), n, kMtu, p, 8191));
        ports.push_back(&links_.back()->a());
        jw.push_back({{"w" + std::to_string(w), RingLink::ip_b(n), 47101}, w});
        worker_if.push_back(&links_.back()->b());
        server_at.push_back({"ps", RingLink::ip_a(n), 47100});
      }
    }
    server::ServerNodeConfig sc;
    sc.chunk_bytes = chunk_;
    sc.optimizer = o.optimizer;
    sc.layout = job::ShardLayout::of(o.job_shards);
    sc.server_index = o.server_index;
    sc.endpoint = endpoint_config(3, 0);
    sc.endpoint.transport.peer_timeout_us = uint64_t{o.server_peer_timeout_ms} * 1000;
    sc.endpoint.max_messages = o.server_max_messages;
    sc.endpoint.ingress_capacity = o.server_max_messages;
    sc.shard_lcores = o.shard_lcores;
    sc.shard_core = o.shard_core;
    const uint64_t now = rte_rdtsc();
    server_ = std::make_unique<server::ServerNode>(ports, jw, sc, now);
    for (uint32_t w = 0; w < o.workers; ++w) {
      workers_.push_back(
          std::make_unique<TestWorker>(w, decls_, total, chunk_, *worker_if[w], server_at[w], now));
    }
  }

  server::ServerNode& server() { return *server_; }
  TestWorker& worker(uint32_t w) { return *workers_[w]; }
  /// Worker `w` is no longer polled: to the others it has died.
  void silence(uint32_t w) { silent_[w] = true; }
  uint32_t workers() const { return static_cast<uint32_t>(workers_.size()); }
  const std::vector<agg::TensorDecl>& decls() const { return decls_; }
  uint32_t chunk_bytes() const { return chunk_; }

  /// Polls everything until `done()` or `limit_s` seconds; false on time out.
  bool poll_until(const std::function<bool()>& done, double limit_s = 60) {
    const uint64_t deadline = rte_rdtsc() + static_cast<uint64_t>(limit_s * rte_get_tsc_hz());
    for (;;) {
      const uint64_t now = rte_rdtsc();
      server_->poll_st(now);
      if (hub_) hub_->forward();
      for (size_t w = 0; w < workers_.size(); ++w) {
        if (!silent_[w]) workers_[w]->node().poll_st(now);
      }
      if (done()) return true;
      if (now > deadline) return false;
    }
  }

  /// Every worker has received `n` control messages.
  bool each_has_control(size_t n) {
    return poll_until([&] {
      for (auto& w : workers_) {
        if (w->control().size() < n) return false;
      }
      return true;
    });
  }

  /// Declare, ready, rank 0's initial parameters (random), version 0 at
  /// every worker. Returns the initial parameters.
  std::vector<std::vector<float>> start(uint64_t seed = 1) {
    for (auto& w : workers_) w->declare();
    if (!each_has_control(1)) throw std::runtime_error("no answer to declare");
    for (auto& w : workers_) {
      const agg::ControlMessage& m = w->control().back();
      if (m.kind != agg::ControlKind::kReady) throw std::runtime_error("refused: " + m.text);
      if (m.fingerprint != w->table().fingerprint()) throw std::runtime_error("fingerprint");
    }
    std::mt19937 rng(static_cast<uint32_t>(seed));
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<std::vector<float>> init(decls_.size());
    for (size_t t = 0; t < decls_.size(); ++t) {
      for (float& p : workers_[0]->params()[t]) p = dist(rng);
      init[t] = workers_[0]->params()[t];
    }
    workers_[0]->push_all(wire::PacketType::kInit, 0);
    if (!poll_until([&] {
          for (auto& w : workers_) {
            if (!w->has_version(0)) return false;
          }
          return true;
        })) {
      throw std::runtime_error("initial parameters did not reach every worker");
    }
    return init;
  }

  /// One BSP round `r` from version r to r + 1: random gradients, push,
  /// wait, and compare every worker's parameters with the reference
  /// (rank-order sum, x 1/n, the optimizer) bit for bit. `reference` holds
  /// the parameters at version r and is moved to r + 1. Returns "" or what
  /// differs.
  std::string round(uint32_t r, std::vector<std::vector<float>>& reference, std::mt19937& rng) {
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    const float inv_n = 1.0f / static_cast<float>(workers());
    const float lr = options_.optimizer.learning_rate;
    for (size_t t = 0; t < decls_.size(); ++t) {
      for (auto& w : workers_) {
        for (float& g : w->grads()[t]) g = dist(rng);
      }
      for (uint64_t i = 0; i < decls_[t].elements; ++i) {
        float s = workers_[0]->grads()[t][i];
        for (uint32_t k = 1; k < workers(); ++k) s = s + workers_[k]->grads()[t][i];
        const float g = s * inv_n;
        reference[t][i] =
            options_.optimizer.kind == agg::OptimizerKind::kSumOnly ? g : reference[t][i] - lr * g;
      }
    }
    const uint64_t t0 = rte_rdtsc();
    for (auto& w : workers_) w->push_all(wire::PacketType::kData, r);
    const bool done = poll_until(
        [&] {
          for (auto& w : workers_) {
            if (!w->has_version(r + 1)) return false;
          }
          return true;
        },
        options_.round_limit_s);
    push_pull_ticks_ += rte_rdtsc() - t0;
    if (!done) {
      const server::ServerCounters c = server_->counters_st();
      std::string s = "round " + std::to_string(r) + " did not complete: updates " +
                      std::to_string(c.shards.updates) + ", refused " +
                      std::to_string(c.shards.refused) + ", held " + std::to_string(c.held);
      for (uint32_t w = 0; w < workers(); ++w) {
        s += "; w" + std::to_string(w) + (workers_[w]->has_version(r + 1) ? " done" : " missing");
      }
      for (uint32_t p = 0; p < server_->ports(); ++p) {
        transport::Endpoint& e = server_->endpoint(p);
        for (uint16_t q = 0; q < e.num_peers(); ++q) {
          const transport::EndpointPeerStats st = e.peer_stats_st(q);
          s += "; server->" + e.peer_spec(q).name + " outstanding " +
               std::to_string(st.outstanding) + " waiting_resend " +
               std::to_string(st.waiting_resend) + (st.dead ? " dead" : "");
        }
      }
      for (uint32_t w = 0; w < workers(); ++w) {
        const transport::EndpointPeerStats st = workers_[w]->node().endpoint().peer_stats_st(0);
        s += "; w" + std::to_string(w) + "->server outstanding " + std::to_string(st.outstanding) +
             " waiting_resend " + std::to_string(st.waiting_resend) + (st.dead ? " dead" : "");
      }
      for (uint32_t p = 0; p < server_->ports(); ++p) {
        const transport::EndpointCounters ec = server_->endpoint(p).counters_st();
        s += "; server port " + std::to_string(p) + " retransmit_stale " +
             std::to_string(
                 ec.drops[static_cast<size_t>(transport::EndpointDrop::kRetransmitStale)]) +
             " stashed " + std::to_string(ec.requeue_stashed);
      }
      return s;
    }
    return compare(reference, "round " + std::to_string(r));
  }

  /// "" when every worker's parameters equal `want` bit for bit.
  std::string compare(const std::vector<std::vector<float>>& want, const std::string& what) {
    for (uint32_t w = 0; w < workers(); ++w) {
      for (size_t t = 0; t < decls_.size(); ++t) {
        const auto& got = workers_[w]->params()[t];
        if (std::memcmp(got.data(), want[t].data(), got.size() * sizeof(float)) == 0) continue;
        size_t i = 0;
        while (std::memcmp(&got[i], &want[t][i], sizeof(float)) == 0) ++i;
        return what + ": worker " + std::to_string(w) + " tensor " + decls_[t].name + " element " +
               std::to_string(i) + " is " + std::to_string(got[i]) + ", expected " +
               std::to_string(want[t][i]);
      }
    }
    return "";
  }

  /// Seconds spent from the first push of a round to its last pull, summed.
  double push_pull_seconds() const {
    return static_cast<double>(push_pull_ticks_) / static_cast<double>(rte_get_tsc_hz());
  }

  /// Chunks of the whole model (every shard).
  uint64_t chunks() const {
    uint64_t n = 0;
    for (const agg::Partition& p : server_->placement_st()->partitions()) {
      n += (p.bytes() + chunk_ - 1) / chunk_;
    }
    return n;
  }

 private:
  JobOptions options_;
  std::vector<agg::TensorDecl> decls_;
  uint32_t chunk_ = 0;
  std::vector<std::unique_ptr<RingLink>> links_;
  std::unique_ptr<Hub> hub_;
  std::vector<bool> silent_ = std::vector<bool>(64, false);
  std::unique_ptr<server::ServerNode> server_;
  std::vector<std::unique_ptr<TestWorker>> workers_;
  uint64_t push_pull_ticks_ = 0;
};

}  // namespace mercury::pstest
