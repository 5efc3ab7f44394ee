// The Ethernet/ARP/IPv4/UDP stack over real PMD ports: two interfaces joined
// by a net_ring link, resolving each other by ARP (no static entries), moving
// Mercury frames byte-exact, and surviving garbage injected under the stack.
#include <gtest/gtest.h>
#include <rte_cycles.h>
#include <rte_mbuf.h>

#include <cstring>
#include <vector>

#include "net/interface.h"
#include "net/mempool.h"
#include "net/port.h"
#include "pmd_env.h"
#include "ring_link.h"

namespace mercury::net {
namespace {

using pmdtest::RingLink;

// Two interfaces over a net_ring link, 10.0.0.1:47100 and 10.0.0.2:47101.
RingLink link(const std::string& name, uint32_t mtu, bool udp_checksum = true) {
  return RingLink(name, 0, {.end = {.mtu = mtu, .mbufs = 4095, .udp_checksum = udp_checksum}});
}

// Polls both sides until `a` has a route to `b` (ARP request and reply);
// nothing else arrives meanwhile.
Route resolve_a_to_b(RingLink& l) {
  Route r;
  uint64_t delivered = 0;
  if (!l.resolve_a_to_b(r, &delivered)) ADD_FAILURE() << "ARP did not resolve";
  EXPECT_EQ(delivered, 0u);
  return r;
}

std::vector<std::byte> pattern(size_t n, uint32_t seed) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = std::byte((i * 131 + seed * 7) >> 3);
  return v;
}

void move_frames(RingLink& l, uint32_t payload_bytes, uint32_t frames) {
  const Route r = resolve_a_to_b(l);
  EXPECT_EQ(r.dst_mac, l.b().local().mac);
  EXPECT_EQ(l.a().counters().arp_requests_sent, 1u);
  EXPECT_EQ(l.b().counters().arp_replies_sent, 1u);

  const uint32_t msg_len = payload_bytes * frames;
  std::vector<std::byte> src = pattern(msg_len, payload_bytes);
  std::vector<std::byte> dst(msg_len);
  uint32_t sent = 0, received = 0;
  RxPacket rx[Interface::kBurst];
  for (int spins = 0; received < frames && spins < 10'000'000; ++spins) {
    const uint64_t now = rte_rdtsc();
    while (sent < frames && l.a().tx_room() > 0) {
      wire::HeaderFields h;
      h.type = wire::PacketType::kData;
      h.dtype = wire::Dtype::kFloat32;
      h.msg_len = msg_len;
      h.offset = sent * payload_bytes;
      h.seq = sent;
      // The pool runs dry while the link holds a backlog: that is back-pressure.
      if (!l.a().stage_data_st(r, h, std::span(src).subspan(h.offset, payload_bytes))) break;
      ++sent;
    }
    l.a().flush_st(now);
    const uint16_t n = l.b().poll_rx_st(rx, Interface::kBurst, now);
    for (uint16_t i = 0; i < n; ++i) {
      const auto& p = rx[i].parsed;
      EXPECT_EQ(p.header.seq, received);  // a ring link never reorders
      EXPECT_EQ(p.src_ip, l.a().local().ip);
      EXPECT_EQ(p.src_port, 47100);
      ASSERT_EQ(p.payload.size(), payload_bytes);
      std::memcpy(dst.data() + p.header.offset, p.payload.data(), p.payload.size());
      rte_pktmbuf_free(mbuf_of(rx[i].buf));
      ++received;
    }
  }
  EXPECT_EQ(received, frames);
  EXPECT_EQ(dst, src);
  EXPECT_EQ(l.b().counters().total_drops(), 0u);
  EXPECT_EQ(l.b().counters().rx_mercury, frames);
  // Every mbuf came back: nothing leaked on either side.
  EXPECT_EQ(l.end_a().pool.available() + l.a().mbufs_held(), 4095u);
  EXPECT_EQ(l.end_b().pool.available() + l.b().mbufs_held(), 4095u);
}

TEST(Interface, ArpThenByteExactFramesAt1500) {
  RingLink l = link("i1500", 1500);
  move_frames(l, payload_per_packet(1500), 20000);
}

TEST(Interface, JumboFramesAt9000) {
  RingLink l = link("i9000", 9000);
  EXPECT_EQ(l.port_a().mtu(), 9000u);
  move_frames(l, payload_per_packet(9000), 4000);
}

TEST(Interface, WithoutUdpChecksums) {
  RingLink l = link("inock", 1500, false);
  EXPECT_EQ(l.a().checksum_mode(), ChecksumMode::kNone);
  move_frames(l, 1024, 2000);
}

TEST(Interface, GarbageUnderTheStackIsCountedByReason) {
  RingLink l = link("igarb", 1500);
  const Route r = resolve_a_to_b(l);
  // Valid frames, then damaged copies injected straight into the port.
  std::vector<std::byte> good(kFrameOverhead + 64);
  wire::HeaderFields h;
  h.msg_len = 64;
  auto payload = pattern(64, 1);
  build_data_frame(good, l.a().local(), r, h, payload, ChecksumMode::kSoftware);

  auto inject = [&](std::vector<std::byte> f) {
    rte_mbuf* m = rte_pktmbuf_alloc(l.end_a().pool.get());
    ASSERT_NE(m, nullptr);
    std::memcpy(rte_pktmbuf_mtod(m, void*), f.data(), f.size());
    m->data_len = m->pkt_len = static_cast<uint32_t>(f.size());
    ASSERT_EQ(l.port_a().tx_burst(0, &m, 1), 1);
  };
  inject(good);
  inject(std::vector<std::byte>(good.begin(), good.begin() + 10));  // truncated
  auto bad_cksum = good;
  bad_cksum.back() ^= std::byte{1};
  inject(bad_cksum);
  auto bad_version = good;
  bad_version[kL2Len + kL3Len + kL4Len] = std::byte{9};  // Mercury version
  inject(bad_version);                                   // caught by the UDP checksum first
  auto ipv6 = good;
  ipv6[12] = std::byte{0x86};
  ipv6[13] = std::byte{0xdd};
  inject(ipv6);

  RxPacket rx[Interface::kBurst];
  uint16_t got = 0;
  for (int i = 0; i < 1000 && l.b().counters().rx_frames < 5; ++i) {
    const uint16_t n = l.b().poll_rx_st(rx, Interface::kBurst, rte_rdtsc());
    for (uint16_t k = 0; k < n; ++k) rte_pktmbuf_free(mbuf_of(rx[k].buf));
    got = static_cast<uint16_t>(got + n);
  }
  EXPECT_EQ(got, 1);
  const auto& c = l.b().counters();
  EXPECT_EQ(c.drops[static_cast<size_t>(DropReason::kFrameTruncated)], 1u);
  EXPECT_EQ(c.drops[static_cast<size_t>(DropReason::kUdpBadChecksum)], 2u);
  EXPECT_EQ(c.drops[static_cast<size_t>(DropReason::kUnknownEtherType)], 1u);
  EXPECT_EQ(c.total_drops(), 4u);
  EXPECT_EQ(l.end_a().pool.available() + l.a().mbufs_held(), 4095u);
  EXPECT_EQ(l.end_b().pool.available() + l.b().mbufs_held(), 4095u);
}

// Detached, an interface calls the PMD no more: a frame waiting in its RX
// queue stays there, what it stages is freed unsent (counted), and once
// attached again both directions work as before.
TEST(Interface, DetachedCallsThePmdNoMore) {
  RingLink l = link("idet", 1500);
  const Route r = resolve_a_to_b(l);
  const auto payload = pattern(256, 3);
  auto stage = [&](uint32_t seq) {
    wire::HeaderFields h;
    h.type = wire::PacketType::kData;
    h.dtype = wire::Dtype::kFloat32;
    h.msg_len = 256;
    h.seq = seq;
    return l.a().stage_data_st(r, h, payload);
  };
  auto receive = [&](uint32_t* seq) {
    RxPacket rx[Interface::kBurst];
    uint16_t got = 0;
    for (int i = 0; i < 1000 && got == 0; ++i) {
      const uint16_t n = l.b().poll_rx_st(rx, Interface::kBurst, rte_rdtsc());
      for (uint16_t k = 0; k < n; ++k) {
        if (seq != nullptr) *seq = rx[k].parsed.header.seq;
        rte_pktmbuf_free(mbuf_of(rx[k].buf));
      }
      got = static_cast<uint16_t>(got + n);
    }
    return got;
  };

  ASSERT_TRUE(stage(1));
  ASSERT_EQ(l.a().flush_st(rte_rdtsc()), 1);
  l.b().set_detached_st(true);
  EXPECT_EQ(l.b().detached(), 1u);
  const uint64_t rx_before = l.b().counters().rx_frames;
  EXPECT_EQ(receive(nullptr), 0);
  EXPECT_EQ(l.b().counters().rx_frames, rx_before);  // the frame waits in the ring

  l.a().set_detached_st(true);
  ASSERT_TRUE(stage(2));
  ASSERT_TRUE(stage(3));
  EXPECT_EQ(l.a().tx_pending(), 2u);
  const uint64_t tx_before = l.a().counters().tx_frames;
  EXPECT_EQ(l.a().flush_st(rte_rdtsc()), 0);
  EXPECT_EQ(l.a().tx_pending(), 0u);
  EXPECT_EQ(l.a().counters().tx_detached, 2u);
  EXPECT_EQ(l.a().counters().tx_frames, tx_before);

  l.a().set_detached_st(false);
  l.b().set_detached_st(false);
  EXPECT_EQ(l.b().detached(), 0u);
  uint32_t seq = 0;
  EXPECT_EQ(receive(&seq), 1);  // the frame that waited, and only it
  EXPECT_EQ(seq, 1u);
  ASSERT_TRUE(stage(4));
  ASSERT_EQ(l.a().flush_st(rte_rdtsc()), 1);
  EXPECT_EQ(receive(&seq), 1);
  EXPECT_EQ(seq, 4u);
  EXPECT_EQ(l.end_a().pool.available() + l.a().mbufs_held(), 4095u);
  EXPECT_EQ(l.end_b().pool.available() + l.b().mbufs_held(), 4095u);
}

TEST(Port, UnknownDeviceIsAClearError) {
  Mempool pool("p_unknown", 1023, 0, 2048);
  try {
    Port::open("net_nonexistent0", pool, {});
    FAIL() << "opened a device that does not exist";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("net_nonexistent0"), std::string::npos) << e.what();
  }
}

TEST(Port, MtuBeyondThePmdIsRefused) {
  Mempool pool("p_mtu", 1023, 0, 2048);
  try {
    auto link = Port::ring_link("imtu", pool, pool, PortOptions{.mtu = 70000});
    FAIL() << "accepted MTU 70000";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("MTU"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace mercury::net

int main(int argc, char** argv) { return mercury::pmdtest::run_all_tests(argc, argv, {}); }
