// Unit tests of the pure link model (no EAL, fake clock). The mbuf stage is
// tested over real ports in pmd-tests/link/.
#include "net/link_emulator.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

namespace mercury::net {
namespace {

constexpr int kFrames = 100'000;
constexpr uint64_t kHz = 2'500'000'000;  // a fake 2.5 GHz TSC

// |observed - n p| within 4 standard deviations of the binomial: with a fixed
// seed the test is deterministic; 4 sigma keeps it robust to seed changes.
void expect_binomial(uint64_t observed, uint64_t n, double p, const char* what) {
  const double mean = static_cast<double>(n) * p;
  const double sigma = std::sqrt(static_cast<double>(n) * p * (1 - p));
  EXPECT_LE(std::abs(static_cast<double>(observed) - mean), 4 * sigma)
      << what << ": " << observed << " of " << n << ", expected " << mean << " +- " << 4 * sigma;
}

struct Tally {
  uint64_t lost = 0, duplicate = 0, corrupt = 0, reorder = 0, decided = 0;
};

Tally run(LinkModel& m, int frames, uint32_t len = 1000) {
  Tally t;
  for (int i = 0; i < frames; ++i) {
    const LinkFate f = m.decide(len);
    ++t.decided;
    t.lost += f.lost;
    t.duplicate += f.duplicate;
    t.corrupt += f.corrupt;
    t.reorder += f.reorder;
  }
  return t;
}

TEST(LinkModel, AllOffIsPassThrough) {
  LinkModel m(LinkParams{}, kHz);
  EXPECT_TRUE(m.passthrough());
  for (uint64_t i = 0; i < 1000; ++i) {
    const LinkFate f = m.decide(1500);
    EXPECT_FALSE(f.lost || f.duplicate || f.corrupt || f.reorder);
    EXPECT_EQ(m.schedule(1500, 1000 + i), 1000 + i);  // leaves the moment it arrives
  }
  LinkParams seeded;
  seeded.seed = 12345;  // a seed alone impairs nothing
  EXPECT_TRUE(LinkModel(seeded, kHz).passthrough());
}

TEST(LinkModel, EachImpairmentAloneMatchesItsRate) {
  for (double p : {0.001, 0.01, 0.1, 0.5}) {
    LinkParams lp;
    lp.seed = 7;
    lp.loss = p;
    LinkModel loss(lp, kHz);
    const Tally t = run(loss, kFrames);
    expect_binomial(t.lost, kFrames, p, "loss");
    EXPECT_EQ(t.duplicate + t.corrupt + t.reorder, 0u);

    lp = LinkParams{};
    lp.seed = 8;
    lp.duplicate = p;
    LinkModel dup(lp, kHz);
    expect_binomial(run(dup, kFrames).duplicate, kFrames, p, "duplicate");

    lp = LinkParams{};
    lp.seed = 9;
    lp.corrupt = p;
    LinkModel corrupt(lp, kHz);
    expect_binomial(run(corrupt, kFrames).corrupt, kFrames, p, "corrupt");

    lp = LinkParams{};
    lp.seed = 10;
    lp.reorder = p;
    LinkModel reorder(lp, kHz);
    expect_binomial(run(reorder, kFrames).reorder, kFrames, p, "reorder");
  }
}

TEST(LinkModel, CombinedImpairmentsApplyToSurvivingFrames) {
  LinkParams lp;
  lp.seed = 2024;
  lp.loss = 0.2;
  lp.duplicate = 0.05;
  lp.corrupt = 0.03;
  lp.reorder = 0.1;
  LinkModel m(lp, kHz);
  const Tally t = run(m, kFrames);
  expect_binomial(t.lost, kFrames, 0.2, "loss");
  // A lost frame is neither duplicated, corrupted nor reordered.
  const uint64_t survivors = t.decided - t.lost;
  expect_binomial(t.duplicate, survivors, 0.05, "duplicate");
  expect_binomial(t.corrupt, survivors, 0.03, "corrupt");
  expect_binomial(t.reorder, survivors, 0.1, "reorder");
}

TEST(LinkModel, ProbabilityOneAlwaysAndZeroNever) {
  LinkParams lp;
  lp.duplicate = 1;
  lp.corrupt = 1;
  LinkModel m(lp, kHz);
  const Tally t = run(m, 10'000);
  EXPECT_EQ(t.duplicate, 10'000u);
  EXPECT_EQ(t.corrupt, 10'000u);
  EXPECT_EQ(t.lost + t.reorder, 0u);

  lp = LinkParams{};
  lp.loss = 1;
  LinkModel all_lost(lp, kHz);
  EXPECT_EQ(run(all_lost, 10'000).lost, 10'000u);
}

TEST(LinkModel, CorruptionHitsOneBitAfterTheEthernetHeaderUniformly) {
  LinkParams lp;
  lp.seed = 99;
  lp.corrupt = 1;
  LinkModel m(lp, kHz);
  constexpr uint32_t kLen = 142;  // 128 corruptible bytes
  std::vector<uint64_t> per_byte(kLen, 0);
  std::vector<uint64_t> per_bit(8, 0);
  for (int i = 0; i < kFrames; ++i) {
    const LinkFate f = m.decide(kLen);
    ASSERT_TRUE(f.corrupt);
    ASSERT_GE(f.corrupt_offset, kCorruptFrom);
    ASSERT_LT(f.corrupt_offset, kLen);
    ASSERT_EQ(std::popcount(f.corrupt_mask), 1);
    ++per_byte[f.corrupt_offset];
    ++per_bit[std::countr_zero(f.corrupt_mask)];
  }
  const uint64_t span = kLen - kCorruptFrom;
  for (uint32_t b = kCorruptFrom; b < kLen; ++b) {
    expect_binomial(per_byte[b], kFrames, 1.0 / span, "byte position");
  }
  for (int bit = 0; bit < 8; ++bit) expect_binomial(per_bit[bit], kFrames, 1.0 / 8, "bit");

  // A frame with nothing past the Ethernet header cannot be corrupted.
  EXPECT_FALSE(m.decide(kCorruptFrom).corrupt);
}

std::vector<LinkFate> pattern(uint64_t seed, int frames) {
  LinkParams lp;
  lp.seed = seed;
  lp.loss = 0.1;
  lp.duplicate = 0.1;
  lp.corrupt = 0.1;
  lp.reorder = 0.1;
  LinkModel m(lp, kHz);
  std::vector<LinkFate> out;
  for (int i = 0; i < frames; ++i) out.push_back(m.decide(64 + static_cast<uint32_t>(i % 1400)));
  return out;
}

bool same(const std::vector<LinkFate>& a, const std::vector<LinkFate>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].lost != b[i].lost || a[i].duplicate != b[i].duplicate ||
        a[i].corrupt != b[i].corrupt || a[i].reorder != b[i].reorder ||
        a[i].corrupt_offset != b[i].corrupt_offset || a[i].corrupt_mask != b[i].corrupt_mask) {
      return false;
    }
  }
  return true;
}

TEST(LinkModel, SameSeedSamePatternOtherSeedAnother) {
  const auto a = pattern(1, 10'000);
  EXPECT_TRUE(same(a, pattern(1, 10'000)));
  EXPECT_FALSE(same(a, pattern(2, 10'000)));
  EXPECT_FALSE(same(a, pattern(0, 10'000)));  // 0 is a seed like any other
  EXPECT_TRUE(same(pattern(0, 1000), pattern(0, 1000)));
}

// Expected departure of the (i+1)-th back-to-back frame from an idle link at
// tick 0: the exact 32.32 fixed-point wire time, rounded up to a tick.
uint64_t expected_departure(uint64_t frames, uint64_t ser_q32) {
  const unsigned __int128 total = static_cast<unsigned __int128>(frames) * ser_q32;
  return static_cast<uint64_t>((total + 0xffffffffu) >> 32);
}

TEST(LinkModel, RateLimiterPacesBackToBackFramesAtTheLineRate) {
  for (double gbps : {10.0, 25.0, 100.0, 0.5}) {
    for (uint32_t len : {60u, 1514u, 9014u}) {
      LinkParams lp;
      lp.rate_gbps = gbps;
      LinkModel m(lp, kHz);
      EXPECT_FALSE(m.passthrough());
      const uint64_t ser = m.serialisation_q32(len);
      uint64_t last = 0;
      for (uint64_t i = 1; i <= kFrames; ++i) {
        const uint64_t d = m.schedule(len, 0);  // all offered at once
        ASSERT_EQ(d, expected_departure(i, ser)) << gbps << " Gbit/s, frame " << i;
        ASSERT_GE(d, last);
        last = d;
      }
      // Against the formula itself: (L + 24) * 8 / rate seconds per frame.
      const double seconds = kFrames * (len + kWireOverheadBytes) * 8.0 / (gbps * 1e9);
      EXPECT_NEAR(static_cast<double>(last), seconds * kHz, 1.0 + seconds * kHz * 1e-9)
          << gbps << " Gbit/s, " << len << " B";
    }
  }
}

TEST(LinkModel, RateLimiterPadsRuntFramesAndDoesNotBankIdleCredit) {
  LinkParams lp;
  lp.rate_gbps = 10;
  LinkModel m(lp, kHz);
  // A 42-byte frame is padded to 60 on the wire.
  EXPECT_EQ(m.serialisation_q32(42), m.serialisation_q32(60));
  // (1514 + 24) bytes * 8 / 10 Gbit/s = 1230.4 ns = 3076 ticks at 2.5 GHz.
  EXPECT_EQ(m.serialisation_q32(1514), uint64_t{3076} << 32);
  // Frames offered slower than the line rate leave one wire time after arrival.
  uint64_t now = 1'000'000;
  for (int i = 0; i < 100; ++i, now += 10'000) EXPECT_EQ(m.schedule(1514, now), now + 3076);
  // After a long idle period a burst is still paced, not sent at once.
  now += 1'000'000'000;
  for (uint64_t i = 1; i <= 10; ++i) EXPECT_EQ(m.schedule(1514, now), now + i * 3076);
}

TEST(LinkModel, DelayAddsExactlyTheSetDelay) {
  LinkParams lp;
  lp.delay_us = 37;
  LinkModel m(lp, kHz);
  EXPECT_EQ(m.delay_ticks(), 37u * 2500u);
  EXPECT_FALSE(m.passthrough());
  for (uint64_t now = 0; now < 10'000'000; now += 9973) {
    EXPECT_EQ(m.schedule(1500, now), now + 92'500);
  }
  // With a rate limit, the delay adds to the paced departure and nothing else.
  LinkParams paced;
  paced.rate_gbps = 25;
  LinkParams paced_delayed = paced;
  paced_delayed.delay_us = 250;
  LinkModel a(paced, kHz);
  LinkModel b(paced_delayed, kHz);
  uint64_t now = 0;
  for (int i = 0; i < kFrames; ++i) {
    now += static_cast<uint64_t>(i % 3) * 500;  // sometimes queued, sometimes idle
    const uint32_t len = 64 + static_cast<uint32_t>(i % 9000);
    ASSERT_EQ(b.schedule(len, now), a.schedule(len, now) + 250u * 2500u);
  }
}

TEST(LinkModel, RateCanChangeAtRunTime) {
  LinkModel m(LinkParams{}, kHz);
  EXPECT_TRUE(m.passthrough());
  m.set_rate_gbps(10);
  EXPECT_FALSE(m.passthrough());
  EXPECT_EQ(m.schedule(1514, 0), 3076u);
  m.set_rate_gbps(100);
  EXPECT_EQ(m.schedule(1514, 0), 3076u + 308u);  // queued behind the first; 307.6 ticks
  m.set_rate_gbps(0);
  EXPECT_TRUE(m.passthrough());
  // Unlimited again, but never ahead of a frame still on the wire.
  EXPECT_EQ(m.schedule(1514, 0), 3076u + 308u);
  EXPECT_EQ(m.schedule(1514, 1'000'000), 1'000'000u);
  EXPECT_THROW(m.set_rate_gbps(-1), std::invalid_argument);
}

std::string wire_name(const char* what) {
  return std::string("test-") + what + "." + std::to_string(::getpid());
}

// link.shared_wire: two models on one wire (each mapping the segment, as two
// processes would) serialise behind each other's frames in the order offered,
// so together they get the line rate, and each its share.
TEST(SharedWire, TwoModelsOnOneWireTakeTurnsAtTheLineRate) {
  LinkParams lp;
  lp.rate_gbps = 10;
  lp.delay_us = 1;  // 2500 ticks, added after the wire
  LinkModel a(lp, kHz), b(lp, kHz);
  SharedWire wa(wire_name("turns"), 10);
  SharedWire wb(wire_name("turns"), 10);
  a.share_wire(&wa);
  b.share_wire(&wb);
  // 1514 bytes at 10 Gbit/s are 3076 ticks exactly; all offered at once.
  for (uint64_t i = 1; i <= 1000; ++i) {
    LinkModel& m = i % 2 ? a : b;
    ASSERT_EQ(m.schedule(1514, 0), i * 3076 + 2500) << "frame " << i;
  }
  // A frame offered after the wire went idle leaves one wire time later.
  EXPECT_EQ(a.schedule(1514, 10'000'000), 10'000'000u + 3076 + 2500);
  // Partial ticks round up per frame: 307.6 ticks at 100 Gbit/s become 308.
  LinkParams fast;
  fast.rate_gbps = 100;
  LinkModel f(fast, kHz);
  SharedWire wf(wire_name("round"), 100);
  f.share_wire(&wf);
  EXPECT_EQ(f.schedule(1514, 0), 308u);
  EXPECT_EQ(f.schedule(1514, 0), 616u);
}

TEST(SharedWire, AnotherProcessSeesTheSameWire) {
  LinkParams lp;
  lp.rate_gbps = 10;
  LinkModel m(lp, kHz);
  const std::string name = wire_name("fork");  // the parent's pid, in both processes
  SharedWire w(name, 10);
  m.share_wire(&w);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The child maps the wire by name and puts 10 frames on it.
    LinkModel c(lp, kHz);
    SharedWire wc(name, 10);
    c.share_wire(&wc);
    bool ok = true;
    for (uint64_t i = 1; i <= 10; ++i) ok = ok && c.schedule(1514, 0) == i * 3076;
    ::_exit(ok ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0);
  // Ours goes behind the child's ten.
  EXPECT_EQ(m.schedule(1514, 0), 11u * 3076);
}

TEST(SharedWire, RefusesAnotherRateNoRateAndRateChanges) {
  LinkParams ten;
  ten.rate_gbps = 10;
  LinkModel a(ten, kHz), none(LinkParams{}, kHz);
  SharedWire wa(wire_name("rates"), 10), wb(wire_name("other"), 20);
  EXPECT_THROW(SharedWire(wire_name("rates"), 20), std::runtime_error);
  EXPECT_THROW(SharedWire(wire_name("zero"), 0), std::runtime_error);
  EXPECT_THROW(SharedWire("Bad/Name", 10), std::runtime_error);
  EXPECT_THROW(none.share_wire(&wa), std::invalid_argument);
  EXPECT_THROW(a.share_wire(&wb), std::invalid_argument);  // the model's rate is not the wire's
  a.share_wire(&wa);
  EXPECT_THROW(a.set_rate_gbps(20), std::invalid_argument);
  a.set_rate_gbps(10);  // the same rate is no change
  EXPECT_EQ(a.schedule(1514, 0), 3076u);
}

// The wire lives while any user has it open: the first of two to close it
// leaves it to the other, and a job starting then joins that one's wire.
// Once the last has closed it the name is gone and the next user starts on
// an idle wire, at any rate.
TEST(SharedWire, TheWireLastsUntilItsLastUserClosesIt) {
  const std::string name = wire_name("lasts");
  auto first = std::make_unique<SharedWire>(name, 10);
  {
    SharedWire second(name, 10);
    EXPECT_EQ(second.reserve(0, 1'000'000), 1'000'000u);
    first.reset();  // the first user leaves while the second runs
    SharedWire third(name, 10);
    EXPECT_EQ(third.reserve(0, 10), 1'000'010u);             // behind the second's frame
    EXPECT_THROW(SharedWire(name, 20), std::runtime_error);  // still paced at 10
  }
  SharedWire later(name, 20);
  EXPECT_EQ(later.reserve(5, 10), 15u);
}

// A process killed with the wire open leaves its segment in /dev/shm; the
// next job finds no process holding it and starts on a fresh wire at its own
// rate, not refused by the dead job's.
TEST(SharedWire, ADeadJobsWireIsTakenOverFresh) {
  const std::string name = wire_name("dead");
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto* w = new SharedWire(name, 20);  // never closed: the process dies with it
    w->reserve(0, 1'000'000'000);
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(::access(("/dev/shm/mercury-wire-" + name).c_str(), F_OK), 0) << "left behind";
  SharedWire w(name, 10);
  EXPECT_EQ(w.rate_gbps(), 10);
  EXPECT_EQ(w.reserve(5, 10), 15u);  // idle, not behind the dead job's reservation
}

// link.rate_steps: nothing is due before the anchor; each step once, at its
// time after the anchor; steps that came due together give the last one.
TEST(RateSchedule, StepsComeDueAfterTheAnchorInOrderOnce) {
  RateSchedule s({{1.0, 0.5}, {2.0, 2.0}, {2.5, 0}, {3.0, 4.0}}, kHz);
  EXPECT_EQ(s.next_at(), UINT64_MAX);
  EXPECT_FALSE(s.due(100 * kHz).has_value()) << "due before the anchor";
  const uint64_t t0 = 7 * kHz;
  s.anchor(t0);
  s.anchor(t0 + 5 * kHz);  // a second anchor changes nothing
  EXPECT_EQ(s.next_at(), t0 + kHz);
  EXPECT_FALSE(s.due(t0 + kHz - 1).has_value());
  EXPECT_EQ(s.due(t0 + kHz), 0.5);
  EXPECT_FALSE(s.due(t0 + kHz).has_value()) << "a step applied twice";
  EXPECT_EQ(s.next_at(), t0 + 2 * kHz);
  // 2.0 s and 2.5 s both passed: only the later rate matters.
  EXPECT_EQ(s.due(t0 + 2 * kHz + kHz / 2), 0.0);
  EXPECT_EQ(s.applied(), 3u);
  EXPECT_EQ(s.due(t0 + 10 * kHz), 4.0);
  EXPECT_EQ(s.next_at(), UINT64_MAX);
  EXPECT_FALSE(s.due(t0 + 100 * kHz).has_value());
}

TEST(RateSchedule, RefusesStepsOutOfOrderOrRate) {
  EXPECT_THROW(RateSchedule({{0, 1}}, kHz), std::invalid_argument);
  EXPECT_THROW(RateSchedule({{2, 1}, {2, 3}}, kHz), std::invalid_argument);
  EXPECT_THROW(RateSchedule({{2, 1}, {1, 3}}, kHz), std::invalid_argument);
  EXPECT_THROW(RateSchedule({{1, -1}}, kHz), std::invalid_argument);
  EXPECT_THROW(RateSchedule({{1, 1e9}}, kHz), std::invalid_argument);
  EXPECT_NO_THROW(RateSchedule({{1, 0}, {2, 0.001}}, kHz));
}

TEST(LinkModel, RejectsParametersOutOfRange) {
  auto with = [](auto set) {
    LinkParams p;
    set(p);
    return p;
  };
  EXPECT_THROW(validate(with([](LinkParams& p) { p.loss = 1.5; })), std::invalid_argument);
  EXPECT_THROW(validate(with([](LinkParams& p) { p.duplicate = -0.1; })), std::invalid_argument);
  EXPECT_THROW(validate(with([](LinkParams& p) { p.corrupt = std::nan(""); })),
               std::invalid_argument);
  EXPECT_THROW(validate(with([](LinkParams& p) { p.rate_gbps = 1e-6; })), std::invalid_argument);
  EXPECT_THROW(validate(with([](LinkParams& p) { p.rate_gbps = 1e6; })), std::invalid_argument);
  EXPECT_THROW(validate(with([](LinkParams& p) { p.delay_us = 20'000'000; })),
               std::invalid_argument);
  EXPECT_THROW(validate(with([](LinkParams& p) { p.queue_packets = 1; })), std::invalid_argument);
  EXPECT_THROW(validate(with([](LinkParams& p) {
                 p.queue_packets = 8;
                 p.reorder_gap = 9;
               })),
               std::invalid_argument);
  EXPECT_THROW(LinkModel(LinkParams{}, 0), std::invalid_argument);
  EXPECT_NO_THROW(validate(with([](LinkParams& p) {
    p.rate_gbps = 100;
    p.delay_us = 50;
    p.loss = 1;
    p.queue_packets = 2;
    p.reorder_gap = 2;
  })));
}

}  // namespace
}  // namespace mercury::net
