#pragma once
// `convnn train --nproc N`: the N processes of a data-parallel run on this machine, started as
// torchrun would start them (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT), for users without torchrun. torchrun stays the way for several machines.
#include <cstdint>
#include <string>
#include <vector>

namespace convnn::cli {

/// Runs this program with `arguments` (argv without --nproc) as ranks 0..nproc-1 on a free
/// loopback port and waits for them. A Ctrl-C is passed on to them once (each saves and stops).
/// When one fails, the others are asked to stop (SIGTERM), and killed if they
/// have not ended 10 s later. Returns 0 when all succeed, else the first failing rank's status
/// (128 + the signal for a rank killed by one).
int run_local_ranks(int64_t nproc, const std::vector<std::string>& arguments);

/// `arguments` without `--nproc N` / `--nproc=N`.
std::vector<std::string> without_nproc(const std::vector<std::string>& arguments);

}  // namespace convnn::cli
