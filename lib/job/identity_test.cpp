#include "job/identity.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <string>

namespace mercury::job {
namespace {

// Two servers and three workers, in file order s0, w0, s1, w1, w2 (two
// hosts, each with its server first): a launcher that starts every node
// gives rank r the r-th node; one that starts the workers alone, worker r.
const char* kJob = R"(
job: {id: 1, name: j}
nodes:
  - {name: s0, role: server, ipv4: 10.0.0.1, ports: ["net_null0"], lcores: [0, 1], shards: 1}
  - {name: w0, role: worker, ipv4: 10.0.0.11, ports: ["net_null1"], lcores: [0]}
  - {name: s1, role: server, ipv4: 10.0.0.2, ports: ["net_null2"], lcores: [0, 1], shards: 1}
  - {name: w1, role: worker, ipv4: 10.0.0.12, ports: ["net_null3"], lcores: [0]}
  - {name: w2, role: worker, ipv4: 10.0.0.13, ports: ["net_null4"], lcores: [0]}
)";

const char* kOneServer = R"(
job: {id: 1, name: k}
nodes:
  - {name: server0, role: server, ipv4: 10.0.0.1, ports: ["net_null0"], lcores: [0, 1], shards: 1}
  - {name: w0, role: worker, ipv4: 10.0.0.11, ports: ["net_null1"], lcores: [0]}
  - {name: w1, role: worker, ipv4: 10.0.0.12, ports: ["net_null2"], lcores: [0]}
)";

Environment env_of(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    const auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

std::string node_of(const config::JobConfig& job, config::Role role,
                    std::map<std::string, std::string> vars, std::string_view name = "") {
  return choose_node(job, role, name, "--node", env_of(std::move(vars))).node->name;
}

std::string error_of(const config::JobConfig& job, config::Role role,
                     std::map<std::string, std::string> vars, std::string_view name = "") {
  try {
    choose_node(job, role, name, "--node", env_of(std::move(vars)));
  } catch (const config::ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

const config::Role kServer = config::Role::kServer;
const config::Role kWorker = config::Role::kWorker;

TEST(Identity, LaunchersAreReadInOrder) {
  EXPECT_FALSE(launcher_rank(env_of({})).has_value());
  const auto torch = launcher_rank(
      env_of({{"RANK", "2"}, {"WORLD_SIZE", "4"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}}));
  ASSERT_TRUE(torch.has_value());
  EXPECT_EQ(torch->rank, 2u);
  EXPECT_EQ(torch->size, 4u);
  EXPECT_EQ(torch->source, "RANK=2 of WORLD_SIZE=4");
  const auto slurm = launcher_rank(env_of({{"SLURM_PROCID", "4"},
                                           {"SLURM_NTASKS", "5"},
                                           {"OMPI_COMM_WORLD_RANK", "0"},
                                           {"OMPI_COMM_WORLD_SIZE", "2"}}));
  EXPECT_EQ(slurm->source, "SLURM_PROCID=4 of SLURM_NTASKS=5");
  const auto ompi = launcher_rank(env_of({{"OMPI_COMM_WORLD_RANK", "1"},
                                          {"OMPI_COMM_WORLD_SIZE", "2"},
                                          {"PMI_RANK", "0"},
                                          {"PMI_SIZE", "2"}}));
  EXPECT_EQ(ompi->rank, 1u);
  EXPECT_EQ(ompi->source, "OMPI_COMM_WORLD_RANK=1 of OMPI_COMM_WORLD_SIZE=2");
  const auto pmi = launcher_rank(env_of({{"PMI_RANK", "3"}, {"PMI_SIZE", "8"}}));
  EXPECT_EQ(pmi->rank, 3u);
  EXPECT_EQ(pmi->size, 8u);
}

TEST(Identity, BadLauncherVariablesAreRefusedByName) {
  auto what = [](std::map<std::string, std::string> vars) {
    try {
      launcher_rank(env_of(std::move(vars)));
    } catch (const config::ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_EQ(what({{"RANK", "1"}}),
            "environment: RANK=1 is set but WORLD_SIZE is not (torchrun sets both)");
  EXPECT_EQ(what({{"SLURM_PROCID", "x"}, {"SLURM_NTASKS", "2"}}),
            "environment: SLURM_PROCID=x is not a whole number (a launcher's rank)");
  EXPECT_EQ(what({{"PMI_RANK", "-1"}, {"PMI_SIZE", "2"}}),
            "environment: PMI_RANK=-1 is not a whole number (a launcher's rank)");
  EXPECT_EQ(what({{"RANK", "0"}, {"WORLD_SIZE", "0"}}),
            "environment: WORLD_SIZE=0 is not a number of processes");
  EXPECT_EQ(what({{"RANK", "4"}, {"WORLD_SIZE", "4"}}),
            "environment: RANK=4 is not below WORLD_SIZE=4");
  EXPECT_EQ(what({{"RANK", ""}, {"WORLD_SIZE", "4"}}),
            "environment: RANK= is not a whole number (a launcher's rank)");
}

TEST(Identity, EveryNodeStartedByTheLauncherInFileOrder) {
  const config::JobConfig job = config::load_string(kJob, "job.yaml");
  const char* expect[] = {"s0", "w0", "s1", "w1", "w2"};
  for (uint32_t r = 0; r < 5; ++r) {
    const std::map<std::string, std::string> vars{{"SLURM_PROCID", std::to_string(r)},
                                                  {"SLURM_NTASKS", "5"}};
    const config::Role role = r == 0 || r == 2 ? kServer : kWorker;
    EXPECT_EQ(node_of(job, role, vars), expect[r]) << r;
    const NodeChoice c = choose_node(job, role, "", "", env_of(vars));
    EXPECT_EQ(c.how, "SLURM_PROCID=" + std::to_string(r) + " of SLURM_NTASKS=5");
  }
  // A trainer on a server's rank, and ps-server on a worker's.
  EXPECT_EQ(error_of(job, kWorker, {{"RANK", "2"}, {"WORLD_SIZE", "5"}}),
            "job.yaml: RANK=2 of WORLD_SIZE=5 is server s1 (rank r is the job file's r-th node "
            "when the launcher starts every node), not a worker");
  EXPECT_EQ(error_of(job, kServer, {{"RANK", "1"}, {"WORLD_SIZE", "5"}}),
            "job.yaml: RANK=1 of WORLD_SIZE=5 is worker w0 (rank r is the job file's r-th node "
            "when the launcher starts every node), not a server");
}

TEST(Identity, TheWorkersAloneByTheLauncher) {
  const config::JobConfig job = config::load_string(kJob, "job.yaml");
  EXPECT_EQ(node_of(job, kWorker, {{"RANK", "0"}, {"WORLD_SIZE", "3"}}), "w0");
  EXPECT_EQ(node_of(job, kWorker, {{"RANK", "2"}, {"WORLD_SIZE", "3"}}), "w2");
  // A server started apart from them is named, or is the only one.
  EXPECT_EQ(node_of(job, kServer, {{"RANK", "2"}, {"WORLD_SIZE", "3"}}, "s1"), "s1");
  EXPECT_NE(error_of(job, kServer, {{"RANK", "2"}, {"WORLD_SIZE", "3"}})
                .find("the job has 2 server nodes (s0, s1): say which"),
            std::string::npos);
  const config::JobConfig one = config::load_string(kOneServer, "one.yaml");
  const NodeChoice c =
      choose_node(one, kServer, "", "", env_of({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}}));
  EXPECT_EQ(c.node->name, "server0");
  EXPECT_EQ(c.how, "the job's only server");
}

TEST(Identity, ASizeThatFitsNeitherNamesBothNumbers) {
  const config::JobConfig job = config::load_string(kJob, "job.yaml");
  for (const config::Role role : {kServer, kWorker}) {
    EXPECT_EQ(error_of(job, role, {{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "4"}}),
              "job.yaml: OMPI_COMM_WORLD_RANK=0 of OMPI_COMM_WORLD_SIZE=4: the launcher started "
              "4 processes, and the job has 2 servers and 3 workers: start 5 (every node) or 3 "
              "(the workers, with the servers started apart), or name the node (MERCURY_NODE)");
  }
}

TEST(Identity, ExplicitNamesComeFirst) {
  const config::JobConfig job = config::load_string(kJob, "job.yaml");
  const std::map<std::string, std::string> launcher{{"RANK", "1"}, {"WORLD_SIZE", "5"}};
  EXPECT_EQ(node_of(job, kWorker, launcher), "w0");
  auto with_node = launcher;
  with_node["MERCURY_NODE"] = "w2";
  EXPECT_EQ(node_of(job, kWorker, with_node), "w2");
  EXPECT_EQ(choose_node(job, kWorker, "", "", env_of(with_node)).how, "MERCURY_NODE=w2");
  EXPECT_EQ(node_of(job, kWorker, with_node, "w1"), "w1");
  EXPECT_EQ(choose_node(job, kWorker, "w1", "--node", env_of(with_node)).how, "--node");
  // An empty MERCURY_NODE is not set.
  auto empty = launcher;
  empty["MERCURY_NODE"] = "";
  EXPECT_EQ(node_of(job, kWorker, empty), "w0");
  EXPECT_EQ(error_of(job, kWorker, {{"MERCURY_NODE", "w9"}}),
            "job.yaml: MERCURY_NODE=w9: the job has no node called 'w9' (nodes: s0, w0, s1, w1, "
            "w2)");
  EXPECT_EQ(error_of(job, kWorker, {}, "s0"),
            "job.yaml: --node: node s0 is a server, not a worker");
}

TEST(Identity, NothingSetAndNoOnlyNode) {
  const config::JobConfig job = config::load_string(kJob, "job.yaml");
  EXPECT_EQ(error_of(job, kWorker, {}),
            "job.yaml: the job has 3 worker nodes (w0, w1, w2): say which (--node, MERCURY_NODE, "
            "or a launcher's rank: RANK, SLURM_PROCID, OMPI_COMM_WORLD_RANK, PMI_RANK)");
  const config::JobConfig one = config::load_string(kOneServer, "one.yaml");
  EXPECT_EQ(node_of(one, kServer, {}), "server0");
}

TEST(Identity, TheJobFileFromTheArgumentOrMercuryJob) {
  EXPECT_EQ(job_file("a.yaml", env_of({{"MERCURY_JOB", "b.yaml"}})), "a.yaml");
  EXPECT_EQ(job_file("", env_of({{"MERCURY_JOB", "b.yaml"}})), "b.yaml");
  EXPECT_THROW(job_file("", env_of({{"MERCURY_JOB", ""}})), config::ConfigError);
  try {
    job_file("", env_of({}));
    FAIL() << "no job file was accepted";
  } catch (const config::ConfigError& e) {
    EXPECT_EQ(std::string(e.what()),
              "environment: no job file: give its path (--config, the job argument) or set "
              "MERCURY_JOB");
  }
}

// The process's own environment, as a launcher leaves it, through a real file.
TEST(Identity, IdentifyReadsTheProcessEnvironment) {
  char path[] = "/tmp/mercury-identity-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  // Removed however the test ends (an exception from identify() included).
  struct Remove {
    const char* path;
    ~Remove() { std::remove(path); }
  } remove_file{path};
  { std::ofstream(path) << kOneServer; }
  setenv("MERCURY_JOB", path, 1);
  setenv("SLURM_PROCID", "2", 1);
  setenv("SLURM_NTASKS", "3", 1);
  const Identity id = identify("", "", kWorker, process_environment());
  EXPECT_EQ(id.job.source, path);
  EXPECT_EQ(id.node, "w1");
  EXPECT_EQ(id.how, "SLURM_PROCID=2 of SLURM_NTASKS=3");
  EXPECT_THROW(identify("", "", kServer, process_environment()), config::ConfigError);
  setenv("SLURM_PROCID", "0", 1);
  EXPECT_EQ(identify("", "", kServer, process_environment()).node, "server0");
  unsetenv("MERCURY_JOB");
  unsetenv("SLURM_PROCID");
  unsetenv("SLURM_NTASKS");
  EXPECT_THROW(identify("", "", kWorker, process_environment()), config::ConfigError);
}

}  // namespace
}  // namespace mercury::job
