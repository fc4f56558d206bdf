// --ready-spares (agent.md, In-process recovery): while this node waits as a spare, its workers
// are forked ahead from the zygote and run until they make dlrun.recovery's loop, which waits
// for their place (python/dlrun/_reserve.py). A round that puts this node in a lost node's place
// hands each its worker's launch (startSome); any other round stops them and starts its own.
#include "agents/agent_impl.h"
#include "agents/recovery.h"
#include "agents/warm_start.h"
#include "agents/worker_args.h"

namespace dlrun::agents::detail {

bool AgentImpl::readiesSpares() const {
  return options_.readySpares && options_.inProcessRecovery && options_.warmStart;
}

// On the io_context, told by the rendezvous thread as this node begins to wait as a spare, and
// again once the zygote is ready (it may still import when the node begins to wait).
void AgentImpl::readySpares() {
  if (!spareWaiting_ || !zygote_ || zygote_->state() != Zygote::State::Ready) return;
  if (state_ != State::Joining || liveWorkers() > 0) return;  // kept ones run still
  const int n = options_.nprocPerNode;
  for (int local = 0; local < n; ++local) {
    // The node's variables and the local rank's: no rank, world or store before its place.
    Environment env = zygoteEnvironment(inherited_, n, services_);
    if (hang_)  // the stack hook, which the program reads at its start only
      for (auto& [key, value] : hang_->hookEnvironment(runDir(), env)) env[key] = value;
    env["LOCAL_RANK"] = std::to_string(local);
    env["LOCAL_WORLD_SIZE"] = std::to_string(n);
    env[std::string(recovery::kJoinVariable)] = "1";
    env[std::string(recovery::kReserveVariable)] = "1";
    std::vector<std::string> envp;
    for (const auto& [key, value] : env) envp.push_back(key + "=" + value);
    SpawnRequest request{
        .argv = workerArgv(options_.command, local, options_.localRankFlag,
                           options_.virtualLocalRank ? 0 : local),
        .envp = std::move(envp),
        .nullStdin = true,
    };
    if (!options_.cpuBinding.empty()) request.cpus = options_.cpuBinding.at(local);
    zygote_->reserve(request, local);
  }
  if (!sparesSaid_)
    log::info("waiting as a spare: " + std::to_string(n) +
              " workers start ahead and wait in dlrun.recovery's loop to take a lost node's "
              "ranks (--ready-spares)");
  sparesSaid_ = true;
}

// A round begins on this node: its workers take the places of the ones started ahead only where
// they join the kept workers' recovery in a lost node's place (startSome); otherwise those stop,
// unused.
bool AgentImpl::placesSpares(const rendezvous::World& world) const {
  return world.joinInProcess && readiesSpares();
}

void AgentImpl::sparesBeforeRound(const rendezvous::World& world) {
  spareWaiting_ = false;
  if (zygote_ && !placesSpares(world)) zygote_->dropReserves();
}

}  // namespace dlrun::agents::detail
