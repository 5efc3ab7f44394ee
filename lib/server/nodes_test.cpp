// A whole job without EAL: one ServerNode and 2-4 workers (the library's
// Worker, its NetCore a poller of the same node::Loop), every link a pair of
// net::MemoryPorts, one thread, a fake clock. What the PMD tests check over
// real DPDK ports, checked here on the node layer alone: a BSP round exact
// against the reference, a mismatched declare refused, a silent worker named
// by liveness, loss and reordering recovered bit for bit, PS+'s eager pull,
// a start that no server answers, every buffer back in its pool at the end,
// and a wrong-thread call aborting.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "job/job.h"
#include "net/memory_port.h"
#include "node/loop.h"
#include "server/server_node.h"
#include "transport/test_util.h"
#include "worker/attach.h"

namespace mercury {
namespace {

constexpr uint64_t kHz = transport::test::kHz;  // 1 tick = 1 ns
constexpr uint64_t kUs = transport::test::kUs;
constexpr uint64_t kMs = transport::test::kMs;
constexpr uint32_t kMtu = 1500;
constexpr uint32_t kShards = 2;
constexpr float kLr = 0.25f;

// The fake clock: every read moves it on by a microsecond, so a loop that
// only polls (a worker's shutdown) still sees time pass.
std::atomic<uint64_t> g_now{kMs};
node::Tick tick() { return g_now.fetch_add(kUs) + kUs; }

net::LocalAddr address(uint32_t r, uint8_t host) {
  return net::LocalAddr{net::MacAddr{{0x02, 0, 0, 0, static_cast<uint8_t>(r), host}},
                        0x0a000000u | r << 8 | host, static_cast<uint16_t>(47100 + host)};
}

transport::EndpointConfig endpoint(uint32_t epoch, uint16_t id) {
  transport::EndpointConfig c;
  c.transport = transport::test::test_config(64);
  c.local_epoch = epoch;
  c.sender_id = id;
  c.max_messages = 4096;
  c.ingress_capacity = 4096;
  return c;
}

const std::vector<agg::TensorDecl> kModel = {
    {"conv1.weight", 1728, 0}, {"conv1.bias", 64, 1}, {"fc.weight", 5000, 2}, {"fc.bias", 10, 3}};

struct Options {
  uint32_t workers = 4;
  config::Sync sync = config::Sync::kBsp;
  net::MemoryLinkParams impair;  // every link, both ways (seeds differ per link)
  std::vector<agg::TensorDecl> model = kModel;
  uint32_t odd_rank = UINT32_MAX;  // declares a different fc.weight
  uint32_t start_timeout_ms = 2'000;
};

// One rank: its buffers, declared to the library's worker.
struct Rank {
  std::vector<std::vector<float>> params, grads;
  std::unique_ptr<worker::PolledWorker> polled;
  worker::Worker& api() { return polled->worker(); }
};

class Nodes {
 public:
  explicit Nodes(const Options& o) : o_(o) {
    const uint32_t n = o.workers;
    std::vector<net::PacketPort*> server_ports;
    std::vector<server::JobWorker> workers;
    for (uint32_t r = 0; r < n; ++r) {
      server_side_.push_back(std::make_unique<net::MemoryPort>(
          address(r, 1), net::MemoryPortOptions{.mtu = kMtu, .buffers = 4096}));
      worker_side_.push_back(std::make_unique<net::MemoryPort>(
          address(r, 2), net::MemoryPortOptions{.mtu = kMtu, .buffers = 4096}));
      net::MemoryPort::connect(*server_side_[r], *worker_side_[r]);
      impair(r, o.impair);
      server_ports.push_back(server_side_[r].get());
      const net::LocalAddr w = address(r, 2);
      workers.push_back(
          {{"w" + std::to_string(r), w.ip, w.udp_port, 0, static_cast<uint16_t>(1 + r)}, r});
    }
    server::ServerNodeConfig sc;
    sc.chunk_bytes = net::payload_per_packet(kMtu);
    sc.optimizer = {.kind = agg::OptimizerKind::kSgd, .learning_rate = kLr};
    config::TrainingConfig training;
    training.sync = o.sync;
    sc.sync_policy = [training] { return job::sync_policy(training); };
    sc.fanout = o.sync == config::Sync::kBsp      ? server::Fanout::kEvery
                : o.sync == config::Sync::kPsPlus ? server::Fanout::kEveryVersion
                                                  : server::Fanout::kContributor;
    sc.layout = job::ShardLayout::of({kShards});
    sc.endpoint = endpoint(7, 0);
    server_ = std::make_unique<server::ServerNode>(server_ports, workers, sc, g_now.load());
    server_->attach(loop_);
    for (uint32_t r = 0; r < n; ++r) add_rank(r, 100 + r);
  }
  ~Nodes() {
    ranks_.clear();  // each shutdown runs the loop until its leave is answered
    server_.reset();
  }

  void impair(uint32_t r, net::MemoryLinkParams p) {
    p.seed = 17 + r * 31;
    server_side_[r]->set_link(p);
    p.seed = 23 + r * 37;
    worker_side_[r]->set_link(p);
  }

  // Rank r's worker process, with transport incarnation `epoch`.
  void add_rank(uint32_t r, uint32_t epoch) {
    worker::NetCoreConfig c;
    c.rank = r;
    c.workers = o_.workers;
    const net::LocalAddr s = address(r, 1);
    c.servers = {worker::ServerSpec{{"server0", s.ip, s.udp_port, 0, 0}, kShards}};
    c.chunk_bytes = net::payload_per_packet(kMtu);
    c.endpoint = endpoint(epoch, static_cast<uint16_t>(1 + r));
    c.start_timeout_ms = o_.start_timeout_ms;
    c.sync = o_.sync;
    c.pulls.async = o_.sync != config::Sync::kBsp;
    auto rank = std::make_unique<Rank>();
    rank->polled = std::make_unique<worker::PolledWorker>(*worker_side_[r], c);
    rank->polled->attach(loop_, &tick);
    std::vector<agg::TensorDecl> model = o_.model;
    if (r == o_.odd_rank) model[2].elements += 1;
    rank->params.resize(model.size());
    rank->grads.resize(model.size());
    for (size_t t = 0; t < model.size(); ++t) {
      rank->params[t].assign(model[t].elements, 0.0f);
      rank->grads[t].assign(model[t].elements, 0.0f);
      rank->api().declare(model[t].name, rank->params[t], model[t].priority);
    }
    if (ranks_.size() <= r) ranks_.resize(r + 1);
    ranks_[r] = std::move(rank);
  }

  // Passes of the whole loop, a fake microsecond each, until `done` or
  // `limit` of fake time; false on time out.
  template <class Done>
  bool run(Done done, uint64_t limit = 5'000 * kMs) {
    const uint64_t end = g_now.load() + limit;
    while (g_now.load() < end) {
      loop_.pass_st(tick());
      if (done()) return true;
    }
    return false;
  }
  bool wait(const std::vector<worker::Handle>& hs, uint64_t limit = 5'000 * kMs) {
    return run(
        [&] {
          for (const worker::Handle& h : hs) {
            if (!h.ready()) return false;
          }
          return true;
        },
        limit);
  }

  // Every rank starts; rank 0's parameters (random) become version 0.
  std::string start(std::vector<std::vector<float>>& reference) {
    std::mt19937 rng(5);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    for (auto& p : ranks_[0]->params) {
      for (float& x : p) x = dist(rng);
    }
    reference = ranks_[0]->params;
    std::vector<worker::Handle> hs;
    for (auto& r : ranks_) hs.push_back(r->api().start_async());
    if (!wait(hs)) return "the start timed out";
    for (const worker::Handle& h : hs) {
      if (!h.ok()) return std::string(h.error());
    }
    return compare(reference, "version 0");
  }

  // One BSP round: random gradients, every rank's push_pull of every tensor,
  // the reference moved on (rank-order sum, x 1/n, SGD) and compared.
  std::string round(std::vector<std::vector<float>>& reference, std::mt19937& rng) {
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    const float inv_n = 1.0f / static_cast<float>(ranks_.size());
    for (size_t t = 0; t < reference.size(); ++t) {
      for (auto& r : ranks_) {
        for (float& g : r->grads[t]) g = dist(rng);
      }
      for (size_t i = 0; i < reference[t].size(); ++i) {
        float s = ranks_[0]->grads[t][i];
        for (size_t k = 1; k < ranks_.size(); ++k) s = s + ranks_[k]->grads[t][i];
        reference[t][i] = reference[t][i] - kLr * (s * inv_n);
      }
    }
    std::vector<worker::Handle> hs;
    for (auto& r : ranks_) {
      for (uint32_t t = 0; t < r->params.size(); ++t) {
        hs.push_back(r->api().push_pull(t, r->grads[t], r->params[t]));
      }
    }
    if (!wait(hs)) return "the round timed out";
    for (const worker::Handle& h : hs) {
      if (!h.ok()) return std::string(h.error());
    }
    return compare(reference, "the round");
  }

  std::string compare(const std::vector<std::vector<float>>& want, const std::string& what) {
    for (size_t r = 0; r < ranks_.size(); ++r) {
      for (size_t t = 0; t < want.size(); ++t) {
        if (std::memcmp(ranks_[r]->params[t].data(), want[t].data(), want[t].size() * 4) != 0) {
          return what + ": rank " + std::to_string(r) + " tensor " + std::to_string(t) +
                 " differs from the reference";
        }
      }
    }
    return "";
  }

  server::ServerNode& server() { return *server_; }
  Rank& rank(uint32_t r) { return *ranks_[r]; }
  node::Loop& loop() { return loop_; }
  net::MemoryPort& server_side(uint32_t r) { return *server_side_[r]; }
  net::MemoryPort& worker_side(uint32_t r) { return *worker_side_[r]; }
  // Rank r's process is gone: nothing polls it, nothing reaches it.
  void kill(uint32_t r) {
    loop_.remove(*ranks_[r]->polled->net_core());
    impair(r, {.cut = true});
    dead_.push_back(std::move(ranks_[r]));
    ranks_.erase(ranks_.begin() + r);
  }

 private:
  Options o_;
  node::Loop loop_{{.tick_hz = kHz}};
  std::vector<std::unique_ptr<net::MemoryPort>> server_side_, worker_side_;
  std::unique_ptr<server::ServerNode> server_;
  std::vector<std::unique_ptr<Rank>> ranks_;
  // Killed ranks: never polled again; their net cores are dropped with them
  // (a PolledWorker whose loop no longer runs it stops at once).
  std::vector<std::unique_ptr<Rank>> dead_;
};

TEST(Nodes, BspRoundsAreExactWithTwoToFourWorkers) {
  for (uint32_t n = 2; n <= 4; ++n) {
    SCOPED_TRACE("workers " + std::to_string(n));
    std::vector<std::vector<float>> reference;
    {
      Nodes job({.workers = n});
      ASSERT_EQ(job.start(reference), "");
      std::mt19937 rng(n);
      for (int round = 0; round < 3; ++round) ASSERT_EQ(job.round(reference, rng), "");
      const server::ServerCounters c = job.server().counters_st();
      // Every chunk of every block: version 0 and three updates.
      uint64_t chunks = 0;
      for (const agg::Block& b : job.server().placement_st()->blocks()) {
        chunks += (b.bytes() + net::payload_per_packet(kMtu) - 1) / net::payload_per_packet(kMtu);
      }
      EXPECT_EQ(c.shards.updates, 4 * chunks);
      EXPECT_EQ(c.net.tx_retransmits, 0u);
      for (uint32_t r = 0; r < n; ++r) {
        EXPECT_EQ(job.server().port(r).traffic().rx_frames, job.worker_side(r).traffic().tx_frames);
      }
    }
  }
}

// Every buffer a port lent out (held by a chunk table, queued, on the link)
// is back in its pool once the job is over.
TEST(Nodes, EveryBufferComesBack) {
  std::vector<std::vector<float>> reference;
  Nodes job({.workers = 3, .impair = {.loss = 0.02}});
  ASSERT_EQ(job.start(reference), "");
  std::mt19937 rng(9);
  ASSERT_EQ(job.round(reference, rng), "");
  ASSERT_EQ(job.round(reference, rng), "");
  // The workers leave (answered), then nothing is left in flight.
  for (uint32_t r = 0; r < 3; ++r) job.rank(r).api().shutdown();
  EXPECT_EQ(job.server().state_st(), server::NodeState::kFinished);
  EXPECT_TRUE(job.run(
      [&] {
        for (uint32_t r = 0; r < 3; ++r) {
          if (job.server_side(r).buffers_free() != job.server_side(r).buffers()) return false;
          if (job.worker_side(r).buffers_free() != job.worker_side(r).buffers()) return false;
        }
        return true;
      },
      100 * kMs));
  EXPECT_EQ(job.server().counters_st().held, 0u);
}

TEST(Nodes, LossReorderingAndDuplicatesChangeNoBit) {
  std::vector<std::vector<float>> reference;
  Nodes job({.workers = 4, .impair = {.loss = 0.02, .duplicate = 0.01, .reorder = 0.02}});
  ASSERT_EQ(job.start(reference), "");
  std::mt19937 rng(3);
  for (int round = 0; round < 4; ++round) ASSERT_EQ(job.round(reference, rng), "");
  const server::ServerCounters c = job.server().counters_st();
  EXPECT_GT(c.net.tx_retransmits, 0u);
  EXPECT_GT(job.server_side(0).counters().link_lost + job.worker_side(0).counters().link_lost, 0u);
}

TEST(Nodes, AMismatchedDeclareIsRefusedOnEveryRank) {
  std::vector<std::vector<float>> reference;
  Nodes job({.workers = 3, .odd_rank = 1});
  const std::string failed = job.start(reference);
  EXPECT_NE(failed.find("refused the declarations"), std::string::npos) << failed;
  EXPECT_NE(failed.find("fc.weight"), std::string::npos) << failed;
  EXPECT_EQ(job.server().state_st(), server::NodeState::kRefused);
  EXPECT_NE(job.server().refusal_st().find("rank 1"), std::string::npos)
      << job.server().refusal_st();
}

// A worker that dies mid-job is named by the server's liveness within the
// peer timeout (1 s here), and every other rank's calls fail with the
// server's text instead of waiting for its gradients.
TEST(Nodes, ASilentWorkerIsNamedByLiveness) {
  std::vector<std::vector<float>> reference;
  Nodes job({.workers = 3});
  ASSERT_EQ(job.start(reference), "");
  std::mt19937 rng(4);
  ASSERT_EQ(job.round(reference, rng), "");
  job.kill(2);
  const uint64_t t0 = g_now.load();
  std::vector<worker::Handle> hs;
  for (uint32_t r = 0; r < 2; ++r) {
    hs.push_back(job.rank(r).api().push_pull(0, job.rank(r).grads[0], job.rank(r).params[0]));
  }
  ASSERT_TRUE(job.wait(hs, 3'000 * kMs));
  const double seconds = static_cast<double>(g_now.load() - t0) / kHz;
  EXPECT_LT(seconds, 1.5);
  for (const worker::Handle& h : hs) {
    EXPECT_FALSE(h.ok());
    EXPECT_NE(h.error().find("w2"), std::string_view::npos) << h.error();
  }
  EXPECT_EQ(job.server().state_st(), server::NodeState::kRefused);
}

// PS+: a worker that pushes nothing still receives each new version of a
// tensor (the eager pull), the update of the gradient another worker pushed.
TEST(Nodes, PsPlusSendsEveryVersionEagerly) {
  std::vector<std::vector<float>> reference;
  Nodes job({.workers = 2, .sync = config::Sync::kPsPlus});
  ASSERT_EQ(job.start(reference), "");
  Rank& w0 = job.rank(0);
  Rank& w1 = job.rank(1);
  for (size_t i = 0; i < w0.grads[2].size(); ++i) w0.grads[2][i] = static_cast<float>(i % 7) - 3;
  job.rank(0).api().mark_read(2);
  const worker::Handle pushed = w0.api().push(2, w0.grads[2]);
  // w1 asks for version 1 of fc.weight without pushing anything.
  std::vector<float> got(w1.params[2].size());
  const worker::Handle pulled = w1.api().pull(2, got, 1);
  ASSERT_TRUE(job.wait({pushed, pulled}));
  ASSERT_TRUE(pushed.ok()) << pushed.error();
  ASSERT_TRUE(pulled.ok()) << pulled.error();
  for (size_t i = 0; i < got.size(); ++i) {
    // Quorum 1, staleness 0: the gradient unaveraged, the rate unscaled.
    ASSERT_EQ(got[i], reference[2][i] - kLr * w0.grads[2][i]) << i;
  }
  EXPECT_GT(job.server().counters_st().shards.eager_sent, 0u);
}

// A worker whose server never answers fails its start at the start timeout
// (fake time), naming the server.
TEST(Nodes, AStartNobodyAnswersTimesOut) {
  std::vector<std::vector<float>> reference;
  Nodes job({.workers = 2, .start_timeout_ms = 500});
  job.impair(1, {.cut = true});
  const uint64_t t0 = g_now.load();
  const std::string failed = job.start(reference);
  EXPECT_NE(failed.find("no answer to the declarations from server server0"), std::string::npos)
      << failed;
  const double seconds = static_cast<double>(g_now.load() - t0) / kHz;
  EXPECT_GE(seconds, 0.5);
  EXPECT_LT(seconds, 0.6);
}

// The thread contract on a real node: its net core's thread owns it, and a
// call from any other thread aborts in a build with owner checks.
TEST(NodesDeathTest, AWrongThreadCallAborts) {
  if (!base::kOwnerChecks) GTEST_SKIP() << "built with owner_checks=false";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        std::vector<std::vector<float>> reference;
        Nodes job({.workers = 2});
        if (!job.start(reference).empty()) std::abort();
        std::thread other([&] { (void)job.server().counters_st(); });
        other.join();
      },
      "counters_st called on thread .*, but its object belongs to thread");
}

}  // namespace
}  // namespace mercury
