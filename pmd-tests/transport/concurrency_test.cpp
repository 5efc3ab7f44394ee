// The endpoint's any-thread send path under a real concurrent producer: a
// second lcore submits messages while the net core polls, completes and
// reuses their descriptors, over a lossy, reordering, duplicating link
// (the case itself: pmd-tests/common/concurrency_case.h; its sweep of seeds
// and loss rates, timed, is benchmarks/transport_pmd/concurrency_bench).
#include <gtest/gtest.h>

#include "concurrency_case.h"
#include "pmd_env.h"

namespace mercury::transport {
namespace {

void run_case(double loss, uint64_t seed, uint32_t descriptors, bool same_thread = false) {
  const pmdtest::ConcurrencyResult r = pmdtest::run_concurrency_case(
      {.loss = loss, .seed = seed, .descriptors = descriptors, .same_thread = same_thread});
  ASSERT_EQ(r.launch, 0);
  if (!r.stuck.empty()) ADD_FAILURE() << r.stuck;
  if (!same_thread) {
    EXPECT_EQ(r.producer_exit, 0);
  }
  EXPECT_TRUE(r.submitted);
  EXPECT_EQ(r.completed, r.messages)
      << "failed " << r.failed << ", the first as " << r.first_status << ": " << r.first_error;
  EXPECT_TRUE(r.exactly_once);
}

TEST(EndpointConcurrency, ProducerOnAnotherLcoreNoLoss) { run_case(0, 7, 256); }
TEST(EndpointConcurrency, ProducerOnAnotherLcoreUnderLoss) { run_case(0.02, 13, 8192); }
TEST(EndpointConcurrency, SameThreadUnderLoss) { run_case(0.02, 17, 8192, true); }

// Few descriptors: each is completed and reused many times while packets of
// other messages wait for their resends (the stall fixed in docs/transport.md).
TEST(EndpointConcurrency, FewDescriptorsProducerOnAnotherLcoreUnderLoss) {
  run_case(0.02, 11, 256);
}
TEST(EndpointConcurrency, FewDescriptorsSameThreadUnderLoss) { run_case(0.02, 11, 256, true); }

}  // namespace
}  // namespace mercury::transport

int main(int argc, char** argv) {
  return mercury::pmdtest::run_all_tests(argc, argv, {"--lcores=0@0,1@1"});
}
