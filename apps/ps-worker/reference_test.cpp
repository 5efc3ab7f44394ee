// The synthetic trainer's reference: the average it checks every aggregate
// against, and that checking a round allocates nothing once its buffers grew.
#include "reference.h"

#include <gtest/gtest.h>

#include <vector>

namespace mercury::trainer {
namespace {

// The servers' sum: every rank's gradient in rank order, then times 1/N.
std::vector<float> rank_order_average(uint32_t workers, uint32_t seed, size_t tensor, size_t n) {
  std::vector<float> sum(n), g(n);
  for (uint32_t r = 0; r < workers; ++r) {
    gradient(g, r, seed, tensor);
    for (size_t i = 0; i < n; ++i) sum[i] = r == 0 ? g[i] : sum[i] + g[i];
  }
  for (float& x : sum) x = x * (1.0f / static_cast<float>(workers));
  return sum;
}

TEST(Reference, AverageIsTheRankOrderSumOverNFromAnyRanksOwnGradient) {
  const uint32_t workers = 4;
  const size_t n = 3000;
  const std::vector<float> want = rank_order_average(workers, 7, 2, n);
  for (uint32_t rank = 0; rank < workers; ++rank) {
    Floats own(n), avg, other;
    gradient(own, rank, 7, 2);
    average(avg, other, workers, 7, 2, own, rank);
    ASSERT_EQ(avg.size(), n);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(avg[i], want[i]) << "rank " << rank << ", i " << i;
  }
}

// A set of a BSP job that shrank (ps-worker --lose): ranks 0, 1 and 3 of 4.
TEST(Reference, AverageOfSomeRanksIsTheirRankOrderSumOverTheirCount) {
  const size_t n = 2000;
  std::vector<float> want(n), g(n);
  bool first = true;
  for (uint32_t r : {0u, 1u, 3u}) {
    gradient(g, r, 5, 1);
    for (size_t i = 0; i < n; ++i) want[i] = first ? g[i] : want[i] + g[i];
    first = false;
  }
  for (float& x : want) x = x * (1.0f / 3.0f);
  for (uint32_t rank : {0u, 1u, 3u}) {
    Floats own(n), avg, other;
    gradient(own, rank, 5, 1);
    average_of(avg, other, 0b1011, 5, 1, own, rank);
    ASSERT_EQ(avg.size(), n);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(avg[i], want[i]) << "rank " << rank << ", i " << i;
  }
  // Over every rank it is average()'s.
  Floats own(n), avg, other;
  gradient(own, 2, 5, 1);
  average_of(avg, other, 0b1111, 5, 1, own, 2);
  const std::vector<float> all = rank_order_average(4, 5, 1, n);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(avg[i], all[i]) << i;
}

TEST(Reference, AverageReusesTheCallersBuffersOnceTheyHoldTheLargestTensor) {
  // Sizes past the huge-page allocator's 2 MiB threshold, as a model's
  // largest tensors are: each fresh buffer would be an mmap and a munmap.
  const size_t big = 3 << 20, small = 1 << 20;
  Floats own_big(big), own_small(small), avg, other;
  gradient(own_big, 1, 0, 0);
  gradient(own_small, 1, 0, 1);
  average(avg, other, 4, 0, 0, own_big, 1);
  ASSERT_EQ(other.size(), big);  // the other ranks' gradients were generated there
  const float* avg_at = avg.data();
  const float* other_at = other.data();
  for (uint32_t round = 1; round < 4; ++round) {
    gradient(own_small, 1, round, 1);
    gradient(own_big, 1, round, 0);
    average(avg, other, 4, round, 1, own_small, 1);
    ASSERT_EQ(avg.size(), small);
    average(avg, other, 4, round, 0, own_big, 1);
    ASSERT_EQ(avg.size(), big);
    EXPECT_EQ(avg.data(), avg_at) << "round " << round;
    EXPECT_EQ(other.data(), other_at) << "round " << round;
  }
  const std::vector<float> want = rank_order_average(4, 3, 0, big);
  for (size_t i = 0; i < big; i += 4099) ASSERT_EQ(avg[i], want[i]) << i;
}

}  // namespace
}  // namespace mercury::trainer
