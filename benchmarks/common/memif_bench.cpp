#include "memif_bench.h"

#include <rte_cycles.h>
#include <rte_ethdev.h>
#include <rte_mbuf.h>
#include <unistd.h>

#include <cstring>
#include <ctime>
#include <stdexcept>

#include "net/port.h"

namespace mercury::bench::memif {

namespace {
constexpr int kReplyTimeoutMs =
    5000;  // a run's start or stop; the receiver answers in ~1 s at most
constexpr int kReapTimeoutMs = 5000;

std::vector<std::string> peer_args(const std::string& socket, bool zero_copy) {
  std::vector<std::string> a = {socket};
  if (zero_copy) a.emplace_back(kZeroCopyPeerArg);
  return a;
}
}  // namespace

std::string memif_vdev(bool receiver, const std::string& socket, uint16_t index,
                       bool receiver_zero_copy) {
  const bool server = receiver != receiver_zero_copy;
  return pmdtest::memif_vdev({.index = index,
                              .server = server,
                              .socket = socket,
                              .mac = receiver ? kReceiverMac : kSenderMac,
                              .slot_bytes = kSlotBytes,
                              .zero_copy = receiver_zero_copy && !server});
}

std::vector<std::string> eal_extra(const MemifBenchmark& b, bool receiver,
                                   const std::string& socket, bool zero_copy) {
  std::vector<std::string> a = {receiver ? "--lcores=0@1" : "--lcores=0@0", "--no-telemetry",
                                "--log-level=pmd.net.memif:warning"};
  for (uint16_t i = 0; i < b.links; ++i) {
    a.push_back("--vdev=" + memif_vdev(receiver, socket, i, zero_copy));
  }
  if (zero_copy) a.emplace_back(kZeroCopyEalArg);
  return a;
}

bool Stall::stuck(uint16_t progress) {
  if (progress != 0) {
    since_ = 0;
    return false;
  }
  const uint64_t now = rte_rdtsc();
  if (since_ == 0) since_ = now;
  return now - since_ > rte_get_tsc_hz();
}

uint16_t send_raw_burst(net::Port& port, rte_mempool* pool, std::span<const std::byte> source,
                        size_t frame, uint16_t n, size_t& offset, Stall& stall,
                        std::string& failure) {
  rte_mbuf* burst[64];
  if (n > 64) n = 64;
  if (rte_pktmbuf_alloc_bulk(pool, burst, n) != 0) {
    failure = "the sender's mempool is empty";
    return 0;
  }
  for (uint16_t i = 0; i < n; ++i) {
    if (offset + frame > source.size()) offset = 0;
    std::memcpy(rte_pktmbuf_mtod(burst[i], void*), source.data() + offset, frame);
    offset += frame;
    burst[i]->data_len = static_cast<uint16_t>(frame);
    burst[i]->pkt_len = static_cast<uint32_t>(frame);
  }
  uint16_t done = 0;
  while (done < n) {
    const uint16_t went = port.tx_burst(0, burst + done, n - done);
    done += went;
    if (stall.stuck(went)) break;
  }
  if (done < n) {
    rte_pktmbuf_free_bulk(burst + done, n - done);
    failure = "memif took nothing for 1 s";
  }
  return done;
}

uint64_t clock_ns(int clock) {
  timespec t{};
  ::clock_gettime(clock, &t);
  return static_cast<uint64_t>(t.tv_sec) * 1'000'000'000 + static_cast<uint64_t>(t.tv_nsec);
}

void wait_link_up(net::Port& port, int timeout_ms) {
  rte_eth_link link{};
  for (int waited = 0; link.link_status != RTE_ETH_LINK_UP; waited += 10) {
    if (waited >= timeout_ms) {
      throw std::runtime_error(port.name() + ": memif link to the receiver is not up after " +
                               std::to_string(timeout_ms / 1000) + " s");
    }
    ::usleep(10'000);
    rte_eth_link_get_nowait(port.id(), &link);
  }
}

Peer::Peer(const MemifBenchmark& b, const std::string& socket, bool zero_copy)
    : process_(b.peer_name, kPeerFlag, peer_args(socket, zero_copy)) {}

void Peer::go() {
  Command c;
  c.kind = Command::Kind::kGo;
  if (!process_.control().send(c)) throw std::runtime_error("the receiver process is gone");
}

void Peer::wait_ready(int timeout_ms) {
  Report ready;
  const int got = process_.control().receive(ready, timeout_ms);
  if (got == 1) return;
  throw std::runtime_error(got == 0 ? "the receiver process is not ready after " +
                                          std::to_string(timeout_ms / 1000) + " s"
                                    : "the receiver process failed to start (see its message)");
}

bool Peer::start(Variant v, uint32_t frame, Report& ack, std::string& error) {
  Command c;
  c.kind = Command::Kind::kStart;
  c.variant = v;
  c.frame = frame;
  if (process_.control().send(c) && process_.control().receive(ack, kReplyTimeoutMs) == 1) {
    return true;
  }
  error = "the receiver process did not answer start";
  return false;
}

bool Peer::stop(uint64_t sent, Report& out, std::string& error) {
  Command c;
  c.kind = Command::Kind::kStop;
  c.sent = sent;
  if (process_.control().send(c) && process_.control().receive(out, kReplyTimeoutMs) == 1) {
    return true;
  }
  error = "the receiver process did not answer stop";
  return false;
}

int Peer::quit() {
  Command c;
  c.kind = Command::Kind::kQuit;
  process_.control().send(c);
  return process_.reap(kReapTimeoutMs);  // a receiver that missed kQuit sees the socket close
}

}  // namespace mercury::bench::memif
