// pcap record and replay through net_pcap, and the Wireshark dissector read
// back with tshark.
//
// Recording: a net_pcap port given to EAL with tx_pcap=<file> writes every
// frame sent on it to the file (net_pcap opens the file when probed, and
// again, truncated, on each restart; stopping the port closes it).
// Replay: a second net_pcap port with rx_pcap=<file> is hot-plugged with
// rte_dev_probe once the file exists, and read until the file is exhausted.
// net_pcap reads as fast as it is polled, so the reader never drains its RX
// queue before the test starts reading (that would eat the replay), and every
// loop is bounded in packets and in polls.
//
// The dissector tests run `tshark -X lua_script:lib/wire/mercury.lua` over
// such a recording and compare what it prints, field by field, with what was
// sent, and its verdict on malformed headers with wire::decode()'s.
#include <gtest/gtest.h>
#include <rte_dev.h>
#include <rte_ethdev.h>
#include <rte_mbuf.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "agg/half.h"
#include "files.h"
#include "net/frame.h"
#include "net/mempool.h"
#include "pmd_env.h"

#ifndef MERCURY_LUA_DISSECTOR
#error "the build passes the path of lib/wire/mercury.lua"
#endif

namespace mercury::net {
namespace {

constexpr char kRecorder[] = "net_pcap_rec";
std::string scratch_dir;  // made by main() before EAL starts: the recorder's file lives there

std::string recording() { return scratch_dir + "/record.pcap"; }

const MacAddr kMacA{{0x02, 0, 0, 0, 0, 0x0a}};
const MacAddr kMacB{{0x02, 0, 0, 0, 0, 0x0b}};
const LocalAddr kLocalA{kMacA, 0xc0000201, 47100};  // 192.0.2.1 (documentation range)
const LocalAddr kLocalB{kMacB, 0xc0000202, wire::kDefaultUdpPort};

// One frame to send: the header, the payload, and the UDP port it goes to.
struct Sent {
  wire::HeaderFields h;
  std::vector<std::byte> payload;
  uint16_t dst_port = wire::kDefaultUdpPort;
  uint16_t src_port = kLocalA.udp_port;
  std::vector<std::byte> frame;  // filled by build()
};

std::vector<std::byte> floats(uint32_t count, float first) {
  std::vector<std::byte> p(count * 4);
  for (uint32_t i = 0; i < count; ++i) {
    const float v = first + static_cast<float>(i) * 0.25f;
    std::memcpy(p.data() + 4 * i, &v, 4);  // little-endian on the wire, as the host
  }
  return p;
}

// `count` bfloat16 or float16 elements first, first + 0.25, ... (cycling
// through 16 steps, so every value is exact in either type).
std::vector<std::byte> halves(uint32_t count, float first, wire::Dtype dtype) {
  std::vector<std::byte> p(count * 2);
  for (uint32_t i = 0; i < count; ++i) {
    const float v = first + static_cast<float>(i % 16) * 0.25f;
    const uint16_t h =
        dtype == wire::Dtype::kBFloat16 ? agg::float_to_bf16(v) : agg::float_to_fp16(v);
    std::memcpy(p.data() + 2 * i, &h, 2);  // little-endian on the wire, as the host
  }
  return p;
}

void build(Sent& s) {
  s.frame.resize(std::max<size_t>(kFrameOverhead + s.payload.size(), kMinFrame));
  const Route route{kMacB, kLocalB.ip, s.dst_port};
  LocalAddr from = kLocalA;
  from.udp_port = s.src_port;
  const size_t len =
      build_data_frame(s.frame, from, route, s.h, s.payload, ChecksumMode::kSoftware);
  s.frame.resize(len);
  s.h.payload_len = static_cast<uint16_t>(s.payload.size());
}

// A set of frames in which every header field takes distinct values, with
// every packet type, every dtype, each flag, empty to jumbo payloads.
std::vector<Sent> varied_frames(uint32_t count) {
  std::vector<Sent> out;
  for (uint32_t i = 0; i < count; ++i) {
    Sent s;
    wire::HeaderFields& h = s.h;
    h.type = static_cast<wire::PacketType>(1 + i % 6);
    h.flags = static_cast<uint16_t>(i % 16);
    h.job_id = 0x10000000u + i * 977u;
    h.sender_id = static_cast<uint16_t>(100 + i);
    h.priority = static_cast<uint8_t>(i * 7 % 256);
    h.block_key = 0xa0000000u + i;
    h.msg_id = 5000 + i * 3;
    h.iteration = 1'000'000 + i;
    h.param_version = 999'000 + i;
    h.seq = 0xfffffff0u + i;  // wraps past 2^32 within the set
    h.ack = i * 11;
    h.epoch = 0xe0000001u + i * 0x01020304u;  // every byte varies, above 2^31
    h.sack = 0x8000000000000001ull ^ (uint64_t{i} << 17);
    h.credit = static_cast<uint16_t>(0x7000 + i * 0x0101);
    if (h.type == wire::PacketType::kAck || h.type == wire::PacketType::kPartitionStart) {
      h.dtype = wire::Dtype::kBytes;  // no payload
    } else if (h.type == wire::PacketType::kControl) {
      h.dtype = wire::Dtype::kBytes;
      s.payload.resize(3 + i);  // any length
      for (size_t j = 0; j < s.payload.size(); ++j) s.payload[j] = std::byte(j ^ i);
    } else {
      // Data of each tensor dtype in turn; up to the largest payload of a
      // 9000-byte MTU every few frames.
      const wire::Dtype dtypes[] = {wire::Dtype::kFloat32, wire::Dtype::kBFloat16,
                                    wire::Dtype::kFloat16};
      h.dtype = dtypes[i / 6 % 3];
      const uint32_t size = wire::element_bytes(h.dtype);
      const uint32_t n = i % 5 == 0 ? payload_per_packet(kMaxMtu) / size : 1 + i * 13;
      s.payload = h.dtype == wire::Dtype::kFloat32
                      ? floats(n, 1.5f + static_cast<float>(i))
                      : halves(n, 1.5f + static_cast<float>(i), h.dtype);
    }
    h.offset = h.type == wire::PacketType::kAck ? 0 : 4 * i;
    h.msg_len = h.type == wire::PacketType::kAck
                    ? 0
                    : h.offset + static_cast<uint32_t>(s.payload.size()) + 4 * (i % 3);
    build(s);
    out.push_back(std::move(s));
  }
  return out;
}

std::unique_ptr<Mempool> pool;  // jumbo mbufs; lives from the first test to suite tear-down

class Pcap : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    pool = std::make_unique<Mempool>("pcap_pool", 2047, 0, frame_bytes_for_mtu(kMaxMtu));
  }
  static void TearDownTestSuite() { pool.reset(); }
};

uint16_t port_of(const std::string& name) {
  uint16_t id = 0;
  if (rte_eth_dev_get_port_by_name(name.c_str(), &id) != 0) {
    throw std::runtime_error("no port named " + name);
  }
  return id;
}

void configure(uint16_t port) {
  rte_eth_conf conf{};
  if (rte_eth_dev_configure(port, 1, 1, &conf) != 0 ||
      rte_eth_rx_queue_setup(port, 0, 512, SOCKET_ID_ANY, nullptr, pool->get()) != 0 ||
      rte_eth_tx_queue_setup(port, 0, 512, SOCKET_ID_ANY, nullptr) != 0) {
    throw std::runtime_error("cannot configure port " + std::to_string(port));
  }
}

// Sends `frames` through the recorder; returns when the file is closed.
void record(const std::vector<Sent>& frames) {
  const uint16_t port = port_of(kRecorder);
  static bool configured = false;
  if (!configured) {
    configure(port);
    configured = true;
  }
  ASSERT_EQ(rte_eth_dev_start(port), 0);
  std::vector<rte_mbuf*> burst;
  for (const Sent& s : frames) {
    rte_mbuf* m = rte_pktmbuf_alloc(pool->get());
    ASSERT_NE(m, nullptr);
    auto* d = rte_pktmbuf_append(m, static_cast<uint16_t>(s.frame.size()));
    ASSERT_NE(d, nullptr) << "frame of " << s.frame.size() << " bytes does not fit an mbuf";
    std::memcpy(d, s.frame.data(), s.frame.size());
    burst.push_back(m);
  }
  size_t done = 0;
  for (int tries = 0; done < burst.size() && tries < 1000; ++tries) {
    const uint16_t n = static_cast<uint16_t>(std::min<size_t>(burst.size() - done, 32));
    done += rte_eth_tx_burst(port, 0, burst.data() + done, n);
  }
  for (size_t i = done; i < burst.size(); ++i) rte_pktmbuf_free(burst[i]);
  ASSERT_EQ(done, burst.size()) << "net_pcap refused frames";
  ASSERT_EQ(rte_eth_dev_stop(port), 0);  // closes (and so completes) the pcap file
}

// Replays `file` through a hot-plugged net_pcap port; returns every frame's bytes.
std::vector<std::vector<std::byte>> replay(const std::string& file, size_t max_frames) {
  static int instance = 0;
  const std::string name = "net_pcap_replay" + std::to_string(instance++);
  std::vector<std::vector<std::byte>> out;
  if (rte_dev_probe((name + ",rx_pcap=" + file).c_str()) != 0) {
    ADD_FAILURE() << "rte_dev_probe " << name << " rx_pcap=" << file;
    return out;
  }
  const uint16_t port = port_of(name);
  configure(port);
  EXPECT_EQ(rte_eth_dev_start(port), 0);
  // No drain at start: the first burst is already the replay.
  rte_mbuf* pkts[32];
  int idle_polls = 0;
  while (out.size() < max_frames && idle_polls < 100) {
    const uint16_t n = rte_eth_rx_burst(port, 0, pkts, 32);
    idle_polls = n == 0 ? idle_polls + 1 : 0;
    for (uint16_t i = 0; i < n; ++i) {
      std::vector<std::byte> bytes(rte_pktmbuf_pkt_len(pkts[i]));
      const void* p = rte_pktmbuf_read(pkts[i], 0, static_cast<uint32_t>(bytes.size()),
                                       bytes.data());  // copies only if segmented
      if (p != bytes.data()) std::memcpy(bytes.data(), p, bytes.size());
      out.push_back(std::move(bytes));
      rte_pktmbuf_free(pkts[i]);
    }
  }
  EXPECT_EQ(rte_eth_dev_stop(port), 0);
  EXPECT_EQ(rte_eth_dev_close(port), 0);
  EXPECT_EQ(rte_eal_hotplug_remove("vdev", name.c_str()), 0);
  return out;
}

TEST_F(Pcap, RecordThenReplayGivesBackEveryFieldAndByte) {
  const auto frames = varied_frames(60);
  record(frames);
  ASSERT_TRUE(std::filesystem::exists(recording()));
  const auto replayed = replay(recording(), 1000);
  ASSERT_EQ(replayed.size(), frames.size());
  for (size_t i = 0; i < frames.size(); ++i) {
    const Sent& s = frames[i];
    ASSERT_EQ(replayed[i], s.frame) << "frame " << i << " differs from what was sent";
    ParsedFrame pf;
    parse_frame(replayed[i], kLocalB, RxChecks{}, pf);
    ASSERT_EQ(pf.kind, FrameKind::kMercury) << "frame " << i << ": " << drop_reason_name(pf.drop)
                                            << " / " << wire::reject_name(pf.reject);
    EXPECT_EQ(pf.header, s.h) << "frame " << i;
    EXPECT_EQ(pf.src_mac, kMacA);
    EXPECT_EQ(pf.src_ip, kLocalA.ip);
    EXPECT_EQ(pf.src_port, kLocalA.udp_port);
    EXPECT_TRUE(
        std::equal(pf.payload.begin(), pf.payload.end(), s.payload.begin(), s.payload.end()))
        << "frame " << i;
  }
  // A second recording replaces the first: the recorder is reusable.
  const auto fewer = varied_frames(5);
  record(fewer);
  EXPECT_EQ(replay(recording(), 1000).size(), 5u);
}

// --- tshark ---------------------------------------------------------------

struct Command {
  int status = -1;
  std::string out;
  std::string err;
};

Command run(const std::string& cmd) {
  Command c;
  const std::string err_file = scratch_dir + "/stderr.txt";
  FILE* p = popen((cmd + " 2>" + err_file).c_str(), "r");
  if (p == nullptr) return c;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) c.out.append(buf.data(), n);
  c.status = pclose(p);
  std::ifstream e(err_file);
  c.err.assign(std::istreambuf_iterator<char>(e), {});
  return c;
}

bool have_tshark() { return run("command -v tshark").status == 0; }

#define REQUIRE_TSHARK()                                                             \
  if (!have_tshark()) {                                                              \
    FAIL() << "tshark is not installed: the dissector cannot be checked (.ci/setup " \
              "installs it: apt-get install tshark)";                                \
  }

std::string tshark(const std::string& file, const std::string& args) {
  const Command c =
      run("tshark -n -r " + file + " -X lua_script:" MERCURY_LUA_DISSECTOR " " + args);
  EXPECT_EQ(c.status, 0) << "tshark failed:\n" << c.err;
  EXPECT_EQ(c.err.find("Lua: Error"), std::string::npos) << c.err;
  return c.out;
}

std::vector<std::vector<std::string>> rows(const std::string& text) {
  std::vector<std::vector<std::string>> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> cols;
    size_t start = 0;
    for (;;) {
      const size_t tab = line.find('\t', start);
      cols.push_back(line.substr(start, tab - start));
      if (tab == std::string::npos) break;
      start = tab + 1;
    }
    out.push_back(std::move(cols));
  }
  return out;
}

std::string hex64(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%016llx", static_cast<unsigned long long>(v));
  return buf;
}

TEST_F(Pcap, DissectorShowsEveryFieldAsSent) {
  REQUIRE_TSHARK();
  const auto frames = varied_frames(24);
  record(frames);
  const char* fields[] = {
      "mercury.version",       "mercury.type",       "mercury.flags",  "mercury.job_id",
      "mercury.sender_id",     "mercury.priority",   "mercury.dtype",  "mercury.block_key",
      "mercury.msg_id",        "mercury.msg_len",    "mercury.offset", "mercury.iteration",
      "mercury.param_version", "mercury.seq",        "mercury.ack",    "mercury.payload_len",
      "mercury.epoch",         "mercury.sack",       "mercury.credit", "mercury.float_count",
      "mercury.float",         "mercury.half_count", "mercury.half",   "mercury.reject"};
  std::string args = "-T fields -E occurrence=f";
  for (const char* f : fields) args += std::string(" -e ") + f;
  const auto table = rows(tshark(recording(), args));
  ASSERT_EQ(table.size(), frames.size());
  for (size_t i = 0; i < frames.size(); ++i) {
    const wire::HeaderFields& h = frames[i].h;
    const auto& r = table[i];
    ASSERT_EQ(r.size(), std::size(fields)) << "row " << i;
    std::vector<std::string> expect = {
        std::to_string(wire::kVersion),
        std::to_string(static_cast<unsigned>(h.type)),
        [&] {
          char b[8];
          std::snprintf(b, sizeof b, "0x%04x", h.flags);
          return std::string(b);
        }(),
        std::to_string(h.job_id),
        std::to_string(h.sender_id),
        std::to_string(h.priority),
        std::to_string(static_cast<unsigned>(h.dtype)),
        std::to_string(h.block_key),
        std::to_string(h.msg_id),
        std::to_string(h.msg_len),
        std::to_string(h.offset),
        std::to_string(h.iteration),
        std::to_string(h.param_version),
        std::to_string(h.seq),
        std::to_string(h.ack),
        std::to_string(h.payload_len),
        std::to_string(h.epoch),
        hex64(h.sack),
        std::to_string(h.credit),
        "",  // float_count, float, half_count, half: below
        "",
        "",
        "",
        "",  // a valid header is not rejected
    };
    if (h.dtype == wire::Dtype::kFloat32 && h.payload_len > 0) {
      expect[19] = std::to_string(h.payload_len / 4);
      float first;
      std::memcpy(&first, frames[i].payload.data(), 4);
      char b[32];
      std::snprintf(b, sizeof b, "%g", static_cast<double>(first));
      expect[20] = b;
    }
    if ((h.dtype == wire::Dtype::kBFloat16 || h.dtype == wire::Dtype::kFloat16) &&
        h.payload_len > 0) {
      expect[21] = std::to_string(h.payload_len / 2);
      uint16_t first;
      std::memcpy(&first, frames[i].payload.data(), 2);
      const float value =
          h.dtype == wire::Dtype::kBFloat16 ? agg::bf16_to_float(first) : agg::fp16_to_float(first);
      char b[32];
      std::snprintf(b, sizeof b, "%g", static_cast<double>(value));
      expect[22] = b;
    }
    for (size_t c = 0; c < expect.size(); ++c) {
      EXPECT_EQ(r[c], expect[c]) << "frame " << i << " field " << fields[c];
    }
  }
}

TEST_F(Pcap, DissectorNamesTypesDtypesAndFlagBits) {
  REQUIRE_TSHARK();
  Sent data;
  data.h.type = wire::PacketType::kAggData;
  data.h.dtype = wire::Dtype::kFloat32;
  data.h.flags = wire::flags::kAckValid | wire::flags::kAckRequest | wire::flags::kSlice;
  data.h.sack = 0x00000000deadbeefull;
  data.payload = floats(100, 2.0f);
  data.h.msg_len = 400;
  build(data);
  Sent ack;
  ack.h.type = wire::PacketType::kAck;
  ack.h.flags = wire::flags::kAckValid | wire::flags::kRetransmit;
  build(ack);
  Sent start;
  start.h.type = wire::PacketType::kPartitionStart;
  start.h.block_key = 9;
  build(start);
  Sent bf16;
  bf16.h.type = wire::PacketType::kData;
  bf16.h.dtype = wire::Dtype::kBFloat16;
  bf16.payload = halves(100, -3.0f, wire::Dtype::kBFloat16);
  bf16.h.msg_len = 200;
  build(bf16);
  Sent fp16 = bf16;
  fp16.h.dtype = wire::Dtype::kFloat16;
  fp16.payload = halves(40, 0.5f, wire::Dtype::kFloat16);
  fp16.h.msg_len = 80;
  build(fp16);
  record({data, ack, start, bf16, fp16});
  const std::string v = tshark(recording(), "-V");
  for (const char* expect : {"Mercury parameter-server protocol",
                             "Type: agg_data (2)",
                             "Data type: float32 (1)",
                             "Type: ack (3)",
                             "Type: partition_start (6)",
                             "Data type: bytes (0)",
                             "Data type: bfloat16 (2)",
                             "Data type: float16 (3)",
                             "Half-precision elements: 100",
                             "Half-precision elements: 40",
                             "Element: -2.75",
                             "Element: 0.75",
                             "= ACK valid: True",
                             "= ACK request: True",
                             "= Retransmit: False",
                             "= Retransmit: True",
                             "= Slice: True",
                             "= Slice: False",
                             "SACK: 0x00000000deadbeef",
                             "Float32 elements: 100",
                             "Element: 2.25",
                             "[68 more elements not shown]"}) {
    EXPECT_NE(v.find(expect), std::string::npos) << "missing \"" << expect << "\" in:\n" << v;
  }
  const std::string summary = tshark(recording(), "");
  EXPECT_NE(summary.find("Mercury"), std::string::npos) << summary;
  EXPECT_NE(summary.find("agg_data seq=0 ack=0 key=0 off=0 len=400 [slice]"), std::string::npos)
      << summary;
  EXPECT_NE(summary.find("[retransmit]"), std::string::npos) << summary;
  EXPECT_NE(summary.find("partition_start seq=0 key=9 off=0 len=0"), std::string::npos) << summary;
}

// Frames whose Mercury header breaks one rule each; their UDP checksum is
// left 0 ("none"), which Wireshark accepts, so only the header is at fault.
TEST_F(Pcap, DissectorRejectsWhatDecodeRejectsWithTheSameReason) {
  REQUIRE_TSHARK();
  struct Case {
    const char* name;
    void (*mutate)(wire::Header&);
  };
  const Case cases[] = {
      {"valid", [](wire::Header&) {}},
      {"bad_version", [](wire::Header& h) { h.version = 1; }},  // the previous wire version
      {"bad_type", [](wire::Header& h) { h.type = 9; }},
      {"bad_flags", [](wire::Header& h) { h.flags.set(0x0100); }},
      {"bad_dtype", [](wire::Header& h) { h.dtype = 7; }},
      {"bad_dtype", [](wire::Header& h) { h.dtype = 4; }},  // the first past float16
      {"payload_mismatch", [](wire::Header& h) { h.payload_len.set(12); }},
      {"ack_with_payload", [](wire::Header& h) { h.type = 3; }},
      {"start_with_payload", [](wire::Header& h) { h.type = 6; }},
      {"bad_range", [](wire::Header& h) { h.msg_len.set(4); }},
      {"bad_alignment", [](wire::Header& h) { h.offset.set(2); }},
      // Two-byte elements: an even offset is aligned, an odd one is not.
      {"valid",
       [](wire::Header& h) {
         h.dtype = 2;
         h.offset.set(10);
       }},
      {"bad_alignment",
       [](wire::Header& h) {
         h.dtype = 3;
         h.offset.set(9);
       }},
  };
  std::vector<Sent> frames;
  for (const Case& c : cases) {
    Sent s;
    s.h.type = wire::PacketType::kData;
    s.h.dtype = wire::Dtype::kFloat32;
    s.h.msg_len = 64;
    s.h.offset = 8;
    s.payload = floats(2, 1.0f);
    s.frame.resize(kFrameOverhead + s.payload.size());
    build_data_frame(s.frame, kLocalA, Route{kMacB, kLocalB.ip, s.dst_port}, s.h, s.payload,
                     ChecksumMode::kNone);
    auto* mh = reinterpret_cast<wire::Header*>(s.frame.data() + kL2Len + kL3Len + kL4Len);
    c.mutate(*mh);
    // The codec's verdict on these bytes is the reference.
    wire::HeaderFields decoded;
    const wire::Reject r = wire::decode(
        std::span<const std::byte>(s.frame).subspan(kL2Len + kL3Len + kL4Len), decoded);
    EXPECT_EQ(wire::reject_name(r), c.name == std::string("valid") ? "none" : c.name);
    frames.push_back(std::move(s));
  }
  record(frames);
  const auto table = rows(tshark(recording(), "-T fields -e mercury.reject -e _ws.expert.message"));
  ASSERT_EQ(table.size(), std::size(cases));
  for (size_t i = 0; i < std::size(cases); ++i) {
    const std::string want = cases[i].name == std::string("valid") ? "" : cases[i].name;
    EXPECT_EQ(table[i][0], want) << "case " << cases[i].name;
    if (!want.empty()) {
      EXPECT_NE(table[i][1].find(want), std::string::npos) << "expert info for " << want;
    }
  }
}

TEST_F(Pcap, HeuristicFindsMercuryOnAnyUdpPort) {
  REQUIRE_TSHARK();
  // Neither UDP port is Mercury's, so only the heuristic can claim a frame.
  Sent mercury_elsewhere;
  mercury_elsewhere.src_port = 50000;
  mercury_elsewhere.dst_port = 50123;
  mercury_elsewhere.h.type = wire::PacketType::kControl;
  mercury_elsewhere.h.seq = 77;
  mercury_elsewhere.payload.resize(10);
  mercury_elsewhere.h.msg_len = 10;
  build(mercury_elsewhere);
  // Not Mercury: a UDP datagram whose first bytes are not a Mercury header.
  Sent other = mercury_elsewhere;
  other.dst_port = 50124;
  build(other);
  other.frame[kL2Len + kL3Len + kL4Len] = std::byte{0x45};  // "version" 0x45
  record({mercury_elsewhere, other});
  const auto table =
      rows(tshark(recording(), "-T fields -e udp.dstport -e mercury.seq -e frame.protocols"));
  ASSERT_EQ(table.size(), 2u);
  EXPECT_EQ(table[0][0], "50123");
  EXPECT_EQ(table[0][1], "77");
  EXPECT_EQ(table[1][0], "50124");
  EXPECT_EQ(table[1][1], "");
  EXPECT_EQ(table[1][2].find("mercury"), std::string::npos) << table[1][2];
  // "Decode As" / the port preference still force the dissector onto a port.
  const auto forced =
      rows(tshark(recording(), "-d udp.port==50124,mercury -T fields -e mercury.reject"));
  ASSERT_EQ(forced.size(), 2u);
  EXPECT_EQ(forced[1][0], "bad_version");
}

}  // namespace
}  // namespace mercury::net

int main(int argc, char** argv) {
  // MERCURY_KEEP_PCAP keeps it, for a look in Wireshark at the last recording.
  const mercury::pmdtest::ScratchDir dir("pcap", "captures");
  mercury::net::scratch_dir = dir.path();
  return mercury::pmdtest::run_all_tests(
      argc, argv,
      {std::string("--vdev=") + mercury::net::kRecorder + ",tx_pcap=" + mercury::net::recording()});
}
