// Helpers of the PeerSender unit tests (sender_test.cpp,
// sender_timer_test.cpp).
#pragma once

#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "transport/test_util.h"
#include "transport/transport.h"

namespace mercury::transport::test {

inline constexpr uint32_t kIsn = 1000;

// Params for the tests of the resend path: a PeerSender alone has nobody to
// send the timer's probe (Params::rto_probe), so its expiries resend at once.
// The probe's own tests use test_params().
inline Params resend_params(uint32_t window = 16) {
  Params p = test_params(window);
  p.rto_probe = false;
  return p;
}

// Sends n slices (slice_of(first..first+n-1)) at time `now`; returns their seqs.
inline std::vector<uint32_t> send_n(PeerSender& s, uint32_t n, Tick now, uint32_t first = 0) {
  std::vector<uint32_t> seqs;
  for (uint32_t i = 0; i < n; ++i) {
    EXPECT_TRUE(s.can_send());
    seqs.push_back(s.on_send(slice_of(first + i), now).seq);
  }
  return seqs;
}

// Every slice in `acked` is distinct (each reported once).
inline bool all_distinct(const std::vector<SliceRef>& acked) {
  std::set<uint64_t> tokens;
  for (const auto& s : acked) tokens.insert(s.msg_token);
  return tokens.size() == acked.size();
}

}  // namespace mercury::transport::test
