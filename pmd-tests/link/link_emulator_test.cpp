// The link emulator's mbuf stage over real PMD ports: two net_ring ports
// joined by rte_rings (rte_eth_from_rings), Mercury frames built with
// build_data_frame pushed through LinkEmulator on one side and classified
// with parse_frame on the other.
//
// The emulator is deterministic, so a twin LinkModel with the same seed fed
// the same frame lengths predicts every frame's fate; the tests check the
// counters, every frame's delivery count and the exact arrival order against
// that prediction, and that every corrupted frame is caught by an integrity
// check of the receiver. Time is a fake clock passed in, so no assertion
// depends on how fast this machine runs.
#include <gtest/gtest.h>
#include <rte_eth_ring.h>
#include <rte_ethdev.h>
#include <rte_mbuf.h>
#include <rte_ring.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "net/frame.h"
#include "net/link_emulator.h"
#include "net/mempool.h"
#include "pmd_env.h"

namespace mercury::net {
namespace {

constexpr uint64_t kHz = 1'000'000'000;  // the fake clock ticks in nanoseconds
constexpr uint32_t kPayload = 256;
const MacAddr kMacA{{0x02, 0, 0, 0, 0, 0x0a}};
const MacAddr kMacB{{0x02, 0, 0, 0, 0, 0x0b}};
const LocalAddr kLocalA{kMacA, 0xc0000201, 47100};  // 192.0.2.1 (documentation range)
const LocalAddr kLocalB{kMacB, 0xc0000202, 47100};  // 192.0.2.2
const Route kToB{kMacB, kLocalB.ip, kLocalB.udp_port};

// Two ports joined by two rings: what `a` sends, `b` receives. The rings are
// sized by the test, so a small one can make the PMD refuse frames.
class RingLink {
 public:
  RingLink(const std::string& name, unsigned ring_size, rte_mempool* pool) {
    ab_ = rte_ring_create(("lk_ab_" + name).c_str(), ring_size, SOCKET_ID_ANY,
                          RING_F_SP_ENQ | RING_F_SC_DEQ);
    ba_ = rte_ring_create(("lk_ba_" + name).c_str(), ring_size, SOCKET_ID_ANY,
                          RING_F_SP_ENQ | RING_F_SC_DEQ);
    if (ab_ == nullptr || ba_ == nullptr) throw std::runtime_error("ring create " + name);
    const int a = rte_eth_from_rings(("lk_a_" + name).c_str(), &ba_, 1, &ab_, 1, SOCKET_ID_ANY);
    const int b = rte_eth_from_rings(("lk_b_" + name).c_str(), &ab_, 1, &ba_, 1, SOCKET_ID_ANY);
    if (a < 0 || b < 0) throw std::runtime_error("rte_eth_from_rings " + name);
    a_ = static_cast<uint16_t>(a);
    b_ = static_cast<uint16_t>(b);
    start(a_, pool);
    start(b_, pool);
  }
  ~RingLink() {
    for (uint16_t p : {a_, b_}) {
      rte_eth_dev_stop(p);
      rte_eth_dev_close(p);
    }
    // Frames still in the rings go back to their pool.
    void* m;
    while (rte_ring_dequeue(ab_, &m) == 0) rte_pktmbuf_free(static_cast<rte_mbuf*>(m));
    while (rte_ring_dequeue(ba_, &m) == 0) rte_pktmbuf_free(static_cast<rte_mbuf*>(m));
    rte_ring_free(ab_);
    rte_ring_free(ba_);
  }
  RingLink(const RingLink&) = delete;
  RingLink& operator=(const RingLink&) = delete;

  [[nodiscard]] uint16_t a() const { return a_; }
  [[nodiscard]] uint16_t b() const { return b_; }

 private:
  static void start(uint16_t port, rte_mempool* pool) {
    rte_eth_conf conf{};
    if (rte_eth_dev_configure(port, 1, 1, &conf) != 0 ||
        rte_eth_rx_queue_setup(port, 0, 1024, SOCKET_ID_ANY, nullptr, pool) != 0 ||
        rte_eth_tx_queue_setup(port, 0, 1024, SOCKET_ID_ANY, nullptr) != 0 ||
        rte_eth_dev_start(port) != 0) {
      throw std::runtime_error("cannot start ring port " + std::to_string(port));
    }
  }
  rte_ring* ab_ = nullptr;
  rte_ring* ba_ = nullptr;
  uint16_t a_ = 0, b_ = 0;
};

std::vector<std::byte> payload_for(uint32_t seq) {
  std::vector<std::byte> p(kPayload);
  for (uint32_t i = 0; i < kPayload; ++i) p[i] = std::byte((seq * 131u + i * 7u) & 0xff);
  return p;
}

wire::HeaderFields header_for(uint32_t seq) {
  wire::HeaderFields h;
  h.type = wire::PacketType::kData;
  h.dtype = wire::Dtype::kFloat32;
  h.job_id = 7;
  h.sender_id = 1;
  h.block_key = seq / 16;
  h.msg_id = seq / 16;
  h.msg_len = 16 * kPayload;
  h.offset = (seq % 16) * kPayload;
  h.seq = seq;
  return h;
}

rte_mbuf* make_frame(rte_mempool* pool, uint32_t seq) {
  rte_mbuf* m = rte_pktmbuf_alloc(pool);
  if (m == nullptr) return nullptr;
  const size_t len = kFrameOverhead + kPayload;
  auto* data = reinterpret_cast<std::byte*>(rte_pktmbuf_append(m, static_cast<uint16_t>(len)));
  const auto payload = payload_for(seq);
  build_data_frame(std::span(data, len), kLocalA, kToB, header_for(seq), payload,
                   ChecksumMode::kSoftware);
  return m;
}

// What the receiver saw.
struct Received {
  std::vector<uint32_t> order;           // seq of each valid frame, in arrival order
  std::map<DropReason, uint64_t> drops;  // frames parse_frame refused, by reason
  uint64_t frames = 0;                   // frames taken from the RX queue
  uint64_t bad_payload = 0;              // valid header but payload differs from sent
};

void receive(uint16_t port, Received& r) {
  rte_mbuf* pkts[64];
  for (;;) {
    const uint16_t n = rte_eth_rx_burst(port, 0, pkts, 64);
    if (n == 0) return;
    for (uint16_t i = 0; i < n; ++i) {
      ++r.frames;
      ASSERT_TRUE(rte_pktmbuf_is_contiguous(pkts[i]));
      ParsedFrame pf;
      parse_frame(
          std::span(rte_pktmbuf_mtod(pkts[i], const std::byte*), rte_pktmbuf_pkt_len(pkts[i])),
          kLocalB, RxChecks{}, pf);
      if (pf.kind == FrameKind::kMercury) {
        r.order.push_back(pf.header.seq);
        const auto expect = payload_for(pf.header.seq);
        if (pf.header !=
                [&] {
                  auto h = header_for(pf.header.seq);
                  h.payload_len = kPayload;
                  return h;
                }() ||
            !std::equal(pf.payload.begin(), pf.payload.end(), expect.begin(), expect.end())) {
          ++r.bad_payload;
        }
      } else {
        ++r.drops[pf.drop];
      }
      rte_pktmbuf_free(pkts[i]);
    }
  }
}

// Offers frames [0, count) through the emulator at time `now`, keeping what
// it refuses for the next call, receiving as it goes.
void send_all(LinkEmulator& e, rte_mempool* pool, uint32_t count, uint64_t now, uint16_t rx_port,
              Received& r) {
  std::vector<rte_mbuf*> pending;
  uint32_t next = 0;
  while (next < count || !pending.empty()) {
    while (pending.size() < 32 && next < count) {
      rte_mbuf* m = make_frame(pool, next);
      ASSERT_NE(m, nullptr) << "mempool exhausted at frame " << next;
      pending.push_back(m);
      ++next;
    }
    const uint16_t took = e.tx_burst(pending.data(), static_cast<uint16_t>(pending.size()), now);
    ASSERT_GT(took, 0) << "emulator refused everything with " << e.queued() << " queued";
    pending.erase(pending.begin(), pending.begin() + took);
    receive(rx_port, r);
  }
}

struct Pools {
  Mempool frames{"lk_frames", 8191, 0, 2048};
  Mempool copies{"lk_copies", 2047, 0, 2048};
};

// The pools live for the whole suite: created after EAL starts, freed before
// it stops. No mempool cache, so available() counts every free mbuf.
std::unique_ptr<Pools> suite_pools;
Pools& pools() { return *suite_pools; }

class LinkEmulatorPmd : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { suite_pools = std::make_unique<Pools>(); }
  static void TearDownTestSuite() { suite_pools.reset(); }
};

TEST_F(LinkEmulatorPmd, PassThroughIsTransparent) {
  RingLink link("pass", 4096, pools().frames.get());
  const uint32_t before = pools().frames.available();
  LinkEmulator e(link.a(), 0, LinkParams{}, nullptr, kHz);
  Received r;
  send_all(e, pools().frames.get(), 2000, 0, link.b(), r);
  EXPECT_EQ(e.queued(), 0u);
  EXPECT_EQ(e.poll(0), 0);
  receive(link.b(), r);
  ASSERT_EQ(r.order.size(), 2000u);
  for (uint32_t i = 0; i < 2000; ++i) ASSERT_EQ(r.order[i], i);
  EXPECT_EQ(r.bad_payload, 0u);
  EXPECT_TRUE(r.drops.empty());
  const LinkCounters& c = e.counters();
  EXPECT_EQ(c.sent, 2000u);
  EXPECT_EQ(c.lost + c.duplicated + c.corrupted + c.reordered + c.delayed + c.queue_full, 0u);
  EXPECT_EQ(pools().frames.available(), before);
}

// The whole fate of every frame, predicted by a twin model, checked at the
// receiver: counts, per-frame deliveries and the exact arrival order.
void run_impaired(const LinkParams& p, uint32_t frames) {
  RingLink link("imp" + std::to_string(p.seed), 4096, pools().frames.get());
  const uint32_t frames_before = pools().frames.available();
  const uint32_t copies_before = pools().copies.available();
  Received r;
  LinkCounters c;
  {
    LinkEmulator e(link.a(), 0, p, pools().copies.get(), kHz);
    send_all(e, pools().frames.get(), frames, 1000, link.b(), r);
    // Frames still held for reordering leave once their hold time is over.
    e.poll(1000 + 10 * kHz);
    EXPECT_EQ(e.queued(), 0u);
    receive(link.b(), r);
    c = e.counters();
  }

  // Predict: same seed, same frame lengths, same order of decisions.
  LinkModel twin(p, kHz);
  const uint32_t gap = p.reorder_gap != 0 ? p.reorder_gap : LinkParams::kDefaultReorderGap;
  struct Key {
    double at;  // position in the line: taken frames in order, held ones after `gap` more
    uint32_t seq;
    bool operator<(const Key& o) const { return at < o.at; }
  };
  std::vector<Key> expected;
  uint64_t lost = 0, dup = 0, corrupt = 0, held = 0;
  for (uint32_t s = 0; s < frames; ++s) {
    const LinkFate f = twin.decide(static_cast<uint32_t>(kFrameOverhead + kPayload));
    if (f.lost) {
      ++lost;
      continue;
    }
    dup += f.duplicate;
    corrupt += f.corrupt;
    held += f.reorder;
    // The original: delivered unless corrupted; a held one is queued after
    // the gap-th later frame (and that frame's copy), before the next.
    if (!f.corrupt) expected.push_back({f.reorder ? s + gap + 0.5 : s, s});
    // The copy is made before corruption and queued right behind the frame.
    if (f.duplicate) expected.push_back({s + 0.1, s});
  }
  std::stable_sort(expected.begin(), expected.end());

  EXPECT_EQ(c.lost, lost);
  EXPECT_EQ(c.duplicated, dup);
  EXPECT_EQ(c.duplicate_no_mbuf, 0u);
  EXPECT_EQ(c.corrupted, corrupt);
  EXPECT_EQ(c.reordered, held);
  EXPECT_EQ(c.queue_full, 0u);
  EXPECT_EQ(c.pmd_refused, 0u);
  // Conservation: what went on the wire is what was offered, less the lost,
  // plus the copies; the receiver took exactly that, delivered all but the
  // corrupted ones, and dropped those by an integrity check.
  EXPECT_EQ(c.sent, frames - lost + dup);
  EXPECT_EQ(r.frames, c.sent);
  EXPECT_EQ(r.order.size(), c.sent - c.corrupted);
  uint64_t integrity_drops = 0;
  for (const auto& [reason, n] : r.drops) {
    const bool integrity =
        reason == DropReason::kUdpBadChecksum || reason == DropReason::kIpBadChecksum ||
        reason == DropReason::kIpBadHeader || reason == DropReason::kIpTruncated ||
        reason == DropReason::kUdpBadLength;
    EXPECT_TRUE(integrity) << "corrupted frame dropped as " << drop_reason_name(reason);
    integrity_drops += n;
  }
  EXPECT_EQ(integrity_drops, c.corrupted);
  if (c.corrupted >= 50) {
    // The checksums, not the length checks, catch most bit flips.
    EXPECT_GT(r.drops[DropReason::kUdpBadChecksum], c.corrupted / 2);
  }
  EXPECT_EQ(r.bad_payload, 0u) << "a corrupted frame passed every check";

  ASSERT_EQ(r.order.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    ASSERT_EQ(r.order[i], expected[i].seq) << "arrival " << i;
  }
  // Every mbuf is back: lost frames and the emulator's copies were freed.
  EXPECT_EQ(pools().frames.available(), frames_before);
  EXPECT_EQ(pools().copies.available(), copies_before);
}

TEST_F(LinkEmulatorPmd, LossDuplicationReorderAndCorruptionAddUpExactly) {
  LinkParams p;
  p.loss = 0.05;
  p.duplicate = 0.05;
  p.reorder = 0.05;
  p.corrupt = 0.05;
  p.seed = 42;
  run_impaired(p, 4000);
}

TEST_F(LinkEmulatorPmd, HeavyImpairmentsWithAnotherSeedAndGap) {
  LinkParams p;
  p.loss = 0.2;
  p.duplicate = 0.3;
  p.reorder = 0.25;
  p.corrupt = 0.15;
  p.seed = 7;
  p.reorder_gap = 5;
  run_impaired(p, 3000);
}

TEST_F(LinkEmulatorPmd, DelayAndRateReleaseFramesExactlyWhenDue) {
  RingLink link("timed", 4096, pools().frames.get());
  LinkParams p;
  p.rate_gbps = 1;
  p.delay_us = 20;
  LinkEmulator e(link.a(), 0, p, nullptr, kHz);
  LinkModel twin(p, kHz);
  constexpr uint32_t kCount = 50;
  std::vector<uint64_t> due;
  std::vector<rte_mbuf*> frames;
  for (uint32_t i = 0; i < kCount; ++i) {
    frames.push_back(make_frame(pools().frames.get(), i));
    due.push_back(twin.schedule(rte_pktmbuf_pkt_len(frames.back()), 0));
  }
  // (362 + 24) bytes * 8 / 1 Gbit/s = 3088 ns apart, the first after 20 us.
  EXPECT_EQ(due[0], 3088u + 20'000u);
  EXPECT_EQ(due[1] - due[0], 3088u);
  ASSERT_EQ(e.tx_burst(frames.data(), kCount, 0), kCount);
  EXPECT_EQ(e.queued(), kCount);
  EXPECT_EQ(e.next_due(), due[0]);
  Received r;
  for (uint32_t i = 0; i < kCount; ++i) {
    e.poll(due[i] - 1);
    receive(link.b(), r);
    ASSERT_EQ(r.order.size(), i) << "frame " << i << " left before its time";
    e.poll(due[i]);
    receive(link.b(), r);
    ASSERT_EQ(r.order.size(), i + 1u) << "frame " << i << " not released when due";
    EXPECT_EQ(r.order.back(), i);
  }
  EXPECT_EQ(e.counters().delayed, kCount);
  EXPECT_EQ(e.counters().sent, kCount);
  EXPECT_EQ(e.next_due(), UINT64_MAX);
}

// link.rate_steps: poll() applies each step when it is due after the anchor,
// and frames scheduled after it leave at the new rate.
TEST_F(LinkEmulatorPmd, RateScheduleChangesTheRateWhenDue) {
  RingLink link("steps", 4096, pools().frames.get());
  LinkParams p;
  p.rate_gbps = 1;
  LinkEmulator e(link.a(), 0, p, nullptr, kHz);
  e.set_schedule(RateSchedule({{0.001, 0.5}, {0.002, 0}}, kHz));  // 1 ms and 2 ms at 1 GHz
  e.poll(5 * kHz);                                                // not anchored: nothing happens
  EXPECT_EQ(e.model().params().rate_gbps, 1.0);
  const uint64_t t0 = 10 * kHz;
  e.anchor_schedule(t0);
  e.poll(t0 + 999'999);
  EXPECT_EQ(e.model().params().rate_gbps, 1.0);
  e.poll(t0 + 1'000'000);
  EXPECT_EQ(e.model().params().rate_gbps, 0.5);
  EXPECT_EQ(e.counters().rate_changes, 1u);
  // A frame now takes (362 + 24) * 8 / 0.5 Gbit/s = 6176 ns on the wire.
  rte_mbuf* f = make_frame(pools().frames.get(), 0);
  ASSERT_EQ(e.tx_burst(&f, 1, t0 + 1'000'000), 1u);
  EXPECT_EQ(e.next_due(), t0 + 1'000'000 + 6176);
  Received r;
  e.poll(t0 + 1'006'176);
  receive(link.b(), r);
  EXPECT_EQ(r.order.size(), 1u);
  e.poll(t0 + 2'000'000);
  EXPECT_EQ(e.model().params().rate_gbps, 0.0);  // unlimited: pass-through again
  EXPECT_TRUE(e.model().passthrough());
  EXPECT_EQ(e.counters().rate_changes, 2u);
}

TEST_F(LinkEmulatorPmd, FullDelayLineIsBackPressureNotLoss) {
  RingLink link("full", 4096, pools().frames.get());
  LinkParams p;
  p.delay_us = 1000;
  p.queue_packets = 64;
  LinkEmulator e(link.a(), 0, p, nullptr, kHz);
  std::vector<rte_mbuf*> frames;
  for (uint32_t i = 0; i < 100; ++i) frames.push_back(make_frame(pools().frames.get(), i));
  EXPECT_EQ(e.tx_burst(frames.data(), 100, 0), 64);
  EXPECT_EQ(e.counters().queue_full, 36u);
  EXPECT_EQ(e.tx_burst(frames.data() + 64, 36, 10), 0);  // still full: the caller keeps them
  Received r;
  e.poll(1000 * 1000);  // the delay is over: the line drains
  receive(link.b(), r);
  EXPECT_EQ(r.order.size(), 64u);
  EXPECT_EQ(e.tx_burst(frames.data() + 64, 36, 1000 * 1000), 36);
  e.poll(2000 * 1000);
  receive(link.b(), r);
  ASSERT_EQ(r.order.size(), 100u);
  for (uint32_t i = 0; i < 100; ++i) EXPECT_EQ(r.order[i], i);
  EXPECT_EQ(e.counters().lost, 0u);
}

TEST_F(LinkEmulatorPmd, FramesThePmdRefusesStayQueuedInOrder) {
  RingLink link("small", 64, pools().frames.get());  // the ring holds 63 frames
  LinkParams p;
  p.delay_us = 10;
  LinkEmulator e(link.a(), 0, p, nullptr, kHz);
  Received r;
  constexpr uint32_t kCount = 500;
  for (uint32_t i = 0; i < kCount; i += 25) {
    rte_mbuf* burst[25];
    for (uint32_t j = 0; j < 25; ++j) burst[j] = make_frame(pools().frames.get(), i + j);
    ASSERT_EQ(e.tx_burst(burst, 25, 0), 25);
  }
  EXPECT_EQ(e.queued(), kCount);
  EXPECT_EQ(e.poll(10'000), 63);  // the ring is full now
  EXPECT_GT(e.counters().pmd_refused, 0u);
  for (int round = 0; round < 100 && r.order.size() < kCount; ++round) {
    receive(link.b(), r);
    e.poll(10'000);
  }
  receive(link.b(), r);
  ASSERT_EQ(r.order.size(), kCount);
  for (uint32_t i = 0; i < kCount; ++i) ASSERT_EQ(r.order[i], i);
  EXPECT_EQ(e.counters().sent, kCount);
  EXPECT_EQ(e.queued(), 0u);
}

TEST_F(LinkEmulatorPmd, EmptyCopyPoolSkipsTheCopyNotTheFrame) {
  RingLink link("dup", 4096, pools().frames.get());
  Mempool tiny("lk_tiny", 16, 0, 2048);
  LinkParams p;
  p.duplicate = 1;
  LinkEmulator e(link.a(), 0, p, tiny.get(), kHz);
  std::vector<rte_mbuf*> frames;
  for (uint32_t i = 0; i < 40; ++i) frames.push_back(make_frame(pools().frames.get(), i));
  // Nobody receives yet, so the copies stay in the ring, holding the tiny pool.
  EXPECT_EQ(e.tx_burst(frames.data(), 20, 0), 20);
  EXPECT_EQ(e.tx_burst(frames.data() + 20, 20, 0), 20);
  EXPECT_EQ(e.counters().duplicated, 16u);
  EXPECT_EQ(e.counters().duplicate_no_mbuf, 24u);
  Received r;
  receive(link.b(), r);
  EXPECT_EQ(r.order.size(), 56u);
  std::set<uint32_t> seen(r.order.begin(), r.order.end());
  EXPECT_EQ(seen.size(), 40u);  // every original arrived
  EXPECT_EQ(tiny.available(), 16u);
}

TEST_F(LinkEmulatorPmd, DestructorFreesEveryQueuedFrame) {
  RingLink link("dtor", 4096, pools().frames.get());
  const uint32_t before = pools().frames.available();
  {
    LinkParams p;
    p.delay_us = 1'000'000;
    p.reorder = 0.5;
    p.seed = 3;
    LinkEmulator e(link.a(), 0, p, nullptr, kHz);
    rte_mbuf* burst[32];
    for (auto& m : burst) m = make_frame(pools().frames.get(), 0);
    ASSERT_EQ(e.tx_burst(burst, 32, 0), 32);
    EXPECT_EQ(e.queued(), 32u);
    EXPECT_GT(e.counters().reordered, 0u);
    EXPECT_LT(pools().frames.available(), before);
  }
  EXPECT_EQ(pools().frames.available(), before);
}

}  // namespace
}  // namespace mercury::net

int main(int argc, char** argv) { return mercury::pmdtest::run_all_tests(argc, argv, {}); }
