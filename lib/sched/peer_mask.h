// PeerMask: a set of up to 256 peers, as a fixed 256-bit bitset.
//
// The transport builds one per TX burst (peers whose in-flight window is open)
// and the scheduler keeps one per priority level (peers with queued work). All
// operations are a few word operations on the caller's stack: no allocation,
// no shared state, safe from any thread on its own instance.
#pragma once

#include <array>
#include <bit>
#include <cstdint>

namespace mercury::sched {

class PeerMask {
 public:
  static constexpr unsigned kBits = 256;

  constexpr PeerMask() = default;
  /// The set {0, 1, ..., n-1}; n is clamped to kBits.
  static constexpr PeerMask first(unsigned n) {
    PeerMask m;
    for (unsigned w = 0; w < kWords; ++w) {
      const unsigned lo = w * 64;
      if (n >= lo + 64) {
        m.words_[w] = ~uint64_t{0};
      } else if (n > lo) {
        m.words_[w] = (uint64_t{1} << (n - lo)) - 1;
      }
    }
    return m;
  }

  constexpr void set(unsigned peer) { words_[peer / 64] |= bit(peer); }
  constexpr void reset(unsigned peer) { words_[peer / 64] &= ~bit(peer); }
  constexpr bool test(unsigned peer) const { return (words_[peer / 64] & bit(peer)) != 0; }
  constexpr bool any() const { return (words_[0] | words_[1] | words_[2] | words_[3]) != 0; }
  constexpr unsigned count() const {
    // Written out, not as a loop: GCC 12.2 at -O3 -march=native (AVX-512
    // VPOPCNTDQ) folds the loop `unsigned n += popcount(word)` to a wrong
    // constant (3 instead of 6 in peer_mask_test).
    return static_cast<unsigned>(std::popcount(words_[0]) + std::popcount(words_[1]) +
                                 std::popcount(words_[2]) + std::popcount(words_[3]));
  }

  /// Lowest member >= from, or -1 if there is none.
  constexpr int find_from(unsigned from) const {
    for (unsigned w = from / 64; w < kWords; ++w) {
      uint64_t bits = words_[w];
      if (w == from / 64) bits &= ~uint64_t{0} << (from % 64);
      if (bits != 0) return static_cast<int>(w * 64 + std::countr_zero(bits));
    }
    return -1;
  }
  /// Round-robin step: the lowest member after `last`, wrapping around to the
  /// lowest member overall; -1 if the set is empty.
  constexpr int next_after(unsigned last) const {
    const int p = last + 1 < kBits ? find_from(last + 1) : -1;
    return p >= 0 ? p : find_from(0);
  }

  /// Bits 64*i .. 64*i+63 (i < kBits / 64).
  constexpr uint64_t word(unsigned i) const { return words_[i]; }

  constexpr PeerMask operator&(const PeerMask& o) const {
    PeerMask m;
    for (unsigned w = 0; w < kWords; ++w) m.words_[w] = words_[w] & o.words_[w];
    return m;
  }
  constexpr PeerMask operator|(const PeerMask& o) const {
    PeerMask m;
    for (unsigned w = 0; w < kWords; ++w) m.words_[w] = words_[w] | o.words_[w];
    return m;
  }
  constexpr bool operator==(const PeerMask&) const = default;

 private:
  static constexpr unsigned kWords = kBits / 64;
  static constexpr uint64_t bit(unsigned peer) { return uint64_t{1} << (peer % 64); }
  std::array<uint64_t, kWords> words_{};
};

}  // namespace mercury::sched
