// The data flow of docs/architecture.md ("One BSP iteration, as data flows"), end to end
// over real ports, from the parts that exist: 4 workers push every partition
// of a real model's gradients through their transport endpoints; the server's
// endpoints hand each packet (one chunk) to the owning shard's ChunkTable,
// which holds the mbufs until all 4 contributions of that chunk are in, reduces
// them in rank order and emits the update at once; the update goes back to
// every worker as a slice of its partition, from one buffer, at the tensor's
// level; each worker's PullTracker places it and completes the tensor's pull
// when its last chunk lands. Checked bit for bit against a rank-order
// reference, with and without loss, reordering and duplication, for several
// BSP rounds. One thread polls everything, shards inline, with the
// placement given to the server; the control plane and shard cores are
// tested in ps_control_test.cpp and ps_cores_test.cpp.
#include <gtest/gtest.h>
#include <rte_cycles.h>
#include <rte_mbuf.h>

#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <vector>

#include "agg/placement.h"
#include "fixture.h"
#include "net/frame.h"
#include "pmd_env.h"
#include "server/server_node.h"
#include "transport/endpoint.h"
#include "worker/handle.h"
#include "worker/tensor_table.h"
#include "worker/worker_node.h"

namespace mercury {
namespace {

using transport::Endpoint;
using transport::EndpointConfig;
using transport::PeerSpec;
using transport::testing::RingLink;

constexpr uint32_t kWorkers = 4;
constexpr uint32_t kShards = 2;
constexpr uint32_t kMtu = 1500;
const uint32_t kChunk = net::payload_per_packet(kMtu);

std::string read_model(const char* name) {
  std::ifstream in(std::string(MERCURY_MODELS_DIR) + "/" + name);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

EndpointConfig endpoint_config(uint16_t epoch, uint16_t sender_id, const PeerSpec& peer) {
  EndpointConfig c;
  c.transport.tsc_hz = rte_get_tsc_hz();
  c.transport.window_packets = 128;
  c.transport.peer_timeout_us = 10'000'000;
  c.local_epoch = epoch;
  c.sender_id = sender_id;
  // Every chunk update is one slice to each worker: many descriptors in flight.
  c.max_messages = 1 << 16;
  c.ingress_capacity = 1 << 16;
  c.peers = {peer};
  return c;
}

// A worker: its parameters, this round's gradient, its tensor table and its
// network side (endpoint + pull tracker).
struct Worker {
  std::vector<std::vector<float>> params;
  std::vector<std::vector<float>> grads;
  worker::TensorTable table;
  std::unique_ptr<worker::WorkerNode> node;
  std::vector<worker::Handle> pulls;
};

// Polls every node until `done` or `limit_s` seconds; false on time out.
template <typename Done>
bool poll_until(server::ServerNode& server, std::vector<std::unique_ptr<Worker>>& workers,
                Done done, double limit_s) {
  const uint64_t deadline = rte_rdtsc() + static_cast<uint64_t>(limit_s * rte_get_tsc_hz());
  for (;;) {
    const uint64_t now = rte_rdtsc();
    server.poll_st(now);
    for (auto& w : workers) w->node->poll_st(now);
    if (done()) return true;
    if (now > deadline) return false;
  }
}

void run_rounds(const net::LinkParams& impair, uint32_t rounds, const char* model) {
  const std::vector<agg::TensorDecl> decls = agg::parse_model_shapes(read_model(model));
  std::vector<std::unique_ptr<RingLink>> links;
  for (uint32_t w = 0; w < kWorkers; ++w) {
    net::LinkParams p = impair;
    p.seed = impair.seed + w;
    // Ring and port names are process-wide and outlive a closed port: one set per run.
    static int run = 0;
    links.push_back(std::make_unique<RingLink>("ps" + std::to_string(run++),
                                               static_cast<uint8_t>(60 + w), kMtu, p, 8191));
  }

  // Workers declare the model (each its own parameter buffers) and freeze.
  std::vector<std::unique_ptr<Worker>> workers;
  std::mt19937 rng(7);
  for (uint32_t w = 0; w < kWorkers; ++w) {
    auto wk = std::make_unique<Worker>();
    wk->params.resize(decls.size());
    wk->grads.resize(decls.size());
    for (size_t t = 0; t < decls.size(); ++t) {
      wk->params[t].assign(decls[t].elements, 0.0f);
      wk->grads[t].resize(decls[t].elements);
      wk->table.declare(decls[t].name, wk->params[t], decls[t].priority);
    }
    wk->table.freeze(kShards, kChunk);
    workers.push_back(std::move(wk));
  }

  // The server places the same declarations: the same partitions and keys.
  const agg::Placement placement =
      agg::Placement::compute(workers[0]->table.declarations(), kShards);
  ASSERT_EQ(placement.fingerprint(), workers[0]->table.fingerprint());
  const uint64_t now0 = rte_rdtsc();
  std::vector<server::WorkerLink> wlinks;
  for (uint32_t w = 0; w < kWorkers; ++w) {
    const auto net = static_cast<uint8_t>(60 + w);
    wlinks.push_back({&links[w]->a(), {"w" + std::to_string(w), RingLink::ip_b(net), 47101}});
  }
  server::ServerNodeConfig sc;
  sc.chunk_bytes = kChunk;
  sc.optimizer.kind = agg::OptimizerKind::kSumOnly;
  sc.shard_ids = {0, 1};
  sc.endpoint = endpoint_config(3, 0, {});
  server::ServerNode server(placement, wlinks, sc, now0);
  for (uint32_t w = 0; w < kWorkers; ++w) {
    const auto net = static_cast<uint8_t>(60 + w);
    worker::WorkerNodeConfig wc;
    wc.endpoint =
        endpoint_config(5, static_cast<uint16_t>(w + 1), {"ps", RingLink::ip_a(net), 47100});
    wc.pulls.first_version = 1;  // no initial parameters here: the first update is version 1
    workers[w]->node =
        std::make_unique<worker::WorkerNode>(workers[w]->table, links[w]->b(), wc, now0);
  }

  for (uint32_t round = 0; round < rounds; ++round) {
    // Each worker's gradient for this round, and the rank-order reference.
    std::vector<std::vector<float>> expect(decls.size());
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    for (size_t t = 0; t < decls.size(); ++t) {
      for (auto& w : workers) {
        for (float& g : w->grads[t]) g = dist(rng);
      }
      expect[t].resize(decls[t].elements);
      for (uint64_t i = 0; i < decls[t].elements; ++i) {
        float s = workers[0]->grads[t][i];
        for (uint32_t r = 1; r < kWorkers; ++r) s = s + workers[r]->grads[t][i];
        expect[t][i] = s * (1.0f / kWorkers);  // agg's g = (((c0 + c1) + c2) + c3) * (1/n)
      }
    }
    // Register the pulls of version round + 1, then push every partition.
    for (auto& w : workers) {
      // One Handle per tensor: a copied Handle shares its state.
      w->pulls.clear();
      for (size_t t = 0; t < decls.size(); ++t) w->pulls.emplace_back();
      for (size_t t = 0; t < decls.size(); ++t) {
        ASSERT_EQ(
            w->node->tracker().expect_st(static_cast<worker::TensorId>(t), round + 1, w->pulls[t]),
            worker::ExpectResult::kWaiting);
      }
      for (size_t t = 0; t < decls.size(); ++t) {
        ASSERT_EQ(w->node->push(static_cast<worker::TensorId>(t), w->grads[t], round), 0u);
      }
    }
    const bool done = poll_until(
        server, workers,
        [&] {
          for (auto& w : workers) {
            for (const worker::Handle& h : w->pulls) {
              if (!h.ready()) return false;
            }
          }
          return true;
        },
        60.0);
    ASSERT_TRUE(done) << "round " << round << ": not every pull completed; server refused "
                      << server.counters_st().shards.refused << ", updates "
                      << server.counters_st().shards.updates;
    for (uint32_t w = 0; w < kWorkers; ++w) {
      for (size_t t = 0; t < decls.size(); ++t) {
        ASSERT_TRUE(workers[w]->pulls[t].ok()) << workers[w]->pulls[t].error();
        size_t bad = 0;
        while (bad < expect[t].size() &&
               std::memcmp(&workers[w]->params[t][bad], &expect[t][bad], sizeof(float)) == 0) {
          ++bad;
        }
        ASSERT_EQ(bad, expect[t].size())
            << "worker " << w << " tensor " << t << " " << decls[t].name << " (" << expect[t].size()
            << " elements) round " << round << ": element " << bad << " is "
            << workers[w]->params[t][bad] << ", expected " << expect[t][bad];
      }
    }
  }
  const server::ServerCounters c = server.counters_st();
  EXPECT_EQ(c.shards.fanout_refused, 0u);
  EXPECT_EQ(c.shards.refused, 0u);
  EXPECT_EQ(c.drop(server::ServerDrop::kNotOurs), 0u);
  uint64_t chunks = 0;
  for (const agg::Partition& p : placement.partitions())
    chunks += (p.bytes() + kChunk - 1) / kChunk;
  EXPECT_EQ(c.shards.updates, chunks * rounds);  // every chunk updated once per round
  for (uint32_t s = 0; s < kShards; ++s) EXPECT_EQ(server.shard(s)->table().held(), 0u);
  for (auto& w : workers) {
    EXPECT_EQ(w->node->tracker().counters_st().count(worker::ChunkVerdict::kPlaced),
              chunks * rounds);
  }
}

TEST(PsFlow, ServerRefusesAPlacementWhosePrioritiesAreNotLevels) {
  // ResNet-50 declared as is has priorities 0..160; only the workers' tensor
  // table maps them onto the scheduler's 64 levels.
  const agg::Placement raw =
      agg::Placement::compute(agg::parse_model_shapes(read_model("resnet50.txt")), 1);
  server::ServerNodeConfig sc;
  sc.chunk_bytes = kChunk;
  sc.shard_ids = {0};
  try {
    server::ServerNode node(raw, {server::WorkerLink{}}, sc, rte_rdtsc());
    FAIL() << "accepted priorities beyond the scheduler's levels";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("not a scheduler level"), std::string::npos) << e.what();
  }
}

TEST(PsFlow, MobileNetV2ThreeRoundsExactWithoutFaults) { run_rounds({}, 3, "mobilenet_v2.txt"); }

TEST(PsFlow, ResNet50OneRoundExact) { run_rounds({}, 1, "resnet50.txt"); }

TEST(PsFlow, MobileNetV2TwoRoundsExactUnderLossReorderDuplication) {
  net::LinkParams p;
  p.loss = 0.02;
  p.reorder = 0.05;
  p.duplicate = 0.02;
  p.seed = 11;
  run_rounds(p, 2, "mobilenet_v2.txt");
}

}  // namespace
}  // namespace mercury

int main(int argc, char** argv) { return mercury::pmdtest::run_all_tests(argc, argv, {}); }
