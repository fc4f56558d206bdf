// Workers started ahead (agent.md, In-process recovery): forked from the zygote, they run the
// program until it makes dlrun.recovery's loop, which waits for their place
// (python/dlrun/_reserve.py).
// --ready-spares: while this node waits as a spare. A round that puts this node in a lost node's
// place hands each its worker's launch (startSome); any other round stops them and starts its
// own.
// --ready-replacements: while a round runs, one for each local rank, with the environment its
// replacement gets; a failed worker's replacement takes its place (restartAlone), and another is
// started ahead kReplacementDelay later. The next round stops them (sparesBeforeRound).
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

bool AgentImpl::readiesReplacements() const {
  return options_.readyReplacements && options_.inProcessRecovery && options_.warmStart;
}

void AgentImpl::readyReplacementsLater(int local) {
  if (!readiesReplacements()) return;
  if (local >= 0) {
    replacementsDue_.insert(local);
  } else {
    replacementsDue_.clear();
    for (int l = 0; l < options_.nprocPerNode; ++l) replacementsDue_.insert(l);
  }
  replacementTimer_.expires_after(kReplacementDelay);
  replacementTimer_.async_wait([this, attempt = attempt_](const boost::system::error_code& ec) {
    if (!ec) readyReplacements(attempt);
  });
}

// Not for a node whose ranks a round renumbered or kept (a failed worker restarts the whole
// group there, or carries what the keep said), nor for an `alone` role's or a service's worker
// (no recovery loop to wait in).
void AgentImpl::readyReplacements(uint64_t attempt) {
  if (attempt != attempt_ || state_ != State::Running || starting_ || renumbered_ || kept_) return;
  if (!zygote_ || zygote_->state() != Zygote::State::Ready || !environment_) return;
  const fs::path dir = attemptDir();
  for (const int local : std::exchange(replacementsDue_, {})) {
    if (const RoleSpec* role = roleOf(local); role != nullptr && (role->alone || role->service))
      continue;
    WorkerLaunch launch = launchOf(dir, local);
    std::vector<std::string> envp = replacementEnvironment(local, launch.errorFile);
    envp.push_back(std::string(recovery::kReserveVariable) + "=1");
    SpawnRequest request{.argv = std::move(launch.argv),
                         .envp = std::move(envp),
                         .sharedEnvp = environment_->shared(),
                         .nullStdin = true,
                         .cpus = launch.cpus};
    zygote_->reserve(request, local);
  }
}

}  // namespace dlrun::agents::detail
