// The transport endpoint between two processes over net_memif, with the link
// emulator on both sides (1 % loss, 5 % reordering, 2 % duplication).
//
// The test process (memif client, CPU 0) starts itself again as the peer
// process (memif server, CPU 1) before EAL starts, because a process must not
// fork once EAL runs (pmdtest::PeerProcess). Both generate the same pattern and message plans from
// fixed seeds, so each checks every byte it receives without a side channel:
// the parent sends 96 MiB of mixed messages and the peer 16 MiB back; each
// checks its destination buffers and counts completions. The peer leaves
// when it has received everything and its own messages are acknowledged,
// after answering for a while longer (the parent may still need ACKs), with
// exit status 0 only if every byte it received was right. The parent waits
// for that status.
//
// Leaving is a handshake on the control socket (kLeaving, then kStopped),
// because DPDK 22.11's memif unmaps a link's rings from its interrupt thread
// when the other end closes, without waiting for a core that is inside
// rx_burst or tx_burst on that port: the parent must have stopped polling
// before the peer closes its port (docs/net.md, "Ports").
#include <gtest/gtest.h>
#include <rte_cycles.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "eal_args.h"
#include "endpoint_config.h"
#include "messages.h"
#include "net/eal.h"
#include "net/interface.h"
#include "net/link_emulator.h"
#include "net/mempool.h"
#include "net/port.h"
#include "peer_process.h"
#include "pmd_env.h"

namespace mercury::transport {
namespace {

using pmdtest::CheckingReceiver;
using pmdtest::CompletionLog;
using pmdtest::PlannedMessage;

constexpr uint64_t kMiB = 1ull << 20;
constexpr size_t kPatternBytes = 72 * kMiB;
constexpr uint32_t kClientIp = 0x0a007101;  // 10.0.113.1
constexpr uint32_t kServerIp = 0x0a007102;  // 10.0.113.2
const net::MacAddr kClientMac{{0x02, 0, 0, 0, 0x71, 0x01}};
const net::MacAddr kServerMac{{0x02, 0, 0, 0, 0x71, 0x02}};

constexpr const char* kPeerFlag = "--memif-peer";
// Control messages: the peer's socket listens; the peer is about to close its
// port; the parent no longer polls its own.
constexpr char kListening = 1;
constexpr char kLeaving = 2;
constexpr char kStopped = 3;

std::string g_socket;  // abstract memif socket name, unique per test process
std::unique_ptr<pmdtest::PeerProcess> g_peer;  // the test process: null if it did not get ready
pmdtest::ControlChannel* g_ready = nullptr;    // the peer process: told once its socket listens

std::string vdev(bool server) {
  return "--vdev=" +
         pmdtest::memif_vdev(
             {.server = server, .socket = g_socket, .mac = server ? kServerMac : kClientMac});
}

std::vector<std::vector<PlannedMessage>> plans() {
  return {pmdtest::plan_messages(96 * kMiB, 64 << 20, kPatternBytes, 501),
          pmdtest::plan_messages(16 * kMiB, 4 << 20, kPatternBytes, 502)};
}

net::LinkParams impair(uint64_t seed) {
  net::LinkParams p;
  p.loss = 0.01;
  p.reorder = 0.05;
  p.duplicate = 0.02;
  p.seed = seed;
  return p;
}

// One side: its port, Interface, emulator and Endpoint, sending plan `mine`
// and checking plan `theirs`.
struct Side {
  net::Mempool pool;
  net::Mempool copies;
  net::Port port;
  net::Interface iface;
  net::LinkEmulator emulator;
  std::vector<std::vector<PlannedMessage>> all = plans();
  CheckingReceiver rx;
  Endpoint ep;
  CompletionLog log;
  uint32_t mine, theirs;

  Side(bool server, const std::vector<std::byte>& pattern)
      : pool(server ? "ms_pool" : "mc_pool", 8191, 256, net::frame_bytes_for_mtu(1500)),
        copies(server ? "ms_copy" : "mc_copy", 1023, 32, net::frame_bytes_for_mtu(1500)),
        port(net::Port::open("net_memif0", pool, net::PortOptions{.mtu = 1500})),
        iface(
            port, pool,
            net::LocalAddr{server ? kServerMac : kClientMac, server ? kServerIp : kClientIp, 47100},
            {}),
        emulator(port.id(), 0, impair(server ? 71 : 72), copies.get(), rte_get_tsc_hz()),
        rx(pattern, all),
        ep(iface,
           pmdtest::endpoint_config(
               server ? 9 : 4, server ? 1 : 0,
               {{server ? "client" : "server", server ? kClientIp : kServerIp, 47100, 0}},
               {.peer_timeout_ms = 10'000}),
           rx, rte_rdtsc()),
        log(all[server ? 1 : 0].size()),
        mine(server ? 1 : 0),
        theirs(server ? 0 : 1) {
    iface.attach_emulator(&emulator);
    pmdtest::submit_plan(ep, 0, mine, all[mine], pattern, log);
    if (server && g_ready != nullptr) {
      // The server's socket listens now: the client may start (a client
      // that connects before that does not always retry in time).
      if (!g_ready->send(kListening))
        std::fprintf(stderr, "memif peer: the test process is gone\n");
      g_ready = nullptr;
    }
  }
  ~Side() { iface.attach_emulator(nullptr); }
  bool done() const { return log.total_ok() == all[mine].size() && rx.all_exactly_once(theirs); }
};

// The peer process: returns its exit status.
int peer_main(int control_fd, const std::string& socket) {
  g_socket = socket;
  pmdtest::ControlChannel ready(control_fd);
  g_ready = &ready;
  try {
    net::Eal eal(pmdtest::eal_args("memif_peer", {"--lcores=0@1", vdev(true)}));
    const std::vector<std::byte> pattern = pmdtest::random_pattern(kPatternBytes, 43);
    Side s(true, pattern);
    const uint64_t hz = rte_get_tsc_hz();
    const uint64_t deadline = rte_rdtsc() + 60 * hz;
    uint64_t linger_until = 0;
    for (;;) {
      const uint64_t now = rte_rdtsc();
      s.ep.poll_st(now);
      if (linger_until == 0 && s.done()) linger_until = now + 2 * hz;
      if ((linger_until != 0 && now > linger_until) || now > deadline) break;
    }
    // Close the port only once the parent has stopped polling its end.
    char stopped = 0;
    if (!ready.send(kLeaving) || ready.receive(stopped, 10'000) != 1 || stopped != kStopped) {
      std::fprintf(stderr, "memif peer: the test process did not confirm it stopped polling\n");
    }
    const bool ok = s.done() && s.rx.corrupt() == 0 && s.rx.unexpected() == 0 &&
                    s.rx.bytes_ok() == 96 * kMiB && s.log.each_once() && s.log.first_error.empty();
    std::fprintf(stderr,
                 "memif peer: received %llu bytes right, %llu corrupt, sent %llu/%zu ok, %s\n",
                 (unsigned long long)s.rx.bytes_ok(), (unsigned long long)s.rx.corrupt(),
                 (unsigned long long)s.log.total_ok(), s.all[1].size(), ok ? "ok" : "FAILED");
    return ok ? 0 : 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "memif peer: %s\n", e.what());
    return 3;
  }
}

TEST(EndpointMemif, TwoProcessesLoss1PercentReorderDuplicate) {
  ASSERT_NE(g_peer, nullptr) << "the peer process did not start";
  const std::vector<std::byte> pattern = pmdtest::random_pattern(kPatternBytes, 43);
  Side s(false, pattern);
  const uint64_t hz = rte_get_tsc_hz();
  const uint64_t t0 = rte_rdtsc();
  const uint64_t deadline = t0 + 60 * hz;
  int status = -1;
  bool exited = false;
  double done_s = 0;
  // Poll until done, then keep answering until the peer says it leaves.
  bool leaving = false;
  while (!exited && !leaving) {
    const uint64_t now = rte_rdtsc();
    s.ep.poll_st(now);
    if (done_s == 0 && s.done()) done_s = double(now - t0) / hz;
    if ((s.ep.counters_st().passes & 1023) == 0) {
      char m = 0;
      leaving = g_peer->control().receive(m, 0) == 1 && m == kLeaving;
      if (!leaving) exited = g_peer->exited(status);
    }
    if (now > deadline) break;
  }
  if (leaving) {
    // No more bursts on this port: the peer may close its end now.
    EXPECT_TRUE(g_peer->control().send(kStopped));
    status = g_peer->reap(10'000);
    exited = true;
  } else if (!exited) {
    g_peer->reap(0);  // killed
  }
  g_peer.reset();
  const EndpointPeerStats st = s.ep.peer_stats_st(0);
  std::printf(
      "[ memif ] 96 MiB out, 16 MiB back, done in %.2f s; sent %llu packets, resent %llu, "
      "lost on the emulator %llu, duplicated %llu, reordered %llu\n",
      done_s, (unsigned long long)st.transport.tx.packets_sent,
      (unsigned long long)s.ep.counters_st().tx_retransmits,
      (unsigned long long)s.emulator.counters().lost,
      (unsigned long long)s.emulator.counters().duplicated,
      (unsigned long long)s.emulator.counters().reordered);
  EXPECT_TRUE(exited) << "the peer process did not finish";
  EXPECT_EQ(status, 0) << "the peer process reported failure";
  EXPECT_GT(done_s, 0.0);
  EXPECT_TRUE(s.log.each_once());
  EXPECT_EQ(s.log.first_error, "");
  EXPECT_EQ(s.rx.corrupt(), 0u);
  EXPECT_EQ(s.rx.unexpected(), 0u);
  EXPECT_EQ(s.rx.bytes_ok(), 16 * kMiB);
  EXPECT_TRUE(s.rx.all_exactly_once(1));
  EXPECT_GT(s.emulator.counters().lost, 0u);
  EXPECT_GT(s.ep.counters_st().tx_retransmits, 0u);
}

}  // namespace
}  // namespace mercury::transport

int main(int argc, char** argv) {
  using namespace mercury::transport;
  if (const int fd = mercury::pmdtest::peer_control_fd(argc, argv, kPeerFlag); fd >= 0) {
    return argc == 4 ? peer_main(fd, argv[3]) : 2;
  }
  // Before EAL: start the peer process (this binary again, as the server)
  // and wait (at most 30 s) until its memif server listens.
  g_socket = mercury::pmdtest::memif_socket("memif-test");
  g_peer = std::make_unique<mercury::pmdtest::PeerProcess>("memif_peer", kPeerFlag,
                                                           std::vector<std::string>{g_socket});
  char ready = 0;
  if (g_peer->control().receive(ready, 30'000) != 1) {
    std::fprintf(stderr, "memif test: the peer process did not get ready\n");
    g_peer->reap(0);  // killed; the test then fails, saying so
    g_peer.reset();
  }
  const int rc = mercury::pmdtest::run_all_tests(argc, argv, {"--lcores=0@0", vdev(false)});
  if (g_peer) g_peer->reap(0);  // the test did not run: no peer outlives the binary
  return rc;
}
