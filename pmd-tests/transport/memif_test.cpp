// The transport endpoint between two processes over net_memif, with the link
// emulator on both sides (1 % loss, 5 % reordering, 2 % duplication).
//
// The test process (memif client, CPU 0) forks and execs itself as the peer
// process (memif server, CPU 1) before EAL starts, because a process must not
// fork once EAL runs. Both generate the same pattern and message plans from
// fixed seeds, so each checks every byte it receives without a side channel:
// the parent sends 96 MiB of mixed messages and the peer 16 MiB back; each
// checks its destination buffers and counts completions. The peer leaves
// when it has received everything and its own messages are acknowledged,
// after answering for a while longer (the parent may still need ACKs), with
// exit status 0 only if every byte it received was right. The parent waits
// for that status.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <rte_cycles.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "fixture.h"
#include "net/eal.h"
#include "pmd_env.h"

namespace mercury::transport {
namespace {

using testing::CheckingReceiver;
using testing::CompletionLog;
using testing::PlannedMessage;

constexpr uint64_t kMiB = 1ull << 20;
constexpr size_t kPatternBytes = 72 * kMiB;
constexpr uint32_t kClientIp = 0x0a007101;  // 10.0.113.1
constexpr uint32_t kServerIp = 0x0a007102;  // 10.0.113.2
const net::MacAddr kClientMac{{0x02, 0, 0, 0, 0x71, 0x01}};
const net::MacAddr kServerMac{{0x02, 0, 0, 0, 0x71, 0x02}};

std::string g_socket;  // abstract memif socket name, unique per test process
pid_t g_peer = -1;

std::string vdev(bool server) {
  return "--vdev=net_memif0,role=" + std::string(server ? "server" : "client") +
         ",id=0,socket=" + g_socket + ",mac=" + (server ? kServerMac : kClientMac).to_string();
}

std::vector<std::vector<PlannedMessage>> plans() {
  return {testing::plan_messages(96 * kMiB, 64 << 20, kPatternBytes, 501),
          testing::plan_messages(16 * kMiB, 4 << 20, kPatternBytes, 502)};
}

EndpointConfig config(uint16_t epoch, uint16_t id, PeerSpec peer) {
  EndpointConfig c;
  c.transport.tsc_hz = rte_get_tsc_hz();
  c.transport.window_packets = 128;
  c.transport.peer_timeout_us = 10'000'000;
  c.local_epoch = epoch;
  c.sender_id = id;
  c.peers = {std::move(peer)};
  return c;
}

net::LinkParams impair(uint64_t seed) {
  net::LinkParams p;
  p.loss = 0.01;
  p.reorder = 0.05;
  p.duplicate = 0.02;
  p.seed = seed;
  return p;
}

int g_ready_fd = -1;  // the peer process: written once its memif socket listens

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
           config(server ? 9 : 4, server ? 1 : 0,
                  {server ? "client" : "server", server ? kClientIp : kServerIp, 47100, 0}),
           rx, rte_rdtsc()),
        log(all[server ? 1 : 0].size()),
        mine(server ? 1 : 0),
        theirs(server ? 0 : 1) {
    iface.attach_emulator(&emulator);
    testing::submit_plan(ep, 0, mine, all[mine], pattern, log);
    if (server && g_ready_fd >= 0) {
      // The server's socket listens now: the client may start (a client
      // that connects before that does not always retry in time).
      const char ready = 1;
      if (::write(g_ready_fd, &ready, 1) != 1) std::perror("memif peer: ready");
      ::close(g_ready_fd);
      g_ready_fd = -1;
    }
  }
  ~Side() { iface.attach_emulator(nullptr); }
  bool done() const { return log.total_ok() == all[mine].size() && rx.all_exactly_once(theirs); }
};

// The peer process: returns its exit status.
int peer_main(const std::string& socket, int ready_fd) {
  g_socket = socket;
  g_ready_fd = ready_fd;
  try {
    net::Eal eal({"memif_peer", "--no-huge", "-m", "512", "--no-pci", "--no-shconf",
                  "--log-level=lib.eal:warning", "--lcores=0@1",
                  "--file-prefix=mt-memif-peer-" + std::to_string(getpid()), vdev(true)});
    const std::vector<std::byte> pattern = testing::random_pattern(kPatternBytes, 43);
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
  ASSERT_GT(g_peer, 0) << "the peer process did not start";
  const std::vector<std::byte> pattern = testing::random_pattern(kPatternBytes, 43);
  Side s(false, pattern);
  const uint64_t hz = rte_get_tsc_hz();
  const uint64_t t0 = rte_rdtsc();
  const uint64_t deadline = t0 + 60 * hz;
  int status = -1;
  bool exited = false;
  double done_s = 0;
  // Poll until done, then keep answering until the peer has left.
  while (!exited) {
    const uint64_t now = rte_rdtsc();
    s.ep.poll_st(now);
    if (done_s == 0 && s.done()) done_s = double(now - t0) / hz;
    if ((s.ep.counters_st().passes & 1023) == 0) {
      exited = ::waitpid(g_peer, &status, WNOHANG) == g_peer;
    }
    if (now > deadline) break;
  }
  if (!exited) {
    ::kill(g_peer, SIGKILL);
    ::waitpid(g_peer, &status, 0);
  }
  g_peer = -1;
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
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "the peer process reported failure (status " << status << ")";
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
  if (argc >= 4 && std::strcmp(argv[1], "--memif-peer") == 0) {
    return peer_main(argv[2], std::atoi(argv[3]));
  }
  // Before EAL: start the peer process (this binary again, as the server).
  g_socket = "mt-memif-" + std::to_string(getpid());
  std::string self = "/proc/self/exe";
  int ready[2];
  if (::pipe2(ready, O_CLOEXEC) != 0) {
    std::perror("pipe");
    return 1;
  }
  std::vector<std::string> args = {"memif_peer", "--memif-peer", g_socket,
                                   std::to_string(ready[1])};
  std::vector<char*> cargs;
  for (auto& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  const pid_t parent = getpid();
  g_peer = fork();
  if (g_peer == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the test
    if (getppid() != parent) _exit(1);
    ::fcntl(ready[1], F_SETFD, 0);  // the write end survives exec
    execv(self.c_str(), cargs.data());
    _exit(127);
  }
  ::close(ready[1]);
  // Wait (at most 30 s) until the peer's memif server listens.
  pollfd pfd{ready[0], POLLIN, 0};
  char byte = 0;
  if (g_peer < 0 || ::poll(&pfd, 1, 30'000) != 1 || ::read(ready[0], &byte, 1) != 1) {
    std::fprintf(stderr, "memif test: the peer process did not get ready\n");
    if (g_peer > 0) kill(g_peer, SIGKILL);
    g_peer = -1;  // the test then fails, saying so
  }
  ::close(ready[0]);
  const int rc = mercury::pmdtest::run_all_tests(argc, argv, {"--lcores=0@0", vdev(false)});
  if (g_peer > 0) {
    kill(g_peer, SIGKILL);
    waitpid(g_peer, nullptr, 0);
  }
  return rc;
}
