// Packet-level delivery (PacketReceiver) and slices of a logical message
// (Endpoint::send_slice) over real PMD ports: net_ring links with the link
// emulator on both directions, one thread polling every endpoint (as in
// endpoint_test.cpp).
//
// The two halves of a parameter server's data flow ("One BSP iteration, as data flows" in
// docs/architecture.md): four workers push blocks into a "server" whose receiver sees each
// (block_key, offset, rank) packet once and holds its mbuf until all four
// ranks' copies of that chunk are there, as lib/agg's chunk table does; and
// the server sends every chunk of its parameter memory as a slice, out of
// order and at mixed priorities, to four workers that place each packet by
// (block_key, offset). Every byte is checked, every mbuf is counted back.
#include <gtest/gtest.h>
#include <rte_cycles.h>
#include <rte_mbuf.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "endpoint_config.h"
#include "messages.h"
#include "pmd_env.h"
#include "ring_link.h"

namespace mercury::transport {
namespace {

using pmdtest::CompletionLog;
using pmdtest::endpoint_config;
using pmdtest::faults;
using pmdtest::RingLink;
using pmdtest::run;

constexpr uint32_t kMtu = 9000;
constexpr int kWorkers = 4;
constexpr uint32_t kLinkMbufs = 2047;  // LinkEnd's default pool sizes
constexpr uint32_t kCopyMbufs = 511;

// Tensor (block) sizes in bytes, float32: ResNet-like, a few chunks up to
// hundreds, with partial last chunks and one-packet tensors.
const std::vector<uint32_t> kTensors = {4u << 20, 1024, (1u << 20) + 12, 37'632, 256, 2u << 20,
                                        8916,     8920, 590'000,         4};

// Peers declared dead after 5 s without progress.
constexpr pmdtest::EndpointOptions kEndpoint = {.peer_timeout_ms = 5'000};

// Polls until nothing has moved for 20 ms (delayed and pure ACKs included)
// and no emulator holds a frame, so every mbuf is back in its pool.
void settle(const std::vector<Endpoint*>& eps, const std::vector<RingLink*>& links) {
  const uint64_t hz = rte_get_tsc_hz();
  const uint64_t deadline = rte_rdtsc() + 5 * hz;
  uint64_t last_move = rte_rdtsc();
  for (;;) {
    const uint64_t now = rte_rdtsc();
    uint32_t moved = 0;
    for (Endpoint* e : eps) moved += e->poll_st(now);
    for (RingLink* l : links) {
      for (pmdtest::LinkEnd* e : {&l->end_a(), &l->end_b()}) {
        if (e->emulator() != nullptr && e->emulator()->queued() != 0) ++moved;
      }
    }
    if (moved != 0) last_move = now;
    if (now - last_move > hz / 50 || now > deadline) return;
  }
}

void expect_no_mbuf_leak(RingLink& l, const char* what) {
  EXPECT_EQ(l.end_a().pool.available() + l.a().mbufs_held(), kLinkMbufs) << what;
  EXPECT_EQ(l.end_b().pool.available() + l.b().mbufs_held(), kLinkMbufs) << what;
  EXPECT_EQ(l.end_a().copies.available(), kCopyMbufs) << what;
  EXPECT_EQ(l.end_b().copies.available(), kCopyMbufs) << what;
}

// A PacketReceiver for endpoints that only send (it counts what it gets).
struct NoPackets final : PacketReceiver {
  bool on_packet(uint16_t, const wire::HeaderFields&, std::span<const std::byte>,
                 net::PacketBuf*) override {
    ++got;
    return false;
  }
  uint64_t got = 0;
};

// ---------------------------------------------------------------------------
// Workers push, the server receives per packet.

// The server's shard core, reduced to what the transport owes it: each
// (block_key, offset, rank) exactly once with the right bytes; the mbuf of
// each contribution held until the chunk's set of four is complete (then all
// four are freed), except every third chunk, whose mbufs the endpoint frees
// (on_packet returns false), so both ownership paths run.
class ChunkServer final : public PacketReceiver {
 public:
  ChunkServer(const std::vector<std::vector<std::byte>>& grads, uint32_t chunk)
      : grads_(grads), chunk_(chunk) {
    for (uint32_t k = 0; k < kTensors.size(); ++k) {
      const uint32_t chunks = (kTensors[k] + chunk - 1) / chunk;
      for (int r = 0; r < kWorkers; ++r) seen_[r].emplace_back(chunks, 0);
      sets_.emplace_back(chunks);
    }
  }

  bool on_packet(uint16_t, const wire::HeaderFields& h, std::span<const std::byte> payload,
                 net::PacketBuf* buf) override {
    rte_mbuf* mbuf = net::mbuf_of(buf);
    const int rank = h.sender_id - 1;
    if (rank < 0 || rank >= kWorkers || h.block_key >= kTensors.size() ||
        h.msg_len != kTensors[h.block_key] || h.offset % chunk_ != 0 ||
        payload.size() != h.payload_len || (h.flags & wire::flags::kSlice) != 0) {
      ++unexpected_;
      return false;
    }
    const uint32_t c = h.offset / chunk_;
    ++seen_[rank][h.block_key][c];
    const uint32_t want = std::min(chunk_, h.msg_len - h.offset);
    if (h.payload_len != want ||
        std::memcmp(payload.data(), grads_[rank].data() + offset_of(h.block_key) + h.offset,
                    want) != 0) {
      ++corrupt_;
    } else {
      bytes_ok_ += want;
    }
    if (c % 3 == 0) return false;  // the endpoint frees it
    Set& s = sets_[h.block_key][c];
    s.held[s.count++] = mbuf;
    ++held_;
    if (s.count == kWorkers) {  // aggregated: release every contribution
      for (rte_mbuf* m : s.held) rte_pktmbuf_free(m);
      held_ -= kWorkers;
      s.count = 0;
      ++completed_sets_;
    }
    return true;
  }

  static size_t offset_of(uint32_t key) {
    size_t o = 0;
    for (uint32_t k = 0; k < key; ++k) o += kTensors[k];
    return o;
  }
  // Every (key, chunk, rank) delivered exactly `times` times (once a round).
  bool all_seen(uint32_t times) const {
    for (const auto& rank : seen_) {
      for (const auto& key : rank) {
        for (uint32_t n : key) {
          if (n != times) return false;
        }
      }
    }
    return true;
  }
  uint64_t bytes_ok() const { return bytes_ok_; }
  uint64_t corrupt() const { return corrupt_; }
  uint64_t unexpected() const { return unexpected_; }
  uint64_t held() const { return held_; }
  uint64_t completed_sets() const { return completed_sets_; }

 private:
  struct Set {
    rte_mbuf* held[kWorkers] = {};
    int count = 0;
  };
  const std::vector<std::vector<std::byte>>& grads_;
  uint32_t chunk_;
  std::vector<std::vector<uint32_t>> seen_[kWorkers];  // [rank][key][chunk]
  std::vector<std::vector<Set>> sets_;                 // [key][chunk]
  uint64_t bytes_ok_ = 0, corrupt_ = 0, unexpected_ = 0, held_ = 0, completed_sets_ = 0;
};

size_t total_bytes() { return ChunkServer::offset_of(static_cast<uint32_t>(kTensors.size())); }

// Four workers, each on its own ring link to the server's core (four
// Interfaces, four server Endpoints, one PacketReceiver); each pushes every
// tensor as one message (float32, block_key = the tensor, sender_id = rank
// + 1), `rounds` times over.
void workers_push(const char* name, uint8_t net, const net::LinkParams& lp, int rounds) {
  std::vector<std::unique_ptr<RingLink>> links;
  std::vector<std::vector<std::byte>> grads;
  for (int w = 0; w < kWorkers; ++w) {
    net::LinkParams p = lp;
    p.seed = lp.seed + 17 * w;
    links.push_back(std::make_unique<RingLink>(
        std::string(name) + std::to_string(w), static_cast<uint8_t>(net + w),
        pmdtest::RingLinkOptions{.end = {.mtu = kMtu, .impair = p}}));
    grads.push_back(pmdtest::random_pattern(total_bytes(), 1000 + w));
  }
  NoPackets nothing;
  const uint64_t now = rte_rdtsc();
  std::vector<std::unique_ptr<Endpoint>> servers, workers;
  std::vector<Endpoint*> all;
  const uint32_t chunk = net::payload_per_packet(kMtu);
  ChunkServer server(grads, chunk);
  for (int w = 0; w < kWorkers; ++w) {
    const uint8_t n = static_cast<uint8_t>(net + w);
    servers.push_back(std::make_unique<Endpoint>(
        links[w]->a(),
        endpoint_config(9, 0, {{"w" + std::to_string(w), RingLink::ip_b(n), 47101}}, kEndpoint),
        server, now));
    workers.push_back(
        std::make_unique<Endpoint>(links[w]->b(),
                                   endpoint_config(3, static_cast<uint16_t>(w + 1),
                                                   {{"ps", RingLink::ip_a(n), 47100}}, kEndpoint),
                                   nothing, now));
    ASSERT_EQ(servers.back()->max_payload(), chunk);
    all.push_back(servers.back().get());
    all.push_back(workers.back().get());
  }
  for (int round = 0; round < rounds; ++round) {
    std::vector<CompletionLog> logs(kWorkers, CompletionLog(kTensors.size()));
    for (int w = 0; w < kWorkers; ++w) {
      for (uint32_t k = 0; k < kTensors.size(); ++k) {
        MessageMeta meta;
        meta.dtype = wire::Dtype::kFloat32;
        meta.block_key = k;
        meta.iteration = static_cast<uint32_t>(round);
        ASSERT_EQ(workers[w]->send(0, grads[w].data() + ChunkServer::offset_of(k), kTensors[k],
                                   static_cast<uint8_t>(k % 8), meta,
                                   Completion{&CompletionLog::callback, &logs[w], k}),
                  SubmitStatus::kQueued);
      }
    }
    const bool finished = run(
        all,
        [&] {
          for (auto& l : logs) {
            if (l.total_ok() != kTensors.size()) return false;
          }
          return true;
        },
        40);
    EXPECT_TRUE(finished) << name << " round " << round;
    // Delivered before it was acknowledged, so complete with the sends.
    EXPECT_TRUE(server.all_seen(static_cast<uint32_t>(round + 1))) << name << " round " << round;
    for (int w = 0; w < kWorkers; ++w) {
      EXPECT_TRUE(logs[w].each_once()) << "worker " << w;
      EXPECT_EQ(logs[w].first_error, "");
    }
  }
  settle(all, {links[0].get(), links[1].get(), links[2].get(), links[3].get()});
  EXPECT_EQ(server.unexpected(), 0u);
  EXPECT_EQ(server.corrupt(), 0u);
  EXPECT_EQ(server.bytes_ok(), uint64_t(rounds) * kWorkers * total_bytes());
  EXPECT_EQ(server.held(), 0u) << "every chunk set completed and released its mbufs";
  EXPECT_EQ(nothing.got, 0u);
  uint64_t delivered = 0, kept = 0, slice_packets = 0, duplicates = 0;
  for (auto& s : servers) {
    const EndpointCounters c = s->counters_st();
    delivered += c.packets_delivered;
    kept += c.packets_kept;
    EXPECT_EQ(c.messages_received, 0u);
    EXPECT_EQ(c.drops[static_cast<size_t>(EndpointDrop::kNoReceiver)], 0u);
    const PeerCounters pc = s->peer_stats_st(0).transport;
    slice_packets += pc.rx.slice_packets;
    duplicates += pc.rx.duplicates;
    EXPECT_EQ(s->peer_stats_st(0).packets_delivered, c.packets_delivered);
  }
  // Exactly once: one on_packet per (round, key, chunk, rank), counted both
  // by the receiver's ledger and by the endpoints.
  uint64_t chunks = 0;
  for (uint32_t len : kTensors) chunks += (len + chunk - 1) / chunk;
  EXPECT_EQ(delivered, uint64_t(rounds) * kWorkers * chunks);
  EXPECT_TRUE(server.all_seen(static_cast<uint32_t>(rounds)));
  EXPECT_GT(kept, 0u);
  EXPECT_LT(kept, delivered);
  EXPECT_EQ(server.completed_sets() * kWorkers, kept);
  EXPECT_EQ(slice_packets, 0u);  // pushes are whole messages, not slices
  std::printf(
      "[ %s ] %d rounds x %d workers x %.1f MiB: %llu packets delivered (%llu mbufs "
      "kept until their set of %d was complete), %llu duplicates suppressed\n",
      name, rounds, kWorkers, total_bytes() / 1048576.0, (unsigned long long)delivered,
      (unsigned long long)kept, kWorkers, (unsigned long long)duplicates);
  if (lp.loss > 0) {
    EXPECT_GT(duplicates, 0u) << "the faults reached the server";
    uint64_t lost = 0, reordered = 0;
    for (auto& l : links) {
      lost += l->emu_b()->lost;
      reordered += l->emu_b()->reordered;
    }
    EXPECT_GT(lost, 0u);
    EXPECT_GT(reordered, 0u);
  }
  for (auto& l : links) expect_no_mbuf_leak(*l, name);
}

TEST(Slices, PacketModeServerGetsEveryChunkOfFourWorkersOnce) {
  workers_push("pkt0_", 60, faults(0, 1), 1);
}

TEST(Slices, PacketModeServerGetsEveryChunkOnceUnderLossReorderDuplication) {
  workers_push("pkt5_", 70, faults(0.05, 2), 2);
}

// ---------------------------------------------------------------------------
// The server sends slices, the workers place them.

// A worker's pull side: a buffer per tensor, filled with the complement of
// the expected bytes first; every packet placed by (block_key, offset) and
// counted per (key, offset).
class PullWorker final : public PacketReceiver {
 public:
  explicit PullWorker(uint32_t version) : version_(version) {
    for (uint32_t len : kTensors) buffers_.emplace_back(len);
  }
  void expect(const std::vector<std::byte>& params) {
    for (uint32_t k = 0; k < kTensors.size(); ++k) {
      for (uint32_t i = 0; i < kTensors[k]; ++i) {
        buffers_[k][i] = ~params[ChunkServer::offset_of(k) + i];
      }
    }
  }
  bool on_packet(uint16_t, const wire::HeaderFields& h, std::span<const std::byte> payload,
                 net::PacketBuf*) override {
    if ((h.flags & wire::flags::kSlice) == 0 || h.type != wire::PacketType::kAggData ||
        h.block_key >= kTensors.size() || h.msg_len != kTensors[h.block_key] ||
        h.param_version != version_ + h.block_key || h.dtype != wire::Dtype::kFloat32) {
      ++unexpected_;
      return false;
    }
    ++seen_[{h.block_key, h.offset}];
    // wire::decode checked offset + payload_len <= msg_len.
    std::memcpy(buffers_[h.block_key].data() + h.offset, payload.data(), payload.size());
    bytes_ += payload.size();
    return false;
  }
  bool matches(const std::vector<std::byte>& params) const {
    for (uint32_t k = 0; k < kTensors.size(); ++k) {
      if (std::memcmp(buffers_[k].data(), params.data() + ChunkServer::offset_of(k), kTensors[k]) !=
          0) {
        return false;
      }
    }
    return true;
  }
  const std::map<std::pair<uint32_t, uint32_t>, uint32_t>& seen() const { return seen_; }
  uint64_t bytes() const { return bytes_; }
  uint64_t unexpected() const { return unexpected_; }

 private:
  uint32_t version_;
  std::vector<std::vector<std::byte>> buffers_;
  std::map<std::pair<uint32_t, uint32_t>, uint32_t> seen_;
  uint64_t bytes_ = 0, unexpected_ = 0;
};

struct SliceJob {
  uint32_t key;
  uint32_t base;
  uint32_t len;
};

void server_sends_slices(const char* name, uint8_t net, const net::LinkParams& lp) {
  std::vector<std::unique_ptr<RingLink>> links;
  for (int w = 0; w < kWorkers; ++w) {
    net::LinkParams p = lp;
    p.seed = lp.seed + 29 * w;
    links.push_back(std::make_unique<RingLink>(
        std::string(name) + std::to_string(w), static_cast<uint8_t>(net + w),
        pmdtest::RingLinkOptions{.end = {.mtu = kMtu, .impair = p}}));
  }
  const std::vector<std::byte> params = pmdtest::random_pattern(total_bytes(), 4242);
  constexpr uint32_t kVersion = 70;
  std::vector<std::unique_ptr<PullWorker>> pullers;
  NoPackets nothing;
  const uint64_t now = rte_rdtsc();
  std::vector<std::unique_ptr<Endpoint>> servers, workers;
  std::vector<Endpoint*> all;
  for (int w = 0; w < kWorkers; ++w) {
    const uint8_t n = static_cast<uint8_t>(net + w);
    pullers.push_back(std::make_unique<PullWorker>(kVersion));
    pullers.back()->expect(params);
    servers.push_back(std::make_unique<Endpoint>(
        links[w]->a(),
        endpoint_config(9, 0, {{"w" + std::to_string(w), RingLink::ip_b(n), 47101}}, kEndpoint),
        nothing, now));
    workers.push_back(
        std::make_unique<Endpoint>(links[w]->b(),
                                   endpoint_config(3, static_cast<uint16_t>(w + 1),
                                                   {{"ps", RingLink::ip_a(n), 47100}}, kEndpoint),
                                   *pullers.back(), now));
    all.push_back(servers.back().get());
    all.push_back(workers.back().get());
  }
  // Every chunk of every tensor as its own slice (one packet each), except
  // tensor 0, cut into slices of about 2.5 packets so a slice spans packets too;
  // shuffled, so chunks go out (and complete) in any order.
  const uint32_t chunk = servers[0]->max_payload();
  std::vector<SliceJob> jobs;
  for (uint32_t k = 0; k < kTensors.size(); ++k) {
    const uint32_t step = k == 0 ? (chunk * 5 / 2 & ~3u) : chunk;
    for (uint32_t off = 0; off < kTensors[k]; off += step) {
      jobs.push_back({k, off, std::min(step, kTensors[k] - off)});
    }
  }
  std::mt19937 rng(static_cast<uint32_t>(lp.seed));
  std::shuffle(jobs.begin(), jobs.end(), rng);
  std::vector<CompletionLog> logs(kWorkers, CompletionLog(jobs.size()));
  for (uint32_t j = 0; j < jobs.size(); ++j) {
    const SliceJob& s = jobs[j];
    MessageMeta meta;
    meta.type = wire::PacketType::kAggData;
    meta.dtype = wire::Dtype::kFloat32;
    meta.block_key = s.key;
    meta.param_version = kVersion + s.key;
    for (int w = 0; w < kWorkers; ++w) {
      // One payload buffer (the "parameter memory") for every worker.
      ASSERT_EQ(
          servers[w]->send_slice(0, params.data() + ChunkServer::offset_of(s.key) + s.base, s.len,
                                 s.base, kTensors[s.key], static_cast<uint8_t>((s.key * 7) % 64),
                                 meta, Completion{&CompletionLog::callback, &logs[w], j}),
          SubmitStatus::kQueued);
    }
  }
  const bool finished = run(
      all,
      [&] {
        for (auto& l : logs) {
          if (l.total_ok() != jobs.size()) return false;
        }
        return true;
      },
      40);
  EXPECT_TRUE(finished) << name;
  settle(all, {links[0].get(), links[1].get(), links[2].get(), links[3].get()});
  uint64_t packets = 0;
  for (uint32_t len : kTensors) packets += (len + chunk - 1) / chunk;
  // Tensor 0: each slice of ~2.5 packets carves into 3.
  const uint32_t step0 = (chunk * 5 / 2 & ~3u);
  packets -= (kTensors[0] + chunk - 1) / chunk;
  for (uint32_t off = 0; off < kTensors[0]; off += step0) {
    packets += (std::min(step0, kTensors[0] - off) + chunk - 1) / chunk;
  }
  for (int w = 0; w < kWorkers; ++w) {
    const PullWorker& p = *pullers[w];
    EXPECT_TRUE(logs[w].each_once()) << "worker " << w;
    EXPECT_EQ(logs[w].first_error, "");
    EXPECT_EQ(p.unexpected(), 0u) << "worker " << w;
    EXPECT_TRUE(p.matches(params)) << "worker " << w << ": some byte is wrong";
    EXPECT_EQ(p.bytes(), total_bytes()) << "worker " << w;
    EXPECT_EQ(p.seen().size(), packets) << "worker " << w;
    for (const auto& [where, n] : p.seen()) {
      EXPECT_EQ(n, 1u) << "worker " << w << " key " << where.first << " offset " << where.second;
    }
    const EndpointCounters c = workers[w]->counters_st();
    EXPECT_EQ(c.packets_delivered, packets);
    EXPECT_EQ(c.messages_received, 0u);
    // No message accounting for slices: nothing stays in the receiver's table.
    const EndpointPeerStats ps = workers[w]->peer_stats_st(0);
    EXPECT_EQ(ps.transport.rx.slice_packets, packets);
    EXPECT_EQ(ps.transport.rx.messages_completed, 0u);
    EXPECT_EQ(ps.transport.rx.message_table_full, 0u);
    EXPECT_EQ(servers[w]->counters_st().slices_submitted, jobs.size());
    EXPECT_TRUE(servers[w]->idle_st());
    if (lp.loss > 0) {
      EXPECT_GT(servers[w]->counters_st().tx_retransmits, 0u) << "worker " << w;
      EXPECT_GT(ps.transport.rx.duplicates, 0u) << "worker " << w;
    }
  }
  EXPECT_EQ(nothing.got, 0u);
  std::printf(
      "[ %s ] %zu slices x %d workers, %llu packets each; server 0 resent %llu, "
      "worker 0 suppressed %llu duplicates\n",
      name, jobs.size(), kWorkers, (unsigned long long)packets,
      (unsigned long long)servers[0]->counters_st().tx_retransmits,
      (unsigned long long)workers[0]->peer_stats_st(0).transport.rx.duplicates);
  for (auto& l : links) expect_no_mbuf_leak(*l, name);
}

TEST(Slices, ServerSendsSlicesOutOfOrderAtMixedPriorities) {
  server_sends_slices("sl0_", 80, faults(0, 5));
}

TEST(Slices, ServerSendsSlicesUnderLossReorderDuplication) {
  server_sends_slices("sl5_", 90, faults(0.05, 6));
}
}  // namespace
}  // namespace mercury::transport

int main(int argc, char** argv) { return mercury::pmdtest::run_all_tests(argc, argv, {}); }
