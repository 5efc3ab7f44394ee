// Messages for the endpoint PMD tests and benchmarks: a source pattern that
// messages are cut from, a plan of mixed-size messages, a MessageReceiver
// that checks every byte of every completed message against it, a log of
// completions, the faults the tests put on links, and the loop that polls
// endpoints until a condition holds. Test-only code: it allocates freely.
#pragma once

#include <rte_cycles.h>

#include <cstdint>
#include <cstring>
#include <deque>
#include <stdexcept>
#include <string>
#include <vector>

#include "net/link_emulator.h"
#include "transport/endpoint.h"

namespace mercury::pmdtest {

/// Pseudo-random bytes (xorshift), so a misplaced slice never matches by luck.
inline std::vector<std::byte> random_pattern(size_t n, uint64_t seed) {
  std::vector<std::byte> v(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < n; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(v.data() + i, &x, std::min<size_t>(8, n - i));
  }
  return v;
}

/// A message of the plan: its bytes are pattern[start, start + len).
struct PlannedMessage {
  uint32_t len;
  size_t start;
  uint8_t priority;
};

/// Messages of mixed sizes (1 KiB .. `largest`, plus odd lengths) whose
/// lengths sum to exactly `total` bytes, cut from a pattern of
/// `pattern_bytes` at varying offsets (unaligned ones included).
inline std::vector<PlannedMessage> plan_messages(uint64_t total, uint32_t largest,
                                                 size_t pattern_bytes, uint64_t seed) {
  static constexpr uint32_t kSizes[] = {
      1024, 64u << 20,       3 * 1024 + 7, 16u << 20,  9000, 4u << 20,      100 * 1024,
      1024, (1u << 20) + 13, 64 * 1024,    256 * 1024, 2048, (8u << 20) + 5};
  std::vector<PlannedMessage> plan;
  uint64_t left = total;
  uint64_t x = seed | 1;
  for (size_t i = 0; left > 0; ++i) {
    uint32_t len = std::min<uint32_t>(kSizes[i % std::size(kSizes)], largest);
    if (len > left) len = static_cast<uint32_t>(left);
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    const size_t start = static_cast<size_t>(x % (pattern_bytes - len + 1));
    plan.push_back({len, start, static_cast<uint8_t>((x >> 40) % 8)});
    left -= len;
  }
  return plan;
}

/// Checks every completed message against the pattern. The destination
/// buffer is filled with the complement of the expected bytes first, so a
/// byte the transport never wrote cannot pass. Message identity travels in
/// block_key (the plan index) and iteration (the sender's index).
class CheckingReceiver final : public transport::MessageReceiver {
 public:
  /// `plans[s]` is what sender s sends.
  CheckingReceiver(const std::vector<std::byte>& pattern,
                   const std::vector<std::vector<PlannedMessage>>& plans)
      : pattern_(pattern), plans_(plans), done_(plans.size()) {
    for (size_t s = 0; s < plans.size(); ++s) done_[s].assign(plans[s].size(), 0);
  }

  std::byte* on_message_begin(uint16_t, const wire::HeaderFields& h) override {
    const PlannedMessage* m = find(h);
    if (m == nullptr || m->len != h.msg_len) {
      ++unexpected_;
      return nullptr;
    }
    // Reuse a free buffer that is large enough: a fresh 64 MiB one costs
    // thousands of page faults, a stall the transport would see as loss.
    std::vector<std::byte>* pick = nullptr;
    for (auto& b : buffers_) {
      if (!b.busy && b.bytes.size() >= h.msg_len &&
          (pick == nullptr || b.bytes.size() < pick->size())) {
        pick = &b.bytes;
      }
    }
    if (pick == nullptr) {
      buffers_.push_back({std::vector<std::byte>(h.msg_len), false});
      pick = &buffers_.back().bytes;
    }
    for (auto& b : buffers_) {
      if (&b.bytes == pick) b.busy = true;
    }
    auto& buf = *pick;
    const std::byte* want = pattern_.data() + m->start;
    for (uint32_t i = 0; i < h.msg_len; ++i) buf[i] = ~want[i];
    ++begun_;
    return buf.data();
  }

  void on_message_complete(uint16_t, const wire::HeaderFields& h, std::byte* buffer) override {
    const PlannedMessage* m = find(h);
    if (m == nullptr) {
      ++unexpected_;
      return;
    }
    if (std::memcmp(buffer, pattern_.data() + m->start, m->len) != 0) {
      ++corrupt_;
    } else {
      bytes_ok_ += m->len;
    }
    ++done_[h.iteration][h.block_key];
    for (auto& b : buffers_) {
      if (b.bytes.data() == buffer) b.busy = false;
    }
  }

  void on_message_abandoned(uint16_t, uint32_t, std::byte*) override { ++abandoned_; }

  /// Every message of every plan completed exactly once, every byte right.
  bool all_exactly_once() const {
    for (size_t s = 0; s < done_.size(); ++s) {
      if (!all_exactly_once(s)) return false;
    }
    return true;
  }
  /// The same for sender `s` only.
  bool all_exactly_once(size_t s) const {
    for (uint32_t c : done_[s]) {
      if (c != 1) return false;
    }
    return true;
  }
  bool none_twice() const {
    for (const auto& d : done_) {
      for (uint32_t c : d) {
        if (c > 1) return false;
      }
    }
    return true;
  }
  /// Times message `i` of sender `s` completed.
  uint32_t count(size_t s, size_t i) const { return done_[s][i]; }
  /// Messages of sender `s` completed (counting repeats).
  uint64_t completed(size_t s) const {
    uint64_t n = 0;
    for (uint32_t c : done_[s]) n += c;
    return n;
  }
  uint64_t bytes_ok() const { return bytes_ok_; }
  uint64_t corrupt() const { return corrupt_; }
  uint64_t unexpected() const { return unexpected_; }
  uint64_t abandoned() const { return abandoned_; }
  size_t open_buffers() const {
    size_t n = 0;
    for (const auto& b : buffers_) n += b.busy ? 1 : 0;
    return n;
  }

 private:
  const PlannedMessage* find(const wire::HeaderFields& h) const {
    if (h.iteration >= plans_.size() || h.block_key >= plans_[h.iteration].size()) return nullptr;
    return &plans_[h.iteration][h.block_key];
  }
  const std::vector<std::byte>& pattern_;
  const std::vector<std::vector<PlannedMessage>>& plans_;
  std::vector<std::vector<uint32_t>> done_;
  struct Buffer {
    std::vector<std::byte> bytes;
    bool busy;
  };
  std::deque<Buffer> buffers_;  // a deque: growing it never moves a buffer
  uint64_t begun_ = 0, bytes_ok_ = 0, corrupt_ = 0, unexpected_ = 0, abandoned_ = 0;
};

/// Counts completions per plan index, success or failure, and keeps the
/// first error text.
struct CompletionLog {
  std::vector<uint32_t> ok;
  std::vector<uint32_t> failed;
  std::string first_error;
  explicit CompletionLog(size_t n) : ok(n, 0), failed(n, 0) {}
  static void callback(void* self, const transport::SendResult& r) {
    auto& log = *static_cast<CompletionLog*>(self);
    if (r.ok()) {
      ++log.ok[r.cookie];
    } else {
      ++log.failed[r.cookie];
      if (log.first_error.empty()) log.first_error = std::string(r.error);
    }
  }
  uint64_t total_ok() const {
    uint64_t n = 0;
    for (uint32_t c : ok) n += c;
    return n;
  }
  bool each_once() const {
    for (size_t i = 0; i < ok.size(); ++i) {
      if (ok[i] + failed[i] != 1) return false;
    }
    return true;
  }
};

/// Submits plan[i] as message i from sender `sender_index` to `peer`.
inline void submit_plan(transport::Endpoint& ep, uint16_t peer, uint32_t sender_index,
                        const std::vector<PlannedMessage>& plan,
                        const std::vector<std::byte>& pattern, CompletionLog& log) {
  for (uint32_t i = 0; i < plan.size(); ++i) {
    transport::MessageMeta meta;
    meta.block_key = i;
    meta.iteration = sender_index;
    const transport::SubmitStatus st =
        ep.send(peer, pattern.data() + plan[i].start, plan[i].len, plan[i].priority, meta,
                transport::Completion{&CompletionLog::callback, &log, i});
    if (st != transport::SubmitStatus::kQueued) throw std::runtime_error("submit refused");
  }
}

/// Loss with 5% reordering and 2% duplication on top (none of either when
/// the loss is 0), from `seed`.
inline net::LinkParams faults(double loss, uint64_t seed) {
  net::LinkParams p;
  p.loss = loss;
  if (loss > 0) {
    p.reorder = 0.05;
    p.duplicate = 0.02;
  }
  p.seed = seed;
  return p;
}

/// Polls every endpoint until `done()` or `limit_s` seconds; false on time out.
template <typename Done>
bool run(const std::vector<transport::Endpoint*>& eps, Done done, double limit_s) {
  const uint64_t deadline = rte_rdtsc() + static_cast<uint64_t>(limit_s * rte_get_tsc_hz());
  for (;;) {
    const uint64_t now = rte_rdtsc();
    for (transport::Endpoint* e : eps) e->poll_st(now);
    if (done()) return true;
    if (now > deadline) return false;
  }
}

}  // namespace mercury::pmdtest
