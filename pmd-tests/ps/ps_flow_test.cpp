// The parameter server's data flow of docs/architecture.md, end to end over
// real ports: 4 of the library's workers push every tensor of a real
// model's gradients through their net cores, block by block; the
// server's endpoints hand each packet (one chunk) to the owning shard's
// ChunkTable, which holds the mbufs until all 4 contributions of that chunk
// are in, reduces them in rank order and emits the update at once; the
// update goes back to every worker as a slice of its block, from one
// buffer, at the tensor's level; each worker's net core places it in the
// trainer's buffer and completes the tensor's push_pull when its last chunk
// lands. Checked bit for bit against a rank-order reference (sum only, so
// each round's aggregate is the gradients' mean), with and without loss,
// reordering and duplication, for several BSP rounds. One thread polls
// everything, shards inline; the control plane and shard cores are tested
// in ps_control_test.cpp and ps_cores_test.cpp.
#include <gtest/gtest.h>

#include "pmd_env.h"
#include "ps_job.h"

namespace mercury {
namespace {

using pstest::Job;
using pstest::JobOptions;

void run_rounds(const net::LinkParams& impair, uint32_t rounds, const char* model) {
  JobOptions o;
  o.model = model;
  o.impair = impair;
  o.optimizer.kind = agg::OptimizerKind::kSumOnly;
  Job job(o);
  std::vector<std::vector<float>> reference = job.start(7);
  ASSERT_EQ(job.compare(reference, "initial parameters"), "");
  std::mt19937 rng(7);
  for (uint32_t round = 0; round < rounds; ++round) {
    ASSERT_EQ(job.round(round, reference, rng), "");
  }
  const server::ServerCounters c = job.server().counters_st();
  EXPECT_EQ(c.shards.fanout_refused, 0u);
  EXPECT_EQ(c.shards.refused, 0u);
  EXPECT_EQ(c.drop(server::ServerDrop::kNotOurs), 0u);
  const uint64_t chunks = job.chunks();
  EXPECT_EQ(c.shards.updates, chunks * (rounds + 1));  // every chunk: version 0, then once a round
  for (uint32_t s = 0; s < 2; ++s) EXPECT_EQ(job.server().shard(s)->table().held(), 0u);
  // Every worker took every chunk of every version once (the transport
  // removed the duplicates the link made) and placed it, and pushed its
  // gradients once a round (rank 0 also its initial parameters).
  uint64_t model_bytes = 0;
  for (const agg::TensorDecl& d : job.decls()) model_bytes += d.elements * sizeof(float);
  for (uint32_t w = 0; w < job.workers(); ++w) {
    worker::Worker& api = job.worker(w).api();
    api.shutdown();  // its counters, published in full
    const worker::WorkerStats s = api.stats();
    EXPECT_EQ(s.chunks_received, chunks * (rounds + 1)) << "worker " << w;
    EXPECT_EQ(s.chunks_dropped, 0u) << "worker " << w;
    EXPECT_EQ(s.versions_completed, uint64_t{job.decls().size()} * (rounds + 1)) << "worker " << w;
    EXPECT_EQ(s.pushes, uint64_t{job.decls().size()} * rounds) << "worker " << w;
    EXPECT_EQ(s.bytes_pushed, model_bytes * (rounds + (w == 0 ? 1 : 0))) << "worker " << w;
    EXPECT_EQ(s.bytes_placed, model_bytes * (rounds + 1)) << "worker " << w;
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
