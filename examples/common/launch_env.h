// What every example needs before its first NCCL call: its rank, the world size and local rank
// from whichever launcher started it, and one ncclUniqueId shared by all ranks.
#pragma once
#include <nccl.h>

#include <string>

namespace examples {

struct LaunchEnv {
  int rank = 0;
  int world = 1;
  int localRank = 0;
  std::string launcher;  // "torchrun", "openmpi", "slurm" or "none"
  std::string jobKey;    // identifies this job among others on the same hosts
};

// Reads torchrun (RANK, WORLD_SIZE, LOCAL_RANK), OpenMPI (OMPI_COMM_WORLD_*) or SLURM
// (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID) variables; a single rank when none is set.
// Exits with a one-line message when the variables are inconsistent.
LaunchEnv readLaunchEnv();

// Rank 0 creates the id and hands it to the others:
// - with MASTER_ADDR: over TCP on NCCL_UNIQUEID_PORT, else MASTER_PORT+1 (torchrun's own
//   TCPStore owns MASTER_PORT itself), works across machines;
// - otherwise through a file in $TMPDIR (or /tmp) named after the job key, on one machine.
// Exits with a one-line message when the rendezvous fails within its time bound.
ncclUniqueId shareUniqueId(const LaunchEnv& env);

// Prints "<program>: rank R: <what> failed: <why>" and exits with status 2.
[[noreturn]] void die(const LaunchEnv& env, const std::string& what, const std::string& why);

}  // namespace examples

#define EXAMPLE_CUDA_CHECK(env, call)                                                     \
  do {                                                                                    \
    cudaError_t status_ = (call);                                                         \
    if (status_ != cudaSuccess) ::examples::die(env, #call, cudaGetErrorString(status_)); \
  } while (0)

#define EXAMPLE_NCCL_CHECK(env, call)                                                     \
  do {                                                                                    \
    ncclResult_t status_ = (call);                                                        \
    if (status_ != ncclSuccess) ::examples::die(env, #call, ncclGetErrorString(status_)); \
  } while (0)
