// What one server core can carry: one ServerNode (its shard inline, one
// core) driven by N in-memory workers, against the memory-bandwidth limit of
// the same core measured in the same run.
//
//   server/limit/<N>  the limit kernel (bench::limit_sum, agg_bench's): the
//                     N workers' gradient buffers (ResNet-50, 102 MB each, on
//                     2 MB pages) summed into one more, timed with the TSC.
//   server/sum/<N>    one BSP round: N of the library's workers
//   server/sgd/<N>    (worker::PolledWorker) push_pull every tensor of
//                     ResNet-50; the server (optimizer sum or sgd) aggregates
//                     each 8896-byte chunk (MTU 9000) and sends it back to
//                     every worker. N = 4, 8, 16.
//
// Only the server's time counts. The workers' loop holds, after the N
// workers' net cores, one more poller that runs a pass of the server's own
// loop and reads the TSC around it, so the two alternate on one thread and
// the round's server time is the sum of those passes (the passes that did
// work; idle passes, where a dedicated server would wait for the wire, are
// reported apart as `idle`). The ports cost what a NIC costs the server
// (net::MemoryPort, "Who pays for what"): no UDP checksums (offloaded); the
// server's ports send by reference, so each update's copy into a frame is
// made by the worker's port as it takes the frame (a NIC's TX DMA); a
// gradient is copied into its frame by the worker's port as it stages it
// (the worker's CPU: the sender's NIC and the server's RX DMA), and the
// server reads it from there in the reduction. So the server's CPU makes no
// copy of a payload: it does the stack, the transport, the reduction with
// the optimizer, and the fan-out's headers.
//
// Counters: `Gbps`, worker traffic through the server in + out (gradient
// payload in, update payload out: 2 x N x 102.2 MB a round) per second of
// server time on the CPU; for the limit, the in + out traffic a server
// reading gradient at the kernel's rate would carry (2 x the bytes it
// reads, since every byte in brings one byte out under BSP), so the ratio
// is the share of the memory bandwidth the server turns into aggregation.
// Time on the CPU: the TSC time of the passes times the share of the
// round's (or the limit pass's) wall time the thread was on a CPU (thread
// CPU time over wall time; reading the thread's CPU clock costs about 1 us
// here, too much for every pass), so descheduling on this shared machine
// counts on neither side; `cpu_share` is that share over the run,
// `wall_Gbps` the figure per TSC second. `read_GBps` (the
// limit): gradient read per second. `ns_per_packet`: server time per data
// packet in or out (`packets` of them in the run). `idle`: idle passes'
// time over busy time.
// `resent`, `refused`: retransmissions and flow-control refusals (0 in a
// healthy run). Every round checks its counters (every chunk updated once)
// and a sample of every worker's parameters against the rank-order reference;
// a failure ends the run with an error, not a figure.
//
// The job: a job file built here (one server, 1 shard, a port per worker,
// `poll: busy`, `window: 64`, about the bandwidth-delay product of a
// 100 Gbit/s link with a 50 us RTT), read by the loader and turned into the
// server's and workers' configurations by server::node_config() and
// worker::net_core_config(), as ps-server and the worker library do. The
// workers share one parameter buffer (their writes are not the server's
// cost, and N copies of it would only push more of the server's memory out
// of the caches than N remote hosts would); each pushes its own gradient
// buffer, so the server's contributions come from N distinct 102 MB
// sources, the limit's.
//
// Run (figures in benchmarks/server/README.md):
//   build/benchmarks/server/server_bench --benchmark_repetitions=5
//       --benchmark_enable_random_interleaving=true
#include <benchmark/benchmark.h>
#include <x86intrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "agg/placement.h"
#include "config/config.h"
#include "memory_limit.h"
#include "net/memory_port.h"
#include "node/loop.h"
#include "ratio_reporter.h"
#include "server/node_config.h"
#include "server/server_node.h"
#include "worker/attach.h"

namespace mercury {
namespace {

constexpr uint32_t kMtu = 9000;
constexpr uint32_t kMaxWorkers = 16;
constexpr uint32_t kPortBuffers = 1024;
constexpr float kLr = 0.01f;

// TSC ticks per second, against the steady clock over 100 ms.
uint64_t tsc_hz() {
  static const uint64_t hz = [] {
    const auto t0 = std::chrono::steady_clock::now();
    const uint64_t c0 = __rdtsc();
    while (std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(100)) {
    }
    const uint64_t c1 = __rdtsc();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return static_cast<uint64_t>(static_cast<double>(c1 - c0) / s);
  }();
  return hz;
}

// ResNet-50's tensors, laid out one after the other in a buffer, each from a
// 64-byte boundary (as a trainer's tensors are).
struct Model {
  std::vector<agg::TensorDecl> decls;
  std::vector<uint64_t> at;  // first float of each tensor
  uint64_t floats = 0;       // the buffer, padding included
  uint64_t bytes = 0;        // the tensors' bytes: what a round pushes per worker

  static Model resnet50() {
    std::ifstream in(std::string(MERCURY_MODELS_DIR) + "/resnet50.txt");
    if (!in) throw std::runtime_error("cannot read resnet50.txt");
    std::stringstream file;
    file << in.rdbuf();
    Model m;
    m.decls = agg::parse_model_shapes(file.str());
    for (const agg::TensorDecl& d : m.decls) {
      m.at.push_back(m.floats);
      m.floats += (d.elements + 15) / 16 * 16;
      m.bytes += d.elements * 4;
    }
    return m;
  }
};

// The workers' gradients, one model-sized buffer per rank, made as first
// needed and kept: worker r of every job pushes buffer r; the limit reads
// the first N.
struct Gradients {
  Model model = Model::resnet50();
  std::vector<bench::Floats> grads;
  bench::Floats sum_out = bench::huge_floats(model.floats);

  static Gradients& of(uint32_t workers) {
    static Gradients g;
    while (g.grads.size() < workers) {
      const auto r = static_cast<uint32_t>(g.grads.size());
      g.grads.push_back(bench::huge_floats(g.model.floats));
      float* p = g.grads.back().get();
      for (uint64_t i = 0; i < g.model.floats; ++i) p[i] = 1e-3f * static_cast<float>(i % 97 + r);
    }
    return g;
  }
  [[nodiscard]] std::span<const float> tensor(uint32_t rank, size_t t) const {
    return {grads[rank].get() + model.at[t], model.decls[t].elements};
  }
};

// Text of its arguments, streamed (GCC 12 warns falsely about "a" + string).
template <class... T>
std::string text(const T&... parts) {
  std::ostringstream s;
  (s << ... << parts);
  return s.str();
}

// The job file: one server (1 shard, a port per worker), n workers.
std::string job_yaml(uint32_t n, const char* optimizer) {
  std::ostringstream y;
  y << "job: {id: 41, name: server-bench}\n"
    << "network: {mtu: " << kMtu << ", window: 64, poll: busy, udp_checksum: false}\n"
    << "training: {sync: bsp, optimizer: " << optimizer
    << (std::string(optimizer) == "sgd" ? text(", learning_rate: ", kLr) : "") << "}\n"
    << "nodes:\n"
    << "  - {name: server0, role: server, ipv4: 10.0.0.1, mac: '02:00:00:00:00:01', shards: 1,"
    << " lcores: [0, " << kMaxWorkers + 1 << "], ports: [";
  for (uint32_t r = 0; r < n; ++r) y << (r != 0 ? ", " : "") << "'ring:w" << r << "'";
  y << "]}\n";
  for (uint32_t r = 0; r < n; ++r) {
    char mac[32];
    std::snprintf(mac, sizeof mac, "02:00:00:00:01:%02x", r);
    y << "  - {name: w" << r << ", role: worker, ipv4: 10.0.1." << r + 1 << ", mac: '" << mac
      << "', lcores: [" << r + 1 << "], ports: ['ring:w" << r << "']}\n";
  }
  return y.str();
}

std::string worker_name(uint32_t r) { return text("w", r); }

net::LocalAddr address(const config::NodeConfig& node, uint16_t udp_port) {
  net::LocalAddr a;
  a.mac.bytes = node.mac->octets;
  a.ip = node.ipv4.value;
  a.udp_port = udp_port;
  return a;
}

// The share of the wall time since its construction the thread was on a
// CPU: on this shared machine a pass timed with the TSC also counts the
// time the thread was descheduled, the limit's as the server's. Within a
// round descheduling falls on the server's passes and the workers' alike,
// so the round's share scales the server's TSC time to its CPU time.
class CpuShare {
 public:
  CpuShare() : tsc_(__rdtsc()), cpu_(thread_cpu_ns()) {}
  [[nodiscard]] double share() const {
    const double wall = static_cast<double>(__rdtsc() - tsc_) / static_cast<double>(tsc_hz());
    return static_cast<double>(thread_cpu_ns() - cpu_) / 1e9 / wall;
  }

 private:
  static uint64_t thread_cpu_ns() {
    timespec t{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return static_cast<uint64_t>(t.tv_sec) * 1'000'000'000u + static_cast<uint64_t>(t.tv_nsec);
  }
  uint64_t tsc_;
  uint64_t cpu_;
};

// What a round of the server cost.
struct ServerTime {
  uint64_t busy = 0;     // TSC ticks of the passes that did work
  uint64_t idle = 0;     // ... and of those that did none
  double cpu_share = 1;  // of the round's wall time on a CPU (CpuShare)
};

// A pass of the server's own loop, timed: the workers' loop runs it after
// its workers, so the two alternate on one thread. The passes of measured
// rounds go through measured_pass(), never inlined, so a profile finds the
// server's share of them under it (perf's call chains, callgrind's
// --toggle-collect); the start and the warm-up round do not.
class ServerPass final : public node::Poller {
 public:
  explicit ServerPass(node::Loop& server) : server_(server) {}
  uint32_t poll_st(node::Tick) override {
    return measuring ? measured_pass() : server_.pass_st(__rdtsc());
  }
  bool measuring = false;
  ServerTime time;

 private:
  __attribute__((noinline)) uint32_t measured_pass() {
    const uint64_t t0 = __rdtsc();
    const uint32_t work = server_.pass_st(t0);
    const uint64_t t1 = __rdtsc();
    (work != 0 ? time.busy : time.idle) += t1 - t0;
    return work;
  }
  node::Loop& server_;
};

// One job: its ports, the server on its loop, the workers on theirs.
class Job {
 public:
  Job(uint32_t n, const char* optimizer)
      : n_(n),
        sgd_(std::string(optimizer) == "sgd"),
        g_(Gradients::of(n)),
        job_(config::load_string(job_yaml(n, optimizer), "server_bench")),
        server_loop_({.idle = {.mode = config::Poll::kBusy}, .tick_hz = tsc_hz()}),
        loop_({.idle = {.mode = config::Poll::kBusy}, .tick_hz = tsc_hz()}),
        pass_(server_loop_) {
    const config::NodeConfig& s = job_.node("server0");
    const uint16_t server_udp = s.udp_port != 0 ? s.udp_port : job_.network.udp_port;
    for (uint32_t r = 0; r < n; ++r) {
      const config::NodeConfig& w = job_.node(worker_name(r));
      server_ports_.push_back(std::make_unique<net::MemoryPort>(
          address(s, server_udp), net::MemoryPortOptions{.mtu = kMtu,
                                                         .buffers = kPortBuffers,
                                                         .udp_checksum = false,
                                                         .tx_by_reference = true}));
      worker_ports_.push_back(std::make_unique<net::MemoryPort>(
          address(w, w.udp_port != 0 ? w.udp_port : job_.network.udp_port),
          net::MemoryPortOptions{.mtu = kMtu, .buffers = kPortBuffers, .udp_checksum = false}));
      net::MemoryPort::connect(*server_ports_[r], *worker_ports_[r]);
    }
    std::vector<net::PacketPort*> ports;
    for (auto& p : server_ports_) ports.push_back(p.get());
    server::ServerNodeConfig c = server::node_config(
        job_, s,
        {.epoch = 1,
         .tsc_hz = tsc_hz(),
         .rx_pool_mbufs = uint64_t{n} * kPortBuffers,
         // One core: the shard's lcore shares the net core's CPU, so it runs inline.
         .cpu_of_lcore = [](unsigned) { return 0u; }});
    server_ =
        std::make_unique<server::ServerNode>(ports, server::job_workers(job_, s), c, __rdtsc());
    server_->attach(server_loop_);
    params_ = bench::huge_floats(g_.model.floats);
    for (uint32_t r = 0; r < n; ++r) {
      worker::NetCoreConfig wc = worker::net_core_config(job_, worker_name(r));
      wc.endpoint.transport.tsc_hz = tsc_hz();
      wc.endpoint.local_epoch = 100 + r;
      wc.start_timeout_ms = 600'000;
      workers_.push_back(std::make_unique<worker::PolledWorker>(*worker_ports_[r], wc));
      workers_.back()->attach(loop_);
      for (size_t t = 0; t < g_.model.decls.size(); ++t) {
        const agg::TensorDecl& d = g_.model.decls[t];
        workers_.back()->worker().declare(d.name, {params_.get() + g_.model.at[t], d.elements},
                                          static_cast<int>(d.priority));
      }
    }
    loop_.add(pass_);
    // Version 0: rank 0's parameters (all 0.5).
    std::fill(params_.get(), params_.get() + g_.model.floats, 0.5f);
    reference_.assign(params_.get(), params_.get() + g_.model.floats);
    std::vector<worker::Handle> hs;
    for (auto& w : workers_) hs.push_back(w->worker().start_async());
    run_until(hs, "the start");
  }

  ~Job() {
    // Each worker leaves and waits for the server's answer: the server runs
    // inside the workers' loop.
    workers_.clear();
    loop_.remove(pass_);
    server_.reset();
  }

  // One BSP round: every worker push_pulls every tensor. Returns the
  // server's time; throws with the reason when the round failed its checks.
  ServerTime round(bool measured = true) {
    const server::ServerCounters before = server_->counters_st();
    pass_.time = {};
    pass_.measuring = measured;
    std::vector<worker::Handle> hs;
    for (uint32_t r = 0; r < n_; ++r) {
      for (uint32_t t = 0; t < g_.model.decls.size(); ++t) {
        const agg::TensorDecl& d = g_.model.decls[t];
        hs.push_back(workers_[r]->worker().push_pull(t, g_.tensor(r, t),
                                                     {params_.get() + g_.model.at[t], d.elements}));
      }
    }
    const CpuShare cpu;
    run_until(hs, "a round");
    pass_.time.cpu_share = cpu.share();
    pass_.measuring = false;
    const server::ServerCounters after = server_->counters_st();
    if (after.shards.updates - before.shards.updates != chunks()) {
      throw std::runtime_error(text("a round updated ",
                                    after.shards.updates - before.shards.updates, " chunks, not ",
                                    chunks()));
    }
    resent_ += after.net.tx_retransmits - before.net.tx_retransmits;
    refused_ += after.net.drop(transport::EndpointDrop::kBackpressure) -
                before.net.drop(transport::EndpointDrop::kBackpressure);
    check();
    return pass_.time;
  }

  [[nodiscard]] uint64_t chunks() const {
    const uint32_t chunk = net::payload_per_packet(kMtu);
    uint64_t c = 0;
    for (const agg::TensorDecl& d : g_.model.decls) c += (d.elements * 4 + chunk - 1) / chunk;
    return c;
  }
  [[nodiscard]] uint64_t resent() const { return resent_; }
  [[nodiscard]] uint64_t refused() const { return refused_; }

 private:
  void run_until(const std::vector<worker::Handle>& hs, const char* what) {
    const uint64_t deadline = __rdtsc() + 600 * tsc_hz();
    size_t done = 0;
    while (done < hs.size()) {
      loop_.pass_st(__rdtsc());
      while (done < hs.size() && hs[done].ready()) {
        if (!hs[done].ok()) {
          throw std::runtime_error(text(what, " failed: ", hs[done].error()));
        }
        ++done;
      }
      if (__rdtsc() > deadline) throw std::runtime_error(text(what, " timed out"));
    }
  }

  // The reference moves on (the rank-order sum, then the optimizer as the
  // kernels apply it), and a sample of elements of every tensor is compared.
  void check() {
    const float inv_n = 1.0f / static_cast<float>(n_);
    for (size_t t = 0; t < g_.model.decls.size(); ++t) {
      const uint64_t elements = g_.model.decls[t].elements;
      const uint64_t step = std::max<uint64_t>(1, elements / 7);
      for (uint64_t i = 0; i < elements; i += step) {
        const uint64_t at = g_.model.at[t] + i;
        float s = g_.grads[0][at];
        for (uint32_t r = 1; r < n_; ++r) s = s + g_.grads[r][at];
        reference_[at] = sgd_ ? reference_[at] - kLr * (s * inv_n) : s * inv_n;
        if (std::memcmp(&reference_[at], &params_[at], 4) != 0) {
          throw std::runtime_error(text("tensor ", g_.model.decls[t].name, " element ", i, ": ",
                                        params_[at], ", the reference ", reference_[at]));
        }
      }
    }
  }

  uint32_t n_;
  bool sgd_;
  Gradients& g_;
  config::JobConfig job_;
  std::vector<std::unique_ptr<net::MemoryPort>> server_ports_, worker_ports_;
  node::Loop server_loop_;
  node::Loop loop_;  // the workers', with the server's timed passes last
  ServerPass pass_;
  std::unique_ptr<server::ServerNode> server_;
  bench::Floats params_;  // every worker's parameters (one buffer, see the top)
  std::vector<float> reference_;
  std::vector<std::unique_ptr<worker::PolledWorker>> workers_;
  uint64_t resent_ = 0, refused_ = 0;
};

// Rounds (or limit passes) per run: the same bytes through the server
// whatever N.
int64_t rounds(uint32_t n) { return kMaxWorkers / n; }

void BM_Limit(benchmark::State& state) {
  const auto n = static_cast<uint32_t>(state.range(0));
  Gradients& g = Gradients::of(n);
  std::vector<const std::byte*> src;
  for (uint32_t r = 0; r < n; ++r)
    src.push_back(reinterpret_cast<const std::byte*>(g.grads[r].get()));
  const uint64_t bytes = g.model.floats * 4;
  uint64_t ticks = 0, read = 0;
  double on_cpu = 0;  // seconds
  for (auto _ : state) {
    const CpuShare cpu;
    const uint64_t t0 = __rdtsc();
    read += bench::limit_sum(src.data(), n, bytes, g.sum_out.get());
    benchmark::ClobberMemory();
    const uint64_t t = __rdtsc() - t0;
    ticks += t;
    on_cpu += static_cast<double>(t) / static_cast<double>(tsc_hz()) * cpu.share();
    state.SetIterationTime(static_cast<double>(t) / static_cast<double>(tsc_hz()));
  }
  const double wall = static_cast<double>(ticks) / static_cast<double>(tsc_hz());
  state.counters["read_GBps"] = static_cast<double>(read) / on_cpu / 1e9;
  state.counters["Gbps"] = 2 * 8 * static_cast<double>(read) / on_cpu / 1e9;
  state.counters["wall_Gbps"] = 2 * 8 * static_cast<double>(read) / wall / 1e9;
  state.counters["cpu_share"] = on_cpu / wall;
}

void BM_Server(benchmark::State& state, const char* optimizer) {
  const auto n = static_cast<uint32_t>(state.range(0));
  std::unique_ptr<Job> job;
  try {
    job = std::make_unique<Job>(n, optimizer);
    job->round(false);  // warm-up: every page touched, every path taken once
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
    return;
  }
  const uint64_t resent0 = job->resent(), refused0 = job->refused();
  ServerTime total;
  double on_cpu = 0;  // seconds of the server's busy passes
  uint64_t rounds_run = 0;
  for (auto _ : state) {
    ServerTime t;
    try {
      t = job->round();
    } catch (const std::exception& e) {
      state.SkipWithError(e.what());
      return;
    }
    total.busy += t.busy;
    total.idle += t.idle;
    on_cpu += static_cast<double>(t.busy) / static_cast<double>(tsc_hz()) * t.cpu_share;
    ++rounds_run;
    state.SetIterationTime(static_cast<double>(t.busy) / static_cast<double>(tsc_hz()));
  }
  const Gradients& g = Gradients::of(n);
  const double wall = static_cast<double>(total.busy) / static_cast<double>(tsc_hz());
  const double seconds = on_cpu;
  const double bytes =
      2.0 * n * static_cast<double>(g.model.bytes) * static_cast<double>(rounds_run);
  const double packets =
      2.0 * n * static_cast<double>(job->chunks()) * static_cast<double>(rounds_run);
  state.counters["Gbps"] = 8 * bytes / seconds / 1e9;
  state.counters["wall_Gbps"] = 8 * bytes / wall / 1e9;
  state.counters["ns_per_packet"] = seconds * 1e9 / packets;
  state.counters["packets"] = packets;
  state.counters["idle"] = static_cast<double>(total.idle) / static_cast<double>(total.busy);
  state.counters["resent"] = static_cast<double>(job->resent() - resent0);
  state.counters["refused"] = static_cast<double>(job->refused() - refused0);
  state.counters["cpu_share"] = on_cpu / wall;
}

void register_all() {
  for (const int n : {4, 8, 16}) {
    benchmark::RegisterBenchmark("server/limit", BM_Limit)
        ->Arg(n)
        ->Iterations(rounds(n))
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
    for (const char* opt : {"sum", "sgd"}) {
      benchmark::RegisterBenchmark((std::string("server/") + opt).c_str(), BM_Server, opt)
          ->Arg(n)
          ->Iterations(rounds(n))
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
}

}  // namespace
}  // namespace mercury

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  mercury::register_all();
  mercury::bench::RatioReporter reporter("Gbps", "limit");
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
