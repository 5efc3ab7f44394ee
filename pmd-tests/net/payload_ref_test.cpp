// Payloads sent by reference (lib/net/payload_ref.h) over real PMD ports:
// what the PMD writes is the payload as it was when the frame was staged,
// byte for byte the frame the copying path builds; a frame the PMD refuses
// stops referring to the sender's memory before flush_st() returns; the
// link emulator never writes into the sender's memory; ports whose PMD does
// not copy at tx_burst (net_ring) never send by reference.
//
// net_pcap with tx_pcap=<file> is the PMD that copies (into the file, within
// tx_burst); the file is read back after the port is closed. An unconnected
// memif server port refuses every frame (its tx_burst sends nothing before a
// client connects).
#include <gtest/gtest.h>
#include <rte_cycles.h>
#include <rte_mbuf.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "files.h"
#include "net/interface.h"
#include "net/link_emulator.h"
#include "net/mempool.h"
#include "net/port.h"
#include "peer_process.h"
#include "pmd_env.h"
#include "ring_link.h"

namespace mercury::net {
namespace {

// A Port closes its device when it goes, so each test that writes a
// recording has its own net_pcap_ref<i> and file.
constexpr int kPcapPorts = 4;
constexpr uint16_t kMemifIndex = 9;
std::string g_scratch;  // set by main() before EAL starts
std::string g_memif_socket;

const LocalAddr kLocal{MacAddr{{0x02, 0, 0, 0, 0, 0x0a}}, 0xc0000201, 47100};
const Route kRoute{MacAddr{{0x02, 0, 0, 0, 0, 0x0b}}, 0xc0000202, 47101};

std::vector<std::byte> pattern(size_t n, uint32_t seed) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = std::byte((i * 131 + seed * 7 + (i >> 8)) & 0xff);
  return v;
}

wire::HeaderFields header(uint32_t seq, size_t payload_bytes) {
  wire::HeaderFields h;
  h.type = wire::PacketType::kData;
  h.dtype = wire::Dtype::kFloat32;
  h.block_key = 3;
  h.msg_len = 1 << 20;
  h.offset = seq * 8192;
  h.seq = seq;
  h.payload_len = static_cast<uint16_t>(payload_bytes);
  return h;
}

// The frame the copying path builds for the same header and payload.
std::vector<std::byte> copied_frame(const wire::HeaderFields& h,
                                    const std::vector<std::byte>& payload, ChecksumMode mode) {
  std::vector<std::byte> f(kFrameOverhead + payload.size() + kMinFrame);
  f.resize(build_data_frame(f, kLocal, kRoute, h, payload, mode));
  return f;
}

// Every frame of a pcap file (either timestamp precision: the record
// headers are the same 16 bytes).
std::vector<std::vector<std::byte>> read_pcap(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                                std::istreambuf_iterator<char>());
  std::vector<std::vector<std::byte>> frames;
  size_t at = 24;  // the file header
  while (at + 16 <= bytes.size()) {
    uint32_t captured;
    std::memcpy(&captured, bytes.data() + at + 8, 4);
    at += 16;
    if (at + captured > bytes.size()) {
      ADD_FAILURE() << "truncated record in " << path;
      break;
    }
    const auto* p = reinterpret_cast<const std::byte*>(bytes.data() + at);
    frames.emplace_back(p, p + captured);
    at += captured;
  }
  return frames;
}

std::string pcap_port(int i) { return "net_pcap_ref" + std::to_string(i); }
std::string pcap_file(int i) { return g_scratch + "/sent" + std::to_string(i) + ".pcap"; }

struct PcapSide {
  int index;
  Mempool pool;
  Mempool copies;
  std::unique_ptr<Port> port;
  std::unique_ptr<Interface> iface;

  explicit PcapSide(int i, InterfaceOptions opts = {})
      : index(i),
        pool("ref_pool" + std::to_string(i), 1023, 0, frame_bytes_for_mtu(9000)),
        copies("ref_copies" + std::to_string(i), 255, 0, frame_bytes_for_mtu(9000)) {
    port = std::make_unique<Port>(Port::open(pcap_port(i), pool, PortOptions{.mtu = 9000}));
    iface = std::make_unique<Interface>(*port, pool, kLocal, opts);
  }
  // Closes the port (net_pcap closes its file) and returns what it wrote.
  std::vector<std::vector<std::byte>> close() {
    iface.reset();
    port.reset();
    return read_pcap(pcap_file(index));
  }
};

TEST(PayloadByReference, ThePmdWritesThePayloadAsItWasWhenStaged) {
  PcapSide s(0);
  ASSERT_TRUE(s.port->tx_by_reference()) << s.port->describe();
  ASSERT_EQ(s.iface->checksum_mode(), ChecksumMode::kSoftware);
  // By reference from kByReferenceMin up, copied below it.
  const std::vector<size_t> sizes = {8896, 4, Interface::kByReferenceMin, 2000,
                                     Interface::kByReferenceMin - 4u};
  std::vector<std::vector<std::byte>> payloads, want;
  for (size_t i = 0; i < sizes.size(); ++i) {
    payloads.push_back(pattern(sizes[i], static_cast<uint32_t>(i)));
    want.push_back(copied_frame(header(static_cast<uint32_t>(i), sizes[i]), payloads[i],
                                ChecksumMode::kSoftware));
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    ASSERT_TRUE(
        s.iface->stage_data_st(kRoute, header(static_cast<uint32_t>(i), sizes[i]), payloads[i]));
  }
  EXPECT_EQ(s.iface->counters().tx_by_reference, 3u);
  EXPECT_EQ(s.iface->payloads_by_reference(), 3u);
  EXPECT_EQ(s.iface->flush_st(rte_rdtsc()), sizes.size());
  // net_pcap wrote and freed every frame within tx_burst: nothing refers to
  // the payloads any more, and changing them changes nothing written.
  EXPECT_EQ(s.iface->payloads_by_reference(), 0u);
  EXPECT_EQ(s.iface->counters().tx_taken_in, 0u);
  for (auto& p : payloads) std::memset(p.data(), 0xee, p.size());
  const auto frames = s.close();
  ASSERT_EQ(frames.size(), want.size());
  for (size_t i = 0; i < frames.size(); ++i) {
    EXPECT_EQ(frames[i], want[i]) << "frame " << i << " (" << sizes[i] << " bytes of payload)";
    ParsedFrame parsed;
    const LocalAddr to{kRoute.dst_mac, kRoute.dst_ip, kRoute.dst_port};
    parse_frame(frames[i], to, RxChecks{}, parsed);
    EXPECT_EQ(parsed.kind, FrameKind::kMercury) << drop_reason_name(parsed.drop);
  }
}

TEST(PayloadByReference, OffByOptionEveryPayloadIsCopied) {
  PcapSide s(1, InterfaceOptions{.tx_by_reference = false});
  const auto payload = pattern(4000, 9);
  ASSERT_TRUE(s.iface->stage_data_st(kRoute, header(0, payload.size()), payload));
  EXPECT_EQ(s.iface->counters().tx_by_reference, 0u);
  EXPECT_EQ(s.iface->payloads_by_reference(), 0u);
  EXPECT_EQ(s.iface->flush_st(rte_rdtsc()), 1u);
  const auto frames = s.close();
  ASSERT_EQ(frames.size(), 1u);
  EXPECT_EQ(frames[0], copied_frame(header(0, payload.size()), payload, ChecksumMode::kSoftware));
}

TEST(PayloadByReference, TheEmulatorCorruptsItsOwnCopyNeverTheSendersMemory) {
  PcapSide s(2);
  LinkParams p;
  p.corrupt = 1.0;  // every frame
  p.seed = 5;
  LinkEmulator emulator(s.port->id(), 0, p, s.copies.get(), rte_get_tsc_hz());
  s.iface->attach_emulator(&emulator);
  std::vector<std::vector<std::byte>> payloads, kept, want;
  for (uint32_t i = 0; i < 8; ++i) {
    payloads.push_back(pattern(6000 + i, i));
    want.push_back(
        copied_frame(header(i, payloads[i].size()), payloads[i], ChecksumMode::kSoftware));
    ASSERT_TRUE(s.iface->stage_data_st(kRoute, header(i, payloads[i].size()), payloads[i]));
  }
  kept = payloads;
  EXPECT_EQ(s.iface->counters().tx_by_reference, 8u);
  s.iface->flush_st(rte_rdtsc());
  // The emulator took every payload in when it took the frames.
  EXPECT_EQ(s.iface->payloads_by_reference(), 0u);
  for (int i = 0; i < 1000 && emulator.counters().sent < 8; ++i) emulator.poll(rte_rdtsc());
  EXPECT_EQ(emulator.counters().corrupted, 8u);
  EXPECT_EQ(payloads, kept) << "the emulator wrote into the sender's memory";
  s.iface->attach_emulator(nullptr);
  const auto frames = s.close();
  ASSERT_EQ(frames.size(), want.size());
  for (size_t i = 0; i < frames.size(); ++i) {
    ASSERT_EQ(frames[i].size(), want[i].size());
    int bits = 0;
    for (size_t j = 0; j < frames[i].size(); ++j) {
      bits += __builtin_popcount(std::to_integer<unsigned>(frames[i][j] ^ want[i][j]));
    }
    EXPECT_EQ(bits, 1) << "frame " << i;
  }
}

TEST(PayloadByReference, FramesTheEmulatorKeepsTakeTheirPayloadIn) {
  // A 2 ms delay: every frame stays on the emulator's line past the send.
  PcapSide s(3);
  LinkParams p;
  p.delay_us = 2000;
  LinkEmulator emulator(s.port->id(), 0, p, s.copies.get(), rte_get_tsc_hz());
  s.iface->attach_emulator(&emulator);
  std::vector<std::vector<std::byte>> payloads, want;
  for (uint32_t i = 0; i < 6; ++i) {
    payloads.push_back(pattern(5000, 20 + i));
    want.push_back(
        copied_frame(header(i, payloads[i].size()), payloads[i], ChecksumMode::kSoftware));
    ASSERT_TRUE(s.iface->stage_data_st(kRoute, header(i, payloads[i].size()), payloads[i]));
  }
  EXPECT_EQ(s.iface->counters().tx_by_reference, 6u);
  s.iface->flush_st(rte_rdtsc());
  EXPECT_EQ(emulator.counters().sent, 0u) << "the delay did not hold the frames";
  EXPECT_EQ(s.iface->payloads_by_reference(), 0u);
  // The sender's memory changes while the frames wait: what goes out is
  // what was staged.
  for (auto& q : payloads) std::memset(q.data(), 0x5a, q.size());
  const uint64_t until = rte_rdtsc() + rte_get_tsc_hz();
  while (emulator.counters().sent < 6 && rte_rdtsc() < until) emulator.poll(rte_rdtsc());
  EXPECT_EQ(emulator.counters().sent, 6u);
  s.iface->attach_emulator(nullptr);
  EXPECT_EQ(s.close(), want);
}

TEST(PayloadByReference, FramesThePmdRefusesTakeTheirPayloadIn) {
  // A memif server port with no client: its tx_burst sends nothing.
  Mempool pool("ref_memif_pool", 1023, 0, frame_bytes_for_mtu(9000));
  Port port = Port::open("net_memif" + std::to_string(kMemifIndex), pool, PortOptions{.mtu = 9000});
  ASSERT_TRUE(port.tx_by_reference()) << port.describe();
  Interface iface(port, pool, kLocal, {});
  std::vector<std::vector<std::byte>> payloads;
  for (uint32_t i = 0; i < 5; ++i) payloads.push_back(pattern(3000, i));
  for (uint32_t i = 0; i < 5; ++i) {
    ASSERT_TRUE(iface.stage_data_st(kRoute, header(i, payloads[i].size()), payloads[i]));
  }
  EXPECT_EQ(iface.payloads_by_reference(), 5u);
  EXPECT_EQ(iface.flush_st(rte_rdtsc()), 0u);
  EXPECT_EQ(iface.counters().tx_taken_in, 5u);
  EXPECT_EQ(iface.payloads_by_reference(), 0u);
  EXPECT_EQ(iface.tx_room(), Interface::kStage - 5u);
  // A second refused flush finds nothing left to take in.
  EXPECT_EQ(iface.flush_st(rte_rdtsc()), 0u);
  EXPECT_EQ(iface.counters().tx_taken_in, 5u);
}

TEST(PayloadByReference, NeverOverAPmdThatKeepsTheMbufs) {
  // net_ring hands the mbufs themselves to the other end.
  pmdtest::RingLink link("payload_ref", 0, {.end = {.mtu = 9000, .mbufs = 1023}});
  EXPECT_FALSE(link.a().port().tx_by_reference());
  Route r;
  ASSERT_TRUE(link.resolve_a_to_b(r, nullptr));
  const auto payload = pattern(8000, 1);
  ASSERT_TRUE(link.a().stage_data_st(r, header(0, payload.size()), payload));
  EXPECT_EQ(link.a().counters().tx_by_reference, 0u);
  EXPECT_EQ(link.a().payloads_by_reference(), 0u);
}

}  // namespace
}  // namespace mercury::net

int main(int argc, char** argv) {
  namespace net = mercury::net;
  const mercury::pmdtest::ScratchDir dir("payload-ref", "the recordings");
  net::g_scratch = dir.path();
  net::g_memif_socket = mercury::pmdtest::memif_socket("payload-ref");
  std::vector<std::string> vdevs;
  for (int i = 0; i < net::kPcapPorts; ++i) {
    vdevs.push_back("--vdev=" + net::pcap_port(i) + ",tx_pcap=" + net::pcap_file(i));
  }
  vdevs.push_back("--vdev=" + mercury::pmdtest::memif_vdev({.index = net::kMemifIndex,
                                                            .server = true,
                                                            .socket = net::g_memif_socket,
                                                            .mac = net::kLocal.mac}));
  return mercury::pmdtest::run_all_tests(argc, argv, vdevs);
}
