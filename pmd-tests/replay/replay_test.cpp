// A captured 4-worker trace replayed into ps-server produces the expected
// aggregated packets.
//
// Capture (in this process, replay_job.h): a job of 1 server (2 shards) and
// 4 workers over ring links runs the real protocol (declare, ready, rank 0's
// kInit, kRounds BSP rounds of deterministic gradients); an RX tap on the
// server's ports records every frame the server receives, in arrival order,
// into trace.pcap.
//
// Replay: the real ps-server binary, as a separate process, with a job file
// whose server0 has ONE port, `net_pcap0,rx_pcap=trace.pcap,tx_pcap=out.pcap`
// (the 4 workers behind it; their MACs are static in the file, so no ARP),
// `--epoch` set to the capture server's (a stream's sequence numbers are
// keyed to both ends' epochs: see replay_job.h), for `--seconds 1`. net_pcap
// reads the trace as fast as the server polls it.
//
// The replayed workers cannot react to what this server sends. The trace
// does hold the capture workers' ACKs, and as the stream keys are the same
// they name the same sequence numbers: each one either acknowledges whatever
// this server happened to send under that number, or, when it is ahead of
// what was sent, is ignored (acks_invalid). So nothing guarantees the server
// an ACK for any given packet, and the job's `network.window` (4096) is
// larger than everything it has to send a worker in this job (the model is
// 57 chunks, so 57 x (1 + kRounds) = 228 aggregated packets, plus the
// control answer): every aggregated packet can go out without a single ACK. Unacknowledged
// packets are retransmitted on RTO for the rest of the second: out.pcap holds
// those repeats, which are counted and printed, not failed on.
//
// Check: out.pcap is parsed with lib/net's frame parser and wire::decode
// (parse_frame). For every worker, every block and chunk, every version
// 0..kRounds, an aggregated packet (kAggData) must have been sent to that
// worker, and every worker must have been sent kReady with the placement's
// fingerprint. Payloads are compared with the reference bit for bit (version
// 0: rank 0's initial parameters; version v + 1: the rank-order SGD step of
// replay_job.h), with one allowance the replay forces:
//
// The server sends an update from the shard's live parameter memory, not
// from a copy (docs/server.md, "Why the bytes of an update stay valid").
// With real workers that is safe under BSP: version v + 1 needs every
// worker's gradient computed from version v, so the chunk cannot move on
// before every worker has received v. Replayed workers do not wait: the
// gradients of iteration v arrive right behind the packets that made version
// v, so the shard may apply v + 1 before the net core has built version v's
// packets, which then carry v + 1's (or a later version's) values under
// version v's header. So a packet's payload must be, element by element, the
// reference at its header's version or a later one (never anything else);
// the packets of the last version, which nothing overwrites, must be exact;
// and how many (worker, chunk, version) got an exact copy, and how many
// packets carry later values, is printed. The capture itself checks every
// version bit for bit at every worker (replay_job.h), where the protocol's
// causality holds.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <pcap/pcap.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "../../apps/common/synthetic.h"
#include "files.h"
#include "pmd_env.h"
#include "replay_job.h"

#ifndef MERCURY_PS_SERVER
#error "the build passes the path of the ps-server binary"
#endif

namespace mercury::replay {
namespace {

constexpr uint32_t kRounds = 3;
std::string scratch_dir;  // made by main()

// MERCURY_PS_SERVER in the environment overrides the built binary.
std::string ps_server() {
  const char* e = std::getenv("MERCURY_PS_SERVER");
  return e != nullptr ? e : MERCURY_PS_SERVER;
}

struct Process {
  int status = -1;  // exit code, or -1 when it did not exit normally
  std::string output;
};

// Runs `args` (argv[0] first) with stdout and stderr to a file; kills it
// (by its pid) if it is still running after `limit_s`, so a hang fails the
// test instead of stalling it.
Process run(const std::vector<std::string>& args, double limit_s) {
  const std::string log = scratch_dir + "/ps-server.log";
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    // Only async-signal-safe calls between fork and exec (EAL has threads).
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || dup2(fd, STDOUT_FILENO) < 0 || dup2(fd, STDERR_FILENO) < 0) _exit(126);
    execv(argv[0], argv.data());
    _exit(127);
  }
  Process r;
  if (pid < 0) return r;
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(limit_s);
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      r.output = apps::read_file(log) + "\n[killed after " + std::to_string(limit_s) + " s]";
      return r;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.output = apps::read_file(log);
  return r;
}

// One aggregated chunk as sent: (worker, key, offset, version).
using ChunkId = std::tuple<uint32_t, uint32_t, uint32_t, uint32_t>;
struct Copies {
  uint32_t sent = 0;   // packets with this id
  uint32_t exact = 0;  // ... whose payload is exactly the reference of that version
};

enum class Payload { kExact, kLater, kWrong };

// An aggregated packet of (tensor, block p, byte `offset`, `version`):
// kExact when its payload is that chunk of reference version `version`, bit
// for bit; kLater when every element is that element at version `version`
// or a later one (see the file comment: the fan-out reads the shard's live
// parameters, which a replay can move on before the packet is built);
// kWrong otherwise, or when the geometry (offset, length, version) is off.
Payload judge(const std::vector<std::vector<std::vector<float>>>& want, uint32_t tensor,
              const worker::BlockGeometry& p, uint32_t chunk, uint32_t offset, uint32_t version,
              std::span<const std::byte> payload) {
  if (version >= want.size() || offset % chunk != 0 || offset >= p.bytes() ||
      payload.size() != std::min<uint64_t>(chunk, p.bytes() - offset)) {
    return Payload::kWrong;
  }
  const uint64_t first = p.first_element + offset / sizeof(float);
  const size_t n = payload.size() / sizeof(float);
  if (std::memcmp(payload.data(), want[version][tensor].data() + first, payload.size()) == 0) {
    return Payload::kExact;
  }
  for (size_t i = 0; i < n; ++i) {
    bool found = false;
    for (size_t v = version; v < want.size() && !found; ++v) {
      found = std::memcmp(payload.data() + i * sizeof(float), &want[v][tensor][first + i],
                          sizeof(float)) == 0;
    }
    if (!found) return Payload::kWrong;
  }
  return Payload::kLater;
}

TEST(PcapReplay, CapturedFourWorkerTraceReplayedIntoPsServerGivesEveryAggregate) {
  const std::vector<agg::TensorDecl> decls = small_model();
  const std::string trace = scratch_dir + "/trace.pcap";
  const std::string out = scratch_dir + "/out.pcap";

  // Capture.
  const config::JobConfig capture_job =
      config::load_string(job_yaml({.name = "capture"}), "capture.yaml");
  const Capture cap = capture(capture_job, decls, kRounds, trace);
  std::printf(
      "capture: %lu frames received by the server, %lu chunks per version, %lu worker "
      "retransmissions\n",
      static_cast<unsigned long>(cap.frames), static_cast<unsigned long>(cap.chunks),
      static_cast<unsigned long>(cap.retransmits));
  ASSERT_GT(cap.frames, kWorkers * cap.chunks * kRounds);

  // Replay into ps-server.
  JobLayout replay;
  replay.name = "rp" + std::to_string(getpid());
  replay.server_ports = {"net_pcap0,rx_pcap=" + trace + ",tx_pcap=" + out};
  const std::string job_file = scratch_dir + "/replay.yaml";
  std::ofstream(job_file) << job_yaml(replay);
  const Process r = run({ps_server(), "--config", job_file, "--epoch", std::to_string(kServerEpoch),
                         "--seconds", "1"},
                        60);
  std::error_code ignored;
  std::filesystem::remove_all("/var/run/dpdk/" + replay.name + "-server0", ignored);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("every worker declared"), std::string::npos) << r.output;
  // The last line: aggregations, retransmissions, drops.
  const size_t last = r.output.rfind("ps-server server0: stopped");
  ASSERT_NE(last, std::string::npos) << r.output;
  std::printf("%s", r.output.substr(last).c_str());

  // What every worker must have been sent.
  const config::JobConfig job = config::load_file(job_file);
  const auto workers = job.workers();
  const uint32_t chunk = job.payload_bytes_per_packet();
  std::vector<std::vector<float>> buffers(decls.size());
  worker::TensorTable table;
  for (size_t k = 0; k < decls.size(); ++k) {
    buffers[k].resize(decls[k].elements);
    table.declare(decls[k].name, buffers[k], decls[k].priority);
  }
  table.freeze(kShards, chunk);
  struct Where {
    uint32_t tensor;
    const worker::BlockGeometry* p;
  };
  std::map<uint32_t, Where> by_key;
  for (uint32_t k = 0; k < table.tensors(); ++k) {
    for (const worker::BlockGeometry& p : table.blocks(k)) by_key[p.key] = {k, &p};
  }
  const auto want = reference(decls, kRounds);

  // Parse what the server sent.
  char err[PCAP_ERRBUF_SIZE];
  pcap_t* in = pcap_open_offline(out.c_str(), err);
  ASSERT_NE(in, nullptr) << err;
  std::map<ChunkId, Copies> sent;
  std::vector<bool> ready(kWorkers, false);
  uint64_t frames = 0, agg = 0, retransmit_flagged = 0, acks = 0, other = 0;
  uint64_t later = 0, later_original = 0, wrong = 0;
  std::string first_wrong;
  pcap_pkthdr* hdr = nullptr;
  const u_char* data = nullptr;
  while (pcap_next_ex(in, &hdr, &data) == 1) {
    ++frames;
    const std::span<const std::byte> frame(reinterpret_cast<const std::byte*>(data), hdr->caplen);
    net::ParsedFrame pf;
    uint32_t rank = kWorkers;
    for (uint32_t w = 0; w < kWorkers && rank == kWorkers; ++w) {
      net::MacAddr mac;
      std::copy(workers[w]->mac->octets.begin(), workers[w]->mac->octets.end(), mac.bytes.begin());
      const net::LocalAddr to{mac, workers[w]->ipv4.value, workers[w]->udp_port};
      net::parse_frame(frame, to, net::RxChecks{}, pf);
      if (pf.kind == net::FrameKind::kMercury) rank = w;
    }
    if (rank == kWorkers) {
      ++other;  // not a valid Mercury packet for any worker (ARP, say)
      continue;
    }
    const wire::HeaderFields& h = pf.header;
    if (h.type == wire::PacketType::kAck) {
      ++acks;
      continue;
    }
    if (h.type == wire::PacketType::kControl) {
      if (h.payload_len == h.msg_len) {
        const agg::ControlMessage m = agg::decode_control(pf.payload);
        if (m.kind == agg::ControlKind::kReady && m.fingerprint == table.fingerprint()) {
          ready[rank] = true;
        }
      }
      continue;
    }
    if (h.type != wire::PacketType::kAggData) {
      ++other;
      continue;
    }
    ++agg;
    const bool retransmit = (h.flags & wire::flags::kRetransmit) != 0;
    retransmit_flagged += retransmit ? 1 : 0;
    Copies& copies = sent[{rank, h.block_key, h.offset, h.param_version}];
    ++copies.sent;
    const auto it = by_key.find(h.block_key);
    const Payload verdict = it == by_key.end()
                                ? Payload::kWrong
                                : judge(want, it->second.tensor, *it->second.p, chunk, h.offset,
                                        h.param_version, pf.payload);
    if (verdict == Payload::kExact) {
      ++copies.exact;
    } else if (verdict == Payload::kLater) {
      ++later;
      later_original += retransmit ? 0 : 1;
    } else if (++wrong == 1) {
      first_wrong = "to w" + std::to_string(rank) + " key " + std::to_string(h.block_key) +
                    " offset " + std::to_string(h.offset) + " version " +
                    std::to_string(h.param_version) + " (" + std::to_string(pf.payload.size()) +
                    " bytes)";
    }
  }
  pcap_close(in);

  // Every (worker, chunk, version) at least once.
  uint64_t expected = 0, missing = 0, repeats = 0, with_exact = 0;
  std::string first_missing;
  for (uint32_t w = 0; w < kWorkers; ++w) {
    for (const auto& [key, where] : by_key) {
      for (uint32_t off = 0; off < where.p->bytes(); off += chunk) {
        for (uint32_t v = 0; v <= kRounds; ++v) {
          ++expected;
          const auto it = sent.find({w, key, off, v});
          if (it == sent.end()) {
            if (++missing == 1) {
              first_missing = "w" + std::to_string(w) + " key " + std::to_string(key) + " offset " +
                              std::to_string(off) + " version " + std::to_string(v);
            }
            continue;
          }
          repeats += it->second.sent - 1;
          with_exact += it->second.exact > 0 ? 1 : 0;
        }
      }
    }
  }
  std::printf(
      "replay: ps-server sent %lu frames: %lu aggregated packets for %lu of %lu expected (worker, "
      "chunk, version), %lu repeats (%lu flagged retransmit); %lu acks, %lu other\n"
      "payloads: %lu of the expected have an exact copy; %lu packets carry a later version's "
      "values (%lu of them first transmissions)\n",
      static_cast<unsigned long>(frames), static_cast<unsigned long>(agg),
      static_cast<unsigned long>(sent.size()), static_cast<unsigned long>(expected),
      static_cast<unsigned long>(repeats), static_cast<unsigned long>(retransmit_flagged),
      static_cast<unsigned long>(acks), static_cast<unsigned long>(other),
      static_cast<unsigned long>(with_exact), static_cast<unsigned long>(later),
      static_cast<unsigned long>(later_original));
  EXPECT_EQ(wrong, 0u) << "aggregated packets whose payload is no version of the reference at or "
                          "after the one in their header (or of a chunk that does not exist); "
                          "first: "
                       << first_wrong;
  EXPECT_EQ(missing, 0u) << "aggregates never sent; first: " << first_missing;
  EXPECT_EQ(sent.size(), expected) << "aggregated packets of chunks or versions that do not exist";
  for (uint32_t w = 0; w < kWorkers; ++w) EXPECT_TRUE(ready[w]) << "no kReady to w" << w;
}

}  // namespace
}  // namespace mercury::replay

int main(int argc, char** argv) {
  const mercury::pmdtest::ScratchDir dir(
      "replay", "traces (trace.pcap: the server's RX; out.pcap: ps-server's TX)");
  mercury::replay::scratch_dir = dir.path();
  return mercury::pmdtest::run_all_tests(argc, argv, {});
}
