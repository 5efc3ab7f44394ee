// The server's flow control (docs/server.md, "Flow control") with one worker
// a whole round ahead of the other, as separate hosts at different speeds
// are. The server's port receives into its own small pool (frames are copied
// into it, as net_af_packet and net_memif do), much smaller than what the
// fast worker's round would have the chunk tables hold. Without flow
// control this deadlocks: the held contributions empty the pool, the slow
// worker's packets (which complete the sets) can no longer be received, nor
// anything sent. With the server's default staging, the fast worker's
// packets beyond the limit are copied into the chunk tables' staging chunks
// and their mbufs freed: nothing is refused. Without staging (or with too
// little), they are refused unacknowledged and resent. Either way every
// round completes bit for bit, and the aggregation path never owns more than
// the limit (plus the copies on their way to a shard core) while only one
// worker pushes. The workers are the library's (ps_job.h); inline shards
// and shard cores (lcores 1 and 2).
#include <gtest/gtest.h>
#include <rte_cycles.h>

#include <algorithm>
#include <cstdio>
#include <deque>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "pmd_env.h"
#include "ps_job.h"

namespace mercury {
namespace {

using pstest::TestWorker;

constexpr uint32_t kMtu = 1500;
constexpr uint32_t kServerPool = 2047;  // mobilenet_v2 has ~9 900 chunks
constexpr uint32_t kWorkerPool = 8191;

// One server port and a port per worker on a switch that copies every frame
// into the receiving end's own pool (pmdtest::SwitchOptions::copy_to_receiver),
// so what the server holds comes out of its port's pool, and a full pool
// drops frames as a NIC does.
class CopyingHub {
 public:
  CopyingHub(const std::string& name, uint32_t workers)
      : switch_("bp" + name, {.mtu = kMtu, .copy_to_receiver = true}) {
    server_ = &switch_.attach("s", {.mtu = kMtu, .mbufs = kServerPool, .mbuf_cache = 32},
                              server_ip(), 47100);
    for (uint32_t w = 0; w < workers; ++w) {
      workers_.push_back(&switch_.attach("w" + std::to_string(w),
                                         {.mtu = kMtu, .mbufs = kWorkerPool}, worker_ip(w), 47101));
    }
  }

  static uint32_t server_ip() { return 0x0a4d0001u; }
  static uint32_t worker_ip(uint32_t w) { return 0x0a4d0010u + w; }
  net::Interface& server() { return server_->iface(); }
  net::Interface& worker(uint32_t w) { return workers_[w]->iface(); }
  uint64_t rx_pool_empty() const { return switch_.rx_pool_empty(); }
  /// Moves every queued frame (the links are faster than the nodes: no
  /// frame waits in a TX ring, which would hold the sender's mbufs as a
  /// NIC's TX ring never holds more than its descriptors).
  void forward() { switch_.forward(); }

 private:
  pmdtest::RingSwitch switch_;
  pmdtest::LinkEnd* server_ = nullptr;
  std::vector<pmdtest::LinkEnd*> workers_;
};

class AheadJob {
 public:
  AheadJob(const std::string& name, uint32_t workers, std::vector<unsigned> shard_lcores,
           uint64_t staging)
      : hub_(name, workers) {
    decls_ = agg::parse_model_shapes(pstest::read_model("mobilenet_v2.txt"));
    chunk_ = net::payload_per_packet(kMtu);
    std::vector<server::JobWorker> jw;
    for (uint32_t w = 0; w < workers; ++w) {
      jw.push_back({{"w" + std::to_string(w), CopyingHub::worker_ip(w), 47101}, 0});
    }
    server::ServerNodeConfig sc;
    sc.chunk_bytes = chunk_;
    sc.optimizer = optimizer_;
    sc.layout = job::ShardLayout::of({2});
    sc.endpoint = pmdtest::endpoint_config(3, 0, {}, pstest::kJobEndpoint);
    sc.shard_lcores = std::move(shard_lcores);
    sc.shard_core = {.ring_entries = 1 << 15};
    sc.staging_chunks = staging;
    server_ = std::make_unique<server::ServerNode>(std::vector<net::PacketPort*>{&hub_.server()},
                                                   jw, sc, rte_rdtsc());
    server_->attach(loop_);
    loop_.add(hub_poller_);
    for (uint32_t w = 0; w < workers; ++w) {
      const worker::NetCoreConfig c =
          pstest::worker_config(w, workers, {{{"ps", CopyingHub::server_ip(), 47100}, 2}}, chunk_,
                                static_cast<uint16_t>(5 + w));
      workers_.push_back(std::make_unique<TestWorker>(decls_, hub_.worker(w), c, loop_));
    }
  }
  ~AheadJob() { workers_.clear(); }  // before the server and the hub

  server::ServerNode& server() { return *server_; }
  CopyingHub& hub() { return hub_; }
  uint64_t chunks() const {
    uint64_t n = 0;
    for (const agg::Block& p : server_->placement_st()->blocks()) {
      n += (p.bytes() + chunk_ - 1) / chunk_;
    }
    return n;
  }
  uint64_t backpressure() {
    return server_->endpoint(0)
        .counters_st()
        .drops[static_cast<size_t>(transport::EndpointDrop::kBackpressure)];
  }
  uint64_t most_owned_alone() const { return most_owned_alone_; }

  // Polls everything until `done()`; with `only_w0`, records the most mbufs
  // the aggregation path owned after each pass. False after 120 s (a
  // deadlock).
  template <typename Done>
  bool poll_until(Done done, bool only_w0 = false) {
    const uint64_t deadline = rte_rdtsc() + 120 * rte_get_tsc_hz();
    for (;;) {
      const uint64_t now = rte_rdtsc();
      loop_.pass_st(now);
      if (only_w0)
        most_owned_alone_ = std::max(most_owned_alone_, server_->aggregation_mbufs_st(0));
      if (done()) return true;
      if (now > deadline) return false;
    }
  }
  static bool all_ready(const std::vector<worker::Handle>& hs) {
    return std::all_of(hs.begin(), hs.end(), [](const worker::Handle& h) { return h.ready(); });
  }

  void start() {
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    reference_.resize(decls_.size());
    for (size_t t = 0; t < decls_.size(); ++t) {
      for (float& p : workers_[0]->params()[t]) p = dist(rng);
      reference_[t] = workers_[0]->params()[t];
    }
    std::vector<worker::Handle> started;
    for (auto& w : workers_) started.push_back(w->start());
    ASSERT_TRUE(poll_until([&] { return all_ready(started); }));
    for (size_t w = 0; w < workers_.size(); ++w) {
      ASSERT_TRUE(started[w].ok()) << workers_[w]->failure();
    }
  }

  // Round r: worker 0 push_pulls the whole round and runs until the server
  // refuses its packets, or with `whole` until the server took all of them;
  // only then do the others. Returns "" or what went wrong.
  std::string round(uint32_t r, std::mt19937& rng, bool whole) {
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    const float inv_n = 1.0f / static_cast<float>(workers_.size());
    for (size_t t = 0; t < decls_.size(); ++t) {
      for (auto& w : workers_) {
        for (float& g : w->grads()[t]) g = dist(rng);
      }
      for (uint64_t i = 0; i < decls_[t].elements; ++i) {
        float s = workers_[0]->grads()[t][i];
        for (size_t k = 1; k < workers_.size(); ++k) s = s + workers_[k]->grads()[t][i];
        reference_[t][i] = reference_[t][i] - optimizer_.learning_rate * (s * inv_n);
      }
    }
    const uint64_t refused_before = backpressure();
    const uint64_t taken_before = server_->counters_st().shards.contributions;
    std::vector<worker::Handle> pending = workers_[0]->push_pull_all();
    if (whole) {
      if (!poll_until(
              [&] {
                return server_->counters_st().shards.contributions >= taken_before + chunks();
              },
              true)) {
        return "round " + std::to_string(r) + ": the server never took worker 0's whole round";
      }
    } else if (!poll_until([&] { return backpressure() > refused_before; }, true)) {
      return "round " + std::to_string(r) + ": worker 0 alone was never refused";
    }
    for (size_t k = 1; k < workers_.size(); ++k) {
      const std::vector<worker::Handle> h = workers_[k]->push_pull_all();
      pending.insert(pending.end(), h.begin(), h.end());
    }
    if (!poll_until([&] { return all_ready(pending); })) {
      const server::ServerCounters c = server_->counters_st();
      return "round " + std::to_string(r) + " did not complete: held " + std::to_string(c.held) +
             ", aggregation mbufs " + std::to_string(c.aggregation_mbufs) + ", pool empty " +
             std::to_string(hub_.rx_pool_empty());
    }
    for (const worker::Handle& h : pending) {
      if (!h.ok()) return "round " + std::to_string(r) + ": " + std::string(h.error());
    }
    for (uint32_t w = 0; w < workers_.size(); ++w) {
      for (size_t t = 0; t < decls_.size(); ++t) {
        const auto& got = workers_[w]->params()[t];
        if (std::memcmp(got.data(), reference_[t].data(), got.size() * sizeof(float)) != 0) {
          return "round " + std::to_string(r) + ": worker " + std::to_string(w) + " tensor " +
                 decls_[t].name + " differs from the reference";
        }
      }
    }
    return "";
  }

 private:
  // The hub's forwarding, a poller of the job's loop.
  struct HubPoller final : node::Poller {
    explicit HubPoller(CopyingHub& h) : hub(h) {}
    uint32_t poll_st(node::Tick) override {
      hub.forward();
      return 0;
    }
    CopyingHub& hub;
  };
  node::Loop loop_{{.tick_hz = rte_get_tsc_hz()}};  // first: every poller is on it until it goes
  CopyingHub hub_;
  HubPoller hub_poller_{hub_};
  std::vector<agg::TensorDecl> decls_;
  uint32_t chunk_ = 0;
  agg::OptimizerConfig optimizer_ = {.kind = agg::OptimizerKind::kSgd, .learning_rate = 0.1f};
  std::unique_ptr<server::ServerNode> server_;
  std::vector<std::unique_ptr<TestWorker>> workers_;
  std::vector<std::vector<float>> reference_;
  uint64_t most_owned_alone_ = 0;
};

// `staging`: the server's staging chunks per shard (ServerNodeConfig::staging_chunks).
void run_ahead(const std::string& name, uint32_t workers, std::vector<unsigned> lcores,
               uint64_t staging) {
  const bool cores = !lcores.empty();
  const bool stages_all = staging == agg::kStagingMost;
  AheadJob job(name, workers, std::move(lcores), staging);
  job.start();
  if (::testing::Test::HasFatalFailure()) return;
  const uint64_t limit = job.server().flow_limit_st(0);
  // The pool is far smaller than one worker's round: without flow control
  // the fast worker alone would fill it.
  ASSERT_GT(limit, 0u);
  ASSERT_LT(limit, kServerPool);
  ASSERT_GT(job.chunks(), 4 * uint64_t{kServerPool});
  std::mt19937 rng(5);
  constexpr uint32_t kRounds = 3;
  const uint64_t t0 = rte_rdtsc();
  for (uint32_t r = 0; r < kRounds; ++r) ASSERT_EQ(job.round(r, rng, stages_all), "");
  const double s = static_cast<double>(rte_rdtsc() - t0) / static_cast<double>(rte_get_tsc_hz());
  // While worker 0 pushed alone, the aggregation path never owned more than
  // the limit (nothing could join its sets), but for copies on their way.
  const uint64_t in_flight = job.server().copy_budget_st(0);
  EXPECT_LE(job.most_owned_alone(), limit + in_flight);
  EXPECT_GE(job.most_owned_alone(), limit);  // ... and it did reach it
  const uint64_t refused = job.backpressure();
  job.server().stop();
  const server::ServerCounters c = job.server().counters_st();
  const uint64_t copied = c.table.count(agg::Outcome::kCopied);
  if (stages_all) {
    // Worker 0's whole round was taken, the part over the limit as copies.
    EXPECT_EQ(refused, 0u);
    EXPECT_GT(copied, 0u);
    EXPECT_EQ(c.table.staging_full, 0u);
  } else {
    EXPECT_GT(refused, 0u);
    if (staging == 0) {
      EXPECT_EQ(copied, 0u);
    } else {
      EXPECT_GT(copied, 0u);
    }
  }
  EXPECT_EQ(c.shards.updates, job.chunks() * (kRounds + 1));
  EXPECT_EQ(c.held, 0u);
  EXPECT_EQ(c.aggregation_mbufs, 0u);  // every handed mbuf counted back
  EXPECT_EQ(c.drop(server::ServerDrop::kShardRingFull), 0u);
  EXPECT_EQ(c.shards.fanout_lost, 0u);
  std::printf(
      "%u workers, %s: %u rounds of mobilenet_v2 (%lu chunks), server pool %u, flow limit %lu: "
      "%.2f s; "
      "%lu packets refused (backpressure), %lu copied, %lu frames dropped for an empty pool, %lu "
      "server retransmissions\n",
      workers, cores ? "shard cores" : "inline shards", kRounds,
      static_cast<unsigned long>(job.chunks()), kServerPool, static_cast<unsigned long>(limit), s,
      static_cast<unsigned long>(refused), static_cast<unsigned long>(copied),
      static_cast<unsigned long>(job.hub().rx_pool_empty()),
      static_cast<unsigned long>(c.net.tx_retransmits));
}

// The default: every set can be staged, nothing is refused.
TEST(PsBackpressure, WorkerARoundAheadIsCopiedNotRefusedInlineShards) {
  run_ahead("si", 2, {}, agg::kStagingMost);
}

TEST(PsBackpressure, WorkerARoundAheadIsCopiedNotRefusedShardCores) {
  run_ahead("sc", 2, {1, 2}, agg::kStagingMost);
}

TEST(PsBackpressure, WorkerARoundAheadOfTwoOthersIsCopiedNotRefusedShardCores) {
  run_ahead("s3", 3, {1, 2}, agg::kStagingMost);
}

// No staging: over the limit, refusals.
TEST(PsBackpressure, WorkerARoundAheadInlineShards) { run_ahead("in", 2, {}, 0); }

TEST(PsBackpressure, WorkerARoundAheadShardCores) { run_ahead("co", 2, {1, 2}, 0); }

// Three workers: the two that follow join worker 0's sets (admitted over
// the limit, which is half the pool's share here so that the joins fit), one
// of them completes each.
TEST(PsBackpressure, WorkerARoundAheadOfTwoOthersShardCores) { run_ahead("c3", 3, {1, 2}, 0); }

// Too little staging (a tenth of one worker's round): copies until it is
// used up, then refusals; still no deadlock and every round exact.
TEST(PsBackpressure, WorkerARoundAheadWithLittleStagingInlineShards) {
  run_ahead("li", 2, {}, 1000);
}

}  // namespace
}  // namespace mercury

int main(int argc, char** argv) {
  return mercury::pmdtest::run_all_tests(argc, argv, {"--lcores=0@0,1@1,2@1"});
}
