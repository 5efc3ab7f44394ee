// job/identity: which job file and which node of it a process is, from its
// command line or from the variables the launcher that started it set
// (torchrun, Slurm's srun, Open MPI's mpirun, any PMI launcher), so that one
// `srun` or `torchrun` line starts a job whose processes carry no
// Mercury-specific arguments. docs/cluster.md, "Identity", is the reference.
//
// The job file: the explicit path, else $MERCURY_JOB.
//
// The node, first match wins:
//   1. the explicit name (--node, WorkerOptions::node, Worker(node=...));
//   2. $MERCURY_NODE;
//   3. a launcher's global rank r among n processes, the first of
//        torchrun      RANK / WORLD_SIZE
//        Slurm         SLURM_PROCID / SLURM_NTASKS
//        Open MPI      OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE
//        PMI (MPICH, Intel MPI, Slurm --mpi=pmi2)  PMI_RANK / PMI_SIZE
//      mapped by the rule below;
//   4. the job's only node of the role asked for.
//
// The mapping rule, for a job of S servers and W workers: n == S + W, the
// launcher started every node: rank r is the job file's r-th node (file
// order, servers and workers as they come); n == W, the launcher started the
// workers alone (the servers apart): rank r is worker r (workers rank in file
// order too), and a server process falls through to 4. Any other n is an
// error naming n, S + W and W. So is a rank that maps to a node of the other
// role (a trainer on a server's rank). File order is the launchers' order:
// srun's block distribution, torchrun's node_rank x nproc + local_rank and
// mpirun's by-slot mapping all number one host's processes consecutively,
// and ps-job writes each host's nodes together.
//
// Control path only: reads the environment and the job file, allocates,
// throws config::ConfigError naming where the value came from. Pure apart
// from process_environment(): everything takes the environment as an
// argument, so the rule is unit-tested without a launcher.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "config/config.h"

namespace mercury::job {

/// Looks an environment variable up by name: nullopt when it is not set.
using Environment = std::function<std::optional<std::string>(const std::string& name)>;

/// This process's environment (getenv), read at each call.
Environment process_environment();

/// A launcher's view of this process: rank `rank` of `size`, and the
/// variables it came from, for messages ("SLURM_PROCID=2 of SLURM_NTASKS=5").
struct LauncherRank {
  uint32_t rank = 0;
  uint32_t size = 0;
  std::string source;
};

/// The first launcher whose rank variable is set, in the order above, or
/// nullopt when none is. Throws ConfigError for a rank whose size variable
/// is missing, a value that is not a whole number, a size of 0 or above
/// 2^31, or a rank not below the size.
std::optional<LauncherRank> launcher_rank(const Environment& env);

/// `explicit_path` when not empty, else $MERCURY_JOB. Throws ConfigError
/// when neither is set.
std::string job_file(std::string_view explicit_path, const Environment& env);

/// One node of a job, and how it was chosen ("--node", "MERCURY_NODE=w2",
/// "SLURM_PROCID=3 of SLURM_NTASKS=5", "the job's only server").
struct NodeChoice {
  const config::NodeConfig* node = nullptr;
  std::string how;
};

/// The node of `job` this process runs, of role `role`, by the rule above;
/// `explicit_name` is the caller's (empty: none; `explicit_how` says where
/// it came from, e.g. "--node"). Throws ConfigError naming the job file and
/// the source of the choice: an unknown name (listing the nodes), a node of
/// the other role, a launcher size that fits neither S + W nor W, or no way
/// to choose (several nodes of the role and nothing set).
NodeChoice choose_node(const config::JobConfig& job, config::Role role,
                       std::string_view explicit_name, std::string_view explicit_how,
                       const Environment& env);

/// A process's whole identity: the job loaded from job_file(), and
/// choose_node() in it.
struct Identity {
  config::JobConfig job;
  std::string node;  ///< the node's name in `job`
  std::string how;   ///< NodeChoice::how
};
Identity identify(std::string_view job_path, std::string_view node_name, config::Role role,
                  const Environment& env);

}  // namespace mercury::job
