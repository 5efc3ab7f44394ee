// ps-worker: a synthetic trainer, one worker process of a job, driving the
// public worker API (mercury/worker.h) the way a real trainer would.
//
//   ps-worker --config FILE --node NAME [--model FILE] [--rounds N] [--check]
//             [--trace FILE [--compute-scale F] [--comm-rounds N]]
//             [-- EAL args...]
//
// It declares a model's tensors (config/models/*.txt: the real layer sizes),
// joins the job (rank 0's deterministic initial values become everyone's
// version 0: checked bit for bit), then runs rounds of push_pull of every
// tensor, each after a barrier of every rank, last layer first as a backward
// pass emits them, with gradients
// that depend only on (rank, round, tensor). Because any process can
// generate every rank's gradients, it computes the aggregate the servers
// must return (rank-order sum, times 1/N, then the job's optimizer) and
// checks every tensor of every round bit for bit. It prints progress and
// throughput and exits non-zero on the first mismatch or failure.
//
// With --trace it is a trace-driven trainer instead (trace_rounds.h): the
// model's measured per-layer compute times (config/traces/*.txt) around
// push_pull, each layer's forward waiting for its parameters; it prints the
// iteration time beside its lower bound, max(compute, communication).
//
// Under training.sync asp, ssp or psplus it runs only with --verify none
// (the checks replay BSP's rounds): the timing of each mode on a real model.
//
// With --compute-ms (and always when training.sync is not bsp and there is
// no --trace) it runs free-running rounds instead (free_rounds.h): compute
// stood for by a sleep, push_pull, no barrier between rounds, so that the
// synchronisation modes can be compared; the final parameters are checked
// bit for bit. Either trainer can make one rank a straggler (--straggler
// RANK,F: that rank's compute takes F times longer).
//
// With --lose RANK,ROUND,K (a job with training.on_worker_loss shrink or
// wait) the rank RANK kills itself (SIGKILL) in round ROUND once the servers
// have its gradients of the first K tensors it pushes. Under shrink the
// others check that round and every later one against the shrinking job's
// documented average (docs/membership.md): those K tensors over every rank,
// the rest and every later round over the ranks left. Under wait a new
// process of the rank (started by whoever runs the job) joins at the round
// in progress: it checks the parameters it joined with against its replay,
// and every rank checks every round against the unbroken run.
//
// With --dtype bfloat16 or float16 (or mixed: the tensors take float32,
// bfloat16 and float16 in turn) the synthetic and the free-running rounds
// declare half-precision tensors: gradients rounded into the dtype before
// they go, and the check is the servers' float32 master parameters replayed
// (every rank's rounded gradient widened, summed in rank order, the
// optimizer) and rounded once into the dtype, bit for bit.
//
// The worker library starts EAL on its own thread for this node (its lcore,
// its ports); `--check` validates the job file, the node and the model (and
// the trace) and exits without starting anything.
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "../common/args.h"
#include "../common/main.h"
#include "../common/synthetic.h"
#include "../common/trace.h"
#include "agg/placement.h"
#include "config/config.h"
#include "free_rounds.h"
#include "job/job.h"
#include "mercury/worker.h"
#include "reference.h"
#include "report.h"
#include "trace_rounds.h"

namespace {

using namespace mercury;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string config;
  std::string node;
  std::string model = "config/models/resnet50.txt";
  uint32_t rounds = 10;
  bool check = false;
  std::string verify = "every";
  bool timestamps = false;
  std::string trace;
  double compute_scale = 0;  // 0: not given (1 with --trace)
  int64_t comm_rounds = -1;  // < 0: not given (5 with --trace)
  double compute_ms = -1;    // < 0: not given
  std::string straggler;     // "RANK,F"
  std::string lose;          // "RANK,ROUND,K"
  std::string dtype = "float32";
  std::vector<std::string> eal;
};

Options parse(int argc, char** argv) {
  Options o;
  apps::Args args("ps-worker",
                  "--config FILE --node NAME [--model FILE] [--rounds N] [--check]\n"
                  "                 [--trace FILE [--compute-scale F] [--comm-rounds N]]\n"
                  "                 [--compute-ms MS] [--straggler RANK,F] [-- EAL args...]");
  args.text("--config", "FILE", &o.config,
            "the job file (every node of the job reads the same one)", apps::Args::kRequired);
  args.text("--node", "NAME", &o.node,
            "this worker's node in it (its rank is its place among the workers)",
            apps::Args::kRequired);
  args.text("--model", "FILE", &o.model,
            "tensor shapes, one per line (default config/models/resnet50.txt)");
  args.whole("--rounds", "N", &o.rounds, 1, UINT32_MAX,
             "push_pull rounds, or with --trace trace rounds (default 10)");
  args.flag("--check", &o.check,
            "validate the job file, the node and the model (and the trace), then exit");
  args.text("--verify", "WHEN", &o.verify,
            "every (default): check every round's aggregate bit for bit; last: only\n"
            "                     the last round's (optimizer sum only), whose gradients are\n"
            "                     computed once and pushed every round, so that nothing but\n"
            "                     push_pull runs between rounds (benchmarks, profiles); with\n"
            "                     --trace, only the final parameters (any optimizer); none:\n"
            "                     with --trace only, nothing after version 0 (timing runs of\n"
            "                     large models, whose reference costs minutes of CPU; the\n"
            "                     only choice with --trace when training.sync is not bsp)");
  args.flag("--timestamps", &o.timestamps,
            "end each round's line with its start and end on CLOCK_MONOTONIC (ns)");
  args.text("--trace", "FILE", &o.trace,
            "train on this compute trace (config/traces/*.txt, matching --model):\n"
            "                     each layer's forward waits for its parameters, each layer's\n"
            "                     backward pushes its gradients; prints the iteration time\n"
            "                     beside max(compute, communication)");
  args.positive("--compute-scale", "F", &o.compute_scale,
                "with --trace: multiply every compute time by F (default 1)");
  args.whole("--comm-rounds", "N", &o.comm_rounds, 0, UINT32_MAX,
             "with --trace: N burst and N streamed communication-only rounds\n"
             "                     first, measuring the communication time (default 5;\n"
             "                     0: none, the lower bound is not measured)");
  std::string compute_ms;
  args.text("--compute-ms", "MS", &compute_ms,
            "free-running rounds (the default when training.sync is not bsp): each\n"
            "                     round sleeps MS milliseconds standing for compute, then\n"
            "                     push_pulls every tensor; no barrier between rounds; the\n"
            "                     final parameters are checked bit for bit");
  args.text("--straggler", "RANK,F", &o.straggler,
            "with --compute-ms or --trace: the worker of rank RANK computes F times\n"
            "                     longer");
  args.text("--lose", "RANK,ROUND,K", &o.lose,
            "a job that shrinks (training.on_worker_loss shrink): the worker of rank\n"
            "                     RANK kills itself (SIGKILL) in round ROUND once its first\n"
            "                     K tensors were pushed; the others check the shrunk average");
  args.text("--dtype", "TYPE", &o.dtype,
            "the tensors' element type: float32 (default), bfloat16, float16, or\n"
            "                     mixed (float32, bfloat16, float16 in turn); not float32:\n"
            "                     the synthetic and free-running rounds, not --trace");
  args.rest(&o.eal, "extra EAL arguments, appended to those the job file generates");
  args.parse(argc, argv);
  if (o.verify != "every" && o.verify != "last" && o.verify != "none") {
    throw std::runtime_error("--verify wants every, last or none, not '" + o.verify + "'");
  }
  if (o.verify == "none" && o.trace.empty()) {
    throw std::runtime_error("--verify none goes with --trace (the timing runs)");
  }
  if (o.trace.empty() && (o.compute_scale != 0 || o.comm_rounds >= 0)) {
    throw std::runtime_error(
        std::string(o.compute_scale != 0 ? "--compute-scale" : "--comm-rounds") + " needs --trace");
  }
  if (!o.trace.empty() && o.timestamps) {
    throw std::runtime_error("--timestamps is for the synthetic rounds, not --trace");
  }
  if (!compute_ms.empty()) {
    char* end = nullptr;
    o.compute_ms = std::strtod(compute_ms.c_str(), &end);
    if (end == compute_ms.c_str() || *end != '\0' || !(o.compute_ms >= 0) || o.compute_ms > 1e6) {
      throw std::runtime_error("--compute-ms wants milliseconds in [0, 1e6], not '" + compute_ms +
                               "'");
    }
  }
  if (!o.straggler.empty() && o.compute_ms < 0 && o.trace.empty()) {
    throw std::runtime_error("--straggler needs --compute-ms or --trace");
  }
  if (o.compute_ms >= 0 && !o.trace.empty()) {
    throw std::runtime_error("--compute-ms and --trace are two different trainers: pick one");
  }
  if (o.dtype != "float32" && o.dtype != "bfloat16" && o.dtype != "float16" && o.dtype != "mixed") {
    throw std::runtime_error("--dtype wants float32, bfloat16, float16 or mixed, not '" + o.dtype +
                             "'");
  }
  if (o.dtype != "float32" && !o.trace.empty()) {
    throw std::runtime_error("--dtype " + o.dtype +
                             " goes with the synthetic and free-running rounds, not --trace");
  }
  if (o.compute_scale == 0) o.compute_scale = 1.0;
  if (o.comm_rounds < 0) o.comm_rounds = 5;
  return o;
}

using apps::read_file;
using trainer::gradient;
using trainer::initial;
using trainer::Update;

// Tensor k's dtype under --dtype.
wire::Dtype dtype_of(const std::string& dtype, size_t k) {
  if (dtype == "bfloat16") return wire::Dtype::kBFloat16;
  if (dtype == "float16") return wire::Dtype::kFloat16;
  if (dtype == "mixed") {
    constexpr wire::Dtype kTurn[] = {wire::Dtype::kFloat32, wire::Dtype::kBFloat16,
                                     wire::Dtype::kFloat16};
    return kTurn[k % 3];
  }
  return wire::Dtype::kFloat32;
}

int run(const Options& o) {
  const config::JobConfig job = config::load_file(o.config);
  const config::NodeConfig& me = job::worker_node(job, o.node);
  // Free-running rounds: asked for, or an asynchronous mode without a trace.
  const bool bsp = job.training.sync == config::Sync::kBsp;
  const bool free = o.compute_ms >= 0 || (!bsp && o.trace.empty());
  trainer::FreeOptions fo{
      .node = o.node, .rounds = o.rounds, .compute_ms = std::max(o.compute_ms, 0.0)};
  if (!o.straggler.empty()) {
    unsigned rank = 0;
    double factor = 0;
    char tail = 0;
    if (std::sscanf(o.straggler.c_str(), "%u,%lf%c", &rank, &factor, &tail) != 2 ||
        !(factor >= 1) || factor > 1000) {
      throw std::runtime_error("--straggler wants RANK,F with F in [1, 1000], not '" + o.straggler +
                               "'");
    }
    if (rank >= job.workers().size()) {
      throw std::runtime_error("--straggler: rank " + std::to_string(rank) + " but the job has " +
                               std::to_string(job.workers().size()) + " workers");
    }
    fo.straggler_rank = rank;
    fo.straggler_factor = factor;
  }
  if (!bsp && !o.trace.empty() && o.verify != "none") {
    throw std::runtime_error("--trace checks the aggregates of bsp jobs only; training.sync is " +
                             std::string(config::to_string(job.training.sync)) +
                             ": time it with --verify none");
  }
  if (free) trainer::free_rounds_checkable(job.training);  // refuses what it cannot check
  // --lose: the rank that dies, in which round (0-based), after how many tensors.
  uint32_t lose_rank = UINT32_MAX, lose_round = 0, lose_after = 0;
  if (!o.lose.empty()) {
    unsigned r = 0, round = 0, k = 0;
    char tail = 0;
    if (std::sscanf(o.lose.c_str(), "%u,%u,%u%c", &r, &round, &k, &tail) != 3) {
      throw std::runtime_error("--lose wants RANK,ROUND,K, not '" + o.lose + "'");
    }
    if (free || !o.trace.empty() || o.verify != "every") {
      throw std::runtime_error("--lose goes with the synthetic bsp rounds and --verify every");
    }
    if (job.training.on_worker_loss == config::OnWorkerLoss::kFail) {
      throw std::runtime_error(
          "--lose needs training.on_worker_loss shrink or wait (under fail the job ends with "
          "the rank)");
    }
    if (r >= job.workers().size() ||
        (r == 0 && job.training.on_worker_loss == config::OnWorkerLoss::kShrink)) {
      throw std::runtime_error("--lose: rank " + std::to_string(r) + " is not one of 1.." +
                               std::to_string(job.workers().size() - 1) +
                               " (a job shrinks without any rank but rank 0)");
    }
    if (round == 0 || round > o.rounds) {
      throw std::runtime_error("--lose: round " + std::to_string(round) + " is not one of 1.." +
                               std::to_string(o.rounds));
    }
    lose_rank = r;
    lose_round = round - 1;
    lose_after = k;
  }
  const Update update = free || !bsp ? Update{} : Update::of(job.training);
  if (o.verify == "last" && !update.sum_only && o.trace.empty() && !free) {
    throw std::runtime_error(
        "--verify last needs training.optimizer sum: with another optimizer every round's "
        "aggregate is needed to know the last one");
  }
  const std::string model_text = read_file(o.model);
  const std::vector<agg::TensorDecl> decls = agg::parse_model_shapes(model_text);
  uint64_t model_bytes = 0;  // in the tensors' dtypes
  std::vector<wire::Dtype> dtypes(decls.size());
  for (size_t k = 0; k < decls.size(); ++k) {
    dtypes[k] = dtype_of(o.dtype, k);
    model_bytes += decls[k].elements * wire::element_bytes(dtypes[k]);
  }
  trace::Trace compute;
  if (!o.trace.empty()) {
    const std::string trace_text = read_file(o.trace);
    compute = trace::parse_trace({o.trace, trace_text}, {o.model, model_text}, decls);
  }
  if (o.check) {
    std::printf(
        "%s: ok (job %s, node %s = worker rank %u of %zu, model %s: %zu tensors, %.1f MB)\n",
        o.config.c_str(), job.name.c_str(), o.node.c_str(), me.rank, job.workers().size(),
        o.model.c_str(), decls.size(), static_cast<double>(model_bytes) / 1e6);
    if (!o.trace.empty()) {
      std::printf("%s: ok (%zu layers, %.1f ms of compute per round)\n", o.trace.c_str(),
                  compute.layers.size(), compute.compute_us() / 1e3);
    }
    return 0;
  }

  // The CPUs of this node's lcores, as EAL maps them, read before EAL pins
  // anything.
  cpu_set_t own_cpus;
  CPU_ZERO(&own_cpus);
  const std::vector<uint32_t> cpus = config::allowed_cpus();
  for (uint32_t l : me.lcores) CPU_SET(config::cpu_of_lcore(l, cpus), &own_cpus);

  uint32_t rank = me.spare ? UINT32_MAX : me.rank;  // a spare's: set once started
  const uint32_t n = static_cast<uint32_t>(job.workers().size());

  // Rank 0's buffers hold the initial model; the others start from garbage
  // that version 0 must overwrite. Unchecked trace runs (--verify none) keep
  // no reference. The buffers come first, before EAL and the net core start:
  // faulting a model's worth of fresh memory in is the slowest part of the
  // start on these VMs (VGG-16: 553 MB per worker), and once every node's
  // pollers are up it runs several times slower.
  const bool unchecked = !o.trace.empty() && o.verify == "none";
  std::vector<trainer::Floats> params(decls.size()), grads(decls.size()), reference(decls.size());
  // A half-precision tensor's buffers (its float ones above hold its
  // rounded gradient and its float32 master parameters, the reference).
  std::vector<std::vector<uint16_t>> half_params(decls.size()), half_grads(decls.size());
  for (size_t k = 0; k < decls.size(); ++k) {
    if (unchecked) {
      params[k].assign(decls[k].elements, -1.0e30f);
      if (rank == 0) initial(params[k], k);
    } else {
      reference[k].resize(decls[k].elements);
      if (free) {
        trainer::grid_initial(reference[k], k);
      } else {
        initial(reference[k], k);
      }
      if (dtypes[k] != wire::Dtype::kFloat32) {
        // Rank 0's values rounded into the dtype: the servers widen them
        // (exactly) into their master parameters. Others start from NaN.
        half_params[k].assign(decls[k].elements, 0x7fffu);
        if (rank == 0) trainer::narrow(reference[k], half_params[k], dtypes[k]);
        trainer::quantize(reference[k], dtypes[k]);
        half_grads[k].resize(decls[k].elements);
      } else if (rank == 0) {
        params[k] = reference[k];
      } else {
        params[k].assign(decls[k].elements, -1.0e30f);
      }
    }
    // The trace and free-running rounds have their own.
    if (o.trace.empty() && !free) grads[k].resize(decls[k].elements);
  }
  worker::WorkerOptions wo;
  wo.job_file = o.config;
  wo.node = o.node;
  wo.eal_args = o.eal;
  worker::Worker w(wo);
  // The trainer (this thread) runs where its net core does: left to roam, it
  // lands on other nodes' CPUs (a server's), and each time it is woken there
  // it can hold that CPU for milliseconds while the node sleeps between
  // polls (docs/performance.md, "Where the nodes run").
  if (const int e = pthread_setaffinity_np(pthread_self(), sizeof own_cpus, &own_cpus); e != 0) {
    std::fprintf(stderr, "ps-worker: cannot keep the trainer on its node's CPUs: %s\n",
                 std::strerror(e));
  }

  for (size_t k = 0; k < decls.size(); ++k) {
    if (dtypes[k] == wire::Dtype::kFloat32) {
      w.declare(decls[k].name, params[k], static_cast<int>(decls[k].priority));
    } else {
      w.declare(decls[k].name, half_params[k], static_cast<worker::Dtype>(dtypes[k]),
                static_cast<int>(decls[k].priority));
    }
  }
  // Whether tensor k's buffer holds its reference (rounded into its dtype).
  auto exact = [&](size_t k) {
    if (dtypes[k] != wire::Dtype::kFloat32) {
      return trainer::equals_narrowed(half_params[k], reference[k], dtypes[k]);
    }
    return std::memcmp(params[k].data(), reference[k].data(), reference[k].size() * 4) == 0;
  };
  // On every way out, the worker stops before the buffers it writes into are
  // freed: its net core places chunks as they come, and under psplus they
  // keep coming.
  struct StopFirst {
    worker::Worker& w;
    ~StopFirst() { w.shutdown(); }
  } stop_first{w};
  const auto t0 = Clock::now();
  try {
    w.start();
  } catch (const worker::SpareReleased& e) {
    // A spare the job ended without needing (docs/membership.md): no failure.
    std::printf("%s: released: %s\n", o.node.c_str(), e.what());
    return 0;
  }
  const double start_s = std::chrono::duration<double>(Clock::now() - t0).count();
  // A job a server resumed from its checkpoint (ps-server --resume) starts
  // at that version: the reference replays the rounds before it, off the
  // clock, and the rounds go on from there.
  const uint32_t first_round = w.start_version();
  // A process that joined a running asynchronous job in place of a removed
  // rank (docs/membership.md) holds the newest versions, not rank 0's, and
  // goes on from the step it joined at, start_version(); one that joined a
  // BSP job (on_worker_loss wait) holds the version of the round in
  // progress, start_version(): replayed and checked as a resume.
  const std::optional<uint32_t> joined = w.joined_version();
  const bool joined_async = joined && !bsp;
  // A spare worker has the rank it took over once started.
  if (me.spare) rank = w.rank();
  trainer::Floats avg, other;  // the reference's scratch, grown once to the largest tensor
  std::vector<trainer::OptState> states(decls.size());  // the servers' optimizer state, replayed
  // The reference at `version`: the initial values and the rounds before it.
  auto replay_to = [&](uint32_t version) {
    if (free || !o.trace.empty() || o.verify != "every") {
      throw std::runtime_error("the job resumes at version " + std::to_string(version) +
                               ": only the synthetic bsp rounds with --verify every replay it");
    }
    for (size_t k = 0; k < decls.size(); ++k) {
      initial(reference[k], k);
      if (dtypes[k] != wire::Dtype::kFloat32) trainer::quantize(reference[k], dtypes[k]);
      states[k] = trainer::OptState{};
    }
    for (uint32_t round = 0; round < version; ++round) {
      for (size_t k = 0; k < decls.size(); ++k) {
        gradient(grads[k], rank, round, k);
        if (dtypes[k] != wire::Dtype::kFloat32) trainer::quantize(grads[k], dtypes[k]);
        trainer::average(avg, other, n, round, k, grads[k], rank, dtypes[k]);
        trainer::apply(reference[k], avg, update, states[k]);
      }
    }
  };
  if (first_round != 0 && !joined_async) replay_to(first_round);
  uint64_t wrong = 0;
  // Under psplus the servers send every version to every worker: a rank that
  // starts later may already hold a newer version than 0 (checked at the end).
  const bool eager = job.training.sync == config::Sync::kPsPlus;
  for (size_t k = 0; k < decls.size() && !eager && !unchecked && !joined_async; ++k) {
    wrong += !exact(k);
  }
  const std::string which =
      joined             ? "joined the running job at version " + std::to_string(*joined) + ":"
      : first_round == 0 ? std::string("initial")
                         : "resumed at version " + std::to_string(first_round);
  std::printf("%s: rank %u of %u, %zu tensors (%.1f MB), started in %.2f s: %s parameters %s\n",
              o.node.c_str(), rank, n, decls.size(), static_cast<double>(model_bytes) / 1e6,
              start_s, which.c_str(),
              joined_async ? "the newest (not checked)"
              : eager      ? "in (psplus: version 0 or newer)"
              : unchecked  ? "not checked (--verify none)"
              : wrong == 0 ? "exact"
                           : "MISMATCH");
  std::fflush(stdout);
  if (wrong != 0) return 1;

  if (free) {
    if (trainer::run_free_rounds(w, job.training, decls, {params, half_params, dtypes}, fo) != 0) {
      return 1;
    }
    w.shutdown();
    return 0;
  }

  if (!o.trace.empty()) {
    // The straggler's compute, every layer's, takes straggler_factor times longer.
    const double factor = rank == fo.straggler_rank ? fo.straggler_factor : 1.0;
    const trainer::TraceOptions to{.node = o.node,
                                   .scale = o.compute_scale * factor,
                                   .comm_rounds = static_cast<uint32_t>(o.comm_rounds),
                                   .rounds = o.rounds,
                                   .check_comm_rounds = o.verify == "every" && o.comm_rounds > 0,
                                   .check_final = o.verify != "none",
                                   .ranks_alike = fo.straggler_factor == 1.0};
    if (trainer::run_trace_rounds(w, compute, decls, params, reference, update, to) != 0) {
      return 1;
    }
    w.barrier();  // nobody leaves before every rank has its last aggregate
    w.shutdown();
    std::printf("%s: done, %u comm-only and %u trace rounds, %s, %s\n", o.node.c_str(),
                static_cast<uint32_t>(o.comm_rounds), o.rounds,
                o.verify == "every"  ? "every aggregate exact"
                : o.verify == "last" ? "the final parameters exact"
                                     : "not checked (--verify none)",
                trainer::drops_text(w).c_str());
    return 0;
  }

  std::vector<worker::Handle> pending(decls.size());
  double total_s = 0;
  // With --verify last only the last round's aggregate is checked (and the
  // sum optimizer keeps no state), so its gradients are computed once, before
  // the first round, and pushed every round: nothing but push_pull runs
  // between rounds (the gradients are 4 bytes of PRNG output per parameter,
  // tens of milliseconds of CPU per round for ResNet-50).
  const bool gradients_once = o.verify == "last";
  // A half-precision tensor's gradient: rounded into its buffer, and the
  // float one made what the servers will widen (the reference's).
  auto make_gradient = [&](size_t k, uint32_t seed) {
    gradient(grads[k], rank, seed, k);
    if (dtypes[k] == wire::Dtype::kFloat32) return;
    trainer::narrow(grads[k], half_grads[k], dtypes[k]);
    trainer::quantize(grads[k], dtypes[k]);
  };
  if (gradients_once) {
    for (size_t k = 0; k < decls.size(); ++k) make_gradient(k, o.rounds - 1);
  }
  // network.on_server_loss wait: a round that fails with a lost server is
  // abandoned; the job rolls back to the version the server resumed at
  // (Worker::roll_back), the reference replays to it, and the rounds go on
  // from there.
  const bool waits = job.network.on_server_loss == config::OnServerLoss::kWait;
  uint32_t rollbacks = 0;
  if (lose_rank != UINT32_MAX && lose_after > decls.size()) {
    throw std::runtime_error("--lose: " + std::to_string(lose_after) + " tensors, the model has " +
                             std::to_string(decls.size()));
  }
  // The ranks whose gradients tensor k's set of round `round` averages
  // (docs/membership.md, "A BSP job that shrinks"): every rank before the
  // loss; in its round those the lost rank pushed (the first lose_after of
  // the backward order: the last tensors) over every rank, the rest without
  // it; after it, without it.
  const uint64_t every = n >= 64 ? ~uint64_t{0} : (uint64_t{1} << n) - 1;
  const bool shrinks = job.training.on_worker_loss == config::OnWorkerLoss::kShrink;
  auto ranks_of = [&](uint32_t round, size_t k) {
    // A job that waits for the rank's new process is the unbroken run.
    if (lose_rank == UINT32_MAX || !shrinks || round < lose_round) return every;
    if (round == lose_round && k >= decls.size() - lose_after) return every;
    return every & ~(uint64_t{1} << lose_rank);
  };
  std::vector<bool> issued(decls.size());
  for (uint32_t round = first_round; round < o.rounds; ++round) {
    if (!gradients_once) {
      for (size_t k = 0; k < decls.size(); ++k) make_gradient(k, round);
    }
    // Every rank starts the round together (the check of the previous
    // round takes each rank its own time), so a round's time is its
    // push_pull alone, and the slowest rank's is the job's iteration.
    std::string failed;
    try {
      w.barrier();
    } catch (const worker::WorkerError& e) {
      if (!waits) throw;
      failed = e.what();
    }
    if (round == lose_round && rank == lose_rank && failed.empty()) {
      // The loss: the first lose_after tensors, taken by the servers (each
      // push's handle completes once acknowledged), then SIGKILL.
      for (size_t k = decls.size(); k-- > decls.size() - lose_after;) {
        const auto key = static_cast<worker::Key>(k);
        worker::Handle h =
            dtypes[k] == wire::Dtype::kFloat32 ? w.push(key, grads[k]) : w.push(key, half_grads[k]);
        if (!h.wait()) {
          std::fprintf(stderr, "ps-worker: round %u, tensor %s: %s\n", round + 1,
                       decls[k].name.c_str(), std::string(h.error()).c_str());
          return 1;
        }
      }
      std::printf("%s round %3u: pushed %u tensors; killing itself (SIGKILL)\n", o.node.c_str(),
                  round + 1, lose_after);
      std::fflush(stdout);
      std::raise(SIGKILL);
    }
    // The backward pass emits the last layer first.
    const auto start = Clock::now();
    std::fill(issued.begin(), issued.end(), false);
    for (size_t k = decls.size(); k-- > 0 && failed.empty();) {
      const auto key = static_cast<worker::Key>(k);
      pending[k] = dtypes[k] == wire::Dtype::kFloat32
                       ? w.push_pull(key, grads[k], params[k])
                       : w.push_pull(key, half_grads[k], half_params[k]);
      issued[k] = true;
    }
    // Every handle issued is waited for, failed or not: none writes params after.
    for (size_t k = 0; k < decls.size(); ++k) {
      if (!issued[k] || pending[k].wait() || !failed.empty()) continue;
      failed = "tensor " + decls[k].name + ": " + std::string(pending[k].error());
    }
    if (!failed.empty()) {
      if (!waits) {
        std::fprintf(stderr, "ps-worker: round %u, %s\n", round + 1, failed.c_str());
        return 1;
      }
      const uint32_t version = w.roll_back();
      replay_to(version);
      wrong = 0;
      for (size_t k = 0; k < decls.size(); ++k) wrong += !exact(k);
      ++rollbacks;
      std::printf("%s: round %u failed (%s); rolled back to version %u: parameters %s\n",
                  o.node.c_str(), round + 1, failed.c_str(), version,
                  wrong == 0 ? "exact" : "MISMATCH");
      std::fflush(stdout);
      if (wrong != 0) return 1;
      round = version - 1;  // the loop's ++ makes it the version: its gradients next
      continue;
    }
    const auto end = Clock::now();
    const double secs = std::chrono::duration<double>(end - start).count();
    total_s += secs;
    const bool verify = o.verify == "every" || round + 1 == o.rounds;
    // What the servers must have produced: every rank's gradient, summed in
    // rank order, times 1/N, then the optimizer.
    wrong = 0;
    for (size_t k = 0; k < decls.size() && verify; ++k) {
      trainer::average_of(avg, other, ranks_of(round, k), round, k, grads[k], rank, dtypes[k]);
      trainer::apply(reference[k], avg, update, states[k]);
      wrong += !exact(k);
    }
    const worker::WorkerStats s = w.stats();
    const double bytes = static_cast<double>(model_bytes) * 2;  // pushed + pulled
    std::string stamps;
    if (o.timestamps) {
      auto ns = [](Clock::time_point t) {
        return std::to_string(
            std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count());
      };
      stamps = "  start=" + ns(start) + " end=" + ns(end);
    }
    std::printf("%s round %3u: %7.3f s  %6.2f Gbit/s push+pull  %s  retransmissions %llu%s\n",
                o.node.c_str(), round + 1, secs, bytes * 8 / secs / 1e9,
                !verify      ? "not checked"
                : wrong == 0 ? "every aggregate exact"
                             : "MISMATCH",
                static_cast<unsigned long long>(s.retransmits), stamps.c_str());
    std::fflush(stdout);
    if (wrong != 0) {
      std::fprintf(stderr, "ps-worker: round %u: %llu tensors differ from the reference\n",
                   round + 1, static_cast<unsigned long long>(wrong));
      return 1;
    }
  }
  w.barrier();  // nobody leaves before every rank has its last aggregate
  w.shutdown();
  const bool standby = std::any_of(job.nodes.begin(), job.nodes.end(), [](const auto& node) {
    return node.role == config::Role::kStandby;
  });
  std::printf("%s: done, %u rounds%s in %.2f s of push_pull (%.2f Gbit/s), %s, %s%s\n",
              o.node.c_str(), o.rounds,
              rollbacks == 0 ? "" : (" (" + std::to_string(rollbacks) + " rolled back)").c_str(),
              total_s, static_cast<double>(model_bytes) * 2 * 8 * o.rounds / total_s / 1e9,
              o.verify == "every" ? "every aggregate exact" : "the last round's aggregate exact",
              trainer::drops_text(w).c_str(), trainer::standby_text(w, standby).c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return mercury::apps::guarded_main("ps-worker", [&] { return run(parse(argc, argv)); });
}
