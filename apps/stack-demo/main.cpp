// stack-demo: Mercury's own Ethernet/IPv4/UDP stack moving traffic between
// two endpoints of a job over a net_ring link, one lcore each, printing the
// rate every second. It is the demo until the parameter server lands; it
// shows the datapath (ARP, framing, checksums, the link emulator when the job
// has one) on any machine, without hugepages or NICs.
//
//   stack-demo [--config FILE] [--seconds N] [--check]
#include <rte_cycles.h>
#include <rte_launch.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_pause.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "../common/args.h"
#include "../common/main.h"
#include "config/config.h"
#include "net/eal.h"
#include "net/net_telemetry.h"
#include "net/node.h"
#include "node/loop.h"

namespace {

using namespace mercury;

using apps::g_stop;

struct Options {
  std::string config = "config/ring-demo.yaml";
  double seconds = 5;
  bool check = false;
};

Options parse(int argc, char** argv) {
  Options o;
  apps::Args args("stack-demo", "[--config FILE] [--seconds N] [--check]");
  args.text("--config", "FILE", &o.config,
            "job file (default config/ring-demo.yaml); the first worker and the\n"
            "                     node at the other end of its first ring link are run");
  args.positive("--seconds", "N", &o.seconds, "how long to send (default 5)");
  args.flag("--check", &o.check, "validate the job file and exit");
  args.parse(argc, argv);
  return o;
}

// Per-side counters, written by one lcore, read by the main lcore's report.
struct alignas(64) SideStats {
  std::atomic<uint64_t> packets{0};
  std::atomic<uint64_t> payload_bytes{0};
  std::atomic<uint64_t> out_of_order{0};
};

struct Sender {
  net::Interface* ifc;
  uint32_t dst_ip;
  uint16_t dst_port;
  uint32_t payload;
  SideStats stats;
  std::atomic<bool> done{false};
};

// The sender: a poller of its lcore's loop. Each pass drains what arrives
// (ARP), resolves the route once, fills the TX stage with data frames and
// flushes; its slow work reads the PMD's drops and the pool gauge for
// telemetry every 100 ms.
class SenderPoller final : public node::Poller {
 public:
  explicit SenderPoller(Sender& s) : s_(s), buffer_(64 << 20) {
    for (size_t i = 0; i < buffer_.size(); ++i) buffer_[i] = std::byte(i * 13 + 7);
    h_.type = wire::PacketType::kData;
    h_.dtype = wire::Dtype::kFloat32;
    h_.msg_len = static_cast<uint32_t>(buffer_.size());
  }
  uint32_t poll_st(node::Tick now) override {
    const uint16_t n = s_.ifc->poll_rx_st(rx_, net::Interface::kBurst, now);
    for (uint16_t i = 0; i < n; ++i) rte_pktmbuf_free(net::mbuf_of(rx_[i].buf));
    if (!routed_) routed_ = s_.ifc->resolve_st(s_.dst_ip, s_.dst_port, route_, now);
    uint32_t sent = 0;
    while (routed_ && s_.ifc->tx_room() > 0) {
      if (offset_ + s_.payload > h_.msg_len) offset_ = 0;
      h_.offset = offset_;
      if (!s_.ifc->stage_data_st(route_, h_, {buffer_.data() + offset_, s_.payload})) break;
      ++h_.seq;
      offset_ += s_.payload;
      ++sent;
    }
    s_.ifc->flush_st(now);
    // Staged frames the PMD refused stay staged; count what left.
    s_.stats.packets.store(s_.ifc->counters().tx_frames, std::memory_order_relaxed);
    s_.stats.payload_bytes.store(s_.ifc->counters().tx_frames * s_.payload,
                                 std::memory_order_relaxed);
    return sent + n;
  }
  [[nodiscard]] node::Tick slow_period() const override { return rte_get_tsc_hz() / 10; }
  void slow_st(node::Tick) override { s_.ifc->refresh_port_stats_st(); }

 private:
  Sender& s_;
  std::vector<std::byte> buffer_;
  wire::HeaderFields h_;
  net::Route route_;
  net::RxPacket rx_[net::Interface::kBurst];
  uint32_t offset_ = 0;
  bool routed_ = false;
};

int sender_main(void* arg) {
  auto& s = *static_cast<Sender*>(arg);
  SenderPoller poller(s);
  node::Loop loop({.idle = {.mode = config::Poll::kBusy}, .tick_hz = rte_get_tsc_hz()});
  loop.add(poller);
  loop.run(g_stop);
  s.done = true;
  return 0;
}

// The receiver: what arrives, checked for gaps in the sequence.
class ReceiverPoller final : public node::Poller {
 public:
  explicit ReceiverPoller(net::Interface& ifc) : ifc_(ifc) {}
  uint32_t poll_st(node::Tick now) override {
    const uint16_t n = ifc_.poll_rx_st(rx_, net::Interface::kBurst, now);
    for (uint16_t i = 0; i < n; ++i) {
      const auto& p = rx_[i].parsed;
      if (p.header.seq != expect_seq_) ++gaps;
      expect_seq_ = p.header.seq + 1;
      bytes += p.payload.size();
      rte_pktmbuf_free(net::mbuf_of(rx_[i].buf));
    }
    received += n;
    ifc_.flush_st(now);
    return n;
  }
  uint64_t received = 0, bytes = 0, gaps = 0;

 private:
  net::Interface& ifc_;
  net::RxPacket rx_[net::Interface::kBurst];
  uint32_t expect_seq_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  return mercury::apps::guarded_main("stack-demo", [&] {
    Options o = parse(argc, argv);
    config::JobConfig job = config::load_file(o.config);
    if (o.check) {
      std::printf("%s: ok (job %s, %zu nodes)\n", o.config.c_str(), job.name.c_str(),
                  job.nodes.size());
      return 0;
    }
    const auto workers = job.workers();
    const config::NodeConfig& worker = *workers.front();
    const config::PortSpec& link = worker.ports.front();
    if (link.kind != config::PortSpec::kRing) {
      throw std::runtime_error(job.source + ": stack-demo needs the first worker's first port " +
                               "to be a ring: link");
    }
    const config::NodeConfig& peer = job.node(link.ring_peer);
    std::string notice;
    config::EalRunOptions eo;
    // Every node of the job runs in this process (ring links cannot cross
    // processes); only the first worker and its peer move traffic.
    std::vector<std::string> names = {peer.name};
    for (const auto& n : job.nodes) {
      if (n.name != peer.name) names.push_back(n.name);
    }
    eo.hugepages =
        config::resolve_hugepages(job.eal, net::hugepage_need_bytes(job, names), &notice);
    if (!notice.empty()) std::printf("%s\n", notice.c_str());
    eo.extra = {"--log-level=lib.eal:warning"};
    net::Eal eal(config::eal_args(job, names, eo));
    apps::stop_on_signals();

    net::NodeNetworks nets(job, names);
    net::NodePort* rx_port = nullptr;
    for (auto* p : nets.ports_of(peer.name)) {
      if (p->spec == link.text) rx_port = p;
    }
    net::Interface& rx_ifc = *rx_port->interface;
    Sender sender{nets.ports_of(worker.name).front()->interface.get(), peer.ipv4.value,
                  peer.udp_port, job.payload_bytes_per_packet()};
    std::printf("%s: %s\n", worker.name.c_str(),
                nets.ports_of(worker.name).front()->port->describe().c_str());
    std::printf("%s: %s\n", peer.name.c_str(), rx_port->port->describe().c_str());
    if (job.link.enabled()) std::printf("link emulator on: %s\n", job.source.c_str());
    // Counters over rte_telemetry: dpdk-telemetry.py -f <file prefix>, /mercury/stats.
    telemetry::Registry registry;
    net::add_telemetry(registry, worker.name + "_tx", *sender.ifc);
    net::add_telemetry(registry, peer.name + "_rx", rx_ifc);
    registry.expose();
    if (rte_eal_remote_launch(sender_main, &sender, worker.net_lcore()) != 0) {
      throw std::runtime_error("cannot launch the sender on lcore " +
                               std::to_string(worker.net_lcore()));
    }
    std::printf("%s -> %s over %s, %u payload bytes per packet, %.0f s\n", worker.name.c_str(),
                peer.name.c_str(), link.text.c_str(), sender.payload, o.seconds);

    const uint64_t hz = rte_get_tsc_hz();
    const uint64_t start = rte_rdtsc();
    ReceiverPoller receiver(rx_ifc);
    node::Loop loop({.idle = {.mode = config::Poll::kBusy}, .tick_hz = hz});
    loop.add(receiver);
    uint64_t last_rx = 0, last_tx = 0, next_report = start + hz;
    int second = 0;
    // Each second: the PMD's drops and the pool gauge for telemetry, and the line.
    loop.every(hz / 100, [&](node::Tick now) {
      if (now < next_report) return;
      next_report += hz;
      ++second;
      rx_ifc.refresh_port_stats_st();
      const uint64_t tx = sender.stats.packets.load(std::memory_order_relaxed);
      std::printf(
          "t=%2ds  sent %6.2f Mpps  received %6.2f Mpps  %7.2f Gbit/s payload  "
          "drops %lu\n",
          second, static_cast<double>(tx - last_tx) / 1e6,
          static_cast<double>(receiver.received - last_rx) / 1e6,
          static_cast<double>((receiver.received - last_rx) * sender.payload) * 8 / 1e9,
          static_cast<unsigned long>(rx_ifc.counters().total_drops()));
      std::fflush(stdout);
      last_tx = tx;
      last_rx = receiver.received;
      if (now - start >= static_cast<uint64_t>(o.seconds * static_cast<double>(hz))) {
        g_stop = true;
      }
    });
    loop.run(g_stop);
    rte_eal_wait_lcore(worker.net_lcore());
    // Drain what is still on the link: 1000 passes in a row that find nothing.
    for (int idle = 0; idle < 1000;) idle = loop.pass_st(rte_rdtsc()) == 0 ? idle + 1 : 0;
    const uint64_t received = receiver.received, bytes = receiver.bytes, gaps = receiver.gaps;
    const uint64_t sent = sender.ifc->counters().tx_frames;
    const double secs = static_cast<double>(rte_rdtsc() - start) / static_cast<double>(hz);
    std::printf(
        "done: sent %lu, received %lu, lost %lu, out of order %lu, drops %lu; "
        "%.2f Gbit/s payload on average\n",
        static_cast<unsigned long>(sent), static_cast<unsigned long>(received),
        static_cast<unsigned long>(sent - received), static_cast<unsigned long>(gaps),
        static_cast<unsigned long>(rx_ifc.counters().total_drops()),
        static_cast<double>(bytes) * 8 / 1e9 / secs);
    const bool lossless = !job.link.enabled();
    return lossless && (sent != received || gaps != 0) ? 1 : 0;
  });
}
