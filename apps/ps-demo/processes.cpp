// ps-demo's process mode: the job as it runs on a cluster, on this machine.
// One ps-server process for the server node and one ps-worker process per
// worker node (the public worker API), joined by the job's virtual ports
// (net_memif in config/memif.yaml). Their output is shown line by line,
// prefixed with the node's name; the demo succeeds when every worker has
// checked every aggregate of every round and exited 0, and the server has
// stopped cleanly.
#include "processes.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace mercury::demo {

namespace {

namespace fs = std::filesystem;

struct Child {
  std::string name;
  pid_t pid = -1;
  int out = -1;         // read end of its stdout + stderr
  std::string partial;  // output not yet ended by a newline
  int status = -1;      // exit status once reaped
  std::string result;   // a trace-driven worker's summary ("w0: iteration ... ratio ...")
};

// ps-server and ps-worker beside this executable: build/apps/ps-demo next to
// build/apps/ps-server and build/apps/ps-worker/ps-worker, or one bin/.
std::string find_sibling(const std::string& name) {
  char self[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) throw std::runtime_error("cannot read /proc/self/exe");
  self[n] = '\0';
  const fs::path dir = fs::path(self).parent_path();
  for (const fs::path& p : {dir / name, dir / name / name}) {
    std::error_code ec;
    if (fs::is_regular_file(p, ec) && access(p.c_str(), X_OK) == 0) return p.string();
  }
  throw std::runtime_error("cannot find the " + name + " executable next to " + self +
                           " (build it with `ninja -C build`)");
}

Child spawn(const std::string& name, const std::vector<std::string>& argv) {
  int fds[2];
  if (pipe(fds) != 0) throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    dup2(fds[1], STDERR_FILENO);
    close(fds[0]);
    close(fds[1]);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    std::fprintf(stderr, "cannot run %s: %s\n", args[0], std::strerror(errno));
    _exit(127);
  }
  close(fds[1]);
  Child c;
  c.name = name;
  c.pid = pid;
  c.out = fds[0];
  return c;
}

// Prints what `c` wrote since last time, a line at a time; false at EOF.
bool pump(Child& c) {
  char buf[4096];
  const ssize_t n = read(c.out, buf, sizeof buf);
  if (n <= 0) {
    if (!c.partial.empty()) std::printf("[%s] %s\n", c.name.c_str(), c.partial.c_str());
    c.partial.clear();
    close(c.out);
    c.out = -1;
    return false;
  }
  c.partial.append(buf, static_cast<size_t>(n));
  for (size_t nl; (nl = c.partial.find('\n')) != std::string::npos;) {
    const std::string line = c.partial.substr(0, nl);
    c.partial.erase(0, nl + 1);
    // EAL's start-up chatter is the same for every process (and memif's note
    // that --no-shconf has no multi-process channel): keep it out.
    if (line.rfind("EAL: ", 0) == 0 || line.rfind("TELEMETRY: ", 0) == 0 ||
        line.find("Failed to register mp action callback") != std::string::npos) {
      continue;
    }
    if (line.rfind(c.name + ": iteration ", 0) == 0) c.result = line;
    std::printf("[%s] %s\n", c.name.c_str(), line.c_str());
  }
  std::fflush(stdout);
  return true;
}

// Pumps every child's output until `done()` or `seconds` pass.
template <typename Done>
bool pump_until(std::vector<Child*> children, Done done, double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::vector<pollfd> fds;
    std::vector<Child*> who;
    for (Child* c : children) {
      if (c->out >= 0) {
        fds.push_back({c->out, POLLIN, 0});
        who.push_back(c);
      }
    }
    if (fds.empty()) {
      // Every output closed (a ps-server ends with its job): the children
      // may still be exiting, so wait for them rather than give up.
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    if (::poll(fds.data(), fds.size(), 200) < 0 && errno != EINTR) return false;
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents != 0) pump(*who[i]);
    }
  }
  return true;
}

bool reap(Child& c, bool block) {
  if (c.status >= 0) return true;
  int st = 0;
  const pid_t r = waitpid(c.pid, &st, block ? 0 : WNOHANG);
  if (r != c.pid) return false;
  c.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return true;
}

}  // namespace

int run_processes(const std::string& config_file, const config::JobConfig& job,
                  const std::string& model, uint32_t rounds,
                  const std::vector<std::string>& worker_args, double timeout_s,
                  const std::atomic<bool>& stop) {
  const auto servers = job.servers();
  const auto workers = job.workers();
  const std::string server_bin = find_sibling("ps-server");
  const std::string worker_bin = find_sibling("ps-worker");
  auto has = [&](const char* arg) {
    return std::find(worker_args.begin(), worker_args.end(), arg) != worker_args.end();
  };
  std::printf(
      "ps-demo: %s in %zu processes: %zu ps-server (%u shards; its start lines say on which "
      "lcores) and %zu ps-worker, %u rounds of push_pull over %s; %s\n",
      job.source.c_str(), servers.size() + workers.size(), servers.size(), servers[0]->shards,
      workers.size(), rounds, model.c_str(),
      has("none") ? "nothing is checked (--verify none)" : "each worker checks its aggregates");
  std::fflush(stdout);

  // Every process at once: a worker's net_memif port waits for its server's
  // socket and link (PortOptions::peer_wait_ms), and eal.hugepages: auto
  // counts what the processes starting together take (docs/config.md).
  std::vector<Child> srv;
  for (const config::NodeConfig* s : servers) {
    srv.push_back(spawn(s->name, {server_bin, "--config", config_file, "--node", s->name}));
  }
  std::vector<Child*> all;
  for (Child& c : srv) all.push_back(&c);
  auto stop_servers = [&] {
    for (Child& c : srv) kill(c.pid, SIGINT);
    pump_until(
        all,
        [&] {
          for (Child& c : srv) {
            if (!reap(c, false)) return false;
          }
          return true;
        },
        30);
    for (Child& c : srv) {
      if (!reap(c, false)) {
        kill(c.pid, SIGKILL);
        reap(c, true);
      }
    }
  };

  std::vector<Child> wk;
  wk.reserve(workers.size());
  for (const config::NodeConfig* w : workers) {
    std::vector<std::string> argv{worker_bin, "--config", config_file,
                                  "--node",   w->name,    "--model",
                                  model,      "--rounds", std::to_string(rounds)};
    argv.insert(argv.end(), worker_args.begin(), worker_args.end());
    wk.push_back(spawn(w->name, argv));
  }
  for (Child& c : wk) all.push_back(&c);
  // A server that fails (a refused job, a port it cannot open) ends the run
  // at once: its workers would otherwise wait for it until their timeout.
  bool server_failed = false;
  const bool finished = pump_until(
      all,
      [&] {
        if (stop.load()) return true;
        for (Child& c : srv) {
          if (reap(c, false) && c.status != 0) server_failed = true;
        }
        if (server_failed) return true;
        for (Child& c : wk) {
          if (!reap(c, false)) return false;
        }
        return true;
      },
      timeout_s);
  for (Child& c : wk) {
    if (!reap(c, false)) {
      kill(c.pid, SIGINT);
      kill(c.pid, SIGKILL);
      reap(c, true);
    }
    while (c.out >= 0 && pump(c)) {
    }
  }
  stop_servers();

  int failed = 0;
  for (const Child& c : wk) failed += c.status != 0;
  for (const Child& c : srv) failed += c.status != 0;
  if (!finished || stop.load()) {
    std::fprintf(stderr, "ps-demo: %s\n", stop.load() ? "interrupted" : "timed out");
    return 1;
  }
  if (failed != 0) {
    std::fprintf(stderr, "ps-demo: %d of %zu processes failed (their output is above)\n", failed,
                 wk.size() + srv.size());
    return 1;
  }
  const bool last_only = has("last");
  const bool unchecked = has("none");
  const bool traced = has("--trace");
  const bool free_running =
      has("--compute-ms") || (!traced && job.training.sync != config::Sync::kBsp);
  std::printf("ps-demo: done: %zu workers, %u %srounds, %s\n", wk.size(), rounds,
              traced         ? "trace "
              : free_running ? "free-running "
                             : "",
              unchecked      ? "nothing checked (--verify none)"
              : free_running ? "each worker's final check is in its last line"
              : last_only
                  ? (traced ? "the final parameters exact" : "the last round's aggregate exact")
                  : "every aggregate exact");
  if (traced) {
    // The job goes at its slowest rank's pace. Each rank times a comm-only
    // round from its own release from the barrier, and the releases reach
    // the ranks at different moments while the round ends for all at about
    // the same one (the last aggregate): the rank released last waited least
    // for the others, so the job's communication time is the smallest.
    double iteration = 0, compute = 0, communication = 1e300;
    bool measured = true;  // false: the workers ran no comm-only rounds (--comm-rounds 0)
    for (const Child& c : wk) {
      double it = 0, cp = 0, cm = 0;
      const char* line = c.result.c_str() + c.name.size();
      const int got =
          std::sscanf(line, ": iteration %lf s, compute %lf s, communication %lf s", &it, &cp, &cm);
      if (got == 2 && std::strstr(line, "communication not measured") != nullptr) {
        measured = false;
      } else if (got != 3) {
        std::fprintf(stderr, "ps-demo: %s printed no iteration line\n", c.name.c_str());
        return 1;
      }
      iteration = std::max(iteration, it);
      compute = std::max(compute, cp);
      communication = std::min(communication, cm);
    }
    if (!measured) {
      std::printf(
          "ps-demo: job: iteration %.3f s, compute %.3f s, communication not measured "
          "(--comm-rounds 0) (iteration: the slowest rank's)\n",
          iteration, compute);
      return 0;
    }
    const double bound = std::max(compute, communication);
    std::printf(
        "ps-demo: job: iteration %.3f s, compute %.3f s, communication %.3f s, lower bound %.3f "
        "s, ratio %.3f (iteration: the slowest rank's; communication: the least any rank "
        "measured)\n",
        iteration, compute, communication, bound, iteration / bound);
  }
  return 0;
}

}  // namespace mercury::demo
