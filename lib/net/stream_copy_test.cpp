// stream_copy(): the same bytes as memcpy at every alignment and length,
// and nothing written outside the destination range.
#include "net/stream_copy.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace mercury::net {
namespace {

std::vector<std::byte> pattern(size_t n, uint32_t seed) {
  std::vector<std::byte> v(n);
  uint32_t x = seed;
  for (auto& b : v) {
    x = x * 1664525u + 1013904223u;
    b = std::byte(x >> 24);
  }
  return v;
}

TEST(StreamCopy, MatchesMemcpyAtEveryAlignmentAndLength) {
  constexpr size_t kGuard = 128;
  const std::vector<std::byte> src = pattern(4096 + 64, 7);
  std::vector<std::byte> dst(4096 + 2 * kGuard + 64);
  size_t cases = 0;
  for (size_t dst_align = 0; dst_align < 64; dst_align += 3) {
    for (size_t src_align = 0; src_align < 64; src_align += 17) {
      for (size_t n : {size_t{0}, size_t{1}, size_t{63}, size_t{64}, size_t{65}, size_t{127},
                       size_t{128}, size_t{129}, size_t{1416}, size_t{4096}}) {
        std::fill(dst.begin(), dst.end(), std::byte{0xa5});
        std::byte* d = dst.data() + kGuard + dst_align;
        stream_copy(d, src.data() + src_align, n);
        stream_fence();
        for (size_t i = 0; i < n; ++i) {
          ASSERT_EQ(d[i], src[src_align + i])
              << "byte " << i << " of " << n << ", dst+" << dst_align << ", src+" << src_align;
        }
        for (std::byte* g = dst.data(); g < d; ++g) ASSERT_EQ(*g, std::byte{0xa5});
        for (std::byte* g = d + n; g < dst.data() + dst.size(); ++g) {
          ASSERT_EQ(*g, std::byte{0xa5}) << "written past the end, n " << n;
        }
        ++cases;
      }
    }
  }
  EXPECT_EQ(cases, 22u * 4u * 10u);
}

TEST(StreamCopy, PlacesPacketsIntoALargeBufferLikeMemcpy) {
  // The endpoint's use: payloads at consecutive offsets of a message larger
  // than kStreamDestinationBytes. 1416 bytes, not net::payload_per_packet's
  // whole lines, so that every packet has partial lines at both ends (as in
  // a buffer that is not 64-byte aligned).
  constexpr size_t kPayload = 1416;
  const size_t total = kStreamDestinationBytes + 12345;
  const std::vector<std::byte> src = pattern(total, 11);
  std::vector<std::byte> placed(total);
  for (size_t off = 0; off < total; off += kPayload) {
    const size_t n = std::min(kPayload, total - off);
    stream_copy(placed.data() + off, src.data() + off, n);
  }
  stream_fence();
  EXPECT_EQ(placed, src);
}

}  // namespace
}  // namespace mercury::net
