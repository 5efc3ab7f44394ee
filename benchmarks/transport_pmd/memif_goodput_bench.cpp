// Goodput of one transport connection over net_memif between two processes,
// against the raw rate of the same vdev carrying the same payload, in the
// same run (issue 3's memif benchmark; the net_ring one is
// transport_pmd_bench).
//
//   memif/raw/<mtu>             the raw loop of memif_rate_bench: the sender
//                               copies each frame (<mtu> + 14 bytes) from a
//                               source buffer into an mbuf and hands it to
//                               memif; the receiver takes, counts and frees. An
//                               iteration sends the frames that carry 32 MiB
//                               of payload at the endpoint's payload per frame
//                               for this MTU. The limit.
//   memif/raw_place/<mtu>       the same, and the receiver copies each frame's
//                               payload into a destination buffer: the
//                               endpoint's two copies, one per core.
//   memif/endpoint/<mtu>        transport::Endpoint (window 128, strict
//                               scheduler) sends 8 messages of 4 MiB; the
//                               receiver's Endpoint places every payload into a
//                               destination buffer; an iteration ends when all
//                               8 completions have run (every byte acknowledged).
//   memif/endpoint_loss1/<mtu>  the same with the link emulator dropping 1 % of
//                               frames on each side (data and ACKs).
//   memif/endpoint_auth/<mtu>   memif/endpoint with a job key: every packet, data
//                               and ACK, carries an AES-256-GMAC tag that the
//                               other side verifies (transport/auth.h); its
//                               payload per packet is 24 bytes shorter before
//                               rounding (1344 at 1500, 8832 at 9000). A second
//                               table gives its ratio to memif/endpoint per
//                               repetition: the cost of authentication where
//                               the cores, not the link, are the limit.
//   memif/endpoint_10g/<mtu>, memif/endpoint_auth_10g/<mtu>
//                               memif/endpoint and memif/endpoint_auth through
//                               the link emulator at a line rate of 10 Gbit/s
//                               each way (preamble, gap and FCS counted): a
//                               NIC's rate, not the cores, is the limit. A third
//                               table gives their ratio per repetition.
// The source and the destination buffers are on 64-byte boundaries
// (AlignedBytes), as a trainer's tensors are.
// The counter compared is "Gbps": payload bits per second of the sender's real
// time. raw's "rx_Gbps" is the same payload per second of the receiver's clock
// (memif_rate_bench's figure), to show the two agree. The endpoint variants
// also report "tx_idle" and "rx_idle", the share of the run each side spent
// in poll passes that found nothing to do (the side near 0 sets the rate),
// and "resent_pct", resends in % of the data packets the messages needed.
//
// Checked every run (a failure ends the benchmark rather than reporting a
// figure): raw, every frame memif accepted arrived whole and of its length;
// endpoint, every message completed on both sides, the receiver compared the
// first iteration's 8 messages with the source byte for byte and three 256-byte
// spans of every later one, and none differed.
//
// Processes, ports and the CPU-share guard are memif_rate_bench's
// (benchmarks/common/memif_bench.h, cpu_share.h): this process (memif client, CPU 0) runs
// Google Benchmark and sends; before EAL starts it spawns itself with --peer
// as the receiver (memif server, CPU 1) and drives it over a socket pair. One
// memif interface per MTU (net_memif0: 1500, net_memif1: 9000; bsize 9024 on
// both); memif_max_frame.cpp lets the 9000 one be configured at 9000. Each
// endpoint variant has its own pair of Interfaces (its own UDP port) and
// Endpoints on that memif link, so variants never share transport state. A
// repetition in which either side had less than --min_cpu_share (default 0.9)
// of its core is reported under "memif_shared_cpu" instead of "memif".
// --memif_zero_copy: memif's zero-copy mode on the receiving side (the
// receiver's ports are clients with zero-copy=yes, the sender's servers; both
// EALs get --single-file-segments); the default is copy mode on both sides.
// Run (see benchmarks/transport_pmd/README.md):
//   build/benchmarks/transport_pmd/memif_goodput_bench --benchmark_repetitions=5
//       --benchmark_min_time=0.3 --benchmark_enable_random_interleaving=true
#include <benchmark/benchmark.h>
#include <rte_cycles.h>
#include <rte_mbuf.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <ctime>
#include <memory>
#include <new>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "endpoint_config.h"
#include "memif_bench.h"
#include "messages.h"
#include "net/interface.h"
#include "net/link_emulator.h"
#include "net/mempool.h"
#include "net/port.h"
#include "ring_link.h"
#include "transport/endpoint.h"

namespace mercury::bench::memif {
namespace {

constexpr uint32_t kMsgBytes = 4u << 20;
constexpr uint32_t kMessages = 8;  // per iteration: 32 MiB
constexpr size_t kSourceBytes = 64u << 20;
constexpr uint64_t kPatternSeed = 9;
constexpr uint32_t kMtus[] = {1500, 9000};
constexpr uint16_t kBurst = 32;
// Bytes of each later message compared at three places (first iteration: all).
constexpr size_t kSpan = 256;

// Mbufs hold a whole memif slot (memif's bulk RX path) and a 9000-MTU frame
// with the Interface's alignment pad.
uint32_t mbuf_bytes() { return std::max(kMbufFrameBytes, net::frame_bytes_for_mtu(9000)); }

// Bytes on a 64-byte boundary, as a trainer's tensors are (PyTorch's
// allocator aligns them to 64 or more), holding a copy of `from`. A
// std::vector of megabytes is not: glibc maps it and hands out the address
// 16 bytes past a page, so every line of a message would be split between
// two packets differently than in use.
class AlignedBytes {
 public:
  explicit AlignedBytes(size_t n) : p_(new (std::align_val_t{64}) std::byte[n]()), n_(n) {}
  explicit AlignedBytes(const std::vector<std::byte>& from) : AlignedBytes(from.size()) {
    std::memcpy(p_.get(), from.data(), n_);
  }
  std::byte* data() { return p_.get(); }
  [[nodiscard]] const std::byte* data() const { return p_.get(); }
  [[nodiscard]] size_t size() const { return n_; }
  operator std::span<const std::byte>() const { return {p_.get(), n_}; }

 private:
  struct Free {
    void operator()(std::byte* p) const { ::operator delete[](p, std::align_val_t{64}); }
  };
  std::unique_ptr<std::byte[], Free> p_;
  size_t n_;
};

size_t mtu_index(uint32_t mtu) { return mtu == 9000 ? 1 : 0; }

// Where message `key` of iteration `iteration` starts in the source: it moves
// with the iteration, so a buffer left over from an earlier one does not match.
size_t source_offset(uint32_t iteration, uint32_t key) {
  return (uint64_t{iteration} * kMessages + key) * 7919 * 64 % (kSourceBytes - kMsgBytes);
}

// The endpoint variants of each link: each has its own connection.
enum Kind : size_t { kPlain, kLossy, kAuth, kPlain10G, kAuth10G, kKinds };

Kind kind_of(Variant v) {
  switch (v) {
    case Variant::kEndpointLoss1:
      return kLossy;
    case Variant::kEndpointAuth:
      return kAuth;
    case Variant::kEndpoint10G:
      return kPlain10G;
    case Variant::kEndpointAuth10G:
      return kAuth10G;
    default:
      return kPlain;
  }
}
bool is_endpoint(Variant v) {
  return v == Variant::kEndpoint || v == Variant::kEndpointLoss1 || v == Variant::kEndpointAuth ||
         v == Variant::kEndpoint10G || v == Variant::kEndpointAuth10G;
}
bool is_auth(Kind k) { return k == kAuth || k == kAuth10G; }

// The authenticated variant's job key: both processes build the same.
transport::SharedAuthKey bench_key() {
  auto k = std::make_shared<transport::AuthKey>();
  for (size_t i = 0; i < k->size(); ++i) (*k)[i] = static_cast<uint8_t>(0x5a ^ (i * 29));
  return k;
}

uint64_t frames_per_iteration(uint32_t mtu) {
  const uint32_t payload = net::payload_per_packet(mtu);
  return (uint64_t{kMsgBytes} * kMessages + payload - 1) / payload;
}

// UDP port of endpoint variant `kind` at MTU index `m`, the same on both
// sides; distinct, so a late packet of one variant is dropped by another's
// Interface (kNotOurPort) instead of reaching its Endpoint.
uint16_t udp_port(size_t m, Kind kind) {
  return static_cast<uint16_t>(kUdpPort + 1 + m * kKinds + kind);
}

// Window 128, strict scheduler, as transport_pmd_bench. A variant waits idle
// while the others run; nothing is in flight then, but a loaded machine can
// stall a run for seconds.
// With `auth`, the job key, and node ids 1 (sender) and 2 (receiver): a
// MAC's nonce names both ends.
transport::EndpointConfig endpoint_config(bool server, uint32_t peer_ip, uint16_t port, bool auth) {
  const uint32_t epoch = server ? 5 : 3, peer_epoch = server ? 3 : 5;
  const uint16_t id = server ? 2 : 1, peer_id = server ? 1 : 2;
  transport::EndpointConfig c = pmdtest::endpoint_config(
      epoch, id, {{"memif-peer", peer_ip, port, peer_epoch, peer_id}}, {.peer_timeout_ms = 30'000});
  if (auth) {
    c.auth_key = bench_key();
    c.transport.seq_salt = transport::derive_seq_salt(*c.auth_key);
  }
  return c;
}

net::LinkParams loss1(uint64_t seed) {
  net::LinkParams p;
  p.loss = 0.01;
  p.seed = seed;
  return p;
}

// A 10 Gbit/s NIC's line rate, nothing else impaired.
inline constexpr double kLineRateGbps = 10;
net::LinkParams line_rate() {
  net::LinkParams p;
  p.rate_gbps = kLineRateGbps;
  return p;
}

// The sender's endpoints receive only ACKs; a message would be a fault.
class NoMessages final : public transport::MessageReceiver {
 public:
  std::byte* on_message_begin(uint16_t, const wire::HeaderFields&) override { return nullptr; }
  void on_message_complete(uint16_t, const wire::HeaderFields&, std::byte*) override {}
};

// One endpoint variant on one side: its Interface (own UDP port), its
// emulator when lossy or rate-limited, its Endpoint.
struct Connection {
  Connection(net::Port& port, net::Mempool& pool, bool server, size_t m, Kind kind,
             transport::MessageReceiver& receiver)
      : copies(std::string(server ? "mgr_cp" : "mgs_cp") + std::to_string(m * kKinds + kind), 1023,
               32, mbuf_bytes()),
        iface(port, pool,
              net::LocalAddr{server ? kReceiverMac : kSenderMac, server ? kReceiverIp : kSenderIp,
                             udp_port(m, kind)},
              {}),
        ep(iface,
           endpoint_config(server, server ? kSenderIp : kReceiverIp, udp_port(m, kind),
                           is_auth(kind)),
           receiver, rte_rdtsc()) {
    // Static ARP, as NodeNetworks configures it: the run measures data only.
    iface.add_static_arp(server ? kSenderIp : kReceiverIp, server ? kSenderMac : kReceiverMac);
    if (kind == kLossy || kind == kPlain10G || kind == kAuth10G) {
      emulator = std::make_unique<net::LinkEmulator>(
          port.id(), 0, kind == kLossy ? loss1((server ? 71u : 73u) + m * 4) : line_rate(),
          copies.get(), rte_get_tsc_hz());
      iface.attach_emulator(emulator.get());
    }
  }
  ~Connection() { iface.attach_emulator(nullptr); }

  net::Mempool copies;
  net::Interface iface;
  std::unique_ptr<net::LinkEmulator> emulator;
  transport::Endpoint ep;
};

// One memif link (one MTU) on one side, with its endpoint variants.
struct Link {
  Link(net::Mempool& pool, bool server, size_t m, transport::MessageReceiver& receiver)
      : mtu(kMtus[m]),
        port(net::Port::open("net_memif" + std::to_string(m), pool,
                             net::PortOptions{.mtu = kMtus[m]})) {
    if (port.mtu() != mtu) throw std::runtime_error("memif port MTU is not " + std::to_string(mtu));
    for (size_t k = 0; k < kKinds; ++k) {
      connections[k] =
          std::make_unique<Connection>(port, pool, server, m, static_cast<Kind>(k), receiver);
    }
  }
  /// Frees whatever an earlier run left in the RX ring; returns how many.
  uint64_t drain() { return pmdtest::drain_rx(port); }
  void wait_up() { wait_link_up(port); }

  uint32_t mtu;
  net::Port port;
  std::array<std::unique_ptr<Connection>, kKinds> connections;
};

// ---------------------------------------------------------------------------
// The receiver process.

// Places every message of the sender's endpoint into one of 8 buffers (by
// block_key) and checks it against the source when it completes.
class PlacingReceiver final : public transport::MessageReceiver {
 public:
  explicit PlacingReceiver(const AlignedBytes& source)
      : source_(source), buffers_(kMessages * kMsgBytes) {}

  void reset() { completed = checked = corrupt = unexpected = bytes = 0; }

  std::byte* on_message_begin(uint16_t, const wire::HeaderFields& h) override {
    if (h.msg_len != kMsgBytes || h.block_key >= kMessages) {
      ++unexpected;
      return nullptr;
    }
    return buffers_.data() + size_t{h.block_key} * kMsgBytes;
  }
  void on_message_complete(uint16_t, const wire::HeaderFields& h, std::byte* buffer) override {
    ++completed;
    bytes += kMsgBytes;
    const std::byte* want = source_.data() + source_offset(h.iteration, h.block_key);
    bool same;
    if (h.iteration == 0) {
      same = std::memcmp(buffer, want, kMsgBytes) == 0;
      ++checked;
    } else {
      const size_t middle =
          (uint64_t{h.iteration} * 4099 + h.block_key * 131) * 64 % (kMsgBytes - kSpan);
      same = std::memcmp(buffer, want, kSpan) == 0 &&
             std::memcmp(buffer + middle, want + middle, kSpan) == 0 &&
             std::memcmp(buffer + kMsgBytes - kSpan, want + kMsgBytes - kSpan, kSpan) == 0;
    }
    if (!same) ++corrupt;
  }

  uint64_t completed = 0, checked = 0, corrupt = 0, unexpected = 0, bytes = 0;

 private:
  const AlignedBytes& source_;
  AlignedBytes buffers_;
};

class Receiver {
 public:
  Receiver()
      : pool_("mg_rx", 8191, 256, mbuf_bytes()),
        placing_(source_),
        links_{std::make_unique<Link>(pool_, true, 0, placing_),
               std::make_unique<Link>(pool_, true, 1, placing_)} {}

  uint64_t drain() { return links_[0]->drain() + links_[1]->drain(); }

  void begin(Variant v, uint32_t mtu) {
    variant_ = v;
    link_ = links_[mtu_index(mtu)].get();
    frame_ = mtu + net::kL2Len;
    payload_ = net::payload_per_packet(mtu);
    report_ = Report{};
    first_tsc_ = last_tsc_ = 0;
    first_packets_ = 0;
    idle_ticks_ = 0;
    placed_ = 0;
    placing_.reset();
    wall_at_begin_ = clock_ns(CLOCK_MONOTONIC);
    cpu_at_begin_ = clock_ns(CLOCK_THREAD_CPUTIME_ID);
  }

  /// One burst (raw) or one endpoint pass.
  void poll_st() {
    const uint64_t now = rte_rdtsc();
    if (is_endpoint(variant_)) {
      // A pass with nothing to do is idle: the other side is the bottleneck.
      if (link_->connections[kind_of(variant_)]->ep.poll_st(now) == 0) {
        idle_ticks_ += rte_rdtsc() - now;
      }
      return;
    }
    rte_mbuf* b[kBurst];
    const uint16_t got = link_->port.rx_burst(0, b, kBurst);
    if (got == 0) return;
    for (uint16_t i = 0; i < got; ++i) {
      if (b[i]->pkt_len != frame_ || b[i]->nb_segs != 1) {
        ++report_.wrong_length;
      } else if (variant_ == Variant::kRawPlace) {
        if (placed_ + payload_ > kMsgBytes) placed_ = 0;
        std::memcpy(place_.data() + placed_,
                    rte_pktmbuf_mtod_offset(b[i], const std::byte*, frame_ - payload_), payload_);
        placed_ += payload_;
      }
      report_.bytes += b[i]->pkt_len;
    }
    rte_pktmbuf_free_bulk(b, got);
    if (report_.packets == 0) {
      first_tsc_ = now;
      first_packets_ = got;
    }
    last_tsc_ = now;
    report_.packets += got;
  }

  /// Frames (raw) or messages (endpoint) received so far in the run.
  [[nodiscard]] uint64_t received() const {
    return is_endpoint(variant_) ? placing_.completed : report_.packets;
  }

  Report finish() {
    Report r = report_;
    if (is_endpoint(variant_)) {
      r.packets = placing_.completed;
      r.bytes = placing_.bytes;
      r.wrong_length = placing_.unexpected;
      r.checked = placing_.checked;
      r.corrupt = placing_.corrupt;
      r.idle_ns = static_cast<uint64_t>(static_cast<double>(idle_ticks_) * 1e9 /
                                        static_cast<double>(rte_get_tsc_hz()));
    } else {
      r.timed_packets = r.packets - first_packets_;
      r.timed_bytes = r.timed_packets * payload_;  // payload, as the endpoint's figure
      r.window_ns = static_cast<uint64_t>(static_cast<double>(last_tsc_ - first_tsc_) * 1e9 /
                                          static_cast<double>(rte_get_tsc_hz()));
    }
    r.wall_ns = clock_ns(CLOCK_MONOTONIC) - wall_at_begin_;
    r.cpu_ns = clock_ns(CLOCK_THREAD_CPUTIME_ID) - cpu_at_begin_;
    return r;
  }

 private:
  AlignedBytes source_{pmdtest::random_pattern(kSourceBytes, kPatternSeed)};
  AlignedBytes place_{kMsgBytes};  // raw_place's destination
  net::Mempool pool_;
  PlacingReceiver placing_;
  std::array<std::unique_ptr<Link>, 2> links_;
  Variant variant_ = Variant::kRaw;
  Link* link_ = nullptr;
  uint32_t frame_ = 0;
  uint32_t payload_ = 0;
  size_t placed_ = 0;
  Report report_;
  uint64_t first_tsc_ = 0;
  uint64_t last_tsc_ = 0;
  uint64_t first_packets_ = 0;
  uint64_t idle_ticks_ = 0;  // endpoint: in passes that did nothing
  uint64_t wall_at_begin_ = 0;
  uint64_t cpu_at_begin_ = 0;
};

// ---------------------------------------------------------------------------
// The sender process (Google Benchmark).

struct Sender {
  explicit Sender(Peer& p) : peer(p) {}
  /// Waits until both memif links are up.
  void wait_up() {
    for (auto& l : links) l->wait_up();
  }

  Peer& peer;
  AlignedBytes source{pmdtest::random_pattern(kSourceBytes, kPatternSeed)};
  net::Mempool pool{"mg_tx", 8191, 256, mbuf_bytes()};
  NoMessages no_messages;
  std::array<std::unique_ptr<Link>, 2> links{std::make_unique<Link>(pool, false, 0, no_messages),
                                             std::make_unique<Link>(pool, false, 1, no_messages)};
};
Sender* g_sender = nullptr;

// An iteration hands memif the frames that carry 32 MiB of payload. Returns
// the frames memif accepted; sets `failure` when it stops early.
uint64_t send_raw(benchmark::State& state, Sender& s, Link& l, std::string& failure) {
  const size_t frame = l.mtu + net::kL2Len;
  const uint64_t per_iteration = frames_per_iteration(l.mtu);
  uint64_t sent = 0;
  size_t offset = 0;
  Stall stall;
  for (auto _ : state) {
    for (uint64_t left = per_iteration; left > 0 && failure.empty();) {
      const auto n = static_cast<uint16_t>(std::min<uint64_t>(kBurst, left));
      const uint16_t done =
          send_raw_burst(l.port, s.pool.get(), s.source, frame, n, offset, stall, failure);
      sent += done;
      left -= done;
    }
    if (!failure.empty()) break;
  }
  return sent;
}

struct Completions {
  uint64_t ok = 0;
  uint64_t failed = 0;
  std::string first_error;
};

void on_sent(void* context, const transport::SendResult& r) {
  auto& c = *static_cast<Completions*>(context);
  if (r.ok()) {
    ++c.ok;
  } else if (c.failed++ == 0) {
    c.first_error =
        std::string(transport::send_status_name(r.status)) + ": " + std::string(r.error);
  }
}

// An iteration sends 8 x 4 MiB and polls until their completions have run.
// Returns the messages delivered; sets `failure` when it stops early.
// `idle_ticks` gains the TSC ticks of passes that did nothing.
uint64_t send_messages(benchmark::State& state, Sender& s, transport::Endpoint& ep,
                       uint64_t& idle_ticks, std::string& failure) {
  Completions c;
  uint32_t iteration = 0;
  const uint64_t hz = rte_get_tsc_hz();
  for (auto _ : state) {
    const uint64_t target = c.ok + kMessages;
    for (uint32_t key = 0; key < kMessages; ++key) {
      transport::MessageMeta meta;
      meta.block_key = key;
      meta.iteration = iteration;
      const std::byte* data = s.source.data() + source_offset(iteration, key);
      if (ep.send(0, data, kMsgBytes, 0, meta, transport::Completion{&on_sent, &c, key}) !=
          transport::SubmitStatus::kQueued) {
        failure = "the endpoint refused a send";
        return c.ok;
      }
    }
    const uint64_t deadline = rte_rdtsc() + 60 * hz;
    while (c.ok + c.failed < target) {
      const uint64_t now = rte_rdtsc();
      if (ep.poll_st(now) == 0) idle_ticks += rte_rdtsc() - now;
      if (now > deadline) {
        failure = "an iteration did not complete in 60 s";
        return c.ok;
      }
    }
    if (c.failed != 0) {
      failure = std::to_string(c.failed) + " sends failed, the first with " + c.first_error;
      return c.ok;
    }
    ++iteration;
  }
  return c.ok;
}

// A failed run ends the whole benchmark with an exception (main reports it,
// stops the receiver and EAL), as in memif_rate_bench: a run that loses data
// or its receiver is a fault to look at, not a figure.
void run(benchmark::State& state, Variant v) {
  Sender& s = *g_sender;
  const auto mtu = static_cast<uint32_t>(state.range(0));
  Link& l = *s.links[mtu_index(mtu)];
  const bool endpoint = is_endpoint(v);
  const std::string name = std::string("memif/") +
                           (v == Variant::kRaw             ? "raw/"
                            : v == Variant::kRawPlace      ? "raw_place/"
                            : v == Variant::kEndpoint      ? "endpoint/"
                            : v == Variant::kEndpointLoss1 ? "endpoint_loss1/"
                            : v == Variant::kEndpointAuth  ? "endpoint_auth/"
                            : v == Variant::kEndpoint10G   ? "endpoint_10g/"
                                                           : "endpoint_auth_10g/") +
                           std::to_string(mtu);
  transport::Endpoint* ep = endpoint ? &l.connections[kind_of(v)]->ep : nullptr;
  if (ep != nullptr && !ep->idle_st()) throw std::runtime_error(name + ": endpoint not idle");
  const uint64_t resent_before = ep != nullptr ? ep->counters_st().tx_retransmits : 0;
  std::string failure;
  Report ack;
  l.drain();  // stale ACKs of an earlier run
  if (!s.peer.start(v, mtu, ack, failure)) throw std::runtime_error(name + ": " + failure);
  const uint64_t wall = clock_ns(CLOCK_MONOTONIC);
  const uint64_t cpu = clock_ns(CLOCK_THREAD_CPUTIME_ID);
  uint64_t tx_idle = 0;
  const uint64_t sent =
      endpoint ? send_messages(state, s, *ep, tx_idle, failure) : send_raw(state, s, l, failure);
  const uint64_t tx_wall = clock_ns(CLOCK_MONOTONIC) - wall;
  const double tx_cpu =
      static_cast<double>(clock_ns(CLOCK_THREAD_CPUTIME_ID) - cpu) / static_cast<double>(tx_wall);
  Report r;
  std::string stop_failure;
  if (!s.peer.stop(sent, r, stop_failure)) {
    failure += (failure.empty() ? "" : "; ") + stop_failure;
  }
  const uint64_t iterations = static_cast<uint64_t>(state.iterations());
  if (failure.empty()) {
    if (r.wrong_length != 0) {
      failure = std::to_string(r.wrong_length) +
                (endpoint ? " messages refused by the receiver" : " frames of the wrong length");
    } else if (r.packets != sent) {
      failure = "the receiver got " + std::to_string(r.packets) + " of the " +
                std::to_string(sent) +
                (endpoint ? " messages delivered" : " frames memif accepted");
    } else if (endpoint && r.corrupt != 0) {
      failure = std::to_string(r.corrupt) + " messages differ from the source";
    } else if (endpoint && (r.checked != kMessages || sent != iterations * kMessages ||
                            r.bytes != sent * kMsgBytes)) {
      failure = "counts disagree: " + std::to_string(r.checked) + " messages checked whole, " +
                std::to_string(sent) + " delivered in " + std::to_string(iterations) +
                " iterations, " + std::to_string(r.bytes) + " bytes placed";
    } else if (!endpoint && sent != iterations * frames_per_iteration(mtu)) {
      failure = "sent " + std::to_string(sent) + " frames in " + std::to_string(iterations) +
                " iterations";
    }
  }
  if (!failure.empty()) throw std::runtime_error(name + ": " + failure);
  const uint64_t payload =
      endpoint ? sent * kMsgBytes : sent * uint64_t{net::payload_per_packet(mtu)};
  state.counters["Gbps"] =
      benchmark::Counter(static_cast<double>(payload) * 8 / 1e9, benchmark::Counter::kIsRate);
  if (!endpoint && r.window_ns > 0) {
    state.counters["rx_Gbps"] =
        static_cast<double>(r.timed_bytes) * 8 / static_cast<double>(r.window_ns);
  }
  if (endpoint) {
    // Resends in % of the data packets the run's messages needed.
    const double packets =
        static_cast<double>(sent) * std::ceil(double{kMsgBytes} / ep->max_payload());
    state.counters["resent_pct"] =
        static_cast<double>(ep->counters_st().tx_retransmits - resent_before) * 100 / packets;
  }
  if (endpoint) {
    // Share of the run each endpoint spent in passes that found nothing to do:
    // the side near 0 is the one that sets the rate.
    state.counters["tx_idle"] = static_cast<double>(tx_idle) * 1e9 /
                                static_cast<double>(rte_get_tsc_hz()) /
                                static_cast<double>(tx_wall);
    state.counters["rx_idle"] =
        r.wall_ns > 0 ? static_cast<double>(r.idle_ns) / static_cast<double>(r.wall_ns) : 0.0;
  }
  state.counters["tx_cpu"] = tx_cpu;
  state.counters["rx_cpu"] =
      r.wall_ns > 0 ? static_cast<double>(r.cpu_ns) / static_cast<double>(r.wall_ns) : 0.0;
}

void raw(benchmark::State& state) { run(state, Variant::kRaw); }
void raw_place(benchmark::State& state) { run(state, Variant::kRawPlace); }
void endpoint(benchmark::State& state) { run(state, Variant::kEndpoint); }
void endpoint_loss1(benchmark::State& state) { run(state, Variant::kEndpointLoss1); }
void endpoint_auth(benchmark::State& state) { run(state, Variant::kEndpointAuth); }
void endpoint_10g(benchmark::State& state) { run(state, Variant::kEndpoint10G); }
void endpoint_auth_10g(benchmark::State& state) { run(state, Variant::kEndpointAuth10G); }

// Real time: the sender waits on memif and on ACKs, and the figures are per second.
BENCHMARK(raw)->Name("memif/raw")->Arg(1500)->Arg(9000)->UseRealTime();
BENCHMARK(raw_place)->Name("memif/raw_place")->Arg(1500)->Arg(9000)->UseRealTime();
BENCHMARK(endpoint)->Name("memif/endpoint")->Arg(1500)->Arg(9000)->UseRealTime();
BENCHMARK(endpoint_loss1)->Name("memif/endpoint_loss1")->Arg(1500)->Arg(9000)->UseRealTime();
BENCHMARK(endpoint_auth)->Name("memif/endpoint_auth")->Arg(1500)->Arg(9000)->UseRealTime();
BENCHMARK(endpoint_10g)->Name("memif/endpoint_10g")->Arg(1500)->Arg(9000)->UseRealTime();
BENCHMARK(endpoint_auth_10g)->Name("memif/endpoint_auth_10g")->Arg(1500)->Arg(9000)->UseRealTime();

}  // namespace
}  // namespace mercury::bench::memif

int main(int argc, char** argv) {
  namespace memif = mercury::bench::memif;
  return memif::memif_main<memif::Receiver>(
      argc, argv,
      {.name = "memif_goodput_bench",
       .peer_name = "memif_goodput_p",
       .counter = "Gbps",
       .links = 2,
       .zero_copy_option = true,
       .pairs = {{"endpoint_auth", "endpoint"}, {"endpoint_auth_10g", "endpoint_10g"}}},
      memif::g_sender);
}
