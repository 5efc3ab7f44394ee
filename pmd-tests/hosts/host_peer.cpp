// One "host" of the multi-host stack test: runs inside a network namespace on
// a net_af_packet port bound to a veth, with real ARP (no static entries).
//
//   host_peer --iface IF --ip A.B.C.D --peer A.B.C.D --role send|receive
//             --frames N [--seconds T]
//
// The sender resolves the receiver by ARP and sends N Mercury frames whose
// payloads are a known pattern, over and over (there is no transport here,
// and a veth drops what an overloaded receiver does not read in time); the
// receiver checks every byte of every frame, refuses nothing silently, and
// exits 0 once it has seen all N distinct frames intact. The receiver gives
// up after T seconds (exit 1), so a broken network fails instead of hanging;
// the sender runs until T or until it is stopped.
#include <rte_cycles.h>
#include <rte_mbuf.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "config/config.h"
#include "eal_args.h"
#include "net/eal.h"
#include "net/interface.h"
#include "net/mempool.h"
#include "net/port.h"

namespace {

using namespace mercury;

// The test script stops the sender with SIGINT once the receiver is done; the
// loop then ends normally, so EAL cleans its runtime directory up.
volatile std::sig_atomic_t g_stop = 0;
void on_signal(int) { g_stop = 1; }

std::byte pattern(uint32_t seq, uint32_t i) { return std::byte((seq * 131u + i * 7u) >> 1); }

struct Args {
  std::string iface, role, tag = "solo";
  uint32_t ip = 0, peer = 0, frames = 1000;
  double seconds = 20;
};

uint32_t parse_ip(const std::string& s) {
  auto ip = config::Ipv4::parse(s);
  if (!ip) throw std::runtime_error("not an IPv4 address: " + s);
  return ip->value;
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--iface")
      a.iface = v;
    else if (k == "--ip")
      a.ip = parse_ip(v);
    else if (k == "--peer")
      a.peer = parse_ip(v);
    else if (k == "--role")
      a.role = v;
    else if (k == "--frames")
      a.frames = static_cast<uint32_t>(std::stoul(v));
    else if (k == "--seconds")
      a.seconds = std::stod(v);
    else if (k == "--tag")
      a.tag = v;
    else
      throw std::runtime_error("unknown argument " + k);
  }
  if (a.iface.empty() || a.ip == 0 || a.peer == 0 || (a.role != "send" && a.role != "receive")) {
    throw std::runtime_error("usage: host_peer --iface IF --ip IP --peer IP --role send|receive");
  }
  return a;
}

int run(const Args& a) {
  // The tag lets the test script remove this run's EAL runtime directory.
  const std::string prefix = "mt-host-" + a.tag + "-" + a.role;
  net::Eal eal(pmdtest::eal_args("host_peer", {"--vdev=net_af_packet0,iface=" + a.iface},
                                 {.file_prefix = prefix}));
  net::Mempool pool("hp", 4095, 64, net::frame_bytes_for_mtu(1500));
  net::Port port = net::Port::open("net_af_packet0", pool, net::PortOptions{.mtu = 1500});
  net::Interface ifc(port, pool, net::LocalAddr{port.mac(), a.ip, 47100}, {});
  std::printf("%s: %s\n", a.role.c_str(), port.describe().c_str());

  const uint64_t hz = rte_get_tsc_hz();
  const uint64_t deadline =
      rte_rdtsc() + static_cast<uint64_t>(a.seconds * static_cast<double>(hz));
  const uint32_t payload = 1024;
  std::vector<std::byte> buf(payload);
  net::RxPacket rx[net::Interface::kBurst];
  net::Route route;
  bool routed = false;
  uint32_t sent = 0, received = 0, bad = 0, distinct = 0;
  std::vector<bool> seen(a.frames, false);
  uint64_t last_send = 0;
  while (rte_rdtsc() < deadline && g_stop == 0) {
    const uint64_t now = rte_rdtsc();
    const uint16_t n = ifc.poll_rx_st(rx, net::Interface::kBurst, now);
    for (uint16_t k = 0; k < n; ++k) {
      const auto& p = rx[k].parsed;
      if (a.role == "receive") {
        bool ok = p.header.seq < a.frames && p.payload.size() == payload && p.src_ip == a.peer;
        for (uint32_t i = 0; ok && i < payload; ++i) ok = p.payload[i] == pattern(p.header.seq, i);
        if (!ok) {
          ++bad;
        } else if (!seen[p.header.seq]) {
          seen[p.header.seq] = true;
          ++distinct;
        }
        ++received;
      }
      rte_pktmbuf_free(net::mbuf_of(rx[k].buf));
    }
    // The receiver also resolves the sender, so ARP is exercised both ways.
    if (!routed) routed = ifc.resolve_st(a.peer, 47100, route, now);
    // af_packet has shallow kernel queues: pace the sender a little so the
    // test checks the stack, not the veth's drop policy.
    if (a.role == "send" && routed && now - last_send > hz / 200000) {
      const uint32_t seq = sent % a.frames;
      wire::HeaderFields h;
      h.type = wire::PacketType::kData;
      h.msg_len = payload * a.frames;
      h.offset = seq * payload;
      h.seq = seq;
      for (uint32_t i = 0; i < payload; ++i) buf[i] = pattern(seq, i);
      if (ifc.stage_data_st(route, h, buf)) ++sent;
      last_send = now;
    }
    ifc.flush_st(now);
    if (a.role == "receive" && distinct == a.frames && routed) {
      std::printf(
          "receive: all %u frames intact (%u received, %u bad), drops %lu, "
          "ARP learned %lu, requests sent %lu\n",
          distinct, received, bad, static_cast<unsigned long>(ifc.counters().total_drops()),
          static_cast<unsigned long>(ifc.counters().arp_learned),
          static_cast<unsigned long>(ifc.counters().arp_requests_sent));
      return bad == 0 ? 0 : 1;
    }
  }
  if (a.role == "send") {
    std::printf("send: %u frames sent, ARP learned %lu, replies sent %lu\n", sent,
                static_cast<unsigned long>(ifc.counters().arp_learned),
                static_cast<unsigned long>(ifc.counters().arp_replies_sent));
    return routed ? 0 : 1;
  }
  std::fprintf(stderr, "receive: timed out: %u of %u frames intact, %u bad, routed %d\n", distinct,
               a.frames, bad, routed);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  try {
    return run(parse(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "host_peer: %s\n", e.what());
    return 1;
  }
}
