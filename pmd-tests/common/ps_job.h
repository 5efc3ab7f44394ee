// A whole parameter-server job in one process, for the PMD tests: server
// nodes built as ps-server builds them (the control-plane constructor: they
// wait for every rank's declare) and N workers, each the library's own
// worker (worker::PolledWorker: the public Worker, its net core polled by
// this thread instead of a thread of its own). So the server tests run the
// path a trainer runs: declare, ready, rank 0's initial parameters as
// version 0, push_pull, barrier, each checked by the worker itself.
//
// A rank may instead be a RawPeer: a bare transport endpoint on that rank's
// port that sends whatever control messages and packets a test wants (a
// misbehaving or malicious worker: a declare claiming another rank, a
// barrier sent twice, generations out of order, gradients to the wrong
// server). No honest rank is one.
//
// Topologies: one net_ring link per worker (one server node, a port per
// worker), or a switch (every node has one port; the switch forwards each
// frame to the port whose MAC it is for, a broadcast to all: the bridge of
// the multi-host test, in one process), which several server nodes need.
//
// Everything is polled from the calling thread (Job::poll_until). Test and
// benchmark code (benchmarks/ps/ps_bench runs its rounds on a Job): it
// allocates and throws freely. Its users build with pmd_job_dep, which
// gives MERCURY_MODELS_DIR and -ffp-contract=off (the reference rounds as
// lib/agg does).
#pragma once

#include <rte_cycles.h>

#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "../../apps/common/synthetic.h"
#include "agg/control.h"
#include "agg/placement.h"
#include "endpoint_config.h"
#include "mercury/worker.h"
#include "net/frame.h"
#include "net/interface.h"
#include "node/loop.h"
#include "ring_link.h"
#include "server/server_node.h"
#include "transport/endpoint.h"
#include "worker/attach.h"
#include "worker/tensor_table.h"

namespace mercury::pstest {

using pmdtest::RingLink;
using transport::EndpointConfig;
using transport::PeerSpec;

/// The text of model file `name` (config/models).
inline std::string read_model(const char* name) {
  return apps::read_file(std::string(MERCURY_MODELS_DIR) + "/" + name);
}

/// The model's shapes with every tensor divided by `divisor` (at least 1
/// element): the same tensor count, names and priorities, less data.
inline std::vector<agg::TensorDecl> scaled(std::vector<agg::TensorDecl> d, uint64_t divisor) {
  for (auto& t : d) t.elements = std::max<uint64_t>(1, t.elements / divisor);
  return d;
}

/// Every node's endpoint: every chunk update is one slice to each worker,
/// so many descriptors are in flight.
inline constexpr pmdtest::EndpointOptions kJobEndpoint = {.messages = 1 << 17};

/// The configuration of rank `rank` of `workers`, whose servers are
/// `servers` (job-file order), as a job file would give it.
inline worker::NetCoreConfig worker_config(uint32_t rank, uint32_t workers,
                                           std::vector<worker::ServerSpec> servers,
                                           uint32_t chunk_bytes, uint32_t epoch) {
  worker::NetCoreConfig c;
  c.rank = rank;
  c.workers = workers;
  c.servers = std::move(servers);
  c.chunk_bytes = chunk_bytes;
  // The node's index in a job file that lists the servers first.
  c.endpoint = pmdtest::endpoint_config(epoch, static_cast<uint16_t>(c.servers.size() + rank), {},
                                        kJobEndpoint);
  c.start_timeout_ms = 60'000;
  return c;
}

/// One honest rank: its parameters and gradients, declared to the
/// library's worker, whose net core Job::poll_until polls.
class TestWorker {
 public:
  TestWorker(const std::vector<agg::TensorDecl>& decls, net::Interface& iface,
             const worker::NetCoreConfig& config, node::Loop& loop)
      : polled_(iface, config) {
    polled_.attach(loop);
    params_.resize(decls.size());
    grads_.resize(decls.size());
    for (size_t t = 0; t < decls.size(); ++t) {
      params_[t].assign(decls[t].elements, 0.0f);
      grads_[t].assign(decls[t].elements, 0.0f);
      api().declare(decls[t].name, params_[t], static_cast<int>(decls[t].priority));
    }
  }

  worker::Worker& api() { return polled_.worker(); }
  worker::PolledWorker& polled() { return polled_; }
  std::vector<std::vector<float>>& params() { return params_; }
  std::vector<std::vector<float>>& grads() { return grads_; }

  /// The start (Worker::start_async): the same handle every time.
  worker::Handle start() { return api().start_async(); }
  /// push_pull of every tensor's gradient into its parameters, in
  /// declaration order; one handle per tensor.
  std::vector<worker::Handle> push_pull_all() {
    std::vector<worker::Handle> h;
    for (uint32_t t = 0; t < params_.size(); ++t)
      h.push_back(api().push_pull(t, grads_[t], params_[t]));
    return h;
  }
  /// The text of the failure that ended the worker (start() throws it whole).
  std::string failure() {
    try {
      api().start();
    } catch (const std::exception& e) {
      return e.what();
    }
    return "";
  }
  /// The worker's endpoint towards server `s`, for diagnostics ("" before start).
  std::string peer_state(uint16_t s) {
    const worker::NetCore* core = polled_.net_core();
    if (core == nullptr || core->endpoint_st() == nullptr) return "not started";
    const transport::EndpointPeerStats st = core->endpoint_st()->peer_stats_st(s);
    return "outstanding " + std::to_string(st.outstanding) + " waiting_resend " +
           std::to_string(st.waiting_resend) + (st.dead ? " dead" : "");
  }

 private:
  // Declared first: the worker, destroyed first, writes into them until it stops.
  std::vector<std::vector<float>> params_, grads_;
  worker::PolledWorker polled_;
};

/// A misbehaving rank: a bare transport endpoint on the rank's port (its
/// peers: every server node) that sends what the test asks and collects
/// the servers' control answers. The aggregated chunks sent to it are
/// acknowledged and dropped.
class RawPeer final : public transport::MessageReceiver, public node::Poller {
 public:
  RawPeer(uint32_t rank, const std::vector<agg::TensorDecl>& decls, uint32_t shards,
          uint32_t chunk_bytes, net::Interface& iface, std::vector<PeerSpec> servers,
          transport::Tick now)
      : rank_(rank) {
    params_.resize(decls.size());
    for (size_t t = 0; t < decls.size(); ++t) {
      params_[t].assign(decls[t].elements, 0.0f);
      table_.declare(decls[t].name, params_[t], static_cast<int>(decls[t].priority));
    }
    table_.freeze(shards, chunk_bytes);
    const auto sender = static_cast<uint16_t>(servers.size() + rank);
    endpoint_ = std::make_unique<transport::Endpoint>(
        iface,
        pmdtest::endpoint_config(static_cast<uint16_t>(0x700 + rank), sender, std::move(servers),
                                 kJobEndpoint),
        *this, now);
  }

  uint32_t poll_st(transport::Tick now) override { return endpoint_->poll_st(now); }
  /// What an honest worker would declare (priorities mapped onto levels).
  const std::vector<agg::TensorDecl>& declarations() const { return table_.declarations(); }
  const worker::TensorTable& table() const { return table_; }
  /// Control messages received so far, decoded, per server; the servers'
  /// heartbeats are only counted (heartbeats()), as a worker ignores them.
  std::vector<agg::ControlMessage>& control() { return control_; }
  [[nodiscard]] uint64_t heartbeats() const { return heartbeats_; }

  void send_control(const agg::ControlMessage& m, uint16_t server = 0) {
    out_.push_back(agg::encode_control(m));
    transport::MessageMeta meta;
    meta.type = wire::PacketType::kControl;
    meta.dtype = wire::Dtype::kBytes;
    if (endpoint_->send(server, out_.back().data(), static_cast<uint32_t>(out_.back().size()), 0,
                        meta, {}) != transport::SubmitStatus::kQueued) {
      throw std::runtime_error("control send refused");
    }
  }
  void declare(std::vector<agg::TensorDecl> tensors, uint32_t claimed_rank, uint16_t server = 0) {
    agg::ControlMessage m;
    m.kind = agg::ControlKind::kDeclare;
    m.rank = claimed_rank;
    m.tensors = std::move(tensors);
    send_control(m, server);
  }
  void declare(uint16_t server = 0) { declare(declarations(), rank_, server); }
  void barrier(uint64_t generation, uint16_t server = 0) {
    agg::ControlMessage m;
    m.kind = agg::ControlKind::kBarrier;
    m.rank = rank_;
    m.generation = generation;
    send_control(m, server);
  }
  /// Every block of every tensor (zeros) as `type` packets of
  /// `iteration`, all to `server`, whichever shard owns them.
  void push_all(wire::PacketType type, uint32_t iteration, uint16_t server = 0) {
    for (uint32_t t = 0; t < table_.tensors(); ++t) {
      for (const worker::BlockGeometry& p : table_.blocks(t)) {
        transport::MessageMeta meta;
        meta.type = type;
        meta.dtype = wire::Dtype::kFloat32;
        meta.block_key = p.key;
        meta.iteration = iteration;
        const auto* data = reinterpret_cast<const std::byte*>(params_[t].data() + p.first_element);
        if (endpoint_->send(server, data, static_cast<uint32_t>(p.bytes()), table_.tensor(t).level,
                            meta, {}) != transport::SubmitStatus::kQueued) {
          throw std::runtime_error("push refused");
        }
      }
    }
  }

  std::byte* on_message_begin(uint16_t, const wire::HeaderFields& h) override {
    in_.emplace_back(h.msg_len);
    return in_.back().data();
  }
  void on_message_complete(uint16_t, const wire::HeaderFields& h, std::byte* buffer) override {
    agg::ControlMessage m = agg::decode_control({buffer, h.msg_len});
    if (m.kind == agg::ControlKind::kHeartbeat) {
      ++heartbeats_;
      return;
    }
    control_.push_back(std::move(m));
  }

 private:
  uint32_t rank_;
  uint64_t heartbeats_ = 0;
  std::vector<std::vector<float>> params_;
  worker::TensorTable table_;
  std::unique_ptr<transport::Endpoint> endpoint_;
  std::deque<std::vector<std::byte>> out_, in_;
  std::vector<agg::ControlMessage> control_;
};

struct JobOptions {
  const char* model = "mobilenet_v2.txt";
  uint64_t scale_down = 1;  ///< tensors divided by this
  uint32_t workers = 4;
  /// Per server node of the job, its shard count; more than one needs `hub`.
  std::vector<uint32_t> job_shards = {2};
  bool hub = false;  ///< one port per node, all joined by a RingSwitch (else a link per worker)
  net::LinkParams impair;              ///< on every worker's link (not with the hub)
  uint32_t link_mbufs = 8191;          ///< each end of each worker's link
  uint32_t link_mbuf_cache = 64;       ///< ... and its pool's per-lcore cache
  std::vector<unsigned> shard_lcores;  ///< server 0's
  server::ShardCoreOptions shard_core = {.ring_entries = 1 << 15};  ///< more than every RX pool
  agg::OptimizerConfig optimizer = {.kind = agg::OptimizerKind::kSgd, .learning_rate = 0.1f};
  uint32_t server_max_messages = 1 << 17;  ///< per server endpoint (descriptors and ingress)
  double round_limit_s = 60;  ///< a round that takes longer fails, with the transport's state
  uint32_t server_peer_timeout_ms = 20'000;  ///< the server gives up on a silent worker after this
  /// A worker's new epoch is a restart once its old incarnation leaves the
  /// server's challenge unanswered this long (0: a quarter of the above).
  uint32_t server_challenge_timeout_ms = 0;
  std::set<uint32_t> raw_ranks;     ///< ranks that are RawPeers, not workers
  uint32_t unit_chunks = 0;         ///< store-and-forward unit (ServerNodeConfig::unit_chunks)
  agg::PlacementOptions placement;  ///< how every node cuts the tensors into blocks
  /// The model as rank r read it (default: everyone the same).
  std::function<void(uint32_t rank, std::vector<agg::TensorDecl>&)> model_of;
};

inline constexpr uint32_t kMtu = 1500;

/// Server nodes and their workers, wired up and polled from this thread.
class Job {
 public:
  explicit Job(const JobOptions& o) : options_(o) {
    static int serial = 0;
    id_ = serial++;
    decls_ = scaled(agg::parse_model_shapes(read_model(o.model)), o.scale_down);
    chunk_ = net::payload_per_packet(kMtu);
    const auto servers = static_cast<uint32_t>(o.job_shards.size());
    if (servers > 1 && !o.hub) throw std::invalid_argument("several server nodes need the hub");
    for (uint32_t s : o.job_shards) total_shards_ += s;
    std::vector<std::vector<net::PacketPort*>> ports(servers);
    std::vector<server::JobWorker> jw;
    const auto net = static_cast<uint8_t>(100 + id_);
    if (o.hub) {
      switch_ = std::make_unique<pmdtest::RingSwitch>("job" + std::to_string(id_),
                                                      pmdtest::SwitchOptions{.mtu = kMtu});
      for (uint32_t s = 0; s < servers; ++s) {
        ports[s].push_back(
            &switch_
                 ->attach(std::to_string(s), {.mtu = kMtu, .mbufs = 8191}, server_ip(net, s), 47100)
                 .iface());
      }
      for (uint32_t w = 0; w < o.workers; ++w) {
        jw.push_back({{"w" + std::to_string(w), worker_ip(net, w), 47101}, 0});
        worker_if_.push_back(&switch_
                                  ->attach(std::to_string(servers + w),
                                           {.mtu = kMtu, .mbufs = 4095}, worker_ip(net, w), 47101)
                                  .iface());
        std::vector<worker::ServerSpec> at;
        for (uint32_t s = 0; s < servers; ++s) {
          at.push_back({{"ps" + std::to_string(s), server_ip(net, s), 47100}, o.job_shards[s]});
        }
        servers_of_.push_back(std::move(at));
      }
    } else {
      for (uint32_t w = 0; w < o.workers; ++w) {
        net::LinkParams p = o.impair;
        p.seed = o.impair.seed + w;
        const auto n = static_cast<uint8_t>(w);
        links_.push_back(std::make_unique<RingLink>(
            "job" + std::to_string(id_) + "_" + std::to_string(w), n,
            pmdtest::RingLinkOptions{.end = {.mtu = kMtu,
                                             .mbufs = o.link_mbufs,
                                             .mbuf_cache = o.link_mbuf_cache,
                                             .impair = p}}));
        ports[0].push_back(&links_.back()->a());
        jw.push_back({{"w" + std::to_string(w), RingLink::ip_b(n), 47101}, w});
        worker_if_.push_back(&links_.back()->b());
        servers_of_.push_back({{{"ps0", RingLink::ip_a(n), 47100}, o.job_shards[0]}});
      }
    }
    const uint64_t now = rte_rdtsc();
    for (uint32_t s = 0; s < servers; ++s) {
      server::ServerNodeConfig sc;
      sc.chunk_bytes = chunk_;
      sc.optimizer = o.optimizer;
      sc.unit_chunks = o.unit_chunks;
      sc.placement = o.placement;
      sc.layout = job::ShardLayout::of(o.job_shards);
      sc.server_index = s;
      sc.endpoint = pmdtest::endpoint_config(static_cast<uint16_t>(3 + s), static_cast<uint16_t>(s),
                                             {}, kJobEndpoint);
      sc.endpoint.transport.peer_timeout_us = uint64_t{o.server_peer_timeout_ms} * 1000;
      sc.endpoint.transport.challenge_timeout_us = uint64_t{o.server_challenge_timeout_ms} * 1000;
      sc.endpoint.max_messages = o.server_max_messages;
      sc.endpoint.ingress_capacity = o.server_max_messages;
      if (s == 0) sc.shard_lcores = o.shard_lcores;
      sc.shard_core = o.shard_core;
      servers_.push_back(std::make_unique<server::ServerNode>(ports[s], jw, sc, now));
      servers_.back()->attach(loop_);
    }
    if (switch_) {
      switch_poller_ = std::make_unique<SwitchPoller>(*switch_);
      loop_.add(*switch_poller_);
    }
    workers_.resize(o.workers);
    raw_.resize(o.workers);
    silent_.assign(o.workers, false);
    for (uint32_t w = 0; w < o.workers; ++w) {
      if (o.raw_ranks.count(w) != 0) {
        std::vector<PeerSpec> peers;
        for (const worker::ServerSpec& s : servers_of_[w]) peers.push_back(s.peer);
        raw_[w] = std::make_unique<RawPeer>(w, decls_, total_shards_, chunk_, *worker_if_[w],
                                            std::move(peers), now);
        loop_.add(*raw_[w]);
      } else {
        replace_worker(w, worker_config(w));
      }
    }
  }
  ~Job() {
    // The workers first, one by one (a worker's shutdown runs the loop, so
    // everything else runs while it waits for its leave to be
    // acknowledged), then the servers, then the ports.
    // (A silenced worker's shutdown puts its net core back on the loop.)
    for (auto& w : workers_) w.reset();
    workers_.clear();
    for (auto& r : raw_) {
      if (r && !silent_[&r - raw_.data()]) loop_.remove(*r);
    }
    raw_.clear();
    servers_.clear();
  }

  static uint32_t server_ip(uint8_t net, uint32_t s) {
    return (0x0a010001u | uint32_t{net} << 8) + s;
  }
  static uint32_t worker_ip(uint8_t net, uint32_t w) {
    return (0x0a010000u | uint32_t{net} << 8) + 10 + w;
  }

  server::ServerNode& server(uint32_t s = 0) { return *servers_[s]; }
  /// The loop every node of the job is a poller of.
  node::Loop& loop() { return loop_; }
  /// Rank `w`'s link to the server (not with the hub).
  RingLink& link(uint32_t w) { return *links_[w]; }
  TestWorker& worker(uint32_t w) { return *workers_[w]; }
  RawPeer& raw(uint32_t w) { return *raw_[w]; }
  /// Rank `w` is no longer polled: to the others it has died.
  void silence(uint32_t w) {
    if (silent_[w]) return;
    silent_[w] = true;
    if (workers_[w] && workers_[w]->polled().net_core() != nullptr) {
      loop_.remove(*workers_[w]->polled().net_core());
    }
    if (raw_[w]) loop_.remove(*raw_[w]);
  }
  uint32_t workers() const { return options_.workers; }
  const std::vector<agg::TensorDecl>& decls() const { return decls_; }
  uint32_t chunk_bytes() const { return chunk_; }

  /// The configuration rank `w` is given (a fresh epoch each call).
  worker::NetCoreConfig worker_config(uint32_t w) {
    worker::NetCoreConfig c = pstest::worker_config(w, options_.workers, servers_of_[w], chunk_,
                                                    5 + w + 16 * ++incarnations_);
    c.placement = options_.placement;
    return c;
  }
  /// Rank `w`'s worker process (re)starts with `config`: the old one, if
  /// any, is shut down; the new one declares the model as its rank reads it.
  void replace_worker(uint32_t w, const worker::NetCoreConfig& config) {
    workers_[w].reset();
    std::vector<agg::TensorDecl> decls = decls_;
    if (options_.model_of) options_.model_of(w, decls);
    // While it stops, the rest of the job runs on (its shutdown runs the
    // loop until the servers acknowledged its leave).
    workers_[w] = std::make_unique<TestWorker>(decls, *worker_if_[w], config, loop_);
    silent_[w] = false;
  }

  /// One pass of everything (the loop of every node of the job).
  void poll_all(transport::Tick now) { loop_.pass_st(now); }

  /// Polls everything until `done()` or `limit_s` seconds; false on time out.
  bool poll_until(const std::function<bool()>& done, double limit_s = 60) {
    const uint64_t deadline = rte_rdtsc() + static_cast<uint64_t>(limit_s * rte_get_tsc_hz());
    for (;;) {
      const uint64_t now = rte_rdtsc();
      poll_all(now);
      if (done()) return true;
      if (now > deadline) return false;
    }
  }
  /// Polls until every handle in `hs` is complete.
  bool wait(const std::vector<worker::Handle>& hs, double limit_s = 60) {
    return poll_until(
        [&] {
          for (const worker::Handle& h : hs) {
            if (!h.ready()) return false;
          }
          return true;
        },
        limit_s);
  }

  /// A barrier of every worker (barrier_async), polled until done: "" or
  /// the first failure.
  std::string barrier() {
    std::vector<worker::Handle> hs;
    for (auto& w : workers_) hs.push_back(w->api().barrier_async());
    if (!wait(hs)) return "the barrier did not complete";
    for (const worker::Handle& h : hs) {
      if (!h.ok()) return "barrier: " + std::string(h.error());
    }
    return "";
  }

  /// Every worker starts (rank 0's parameters random: they become version
  /// 0) and is polled until started; throws with the reason otherwise.
  /// Returns the initial parameters.
  std::vector<std::vector<float>> start(uint64_t seed = 1) {
    if (!options_.raw_ranks.empty()) throw std::logic_error("Job::start: raw ranks cannot start");
    std::mt19937 rng(static_cast<uint32_t>(seed));
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<std::vector<float>> init(decls_.size());
    for (size_t t = 0; t < decls_.size(); ++t) {
      for (float& p : workers_[0]->params()[t]) p = dist(rng);
      init[t] = workers_[0]->params()[t];
    }
    std::vector<worker::Handle> started;
    for (auto& w : workers_) started.push_back(w->start());
    if (!wait(started)) throw std::runtime_error("the workers did not start");
    for (auto& w : workers_) {
      if (!w->start().ok()) throw std::runtime_error(w->failure());
    }
    return init;
  }

  /// One BSP round `r` from version r to r + 1: random gradients, every
  /// worker's push_pull of every tensor, and every worker's parameters
  /// compared with the reference (rank-order sum, x 1/n, the optimizer) bit
  /// for bit. `reference` holds the parameters at version r and is moved to
  /// r + 1. Returns "" or what differs.
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
    if (std::string failed = push_pull("round " + std::to_string(r)); !failed.empty()) {
      return failed;
    }
    return compare(reference, "round " + std::to_string(r));
  }

  /// Every worker's push_pull of every tensor (the gradients as they are),
  /// polled until all have completed: "" or what went wrong (`what` first).
  /// A benchmark's round; round() checks the result too.
  std::string push_pull(const std::string& what) {
    const uint64_t t0 = rte_rdtsc();
    std::vector<std::vector<worker::Handle>> pending;
    for (auto& w : workers_) pending.push_back(w->push_pull_all());
    const bool done = poll_until(
        [&] {
          for (const auto& hs : pending) {
            for (const worker::Handle& h : hs) {
              if (!h.ready()) return false;
            }
          }
          return true;
        },
        options_.round_limit_s);
    push_pull_ticks_ += rte_rdtsc() - t0;
    if (!done) return stalled(what, pending);
    for (uint32_t w = 0; w < workers(); ++w) {
      for (const worker::Handle& h : pending[w]) {
        if (!h.ok()) return what + ": w" + std::to_string(w) + ": " + std::string(h.error());
      }
    }
    return "";
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
  uint64_t chunks() const { return units(1); }
  /// The model's blocks cut into units of `n` chunks (the last of a block shorter).
  uint64_t units(uint64_t n) const {
    uint64_t u = 0;
    for (const agg::Block& p : servers_[0]->placement_st()->blocks()) {
      const uint64_t c = (p.bytes() + chunk_ - 1) / chunk_;
      u += (c + n - 1) / n;
    }
    return u;
  }

 private:
  // Why a round did not complete: the servers' and the workers' transport state.
  std::string stalled(const std::string& what,
                      const std::vector<std::vector<worker::Handle>>& pending) {
    std::string s = what + " did not complete";
    for (auto& node : servers_) {
      const server::ServerCounters c = node->counters_st();
      s += ": updates " + std::to_string(c.shards.updates) + ", refused " +
           std::to_string(c.shards.refused) + ", held " + std::to_string(c.held);
      for (uint32_t p = 0; p < node->ports(); ++p) {
        transport::Endpoint& e = node->endpoint(p);
        for (uint16_t q = 0; q < e.num_peers(); ++q) {
          const transport::EndpointPeerStats st = e.peer_stats_st(q);
          s += "; server->" + e.peer_spec(q).name + " outstanding " +
               std::to_string(st.outstanding) + " waiting_resend " +
               std::to_string(st.waiting_resend) + (st.dead ? " dead" : "");
        }
        const transport::EndpointCounters ec = e.counters_st();
        s += "; server port " + std::to_string(p) + " retransmit_stale " +
             std::to_string(ec.drop(transport::EndpointDrop::kRetransmitStale)) + " stashed " +
             std::to_string(ec.requeue_stashed);
      }
    }
    for (uint32_t w = 0; w < workers(); ++w) {
      uint32_t missing = 0;
      for (const worker::Handle& h : pending[w]) missing += h.ready() ? 0 : 1;
      s += "; w" + std::to_string(w) + " " + std::to_string(missing) + " pending, ->server " +
           workers_[w]->peer_state(0);
    }
    return s;
  }

  // The switch's forwarding, a poller of the job's loop.
  struct SwitchPoller final : node::Poller {
    explicit SwitchPoller(pmdtest::RingSwitch& s) : sw(s) {}
    uint32_t poll_st(node::Tick) override {
      sw.forward();
      return 0;
    }
    pmdtest::RingSwitch& sw;
  };

  // First: every node's pollers are on it until they are destroyed.
  node::Loop loop_{{.tick_hz = rte_get_tsc_hz()}};
  JobOptions options_;
  int id_ = 0;
  std::vector<agg::TensorDecl> decls_;
  uint32_t chunk_ = 0;
  uint32_t total_shards_ = 0;
  uint32_t incarnations_ = 0;
  std::vector<std::unique_ptr<RingLink>> links_;
  std::unique_ptr<pmdtest::RingSwitch> switch_;
  std::unique_ptr<SwitchPoller> switch_poller_;
  std::vector<net::Interface*> worker_if_;  // per rank
  std::vector<std::vector<worker::ServerSpec>>
      servers_of_;  // per rank: the servers as it sees them
  std::vector<std::unique_ptr<server::ServerNode>> servers_;
  std::vector<std::unique_ptr<TestWorker>> workers_;  // null for raw ranks
  std::vector<std::unique_ptr<RawPeer>> raw_;         // null for workers
  std::vector<bool> silent_;
  uint64_t push_pull_ticks_ = 0;
};

}  // namespace mercury::pstest
