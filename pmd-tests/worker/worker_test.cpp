// The public worker API (mercury/worker.h, mercury/worker_c.h) end to end
// over real ports: Worker instances, each with its net core on its own
// thread of this process's EAL, talk to lib/server's ServerNode (control
// plane, shards inline, polled by its own thread) over net_ring links. Several trainer threads per
// worker call the API at once; every aggregate is checked bit for bit against a rank-order
// reference, rank 0's initial parameters reach every rank, barriers
// complete, shutdown fails what is pending, misuse throws, a silent or
// refusing server fails start() with its name; the start and the barrier
// as handles (start_async, barrier_async), also for a worker whose net core
// its owner polls (PolledWorker).
#include <gtest/gtest.h>
#include <rte_cycles.h>
#include <rte_ethdev.h>
#include <rte_mbuf.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "../../apps/common/synthetic.h"
#include "endpoint_config.h"
#include "mercury/worker.h"
#include "mercury/worker_c.h"
#include "net/frame.h"
#include "pmd_env.h"
#include "ring_link.h"
#include "server/server_node.h"
#include "worker/attach.h"

namespace mercury::worker {
namespace {

using pmdtest::RingLink;

constexpr uint32_t kMtu = 1500;
constexpr uint32_t kShards = 2;
constexpr float kLr = 0.01f;
const uint32_t kChunk = net::payload_per_packet(kMtu);

// Tensor sizes around the chunk (354 floats) and block boundaries, one
// large enough to be split across both shards.
const std::vector<uint32_t> kSizes = {1,    3,     353,   354,    355,    708,     1000,
                                      4096, 10000, 65536, 100003, 250000, 1u << 20};

using apps::Noise;  // cheap deterministic values, as the apps train with

void fill_gradient(std::vector<float>& g, uint32_t rank, uint32_t round, uint32_t tensor) {
  Noise n{0x9e3779b97f4a7c15ull * ((uint64_t{round} * 131 + rank + 1) * 1009 + tensor)};
  for (float& x : g) x = n.next();
}

void fill_initial(std::vector<float>& p, uint32_t tensor) {
  Noise n{0xabcdef12345ull + tensor};
  for (float& x : p) x = n.next();
}

// The worker's counters once they show `pushes` pushes, or as they are
// after 5 s: the net core publishes them with its slow work, a little after
// the requests it counts completed (WorkerStats).
WorkerStats stats_after(const Worker& w, uint64_t pushes) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  WorkerStats s = w.stats();
  while (s.pushes < pushes && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    s = w.stats();
  }
  return s;
}

// Whether the Job's server runs, or its ports exist and nobody polls them.
enum class Server { kRunning, kSilent };

// A job: one ServerNode (polled by its own thread) and `ranks` workers,
// each joined to it by its own ring link, each a Worker attached to this
// process's EAL.
class Job {
 public:
  explicit Job(uint32_t ranks, Server kind = Server::kRunning, uint32_t start_timeout_ms = 30'000,
               const net::LinkParams& impair = {}, config::Sync sync = config::Sync::kBsp,
               const std::optional<net::LinkParams>& rank0_impair = std::nullopt) {
    static int run = 0;
    const int id = run++;
    std::vector<net::PacketPort*> ports;
    std::vector<server::JobWorker> workers;
    for (uint32_t r = 0; r < ranks; ++r) {
      net::LinkParams p = r == 0 && rank0_impair ? *rank0_impair : impair;
      p.seed = impair.seed + r;
      links_.push_back(std::make_unique<RingLink>(
          "wk" + std::to_string(id) + "_" + std::to_string(r), static_cast<uint8_t>(80 + r),
          pmdtest::RingLinkOptions{.end = {.mtu = kMtu, .mbufs = 8191, .impair = p}}));
      ports.push_back(&links_[r]->a());
      workers.push_back({{"w" + std::to_string(r), RingLink::ip_b(80 + r), 47101, 0}, r});
    }
    server::ServerNodeConfig sc;
    sc.chunk_bytes = kChunk;
    sc.optimizer.kind = agg::OptimizerKind::kSgd;
    sc.optimizer.learning_rate = kLr;
    config::TrainingConfig training;
    training.sync = sync;
    sc.sync_policy = [training] { return job::sync_policy(training); };
    sc.fanout = sync == config::Sync::kBsp      ? server::Fanout::kEvery
                : sync == config::Sync::kPsPlus ? server::Fanout::kEveryVersion
                                                : server::Fanout::kContributor;
    sc.layout = job::ShardLayout::of({kShards});
    sc.server_index = 0;
    sc.endpoint = pmdtest::endpoint_config(3, 0, {}, {.messages = 1 << 16});
    server_ = std::make_unique<server::ServerNode>(ports, workers, sc, rte_rdtsc());
    server_->attach(server_loop_);
    if (kind == Server::kRunning) {
      server_thread_ = std::thread([this] { server_loop_.run(stop_); });
    }
    for (uint32_t r = 0; r < ranks; ++r) {
      NetCoreConfig c;
      c.rank = r;
      c.workers = ranks;
      c.servers = {
          ServerSpec{{"server0", RingLink::ip_a(80 + r), 47100, 0}, kShards, std::nullopt}};
      c.chunk_bytes = kChunk;
      c.endpoint =
          pmdtest::endpoint_config(static_cast<uint16_t>(5 + r), static_cast<uint16_t>(r + 1));
      c.start_timeout_ms = start_timeout_ms;
      c.sync = sync;
      c.pulls.async = sync != config::Sync::kBsp;
      c.optimizer_config = sc.optimizer;
      workers_.push_back(attach_worker(links_[r]->b(), c));
    }
  }
  ~Job() {
    workers_.clear();  // shuts every worker down
    stop_server();
    server_.reset();
  }
  /// Stops polling the server (its counters may be read afterwards).
  void stop_server() {
    stop_ = true;
    if (server_thread_.joinable()) server_thread_.join();
    server_->hand_over();  // its counters are this thread's to read now
  }
  Worker& worker(uint32_t r) { return workers_[r]; }
  std::vector<Worker>& workers() { return workers_; }
  /// The server's counters; after stop_server().
  server::ServerCounters server_counters() const { return server_->counters_st(); }
  /// Packets and control messages the server refused or dropped; after
  /// stop_server() (the counters belong to the server's thread).
  uint64_t server_refusals() const {
    const server::ServerCounters c = server_->counters_st();
    uint64_t n = 0;
    for (uint64_t d : c.drops) n += d;
    for (size_t o = 0; o < agg::kOutcomeCount; ++o) {
      if (!agg::taken(static_cast<agg::Outcome>(o))) n += c.table.outcomes[o];
    }
    return n;
  }
  net::Interface& worker_port(uint32_t r) { return links_[r]->b(); }
  // The server's end of worker r's link: with Server::kSilent nobody polls it,
  // so a test may send raw frames from it.
  pmdtest::LinkEnd& server_end(uint32_t r) { return links_[r]->end_a(); }
  // Moves worker r out (e.g. into the C ABI).
  Worker take(uint32_t r) { return std::move(workers_[r]); }

 private:
  std::vector<std::unique_ptr<RingLink>> links_;
  // The server's net core: a busy loop on a thread of the test's own.
  node::Loop server_loop_{{.idle = {.mode = config::Poll::kBusy}, .tick_hz = rte_get_tsc_hz()}};
  std::unique_ptr<server::ServerNode> server_;
  std::atomic<bool> stop_{false};
  std::thread server_thread_;
  std::vector<Worker> workers_;
};

// 4 workers x 2 trainer threads, 4 rounds of push_pull over 13 tensors
// (1.4 M floats, the largest split over both shards): rank 0's initial
// parameters on every rank after start (one thread starts explicitly, the
// other implicitly through a pull, another pull copies into a second
// buffer), then every aggregate bit-exact against the rank-order SGD
// reference, callbacks run once each, and two barriers per worker per round.
void four_workers_two_threads_each(const net::LinkParams& impair) {
  constexpr uint32_t kRanks = 4;
  constexpr uint32_t kThreads = 2;
  constexpr uint32_t kRounds = 4;
  const auto tensors = static_cast<uint32_t>(kSizes.size());

  // The reference: rank 0's initial values, then per round
  // p -= lr x ((g0 + g1 + g2 + g3) x (1/4)), summed in rank order (lib/agg's rule).
  std::vector<std::vector<std::vector<float>>> ref(kRounds + 1);
  ref[0].resize(tensors);
  for (uint32_t k = 0; k < tensors; ++k) {
    ref[0][k].resize(kSizes[k]);
    fill_initial(ref[0][k], k);
  }
  std::vector<std::vector<float>> g(kRanks);
  for (uint32_t round = 0; round < kRounds; ++round) {
    ref[round + 1] = ref[round];
    for (uint32_t k = 0; k < tensors; ++k) {
      for (uint32_t r = 0; r < kRanks; ++r) {
        g[r].resize(kSizes[k]);
        fill_gradient(g[r], r, round, k);
      }
      for (uint32_t i = 0; i < kSizes[k]; ++i) {
        float s = g[0][i];
        for (uint32_t r = 1; r < kRanks; ++r) s = s + g[r][i];
        ref[round + 1][k][i] = ref[round][k][i] - kLr * (s * (1.0f / kRanks));
      }
    }
  }

  Job job(kRanks, Server::kRunning, 30'000, impair);
  // Each rank's parameters; only rank 0's start as the initial values.
  std::vector<std::vector<std::vector<float>>> params(kRanks);
  for (uint32_t r = 0; r < kRanks; ++r) {
    params[r].resize(tensors);
    for (uint32_t k = 0; k < tensors; ++k) {
      if (r == 0) {
        params[r][k] = ref[0][k];
      } else {
        params[r][k].assign(kSizes[k], -777.0f);
      }
      ASSERT_EQ(job.worker(r).declare("t" + std::to_string(k), params[r][k]), k);
    }
  }

  std::atomic<uint64_t> mismatches{0}, failures{0}, callbacks{0};
  std::vector<std::thread> trainers;
  for (uint32_t r = 0; r < kRanks; ++r) {
    for (uint32_t t = 0; t < kThreads; ++t) {
      trainers.emplace_back([&, r, t] {
        Worker& w = job.worker(r);
        try {
          if (t == 0) {
            w.start();
          } else {
            // Implicit start; version 0 into the declared buffer, and a copy.
            std::vector<float> copy(kSizes[1]);
            Handle a = w.pull(1, params[r][1]);
            Handle b = w.pull(1, copy);
            if (!a.wait() || !b.wait()) ++failures;
            if (std::memcmp(copy.data(), ref[0][1].data(), copy.size() * 4) != 0) ++mismatches;
          }
          for (uint32_t k = t; k < tensors; k += kThreads) {
            if (std::memcmp(params[r][k].data(), ref[0][k].data(), kSizes[k] * 4) != 0) {
              ++mismatches;
            }
          }
          std::vector<std::vector<float>> grads(tensors);
          for (uint32_t round = 0; round < kRounds; ++round) {
            std::vector<std::pair<uint32_t, Handle>> pending;
            for (uint32_t k = t; k < tensors; k += kThreads) {
              grads[k].resize(kSizes[k]);
              fill_gradient(grads[k], r, round, k);
              Handle h = w.push_pull(k, grads[k], params[r][k]);
              h.on_complete([&](const Handle&) { ++callbacks; });
              pending.emplace_back(k, h);
            }
            for (auto& [k, h] : pending) {
              if (!h.wait()) {
                ++failures;
                continue;
              }
              if (std::memcmp(params[r][k].data(), ref[round + 1][k].data(), kSizes[k] * 4) != 0) {
                ++mismatches;
              }
            }
            w.barrier();
          }
        } catch (const std::exception& e) {
          ADD_FAILURE() << "rank " << r << " thread " << t << ": " << e.what();
          ++failures;
        }
      });
    }
  }
  for (auto& th : trainers) th.join();
  EXPECT_EQ(failures.load(), 0u);
  EXPECT_EQ(mismatches.load(), 0u);
  EXPECT_EQ(callbacks.load(), uint64_t{kRanks} * kRounds * tensors);
  for (uint32_t r = 0; r < kRanks; ++r) {
    const WorkerStats s = stats_after(job.worker(r), uint64_t{kRounds} * tensors);
    EXPECT_EQ(s.pushes, uint64_t{kRounds} * tensors) << "rank " << r;
  }
  // The workers leave while the server still runs (they wait for it to
  // acknowledge their leave), then the server stops and can be read.
  for (Worker& w : job.workers()) w.shutdown();
  job.stop_server();
  if (!impair.impairs()) {
    EXPECT_EQ(job.server_refusals(), 0u);  // faults make duplicates, refused as such
  }
}

TEST(WorkerApi, FourWorkersTwoTrainerThreadsEachBitExact) { four_workers_two_threads_each({}); }

// The same under 1% loss, 1% duplication and 1% reordering on every link,
// both directions: the transport recovers, the aggregates stay exact.
TEST(WorkerApi, FourWorkersUnderFaultsBitExact) {
  net::LinkParams faults;
  faults.loss = 0.01;
  faults.duplicate = 0.01;
  faults.reorder = 0.01;
  faults.seed = 42;
  four_workers_two_threads_each(faults);
}

// One worker, 8 trainer threads, 64 tensors (8 each), 20 rounds of
// push_pull with a pull of a neighbour's tensor into a private buffer in
// between: many threads on one request queue at once; every aggregate of
// the thread's own tensors is bit-exact (one rank: p -= lr x g).
TEST(WorkerApi, EightThreadsOneWorker) {
  constexpr uint32_t kThreads = 8, kPerThread = 8, kRounds = 20;
  constexpr uint32_t kTensors = kThreads * kPerThread;
  Job job(1);
  Worker& w = job.worker(0);
  std::vector<std::vector<float>> params(kTensors);
  for (uint32_t k = 0; k < kTensors; ++k) {
    params[k].resize(300 + 97 * k);
    fill_initial(params[k], k);
    w.declare("t" + std::to_string(k), params[k]);
  }
  std::atomic<uint64_t> mismatches{0}, failures{0};
  std::vector<std::thread> threads;
  for (uint32_t t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<std::vector<float>> ref(kPerThread), grad(kPerThread);
      std::vector<float> peek;
      for (uint32_t i = 0; i < kPerThread; ++i) {
        ref[i].resize(params[t * kPerThread + i].size());
        fill_initial(ref[i], t * kPerThread + i);
        grad[i].resize(ref[i].size());
      }
      try {
        for (uint32_t round = 0; round < kRounds; ++round) {
          std::vector<Handle> hs;
          for (uint32_t i = 0; i < kPerThread; ++i) {
            const uint32_t k = t * kPerThread + i;
            fill_gradient(grad[i], 0, round, k);
            for (size_t e = 0; e < ref[i].size(); ++e) {
              ref[i][e] = ref[i][e] - kLr * (grad[i][e] * 1.0f);
            }
            hs.push_back(w.push_pull(k, grad[i], params[k]));
          }
          const uint32_t other = ((t + 1) % kThreads) * kPerThread;
          peek.resize(params[other].size());
          if (!w.pull(other, peek).wait()) ++failures;
          for (uint32_t i = 0; i < kPerThread; ++i) {
            if (!hs[i].wait()) ++failures;
            if (std::memcmp(params[t * kPerThread + i].data(), ref[i].data(), ref[i].size() * 4) !=
                0) {
              ++mismatches;
            }
          }
        }
      } catch (const std::exception& e) {
        ADD_FAILURE() << "thread " << t << ": " << e.what();
        ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0u);
  EXPECT_EQ(mismatches.load(), 0u);
  EXPECT_EQ(stats_after(w, uint64_t{kTensors} * kRounds).pushes, uint64_t{kTensors} * kRounds);
}

// shutdown() while 4 threads are pushing and pulling as fast as they can:
// every call either returns a handle that then completes (ok, or failed
// because of the shutdown) or throws UsageError; nothing hangs.
TEST(WorkerApi, ShutdownWhileThreadsPush) {
  Job job(1);
  Worker& w = job.worker(0);
  std::vector<std::vector<float>> params(4, std::vector<float>(5000, 1.0f));
  for (uint32_t k = 0; k < 4; ++k) w.declare("t" + std::to_string(k), params[k]);
  w.start();
  std::atomic<uint64_t> calls{0}, ok{0}, failed{0}, refused{0};
  std::vector<std::thread> threads;
  for (uint32_t t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::vector<float> grad(5000, 0.001f);
      for (;;) {
        try {
          Handle h = w.push_pull(t, grad, params[t]);
          ++calls;
          (h.wait() ? ok : failed)++;
        } catch (const UsageError& e) {
          EXPECT_STREQ(e.what(), "push_pull: the worker has been shut down");
          ++refused;
          return;
        }
      }
    });
  }
  while (calls.load() < 200) std::this_thread::yield();
  w.shutdown();
  for (auto& th : threads) th.join();
  EXPECT_EQ(refused.load(), 4u);
  EXPECT_EQ(ok.load() + failed.load(), calls.load());
  EXPECT_GE(ok.load(), 200u - 4);
}

// A push_pull that cannot complete (rank 1 never pushes) fails with a clear
// text when its worker shuts down; every later call throws UsageError.
TEST(WorkerApi, ShutdownFailsPendingHandles) {
  Job job(2);
  std::vector<float> p0(1000, 1.0f), p1(1000, 2.0f), grad(1000, 0.5f);
  job.worker(0).declare("a", p0);
  job.worker(1).declare("a", p1);
  std::thread other([&] { job.worker(1).start(); });
  job.worker(0).start();
  other.join();
  EXPECT_EQ(p1, p0);                              // rank 0's initial parameters
  EXPECT_TRUE(job.worker(0).pull(0, p0).wait());  // version 0: already in
  Handle h = job.worker(0).push_pull(0, grad, p0);
  Handle next = job.worker(0).pull(0, p0);  // version 1, as h: pending as well
  job.worker(0).shutdown();
  EXPECT_FALSE(h.wait());
  EXPECT_NE(h.error().find("shut down"), std::string_view::npos) << h.error();
  EXPECT_FALSE(next.wait());
  try {
    job.worker(0).push(0, grad);
    FAIL() << "push after shutdown did not throw";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(), "push: the worker has been shut down");
  }
  EXPECT_THROW(job.worker(0).barrier(), UsageError);
  job.worker(0).shutdown();  // idempotent
}

TEST(WorkerApi, MisuseThrowsUsageError) {
  Job job(1);
  Worker& w = job.worker(0);
  EXPECT_THROW(w.start(), UsageError);  // nothing declared
  std::vector<float> a(1000), b(10);
  w.declare("a", a);
  w.declare("b", b, 0);
  try {
    w.declare("a", b);
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(), "declare: tensor 'a' is already declared (id 0)");
  }
  w.start();
  EXPECT_EQ(w.key("b"), 1u);
  try {
    w.declare("late", b);
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("declare: tensor 'late' declared after start"),
              std::string::npos)
        << e.what();
  }
  try {
    w.push(0, b);
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(), "push: tensor 'a' has 1000 elements but the buffer has 10");
  }
  try {
    w.pull(7, b);
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(), "pull: unknown tensor id 7 (2 tensors declared)");
  }
  EXPECT_THROW(w.push_pull(1, b, a), UsageError);
  EXPECT_THROW((void)w.key("nope"), UsageError);
  EXPECT_THROW((void)w.mark_read(2), UsageError);
  EXPECT_EQ(w.mark_read(1), w.version(1));  // bsp: nothing to mark
  // A single rank: the aggregate is its own gradient (SGD on its initial values).
  std::vector<float> grad(10, 1.0f);
  std::vector<float> expect = b;
  for (float& x : expect) x = x - kLr * (1.0f * (1.0f / 1));
  EXPECT_TRUE(w.push_pull(1, grad, b).wait());
  EXPECT_EQ(b, expect);
}

TEST(WorkerApi, SilentServerFailsStartNamingIt) {
  Job job(1, Server::kSilent, 300);
  std::vector<float> a(100);
  job.worker(0).declare("a", a);
  try {
    job.worker(0).start();
    FAIL() << "start did not fail";
  } catch (const WorkerError& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "no answer to the declarations from server server0 (10.0.80.1:47100) within "
                  "300 ms"),
              std::string::npos)
        << e.what();
  }
  // The failure stays: every later call says why.
  EXPECT_THROW(job.worker(0).push(0, a), WorkerError);
}

// What the worker drops is counted by reason in Worker::drops() (so in
// ps-worker's closing line, Python's stats() and the C ABI's
// mercury_worker_drops): 5 frames for another MAC,
// sent raw into the worker's port from the server's end of its link while
// the worker waits for a server that never answers.
TEST(WorkerApi, StatsCountDropsByReason) {
  Job job(1, Server::kSilent, 10'000);
  Worker& w = job.worker(0);
  std::vector<float> a(100);
  w.declare("a", a);
  Handle start = w.start_async();  // the net core now polls its port
  EXPECT_TRUE(w.drops().empty());

  constexpr uint16_t kFrames = 5;
  pmdtest::LinkEnd& end = job.server_end(0);
  rte_mbuf* frames[kFrames];
  ASSERT_EQ(rte_pktmbuf_alloc_bulk(end.pool.get(), frames, kFrames), 0);
  for (rte_mbuf* m : frames) {
    // 60 zero bytes: destination MAC 00:00:00:00:00:00, neither the worker's nor broadcast.
    std::memset(rte_pktmbuf_mtod(m, void*), 0, 60);
    m->data_len = 60;
    m->pkt_len = 60;
  }
  ASSERT_EQ(rte_eth_tx_burst(end.port().id(), 0, frames, kFrames), kFrames);

  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  std::vector<DropCount> drops = w.drops();
  while (drops.empty() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    drops = w.drops();
  }
  ASSERT_EQ(drops.size(), 1u);
  EXPECT_EQ(drops[0].first, "not_our_mac");
  EXPECT_EQ(drops[0].second, kFrames);

  // The same through the C ABI, as text, snprintf-like.
  mercury_worker* c = wrap_worker_for_c(job.take(0));
  const std::string want = "not_our_mac=" + std::to_string(kFrames);
  size_t needed = 0;
  ASSERT_EQ(mercury_worker_drops(c, nullptr, 0, &needed), MERCURY_OK) << mercury_last_error();
  EXPECT_EQ(needed, want.size());
  char text[64];
  ASSERT_EQ(mercury_worker_drops(c, text, sizeof text, nullptr), MERCURY_OK);
  EXPECT_EQ(std::string(text), want);
  char cut[5];
  ASSERT_EQ(mercury_worker_drops(c, cut, sizeof cut, &needed), MERCURY_OK);
  EXPECT_STREQ(cut, "not_");
  EXPECT_EQ(needed, want.size());
  EXPECT_EQ(mercury_worker_drops(c, nullptr, 4, &needed), MERCURY_E_USAGE);
  EXPECT_STREQ(mercury_last_error(), "mercury_worker_drops: buf (size is not 0) is NULL");
  EXPECT_EQ(mercury_worker_drops(nullptr, text, sizeof text, &needed), MERCURY_E_USAGE);
  EXPECT_EQ(mercury_worker_shutdown(c), MERCURY_OK);  // fails the start still waiting
  EXPECT_FALSE(start.wait());
  mercury_worker_destroy(c);
}

// Ranks that declare different tensors: the server refuses the job, and
// both ranks' start() fails with its text (which names the difference).
// psplus: the servers send every version to every worker, so a declared
// buffer moves on after the pull that delivered it. An unmarked push is
// counted stale from the version its last pull delivered; after
// mark_read(), from the version the buffer held then. Counted by the server
// (what scales psplus's learning rate).
TEST(WorkerApi, MarkReadIsThePushBaseUnderPsPlus) {
  Job job(2, Server::kRunning, 30'000, {}, config::Sync::kPsPlus);
  Worker& w0 = job.worker(0);
  Worker& w1 = job.worker(1);
  EXPECT_EQ(w0.sync(), "psplus");
  std::vector<float> p0(300), p1(300), g(300, 0.5f);
  fill_initial(p0, 0);
  w0.declare("t", p0);
  w1.declare("t", p1);
  EXPECT_THROW((void)w0.mark_read(0), UsageError);  // not started
  const Handle s0 = w0.start_async();
  const Handle s1 = w1.start_async();
  ASSERT_TRUE(s0.wait() && s1.wait()) << s0.error() << s1.error();
  // The version in w's buffer, marked as read, once it is `v` (the
  // servers' copies arrive a little after the pushes that made them).
  auto mark_when = [](Worker& w, uint32_t v) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    uint32_t in = w.mark_read(0);
    while (in < v && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      in = w.mark_read(0);
    }
    return in;
  };
  // Versions 1-3 from w1, each applied before the next (push_pull completes
  // once its answer is back); w0 pushes from its start's version 0, unmarked.
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(w1.push_pull(0, g, p1).wait());
  ASSERT_TRUE(w0.push_pull(0, g, p0).wait());  // 3 versions stale: version 4
  // w1 marks version 4 before its next three (5-7); w0 marks 7 before its push.
  EXPECT_EQ(mark_when(w1, 4), 4u);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(w1.push_pull(0, g, p1).wait());
  EXPECT_EQ(w0.version(0), 4u);  // its last pull's
  EXPECT_EQ(mark_when(w0, 7), 7u);
  ASSERT_TRUE(w0.push_pull(0, g, p0).wait());  // fresh: version 8
  EXPECT_EQ(w0.version(0), 8u);
  w0.shutdown();  // before the server stops: each waits for its leave to be acknowledged
  w1.shutdown();
  job.stop_server();
  const server::ServerCounters c = job.server_counters();
  // Each chunk of the tensor (placement spreads it over several) made
  // versions 0-8; those of w0's unmarked push were 3 versions stale, no other.
  const uint64_t chunks = c.shards.updates / 9;
  EXPECT_EQ(c.shards.updates, 9 * chunks);
  EXPECT_EQ(c.shards.stale_updates, chunks);
  EXPECT_EQ(c.shards.staleness_sum, 3 * chunks);
}

// psplus's eager pull over a slow downlink: w1 makes versions 1-5 of a
// tensor faster than w0's link carries one. The server owes w0 one copy
// per chunk, of the newest version, and sends it as w0's link has room, so
// the versions made meanwhile merge (fewer copies than versions x chunks),
// and w0 ends with version 5, bit for bit w1's.
TEST(WorkerApi, PsPlusEagerCopiesMergeOnASlowLink) {
  net::LinkParams slow;
  slow.rate_gbps = 0.05;  // 1 MB in 160 ms
  Job job(2, Server::kRunning, 30'000, {}, config::Sync::kPsPlus, slow);
  Worker& w0 = job.worker(0);
  Worker& w1 = job.worker(1);
  constexpr uint32_t kN = 1 << 18;  // 1 MiB
  std::vector<float> p0(kN), p1(kN), g(kN);
  fill_initial(p0, 0);
  w0.declare("t", p0);
  w1.declare("t", p1);
  const Handle s0 = w0.start_async();
  const Handle s1 = w1.start_async();
  ASSERT_TRUE(s0.wait() && s1.wait()) << s0.error() << s1.error();
  for (uint32_t round = 0; round < 5; ++round) {
    fill_gradient(g, 1, round, 0);
    ASSERT_TRUE(w1.push_pull(0, g, p1).wait());
  }
  // psplus's push_pull completes once its push is acknowledged; the answer may follow.
  ASSERT_TRUE(w1.pull(0, p1, 5).wait());
  EXPECT_EQ(w1.version(0), 5u);
  const Handle last = w0.pull(0, p0, 5);
  ASSERT_TRUE(last.wait()) << last.error();
  EXPECT_EQ(w0.version(0), 5u);
  EXPECT_EQ(std::memcmp(p0.data(), p1.data(), kN * sizeof(float)), 0);
  w0.shutdown();  // before the server stops: each waits for its leave to be acknowledged
  w1.shutdown();
  job.stop_server();
  const server::ServerCounters c = job.server_counters();
  const uint64_t chunks = (uint64_t{kN} * sizeof(float) + kChunk - 1) / kChunk;
  EXPECT_GE(c.shards.eager_sent, chunks);  // at least the last version, whole
  EXPECT_LT(c.shards.eager_sent, 5 * chunks);
  EXPECT_GT(c.shards.fanout_merged, 0u);
}

TEST(WorkerApi, RefusingServerFailsStartWithItsText) {
  Job job(2);
  std::vector<float> a(100), b(101);
  job.worker(0).declare("a", a);
  job.worker(1).declare("a", b);
  std::string errors[2];
  std::thread other([&] {
    try {
      job.worker(1).start();
    } catch (const WorkerError& e) {
      errors[1] = e.what();
    }
  });
  try {
    job.worker(0).start();
  } catch (const WorkerError& e) {
    errors[0] = e.what();
  }
  other.join();
  for (uint32_t r = 0; r < 2; ++r) {
    const std::string& e = errors[r];
    EXPECT_EQ(e.rfind("start: server server0 (10.0.8" + std::to_string(r) +
                          ".1:47100) refused the declarations: ",
                      0),
              0u)
        << e;
    // The server's whole text, which names both tensors.
    EXPECT_NE(e.find("'a' (100 elements"), std::string::npos) << e;
    EXPECT_NE(e.find("'a' (101 elements"), std::string::npos) << e;
  }
}

// start_async() and barrier_async(): the start and the barrier as handles,
// which the blocking calls wait on. Every start_async() returns the same
// handle; once it is ok the worker has started (version 0 in place), and
// start() returns at once. A barrier handle completes only once every rank
// has arrived.
TEST(WorkerApi, AsyncStartAndBarrier) {
  Job job(2);
  std::vector<float> p0(3000), p1(3000, -1.0f);
  fill_initial(p0, 0);
  const std::vector<float> initial = p0;
  job.worker(0).declare("a", p0);
  job.worker(1).declare("a", p1);
  const Handle s0 = job.worker(0).start_async();
  EXPECT_EQ(job.worker(0).start_async(), s0);
  const Handle s1 = job.worker(1).start_async();
  ASSERT_TRUE(s0.wait()) << s0.error();
  ASSERT_TRUE(s1.wait()) << s1.error();
  EXPECT_TRUE(job.worker(0).started());
  EXPECT_TRUE(job.worker(1).started());
  EXPECT_EQ(p1, initial);
  job.worker(1).start();  // already started: returns at once
  EXPECT_THROW(job.worker(0).declare("late", p0), UsageError);
  const Handle b0 = job.worker(0).barrier_async();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(b0.ready()) << "the barrier completed without rank 1";
  const Handle b1 = job.worker(1).barrier_async();
  EXPECT_TRUE(b0.wait()) << b0.error();
  EXPECT_TRUE(b1.wait()) << b1.error();
}

// A PolledWorker (worker/attach.h) runs its net core only when its owner
// polls it: its blocking calls refuse to wait (they never could return),
// naming the _async form; shutdown() runs the net core itself until it has
// stopped, which fails the pending start.
TEST(WorkerApi, PolledWorkerRefusesToBlock) {
  RingLink link("polled", 90, {.end = {.mtu = kMtu}});
  NetCoreConfig c;
  c.servers = {ServerSpec{{"server0", RingLink::ip_a(90), 47100, 0}, kShards, std::nullopt}};
  c.chunk_bytes = kChunk;
  c.endpoint = pmdtest::endpoint_config(7, 1);
  PolledWorker polled(link.b(), c);
  Worker& w = polled.worker();
  std::vector<float> a(100);
  w.declare("a", a);
  node::Loop loop({.tick_hz = rte_get_tsc_hz()});
  polled.attach(loop);
  const Handle started = w.start_async();
  for (int i = 0; i < 1000; ++i) loop.pass_st(rte_rdtsc());
  EXPECT_FALSE(started.ready());  // nobody polls link.a(): no server answers
  try {
    w.start();
    FAIL() << "start() waited";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(),
                 "start: this worker's net core is polled by its owner (PolledWorker), so "
                 "start() cannot wait; use start_async() and poll until the handle is ready");
  }
  EXPECT_THROW(w.barrier(), UsageError);
  EXPECT_THROW(w.push(0, a), UsageError);  // an implicit start is a start()
  ASSERT_NE(polled.net_core(), nullptr);
  EXPECT_NE(polled.net_core()->endpoint_st(), nullptr);
  w.shutdown();
  EXPECT_FALSE(started.ok());
  EXPECT_NE(started.error().find("shut down"), std::string_view::npos) << started.error();
  EXPECT_EQ(polled.net_core(), nullptr);
  EXPECT_EQ(loop.pass_st(rte_rdtsc()), 0u);  // the net core left the loop
}

// ---------------------------------------------------------------------------
// The C ABI over the same machinery.

struct CallbackRecord {
  std::atomic<int> calls{0};
  std::atomic<int> status{-1};
};

void record(void* context, int status, const char* error) {
  auto* r = static_cast<CallbackRecord*>(context);
  r->status = status;
  EXPECT_STREQ(error, "");
  ++r->calls;
}

TEST(WorkerC, DeclareStartPushPullBarrierStatsErrors) {
  Job job(1);
  mercury_worker* w = wrap_worker_for_c(job.take(0));
  std::vector<float> p(5000), grad(5000);
  for (size_t i = 0; i < p.size(); ++i) {
    p[i] = static_cast<float>(i) * 0.25f;
    grad[i] = static_cast<float>(i % 7) - 3.0f;
  }
  uint32_t key = 99;
  ASSERT_EQ(mercury_worker_declare(w, "p", p.data(), p.size(), -1, &key), MERCURY_OK);
  EXPECT_EQ(key, 0u);
  EXPECT_EQ(mercury_worker_declare(w, "p", p.data(), p.size(), -1, &key), MERCURY_E_USAGE);
  EXPECT_STREQ(mercury_last_error(), "declare: tensor 'p' is already declared (id 0)");
  // Refused at declare, not later across the C boundary (issue: a 65 536-byte
  // name aborted the process at start; SIZE_MAX elements overflowed sizes).
  const std::string long_name(65536, 'n');
  EXPECT_EQ(mercury_worker_declare(w, long_name.c_str(), p.data(), p.size(), -1, &key),
            MERCURY_E_USAGE);
  EXPECT_STREQ(mercury_last_error(), "declare: a tensor name of 65536 bytes; at most 1024");
  EXPECT_EQ(mercury_worker_declare(w, "huge", p.data(), SIZE_MAX, -1, &key), MERCURY_E_USAGE);
  EXPECT_NE(std::string(mercury_last_error()).find("elements; at most 2^36"), std::string::npos)
      << mercury_last_error();
  mercury_handle* started = nullptr;
  ASSERT_EQ(mercury_worker_start_async(w, &started), MERCURY_OK) << mercury_last_error();
  EXPECT_EQ(mercury_handle_wait(started), MERCURY_OK) << mercury_handle_error(started);
  mercury_handle_release(started);
  ASSERT_EQ(mercury_worker_start(w), MERCURY_OK) << mercury_last_error();
  EXPECT_EQ(mercury_worker_rank(w), 0u);
  EXPECT_EQ(mercury_worker_workers(w), 1u);

  std::vector<float> expect = p;
  for (size_t i = 0; i < p.size(); ++i) expect[i] = p[i] - kLr * (grad[i] * 1.0f);
  mercury_handle* h = nullptr;
  ASSERT_EQ(mercury_worker_push_pull(w, 0, grad.data(), p.data(), p.size(), &h), MERCURY_OK);
  CallbackRecord rec;
  ASSERT_EQ(mercury_handle_on_complete(h, &record, &rec), MERCURY_OK);
  EXPECT_EQ(mercury_handle_wait(h), MERCURY_OK);
  EXPECT_EQ(mercury_handle_ready(h), 1);
  EXPECT_EQ(mercury_handle_status(h), MERCURY_OK);
  EXPECT_STREQ(mercury_handle_error(h), "");
  mercury_handle_release(h);
  EXPECT_EQ(p, expect);
  // The callback ran exactly once (on the net core, before or after wait returned).
  while (rec.calls.load() == 0) std::this_thread::yield();
  EXPECT_EQ(rec.calls.load(), 1);
  EXPECT_EQ(rec.status.load(), MERCURY_OK);
  EXPECT_EQ(mercury_worker_barrier(w), MERCURY_OK) << mercury_last_error();
  mercury_handle* barrier = nullptr;
  ASSERT_EQ(mercury_worker_barrier_async(w, &barrier), MERCURY_OK) << mercury_last_error();
  EXPECT_EQ(mercury_handle_wait(barrier), MERCURY_OK) << mercury_handle_error(barrier);
  mercury_handle_release(barrier);
  EXPECT_EQ(mercury_worker_barrier_async(w, nullptr), MERCURY_E_USAGE);
  EXPECT_STREQ(mercury_last_error(), "mercury_worker_barrier_async: handle_out is NULL");

  // Misuse: wrong size, unknown key, NULL arguments.
  EXPECT_EQ(mercury_worker_push(w, 0, grad.data(), 10, &h), MERCURY_E_USAGE);
  EXPECT_STREQ(mercury_last_error(), "push: tensor 'p' has 5000 elements but the buffer has 10");
  EXPECT_EQ(mercury_worker_pull(w, 3, p.data(), p.size(), &h), MERCURY_E_USAGE);
  EXPECT_EQ(mercury_worker_push(w, 0, grad.data(), grad.size(), nullptr), MERCURY_E_USAGE);
  EXPECT_STREQ(mercury_last_error(), "mercury_worker_push: out is NULL");
  uint32_t k = 7;
  EXPECT_EQ(mercury_worker_key(w, "p", &k), MERCURY_OK);
  EXPECT_EQ(k, 0u);
  uint32_t v = 7;
  EXPECT_EQ(mercury_worker_mark_read(w, 0, &v), MERCURY_OK) << mercury_last_error();
  EXPECT_EQ(v, 1u);  // bsp: the version its push_pull delivered
  EXPECT_EQ(mercury_worker_mark_read(w, 0, nullptr), MERCURY_E_USAGE);
  EXPECT_STREQ(mercury_last_error(), "mercury_worker_mark_read: version_out is NULL");
  EXPECT_EQ(mercury_worker_mark_read(w, 9, &v), MERCURY_E_USAGE);

  // The counters: one push_pull of 5000 floats by the only rank, which also
  // sent the initial parameters at start (the net core publishes them with its
  // slow work: wait for the push to show).
  mercury_worker_stats st;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  do {
    std::memset(&st, 0xff, sizeof st);
    ASSERT_EQ(mercury_worker_get_stats(w, &st, sizeof st), MERCURY_OK) << mercury_last_error();
    if (st.pushes != 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  } while (std::chrono::steady_clock::now() < deadline);
  EXPECT_EQ(st.pushes, 1u);
  EXPECT_EQ(st.pulls, 1u);
  EXPECT_EQ(st.bytes_pushed, 2u * 5000 * sizeof(float));
  EXPECT_GE(st.bytes_placed, 5000u * sizeof(float));
  EXPECT_GE(st.versions_completed, 1u);
  EXPECT_GE(st.chunks_received, 1u);
  EXPECT_EQ(st.chunks_dropped + st.control_dropped, 0u);
  EXPECT_EQ(st.staleness_sum + st.stale_pushes + st.staleness_max, 0u);  // bsp
  EXPECT_EQ(st.ssp_waits + st.ssp_gap_max, 0u);
  // A caller built against an older, shorter struct gets the fields it knows
  // and nothing is written past them; a newer, longer one gets zeros past ours.
  uint64_t older[3] = {7, 7, 7};
  ASSERT_EQ(mercury_worker_get_stats(w, reinterpret_cast<mercury_worker_stats*>(older),
                                     2 * sizeof(uint64_t)),
            MERCURY_OK);
  EXPECT_EQ(older[0], st.pushes);
  EXPECT_EQ(older[1], st.pulls);
  EXPECT_EQ(older[2], 7u);
  uint64_t newer[sizeof(mercury_worker_stats) / 8 + 2];
  std::memset(newer, 0xff, sizeof newer);
  ASSERT_EQ(
      mercury_worker_get_stats(w, reinterpret_cast<mercury_worker_stats*>(newer), sizeof newer),
      MERCURY_OK);
  EXPECT_EQ(newer[0], st.pushes);
  EXPECT_EQ(newer[sizeof(mercury_worker_stats) / 8], 0u);
  EXPECT_EQ(newer[sizeof(mercury_worker_stats) / 8 + 1], 0u);
  EXPECT_EQ(mercury_worker_get_stats(w, &st, 12), MERCURY_E_USAGE);
  EXPECT_STREQ(mercury_last_error(),
               "mercury_worker_get_stats: size 12 is not a whole number of 8-byte fields");
  EXPECT_EQ(mercury_worker_get_stats(w, nullptr, sizeof st), MERCURY_E_USAGE);
  EXPECT_STREQ(mercury_last_error(), "mercury_worker_get_stats: out is NULL");
  EXPECT_EQ(mercury_worker_get_stats(nullptr, &st, sizeof st), MERCURY_E_USAGE);

  ASSERT_EQ(mercury_worker_shutdown(w), MERCURY_OK);
  EXPECT_EQ(mercury_worker_push(w, 0, grad.data(), grad.size(), &h), MERCURY_E_USAGE);
  EXPECT_STREQ(mercury_last_error(), "push: the worker has been shut down");
  mercury_worker_destroy(w);

  mercury_worker_options o;
  mercury_worker_options_init(&o, sizeof o);
  // No job file: NULL means $MERCURY_JOB, which this test leaves unset.
  unsetenv("MERCURY_JOB");
  EXPECT_EQ(mercury_worker_connect(&o, &w), MERCURY_E_WORKER);
  EXPECT_STREQ(mercury_last_error(),
               "environment: no job file: give its path (--config, the job argument) or set "
               "MERCURY_JOB");
  o.job_file = "/nonexistent/job.yaml";
  o.node = "w0";
  // Inconsistent EAL arguments are refused, not dereferenced.
  o.eal_argc = 1;
  EXPECT_EQ(mercury_worker_connect(&o, &w), MERCURY_E_USAGE);
  EXPECT_STREQ(mercury_last_error(),
               "mercury_worker_connect: options->eal_args (eal_argc is not 0) is NULL");
  const char* args[] = {"--no-huge", nullptr};
  o.eal_args = args;
  o.eal_argc = 2;
  EXPECT_EQ(mercury_worker_connect(&o, &w), MERCURY_E_USAGE);
  EXPECT_STREQ(mercury_last_error(), "mercury_worker_connect: options->eal_args[1] is NULL");
  o.eal_argc = 0;
  o.eal_args = nullptr;
  EXPECT_EQ(mercury_worker_connect(&o, &w), MERCURY_E_WORKER);
  EXPECT_NE(std::string(mercury_last_error()).find("/nonexistent/job.yaml"), std::string::npos)
      << mercury_last_error();
}

// Settings, a tensor with a rule of its own, a checkpoint and a resume
// through the C ABI: the rate set by rank 0 makes the next version; the
// state read back is a job's state file at version 1, which a new job on a
// new server starts from, with the same parameters, and goes on from.
TEST(WorkerC, SettingsStateAndResume) {
  std::vector<float> p(3000), bn(100), grad(3000), bn_push(100);
  for (size_t i = 0; i < p.size(); ++i) {
    p[i] = static_cast<float>(i % 11) * 0.5f;
    grad[i] = static_cast<float>(i % 7) - 3.0f;
  }
  for (size_t i = 0; i < bn.size(); ++i) bn_push[i] = static_cast<float>(i) * 0.125f;
  void* state = nullptr;
  size_t state_bytes = 0;
  std::vector<float> after_one;
  {
    Job job(1);
    mercury_worker* w = wrap_worker_for_c(job.take(0));
    uint32_t key = 9;
    ASSERT_EQ(mercury_worker_declare(w, "p", p.data(), p.size(), -1, &key), MERCURY_OK);
    ASSERT_EQ(mercury_worker_declare_update(w, "bn", bn.data(), bn.size(), -1, MERCURY_UPDATE_RANK0,
                                            &key),
              MERCURY_OK)
        << mercury_last_error();
    EXPECT_EQ(mercury_worker_declare_update(w, "x", bn.data(), bn.size(), -1, 7, &key),
              MERCURY_E_USAGE);
    EXPECT_STREQ(mercury_last_error(),
                 "mercury_worker_declare_update: update 7 is not a mercury_update");
    mercury_hyperparameters h;
    mercury_handle* set = nullptr;
    EXPECT_EQ(mercury_worker_set_hyperparameters(w, &h, sizeof h, &set), MERCURY_E_USAGE);
    EXPECT_STREQ(mercury_last_error(),
                 "set_hyperparameters: the worker has not started (start() first)");
    ASSERT_EQ(mercury_worker_start(w), MERCURY_OK) << mercury_last_error();
    ASSERT_EQ(mercury_worker_hyperparameters(w, &h, sizeof h), MERCURY_OK);
    EXPECT_EQ(h.learning_rate, kLr);
    h.learning_rate = 0.5f;
    ASSERT_EQ(mercury_worker_set_hyperparameters(w, &h, sizeof h, &set), MERCURY_OK)
        << mercury_last_error();
    EXPECT_EQ(mercury_handle_wait(set), MERCURY_OK) << mercury_handle_error(set);
    mercury_handle_release(set);
    const std::vector<float> before = p;
    mercury_handle* a = nullptr;
    mercury_handle* b = nullptr;
    ASSERT_EQ(mercury_worker_push_pull(w, 0, grad.data(), p.data(), p.size(), &a), MERCURY_OK);
    ASSERT_EQ(mercury_worker_push_pull(w, 1, bn_push.data(), bn.data(), bn.size(), &b), MERCURY_OK);
    EXPECT_EQ(mercury_handle_wait(a), MERCURY_OK);
    EXPECT_EQ(mercury_handle_wait(b), MERCURY_OK);
    mercury_handle_release(a);
    mercury_handle_release(b);
    for (size_t i = 0; i < p.size(); ++i) ASSERT_EQ(p[i], before[i] - 0.5f * grad[i]) << i;
    EXPECT_EQ(bn, bn_push);  // rank 0's push, as it is
    ASSERT_EQ(mercury_worker_server_state(w, &state, &state_bytes), MERCURY_OK)
        << mercury_last_error();
    EXPECT_GT(state_bytes, 64u * 3);  // the settings and a record per chunk
    after_one = p;
    mercury_worker_destroy(w);
  }
  Job job(1);
  mercury_worker* w = wrap_worker_for_c(job.take(0));
  std::vector<float> q(3000, -1.0f), bn2(100, -1.0f);
  uint32_t key = 0;
  ASSERT_EQ(mercury_worker_declare(w, "p", q.data(), q.size(), -1, &key), MERCURY_OK);
  ASSERT_EQ(mercury_worker_declare_update(w, "bn", bn2.data(), bn2.size(), -1, MERCURY_UPDATE_RANK0,
                                          &key),
            MERCURY_OK);
  ASSERT_EQ(mercury_worker_resume_from(w, state, state_bytes), MERCURY_OK) << mercury_last_error();
  mercury_state_release(state);
  ASSERT_EQ(mercury_worker_start(w), MERCURY_OK) << mercury_last_error();
  uint32_t v = 0;
  ASSERT_EQ(mercury_worker_start_version(w, &v), MERCURY_OK);
  EXPECT_EQ(v, 1u);
  // It started with the job (a resume is no join): MERCURY_5's call says so.
  int joined = -1;
  ASSERT_EQ(mercury_worker_joined_version(w, &joined, &v), MERCURY_OK) << mercury_last_error();
  EXPECT_EQ(joined, 0);
  EXPECT_EQ(v, 0u);
  EXPECT_EQ(mercury_worker_joined_version(w, nullptr, &v), MERCURY_E_USAGE);
  EXPECT_EQ(q, after_one);
  EXPECT_EQ(bn2, bn_push);
  // The resumed table holds the rate set before the checkpoint.
  mercury_handle* a = nullptr;
  ASSERT_EQ(mercury_worker_push_pull(w, 0, grad.data(), q.data(), q.size(), &a), MERCURY_OK);
  EXPECT_EQ(mercury_handle_wait(a), MERCURY_OK) << mercury_handle_error(a);
  mercury_handle_release(a);
  for (size_t i = 0; i < q.size(); ++i) ASSERT_EQ(q[i], after_one[i] - 0.5f * grad[i]) << i;
  ASSERT_EQ(mercury_worker_version(w, 0, &v), MERCURY_OK);
  EXPECT_EQ(v, 2u);
  EXPECT_EQ(mercury_worker_resume_from(w, &v, 4), MERCURY_E_USAGE);  // after start
  mercury_worker_destroy(w);
}

// mercury_worker_options carries its size: init sets it and the defaults in
// the caller's bytes only; connect refuses a size no init set and a larger
// (newer) struct whose fields this library lacks are not zero, and takes one
// whose unknown fields are zero (it gets as far as reading the job file).
TEST(WorkerC, OptionsCarryTheirSize) {
  // The first layout with a size (0.4.0) ends at `timeline`.
  constexpr size_t kFirst =
      offsetof(mercury_worker_options, timeline) + sizeof(mercury_worker_options::timeline);
  const std::string sizes = " is not the size of a mercury_worker_options (" +
                            std::to_string(kFirst) +
                            " to 65536 bytes): set it with "
                            "mercury_worker_options_init(&options, sizeof options)";
  EXPECT_EQ(mercury_worker_options_init(nullptr, sizeof(mercury_worker_options)), MERCURY_E_USAGE);
  EXPECT_STREQ(mercury_last_error(), "mercury_worker_options_init: options is NULL");
  mercury_worker_options o;
  std::memset(&o, 0xab, sizeof o);
  EXPECT_EQ(mercury_worker_options_init(&o, 8), MERCURY_E_USAGE);
  EXPECT_EQ(mercury_last_error(), "mercury_worker_options_init: size 8" + sizes);
  EXPECT_EQ(o.start_timeout_ms, 0xababababu);  // nothing written

  ASSERT_EQ(mercury_worker_options_init(&o, sizeof o), MERCURY_OK);
  EXPECT_EQ(o.size, sizeof o);
  EXPECT_EQ(o.eal_mode, MERCURY_EAL_AUTO);
  EXPECT_EQ(o.job_file, nullptr);
  EXPECT_EQ(o.node, nullptr);
  EXPECT_EQ(o.eal_args, nullptr);
  EXPECT_EQ(o.eal_argc, 0u);
  EXPECT_EQ(o.start_timeout_ms, 30'000u);
  EXPECT_EQ(o.idle_backoff, 1);
  EXPECT_EQ(o.timeline, nullptr);

  // A struct not set by init: its size is refused before any field is read.
  mercury_worker* w = nullptr;
  o.job_file = "/nonexistent/job.yaml";
  o.node = "w0";
  o.size = 0;
  EXPECT_EQ(mercury_worker_connect(&o, &w), MERCURY_E_USAGE);
  EXPECT_EQ(mercury_last_error(), "mercury_worker_connect: options->size 0" + sizes);
  o.size = 1u << 20;
  EXPECT_EQ(mercury_worker_connect(&o, &w), MERCURY_E_USAGE);
  EXPECT_EQ(mercury_last_error(), "mercury_worker_connect: options->size 1048576" + sizes);

  // A caller built against a newer header: two fields this library lacks.
  struct Newer {
    mercury_worker_options known;
    int64_t dtype;
    const char* more;
  } n;
  std::memset(&n, 0xff, sizeof n);
  ASSERT_EQ(mercury_worker_options_init(&n.known, sizeof n), MERCURY_OK);
  EXPECT_EQ(n.known.size, sizeof n);
  EXPECT_EQ(n.known.start_timeout_ms, 30'000u);
  EXPECT_EQ(n.dtype, 0);  // init zeroes what it does not know
  EXPECT_EQ(n.more, nullptr);
  n.known.job_file = "/nonexistent/job.yaml";
  n.known.node = "w0";
  EXPECT_EQ(mercury_worker_connect(&n.known, &w), MERCURY_E_WORKER);  // past the options
  EXPECT_NE(std::string(mercury_last_error()).find("/nonexistent/job.yaml"), std::string::npos)
      << mercury_last_error();
  const std::string newer = "mercury_worker_connect: options->size is " + std::to_string(sizeof n) +
                            " but this library knows the first " +
                            std::to_string(sizeof(mercury_worker_options)) +
                            " bytes of mercury_worker_options, and byte ";
  const std::string asks =
      " is not zero: the caller (built against a newer mercury/worker_c.h) sets an option this "
      "library does not have";
  n.more = "x";
  EXPECT_EQ(mercury_worker_connect(&n.known, &w), MERCURY_E_USAGE);
  EXPECT_EQ(mercury_last_error(), newer + std::to_string(offsetof(Newer, more)) + asks);
  n.more = nullptr;
  n.dtype = 1;
  EXPECT_EQ(mercury_worker_connect(&n.known, &w), MERCURY_E_USAGE);
  EXPECT_EQ(mercury_last_error(), newer + std::to_string(offsetof(Newer, dtype)) + asks);
  EXPECT_EQ(w, nullptr);
}

}  // namespace
}  // namespace mercury::worker

int main(int argc, char** argv) { return mercury::pmdtest::run_all_tests(argc, argv, {}); }
