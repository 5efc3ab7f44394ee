#include "job/identity.h"

#include <charconv>
#include <cstdlib>
#include <vector>

namespace mercury::job {

namespace {

constexpr const char* kEnvironment = "environment";

struct LauncherVariables {
  const char* rank;
  const char* size;
  const char* launcher;
};

// In the order the rule tries them (identity.h).
constexpr LauncherVariables kLaunchers[] = {
    {"RANK", "WORLD_SIZE", "torchrun"},
    {"SLURM_PROCID", "SLURM_NTASKS", "Slurm"},
    {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "Open MPI"},
    {"PMI_RANK", "PMI_SIZE", "PMI"},
};

constexpr uint32_t kMaxLauncherSize = 1u << 31;

uint32_t whole(const std::string& name, const std::string& text) {
  uint32_t v = 0;
  const char* end = text.data() + text.size();
  const auto [p, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc() || p != end) {
    throw config::ConfigError(kEnvironment,
                              name + "=" + text + " is not a whole number (a launcher's rank)");
  }
  return v;
}

std::string node_names(const config::JobConfig& job) {
  std::string names;
  for (const auto& n : job.nodes) names += (names.empty() ? "" : ", ") + n.name;
  return names;
}

const config::NodeConfig& named(const config::JobConfig& job, config::Role role,
                                const std::string& name, const std::string& how) {
  const config::NodeConfig* n = job.find_node(name);
  if (n == nullptr) {
    throw config::ConfigError(job.source, how + ": the job has no node called '" + name +
                                              "' (nodes: " + node_names(job) + ")");
  }
  // ps-server runs a standby too (docs/durability.md, "A hot standby").
  const bool standby = role == config::Role::kServer && n->role == config::Role::kStandby;
  if (n->role != role && !standby) {
    throw config::ConfigError(job.source, how + ": node " + n->name + " is a " +
                                              std::string(config::to_string(n->role)) + ", not a " +
                                              std::string(config::to_string(role)));
  }
  return *n;
}

std::string counts(size_t servers, size_t workers) {
  return std::to_string(servers) + (servers == 1 ? " server" : " servers") + " and " +
         std::to_string(workers) + (workers == 1 ? " worker" : " workers");
}

}  // namespace

Environment process_environment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

std::optional<LauncherRank> launcher_rank(const Environment& env) {
  for (const LauncherVariables& l : kLaunchers) {
    const std::optional<std::string> rank = env(l.rank);
    if (!rank) continue;
    const std::optional<std::string> size = env(l.size);
    if (!size) {
      throw config::ConfigError(kEnvironment, std::string(l.rank) + "=" + *rank + " is set but " +
                                                  l.size + " is not (" + l.launcher +
                                                  " sets both)");
    }
    LauncherRank r;
    r.rank = whole(l.rank, *rank);
    r.size = whole(l.size, *size);
    if (r.size == 0 || r.size > kMaxLauncherSize) {
      throw config::ConfigError(
          kEnvironment, std::string(l.size) + "=" + *size + " is not a number of processes");
    }
    if (r.rank >= r.size) {
      throw config::ConfigError(kEnvironment, std::string(l.rank) + "=" + *rank + " is not below " +
                                                  l.size + "=" + *size);
    }
    r.source = std::string(l.rank) + "=" + *rank + " of " + l.size + "=" + *size;
    return r;
  }
  return std::nullopt;
}

std::string job_file(std::string_view explicit_path, const Environment& env) {
  if (!explicit_path.empty()) return std::string(explicit_path);
  if (std::optional<std::string> path = env("MERCURY_JOB"); path && !path->empty()) return *path;
  throw config::ConfigError(kEnvironment,
                            "no job file: give its path (--config, the job argument) or set "
                            "MERCURY_JOB");
}

NodeChoice choose_node(const config::JobConfig& job, config::Role role,
                       std::string_view explicit_name, std::string_view explicit_how,
                       const Environment& env) {
  if (!explicit_name.empty()) {
    const std::string how(explicit_how.empty() ? "the node asked for" : explicit_how);
    return {&named(job, role, std::string(explicit_name), how), how};
  }
  if (std::optional<std::string> name = env("MERCURY_NODE"); name && !name->empty()) {
    const std::string how = "MERCURY_NODE=" + *name;
    return {&named(job, role, *name, how), how};
  }
  const std::vector<const config::NodeConfig*> servers = job.servers();
  const std::vector<const config::NodeConfig*> workers = job.workers();
  const std::vector<const config::NodeConfig*>& mine =
      role == config::Role::kServer ? servers : workers;
  const std::string role_name(config::to_string(role));
  if (const std::optional<LauncherRank> l = launcher_rank(env)) {
    const size_t every = servers.size() + workers.size();
    if (l->size == every) {
      const config::NodeConfig* n = &job.nodes[l->rank];
      if (n->role != role) {
        throw config::ConfigError(
            job.source, l->source + " is " + std::string(config::to_string(n->role)) + " " +
                            n->name +
                            " (rank r is the job file's r-th node when the launcher "
                            "starts every node), not a " +
                            role_name);
      }
      return {n, l->source};
    }
    if (l->size == workers.size()) {
      if (role == config::Role::kWorker) return {workers[l->rank], l->source};
      // The launcher started the workers; this server was started apart.
    } else {
      throw config::ConfigError(
          job.source, l->source + ": the launcher started " + std::to_string(l->size) +
                          " processes, and the job has " + counts(servers.size(), workers.size()) +
                          ": start " + std::to_string(every) + " (every node) or " +
                          std::to_string(workers.size()) +
                          " (the workers, with the servers started apart), or name the node "
                          "(MERCURY_NODE)");
    }
  }
  if (mine.size() == 1) return {mine.front(), "the job's only " + role_name};
  std::string names;
  for (const auto* n : mine) names += (names.empty() ? "" : ", ") + n->name;
  throw config::ConfigError(job.source, "the job has " + std::to_string(mine.size()) + " " +
                                            role_name + " nodes (" + names +
                                            "): say which (--node, MERCURY_NODE, or a "
                                            "launcher's rank: RANK, SLURM_PROCID, "
                                            "OMPI_COMM_WORLD_RANK, PMI_RANK)");
}

Identity identify(std::string_view job_path, std::string_view node_name, config::Role role,
                  const Environment& env) {
  Identity id;
  id.job = config::load_file(job_file(job_path, env));
  NodeChoice c = choose_node(id.job, role, node_name, "", env);
  id.node = c.node->name;
  id.how = std::move(c.how);
  return id;
}

}  // namespace mercury::job
