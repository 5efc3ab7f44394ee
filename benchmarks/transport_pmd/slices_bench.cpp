// What packet delivery and slices cost against the message path, over one
// loss-free net_ring link, both endpoints polled by one thread (so every
// figure is both ends' CPU together, as transport_pmd_bench's ring/endpoint).
//
//   message   a sends 32 MiB as 8 messages of 4 MiB (send); b's
//             MessageReceiver places every payload in a buffer (one copy).
//   packet    the same sends; b's PacketReceiver reads each payload's first
//             word and leaves the mbuf to the endpoint (no copy).
//   hold      as packet, but b keeps every mbuf and frees them four at a time
//             (a chunk set of four workers, as the server's shard core does).
//   slices    a sends the same 32 MiB as one send_slice per packet-sized chunk
//             (offset and logical length per chunk, as the server's per-chunk
//             sends); b as in packet.
//
// Variants are interleaved, 7 repetitions each; the figure is payload Gbit/s
// (median, min, max). Not a test: no assertion on speed. Run:
//   build/benchmarks/transport_pmd/slices_bench
// The binary uses the PMD tests' EAL set-up (run_all_tests) and gtest's runner
// only to start EAL once and report failures of the set-up itself.
#include <gtest/gtest.h>
#include <rte_cycles.h>
#include <rte_mbuf.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "fixture.h"
#include "pmd_env.h"

namespace mercury::transport {
namespace {

using testing::RingLink;

constexpr uint32_t kMsgBytes = 4u << 20;
constexpr uint32_t kMessages = 8;
constexpr uint64_t kTotal = uint64_t{kMsgBytes} * kMessages;
constexpr int kReps = 7;

class Sink final : public MessageReceiver {
 public:
  Sink() : buffers_(16, std::vector<std::byte>(kMsgBytes)) {}
  std::byte* on_message_begin(uint16_t, const wire::HeaderFields& h) override {
    return h.msg_len <= kMsgBytes ? buffers_[h.block_key % 16].data() : nullptr;
  }
  void on_message_complete(uint16_t, const wire::HeaderFields&, std::byte*) override {}

 private:
  std::vector<std::vector<std::byte>> buffers_;
};

class PacketSink final : public PacketReceiver {
 public:
  bool on_packet(uint16_t, const wire::HeaderFields&, std::span<const std::byte> payload,
                 net::PacketBuf* buf) override {
    rte_mbuf* mbuf = net::mbuf_of(buf);
    uint32_t w = 0;
    if (payload.size() >= 4) std::memcpy(&w, payload.data(), 4);
    sum += w;
    if (!hold) return false;
    held[count++] = mbuf;
    if (count == 4) {
      rte_pktmbuf_free_bulk(held, 4);
      count = 0;
    }
    return true;
  }
  void release() {
    if (count != 0) rte_pktmbuf_free_bulk(held, count);
    count = 0;
  }
  bool hold = false;
  uint64_t sum = 0;

 private:
  rte_mbuf* held[4] = {};
  unsigned count = 0;
};

EndpointConfig config(uint16_t epoch, PeerSpec peer) {
  EndpointConfig c;
  c.transport.tsc_hz = rte_get_tsc_hz();
  c.transport.window_packets = 128;
  c.max_messages = 32768;  // slices: one descriptor per chunk
  c.ingress_capacity = 32768;
  c.local_epoch = epoch;
  c.peers = {std::move(peer)};
  return c;
}

void count_ok(void* n, const SendResult& r) {
  if (r.ok()) ++*static_cast<uint64_t*>(n);
}

struct Bench {
  RingLink link;
  Sink sink_a, sink_b;
  PacketSink pkt_b;
  Endpoint a, b;
  std::vector<std::byte> source = testing::random_pattern(kTotal, 3);

  explicit Bench(uint32_t mtu, uint8_t net)
      : link("sb" + std::to_string(mtu), net, mtu, net::LinkParams{}, 4095),
        a(link.a(), config(3, {"b", RingLink::ip_b(net), 47101, 5}), sink_a, rte_rdtsc()),
        b(link.b(), config(5, {"a", RingLink::ip_a(net), 47100, 3}), Receivers{&sink_b, &pkt_b},
          rte_rdtsc()) {}

  // One transfer of kTotal bytes; returns seconds (< 0: did not finish).
  double run(bool slices, uint32_t& submissions) {
    uint64_t done = 0;
    submissions = 0;
    const uint32_t chunk = a.max_payload();
    MessageMeta meta;
    meta.dtype = wire::Dtype::kFloat32;
    const uint64_t t0 = rte_rdtsc();
    for (uint32_t i = 0; i < kMessages; ++i) {
      meta.block_key = i;
      const std::byte* part = source.data() + size_t{i} * kMsgBytes;
      if (!slices) {
        if (a.send(0, part, kMsgBytes, 0, meta, {&count_ok, &done, i}) != SubmitStatus::kQueued) {
          return -1;
        }
        ++submissions;
        continue;
      }
      for (uint32_t off = 0; off < kMsgBytes; off += chunk) {
        const uint32_t len = std::min(chunk, kMsgBytes - off);
        if (a.send_slice(0, part + off, len, off, kMsgBytes, 0, meta, {&count_ok, &done, i}) !=
            SubmitStatus::kQueued) {
          return -1;
        }
        ++submissions;
      }
    }
    const uint64_t deadline = rte_rdtsc() + 60 * rte_get_tsc_hz();
    while (done < submissions) {
      const uint64_t now = rte_rdtsc();
      a.poll_st(now);
      b.poll_st(now);
      if (now > deadline) return -1;
    }
    const double s = double(rte_rdtsc() - t0) / rte_get_tsc_hz();
    pkt_b.release();
    for (int i = 0; i < 2000; ++i) {  // consume the last ACKs
      const uint64_t now = rte_rdtsc();
      a.poll_st(now);
      b.poll_st(now);
    }
    return s;
  }
};

// The message variant needs b without a PacketReceiver; the packet variants
// b with one. Two endpoints on one Interface cannot share it, so each mode
// has its own link.
struct MessageBench {
  RingLink link;
  Sink sink_a, sink_b;
  Endpoint a, b;
  std::vector<std::byte> source = testing::random_pattern(kTotal, 3);
  explicit MessageBench(uint32_t mtu, uint8_t net)
      : link("sm" + std::to_string(mtu), net, mtu, net::LinkParams{}, 4095),
        a(link.a(), config(3, {"b", RingLink::ip_b(net), 47101, 5}), sink_a, rte_rdtsc()),
        b(link.b(), config(5, {"a", RingLink::ip_a(net), 47100, 3}), sink_b, rte_rdtsc()) {}
  double run() {
    uint64_t done = 0;
    MessageMeta meta;
    meta.dtype = wire::Dtype::kFloat32;
    const uint64_t t0 = rte_rdtsc();
    for (uint32_t i = 0; i < kMessages; ++i) {
      meta.block_key = i;
      if (a.send(0, source.data() + size_t{i} * kMsgBytes, kMsgBytes, 0, meta,
                 {&count_ok, &done, i}) != SubmitStatus::kQueued) {
        return -1;
      }
    }
    const uint64_t deadline = rte_rdtsc() + 60 * rte_get_tsc_hz();
    while (done < kMessages) {
      const uint64_t now = rte_rdtsc();
      a.poll_st(now);
      b.poll_st(now);
      if (now > deadline) return -1;
    }
    const double s = double(rte_rdtsc() - t0) / rte_get_tsc_hz();
    for (int i = 0; i < 2000; ++i) {
      const uint64_t now = rte_rdtsc();
      a.poll_st(now);
      b.poll_st(now);
    }
    return s;
  }
};

void report(const char* name, uint32_t mtu, std::vector<double> gbps) {
  std::sort(gbps.begin(), gbps.end());
  std::printf("%-8s mtu %4u  median %6.2f Gbit/s  (min %6.2f, max %6.2f, n=%zu)\n", name, mtu,
              gbps[gbps.size() / 2], gbps.front(), gbps.back(), gbps.size());
}

TEST(SlicesBench, PacketDeliveryAndSlicesAgainstMessages) {
  for (uint32_t mtu : {1500u, 9000u}) {
    const auto net = static_cast<uint8_t>(mtu == 1500 ? 110 : 111);
    MessageBench mb(mtu, net);
    Bench pb(mtu, static_cast<uint8_t>(net + 10));
    std::vector<double> message, packet, hold, slices;
    uint32_t subs = 0;
    mb.run();  // warm-up: page faults, ARP-free epochs, caches
    pb.run(false, subs);
    for (int r = 0; r < kReps; ++r) {
      const double m = mb.run();
      pb.pkt_b.hold = false;
      const double p = pb.run(false, subs);
      pb.pkt_b.hold = true;
      const double h = pb.run(false, subs);
      pb.pkt_b.hold = false;
      const double s = pb.run(true, subs);
      ASSERT_GT(m, 0);
      ASSERT_GT(p, 0);
      ASSERT_GT(h, 0);
      ASSERT_GT(s, 0);
      message.push_back(kTotal * 8 / m / 1e9);
      packet.push_back(kTotal * 8 / p / 1e9);
      hold.push_back(kTotal * 8 / h / 1e9);
      slices.push_back(kTotal * 8 / s / 1e9);
    }
    report("message", mtu, message);
    report("packet", mtu, packet);
    report("hold", mtu, hold);
    report("slices", mtu, slices);
    std::printf("         (slices: %u send_slice calls per 32 MiB)\n", subs);
    EXPECT_EQ(pb.b.counters_st().drops[static_cast<size_t>(EndpointDrop::kNoReceiver)], 0u);
  }
}

}  // namespace
}  // namespace mercury::transport

int main(int argc, char** argv) { return mercury::pmdtest::run_all_tests(argc, argv, {}); }
