#include "launcher/launch.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <csignal>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <optional>
#include <random>
#include <thread>
#include <utility>

#include "agents/agent.h"
#include "agents/torch_probe.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/host_port.h"
#include "common/log.h"
#include "common/signal_name.h"
#include "common/text.h"
#include "control/access.h"
#include "control/control_server.h"
#include "control/job_watch.h"
#include "control/liveness_server.h"
#include "metrics/store_metrics.h"
#include "remote/agent_command.h"
#include "remote/fanout.h"
#include "rendezvous/elastic_rendezvous.h"
#include "rendezvous/etcd/etcd_expiry.h"
#include "rendezvous/etcd/etcd_store.h"
#include "rendezvous/local_rendezvous.h"
#include "store/address.h"
#include "store/store_server.h"
#include "store/tcp_store.h"
#include "store/tcp_stream.h"

namespace dlrun::launcher {
namespace {

constexpr uint16_t kDefaultMasterPort = 29500;  // torchrun's static default
// How long the agent serving the store waits at the end for the others to hang up.
constexpr auto kStoreLinger = std::chrono::seconds(10);

// How long the torch probe may take: a Python start and one read of torch's library, a second
// or less; past this the workers start as before.
constexpr auto kTorchProbeLimit = std::chrono::seconds(15);

// Workers whose torch cannot be a client of the agent's store (or --worker-store=rank0) meet at
// one their rank 0 serves (agents/torch_probe.h), which the agent says as they first start.
void fitTorch(const LaunchConfig& config, agents::AgentOptions& options) {
  std::string why = "--worker-store=rank0";
  if (config.workerStore == WorkerStore::Agent) return;
  if (config.workerStore == WorkerStore::Auto) {
    if (config.workerPython.empty()) return;
    const auto torch = agents::probeTorch(config.workerPython, kTorchProbeLimit);
    if (!torch || !torch->refusesAgentStore()) return;
    why = "torch " + torch->version + " in " + torch->path +
          " was built without libuv, which its clients ask for at dlrun's store";
  }
  options.storeProxy = false;
  const bool recovery = std::exchange(options.inProcessRecovery, false);
  const char* userLibuv = std::getenv("USE_LIBUV");
  options.rankZeroStore =
      why +
      ": rank 0's torch serves the workers' store, at a port of its own each attempt "
      "(TORCHELASTIC_USE_AGENT_STORE=False, " +
      (userLibuv ? std::string("USE_LIBUV=") + userLibuv + " as set" : "USE_LIBUV=0") +
      (config.agent.storeProxy ? "; no store proxy" : "") +
      (recovery ? "; --recovery=in-process needs the agent's store: failures restart "
                  "the whole group"
                : "") +
      ")";
}

std::string hostName() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "unknown-host";
  return name;
}

// The agent's options as the parser filled them, with what this launch path adds.
agents::AgentOptions agentOptions(const LaunchConfig& config, bool servesStore,
                                  std::string nodeName = "") {
  agents::AgentOptions options = config.agent;
  options.servesStore = servesStore;
  options.nodeName = std::move(nodeName);
  options.attemptSpaces = agents::attemptSpacesOverTcp();
  options.quarantine.nodeName = config.nodeName.value_or(hostName());
  return options;
}

// --metrics-port listens where the job is, unless --metrics-host says otherwise: a page that
// shows the job's ranks and hosts is not for every network the machine is on.
void listenWhereTheJobIs(agents::AgentOptions& options, const std::string& address) {
  if (options.metrics && options.metrics->host.empty()) options.metrics->host = address;
}

// Who may connect to a store this launch serves when it knows the job's hosts (--hostfile's
// list, numeric; Slurm's step, by name): those hosts, this machine (at the store's address
// and loopback) and --store-allow's networks; nobody else. Without hosts: --store-allow's rule.
AdmissionRule jobHosts(const LaunchConfig& config, const std::vector<std::string>& hosts,
                       const std::string& self) {
  if (hosts.empty()) return config.storeAllow;
  AdmissionRule rule = config.storeAllow;
  std::vector<std::string> admitted = {self, "127.0.0.1", "::1"};
  for (const std::string& host : hosts) {
    try {
      admitted.push_back(resolveNumeric(host, "the job's host"));
    } catch (const NetworkError& e) {
      log::warn(std::string(e.what()) + "; its agent's connections to the store will be refused");
    }
  }
  for (const std::string& host : admitted)
    if (auto address = AdmissionRule::address(host)) rule.add(*address);
  return rule;
}

using control::StoreConnector;

// Connections to the dlrun store at `store` for the control plane's publisher. Without
// reconnecting: the publisher opens a new one itself after a failure, and its destructor's
// abort() must fail the listener's next call (a reconnecting store would open a fresh
// connection and wait an hour there, holding up the agent's exit whenever the abort came
// between two calls: 1 in about 300 single-node launches of a no-op).
StoreConnector tcpStoreAt(const HostPort& store) {
  return [store] {
    return std::make_unique<TcpStore>(TcpStoreOptions{
        .at = store, .connectTimeout = std::chrono::seconds(5), .reconnect = false});
  };
}

const char* backendName(RdzvBackend backend) {
  switch (backend) {
    case RdzvBackend::Static: return "static";
    case RdzvBackend::C10d: return "c10d";
    case RdzvBackend::Etcd: return "etcd";
  }
  return "?";
}

// What the agent tells the control plane (ARCHITECTURE.md section 10).
agents::ControlOptions controlOptions(const LaunchConfig& config, const std::string& runId,
                                      const std::string& name, const std::string& addr,
                                      StoreConnector connect) {
  return {.runId = runId,
          .meta = {.backend = backendName(config.rdzvBackend),
                   .minNodes = config.minNodes,
                   .maxNodes = config.maxNodes,
                   .maxRestarts = config.restarts.maxRestarts,
                   .tokenHash = config.token.empty() ? "" : control::tokenHash(config.token)},
          .nodeName = name,
          .address = addr,
          .connect = std::move(connect),
          .stragglers = config.stragglers};
}

// torchrun's run id on one node: a fresh one where it picks the store itself (--standalone, or
// no rendezvous flag at all), else --rdzv-id, whose default is "none".
std::string runIdOf(const LaunchConfig& config) {
  const bool ownStore = !config.rdzvEndpoint.given() && !config.masterPort &&
                        config.rdzvBackend != RdzvBackend::Static;
  return config.standalone || (config.rdzvId == "none" && ownStore) ? newRunId() : config.rdzvId;
}

// The whole job's page on this agent's --metrics-port (control/job_watch.h), read from the job's
// store through the control plane's connection. It outlives the agent, whose server calls it.
std::unique_ptr<control::JobWatch> watchJobPage(agents::AgentOptions& agent) {
  if (!agent.metrics || !agent.control) return nullptr;
  control::JobWatchOptions options{.connect = agent.control->connect,
                                   .ownJob = agent.control->runId};
  if (auto stats = agent.metrics->storeStats)
    options.storeJson = [stats] { return metrics::storeJson(stats()); };
  auto watch = std::make_unique<control::JobWatch>(std::move(options));
  agent.metrics->jobApi = [page = watch.get()](std::string_view query) { return page->api(query); };
  return watch;
}

int launchSingleNode(const LaunchConfig& config) {
  agents::AgentOptions options = agentOptions(config, true);
  fitTorch(config, options);
  options.attemptSpaces->close = nullptr;  // the store goes with this process
  agents::checkDescriptors(options);
  const std::string host = config.localAddr.value_or("127.0.0.1");
  // The store runs on its own thread: the agent's thread blocks in rendezvous rounds that
  // talk to this very store. Its port also serves the control plane (built on first use).
  control::StoreWithControl served(
      {.listen = {host, config.masterPort.value_or(0)}, .admission = config.storeAllow});
  const StoreServerThread& store = served.store();
  listenWhereTheJobIs(options, host);
  if (options.metrics) options.metrics->storeStats = [&store] { return store.stats(); };
  const std::string runId = runIdOf(config);
  const std::string name = config.nodeName.value_or(hostName());
  if (config.controlPlane) {
    options.control = controlOptions(config, runId, name, store.address(),
                                     tcpStoreAt({store.address(), store.port()}));
    // The local rendezvous keeps no keys: the job's state comes from its node's own record.
    options.control->meta.backend = control::kLocalBackend;
    // A standalone job's id and port are drawn at random: this line is how to find it.
    options.control->announce = "control plane: dlrun status --rdzv-endpoint=" +
                                joinHostPort(store.address(), store.port()) + " --rdzv-id=" + runId;
  }
  rendezvous::LocalRendezvous rendezvous({
      .runId = runId,
      .localWorldSize = config.agent.nprocPerNode,
      .restarts = config.restarts,
      .store = {store.address(), store.port()},
      .hostAddr = store.address(),
      .nodeName = name,
      .roles = agents::roleNames(config.agent.roles),
  });
  const auto page = watchJobPage(options);
  return agents::Agent(std::move(options), rendezvous).run();
}

struct StorePlan {
  HostPort store;          // as the flags name it, its address resolved
  bool serve = false;      // this agent should try to serve it
  bool mustServe = false;  // and nobody else will
  AdmissionRule allow;     // --store-allow
};

// A host the job's flags name, resolved. A name that does not resolve yet is waited for until
// the rendezvous timeout: in Kubernetes the master's name resolves only once its pod is ready,
// and pods start in any order.
std::string resolveJobHost(const LaunchConfig& config, const std::string& host,
                           const std::string& what) {
  const auto timeout = config.rdzv.joinTimeout;
  return resolveNumericWaiting(host, what, Clock::now() + timeout, [&](const std::string& error) {
    log::warn("waiting for " + what + " '" + host + "' to resolve (" + error +
              "): its host may not be up yet; trying until the rendezvous timeout (" +
              std::to_string(std::chrono::duration_cast<std::chrono::seconds>(timeout).count()) +
              " s)");
  });
}

// The parser has checked the flags and parsed the c10d endpoint; what is left to fail here is
// name resolution.
StorePlan planStore(const LaunchConfig& config) {
  switch (config.rdzvBackend) {
    case RdzvBackend::Static: {
      const bool first = config.nodeRank.value_or(0) == 0;
      return {{config.masterAddr, config.masterPort.value_or(kDefaultMasterPort),
               resolveJobHost(config, config.masterAddr, "--master-addr")},
              first,
              first};
    }
    case RdzvBackend::C10d: {
      StorePlan plan{config.rdzvEndpoint.store()};
      plan.store.address = resolveJobHost(config, plan.store.host, "--rdzv-endpoint host");
      // Every agent on the endpoint's machine tries; the first to bind serves, the others
      // (and a dlrund already listening there) make the rest clients.
      plan.serve = config.rdzv.isHost.value_or(isLocalAddress(plan.store.address));
      return plan;
    }
    case RdzvBackend::Etcd:
      break;  // launchEtcd: etcd is the rendezvous store, and no agent serves it
  }
  throw std::logic_error("planStore: a rendezvous backend without a store plan");
}

// Whether something answers at `at` (a connection that opens, or a failure other than a
// refusal: it cannot be told).
bool answers(const HostPort& at) {
  try {
    TcpStream::connect(at.socketHost(), at.port, Clock::now() + std::chrono::seconds(1));
    return true;
  } catch (const ConnectionRefused&) {
    return false;
  } catch (const Error&) {
    return true;
  }
}

// The store with the control plane on its port (ARCHITECTURE.md section 10), where this agent
// serves the job's store. Every agent on the endpoint's host tries; the first to listen serves.
// Turned away, an agent stands back only once something answers on the port: two agents that
// bind at once (SO_REUSEADDR lets both) can both be turned away at listen(), each seeing the
// other listening for a moment, and a socket bound there without listening blocks both; each
// then waited for a store nobody served, silently until the join timeout. It tries again for up
// to kServeRetry while nothing answers, after short random pauses that break a tie.
std::optional<control::StoreWithControl> serveStore(const StorePlan& plan) {
  if (!plan.serve) return std::nullopt;
  constexpr auto kServeRetry = std::chrono::seconds(5);
  const auto deadline = Clock::now() + kServeRetry;
  std::minstd_rand random;  // seeded at the first refusal: most agents never need it
  for (bool said = false;; said = true) {
    try {
      return std::make_optional<control::StoreWithControl>(
          StoreServerOptions{.listen = plan.store, .admission = plan.allow});
    } catch (const NetworkError& e) {
      if (plan.mustServe)
        throw NetworkError(std::string(e.what()) +
                           "; the store needs a free port: pass another --master-port (under "
                           "Slurm, srun --resv-ports=1 reserves one for the step)");
      if (Clock::now() >= deadline || answers(plan.store)) {
        log::debug(std::string("not serving the store: ") + e.what());
        return std::nullopt;
      }
      if (!said) {
        random.seed(std::random_device{}());
        log::debug("the store's port " + std::to_string(plan.store.port) +
                   " is taken and nothing answers there: trying again to serve the store");
      }
    }
    std::this_thread::sleep_for(std::chrono::microseconds(random() % 5'000));
  }
}

// The job is over for this agent, but others may still be reading the store: give them a
// bounded while to hang up before the store goes away with this process. A terminating signal
// waits too: scancel and Ctrl-C reach the nodes at different times, and this node's, coming
// once its agent had already followed another node's stop, took the store from the nodes still
// reporting theirs (they exited without the job's stop line, or were killed by Slurm later).
void lingerForOthers(const StoreServerThread& store, const LaunchConfig& config) {
  if (store.connectionCount() == 0) return;
  for (const int sig : jobSignals(config.agent.signalsToHandle.value_or(kDefaultStopSignals)))
    ::signal(sig, SIG_IGN);
  log::debug("waiting up to " + std::to_string(kStoreLinger.count()) + " s for " +
             std::to_string(store.connectionCount()) + " connections to the store to close");
  const auto deadline = Clock::now() + kStoreLinger;
  while (store.connectionCount() > 0 && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
}

// This node's address as the others reach it: --local-addr, else the local end of its route
// toward the rendezvous store at host:port.
std::string nodeAddress(const LaunchConfig& config, const std::string& host, uint16_t port) {
  return config.localAddr ? resolveNumeric(*config.localAddr, "--local-addr")
                          : localAddressToward(host, port);
}

rendezvous::ElasticOptions elasticOptions(const LaunchConfig& config, const std::string& addr,
                                          const std::string& name) {
  const bool isStatic = config.rdzvBackend == RdzvBackend::Static;
  return {
      .runId = isStatic && config.rdzvId == "none" ? "static" : config.rdzvId,
      .minNodes = config.minNodes,
      .maxNodes = config.maxNodes,
      .restarts = config.restarts,
      .self = {.addr = addr,
               .name = name,
               .nproc = config.agent.nprocPerNode,
               .rankHint = isStatic ? config.nodeRank.value_or(0) : config.nodeRank,
               .roles = agents::roleNames(config.agent.roles)},
      .lastCall = config.rdzv.lastCall,
      .joinTimeout = config.rdzv.joinTimeout,
      .heartbeat = config.rdzv.heartbeat,
      .leaseTtl = config.rdzv.leaseTtl(),
      .storeOutage = config.rdzv.storeOutage,
      .refuseLostNodes = config.refuseLostNodes,
      .stopOnlyNode = config.rdzv.stopOnlyNode,
  };
}

// etcd's client deadlines: a call not answered within a lease's life is as good as lost (as
// with dlrund), and picking an endpoint is bounded so a dead cluster is one line, not a hang.
constexpr auto kEtcdConnectTimeout = std::chrono::seconds(5);

rendezvous::etcd::EtcdStoreOptions etcdStoreOptions(const LaunchConfig& config) {
  const auto timeout = std::max<std::chrono::milliseconds>(
      config.rdzv.leaseTtl() + config.rdzv.heartbeat, std::chrono::seconds(2));
  return {.client = {.endpoints = config.rdzvEndpoint.etcd(),
                     .timeout = timeout,
                     .connectTimeout = kEtcdConnectTimeout,
                     .outageTimeout = config.rdzv.storeOutage,
                     .security = config.etcdSecurity},
          .prefix = config.rdzv.etcdJobPrefix(config.rdzvId),
          .root = rendezvous::elastic::Keys(config.rdzvId).root(),
          .timeout = timeout};
}

// The newest round of job `runId` in the store (0 before any agent came).
int newestRound(LeasingStore& store, const rendezvous::elastic::Keys& keys) {
  return static_cast<int>(storedCount(store.peek({keys.current()})[0], keys.current()));
}

// How job `runId` ended, as its keys say; nothing while it runs or before it starts. One read
// while the job is in its first round (round 0's end is read with the round number), two after.
std::optional<rendezvous::RoundEnd> jobEnd(LeasingStore& store, const std::string& runId) {
  const rendezvous::elastic::Keys keys(runId);
  auto found = store.peek({keys.current(), keys.stop(), keys.end(0)});
  const auto round = storedCount(found[0], keys.current());
  if (round > 0) found[2] = store.peek({keys.end(static_cast<int>(round))})[0];
  return rendezvous::elastic::endedJob(found[1], found[2]);
}

// Once this agent wrote its last, the keys of a job that ended go on a lease of job_ttl, with
// when (Keys::expiry), so that the id frees then (etcd_expiry.h). Best effort: a failure leaves
// them to the next agent to leave, and costs this one's exit code nothing.
void expireEndedJob(const LaunchConfig& config, rendezvous::etcd::EtcdStore& store) {
  try {
    if (!jobEnd(store, config.rdzvId)) return;  // left alone: the job goes on without this node
    const rendezvous::elastic::Keys keys(config.rdzvId);
    const rendezvous::elastic::Expiry expiry{.endedAt = std::time(nullptr),
                                             .ttl = config.rdzv.jobTtl.count()};
    rendezvous::etcd::expireKeys(store.client(), config.rdzv.etcdJobPrefix(config.rdzvId),
                                 config.rdzv.jobTtl,
                                 {{store.etcdKey(keys.expiry()), encode(expiry)}});
  } catch (const Error& e) {
    log::warn(std::string("could not set the ended job's keys to expire: ") + e.what());
  }
}

// No machine is special: the rendezvous lives in etcd, and every agent serves an idle store for
// workers on its own address; the round's plan names group rank 0's as MASTER_ADDR/MASTER_PORT.
// The control plane too lives in etcd: every agent publishes there, and serves the Control
// service over etcd on its workers' store's port.
int launchEtcd(const LaunchConfig& config) {
  const auto storeOptions = etcdStoreOptions(config);
  // Every store of this agent (the rendezvous's, the control plane's) is a "connection" of its
  // own to etcd, with its own leases and waits, over one channel: etcd and the agent then keep
  // one HTTP/2 connection per agent, not one per store.
  std::shared_ptr<rendezvous::etcd::EtcdClient> client;
  std::string addr;
  {
    // Reached once before anything starts: an unreachable cluster is one line within the
    // connect timeout, where the rendezvous would retry until the join timeout. The address
    // this node reaches etcd from is the one other nodes reach it at (without --local-addr).
    try {
      client = std::make_shared<rendezvous::etcd::EtcdClient>(storeOptions.client);
      const auto& first = config.rdzvEndpoint.etcd().front();
      addr = nodeAddress(config, resolveNumeric(first.host, "--rdzv-endpoint host"), first.port);
    } catch (const NetworkError& e) {
      throw NetworkError(std::string("cannot reach etcd (--rdzv-endpoint): ") + e.what());
    }
  }
  const StoreConnector connectEtcd = [storeOptions, client] {
    return std::make_unique<rendezvous::etcd::EtcdStore>(storeOptions, client);
  };
  agents::checkDescriptors(agentOptions(config, true));
  control::StoreWithControl workerStore({.listen = {addr, 0}, .admission = config.storeAllow},
                                        connectEtcd);
  const std::string name = config.nodeName.value_or(hostName());
  rendezvous::ElasticOptions options = elasticOptions(config, addr, name);
  // etcd, not an agent, is the rendezvous store
  options.store = rendezvous::StoreOpener{
      .name = rendezvous::etcd::describe(config.rdzvEndpoint.etcd()), .open = connectEtcd};
  options.endedJobKeys = "etcd under " + config.rdzv.etcdPrefix + config.rdzvId + "/";
  options.self.storePort = workerStore.store().port();
  agents::AgentOptions agent = agentOptions(config, true, name + " (" + addr + ")");
  fitTorch(config, agent);
  listenWhereTheJobIs(agent, addr);
  agent.watchStoreHost = true;
  // The workers' store goes with the agent serving it (others find nothing to close there).
  agent.attemptSpaces->close = nullptr;
  if (config.controlPlane) {
    auto observing = storeOptions;
    observing.fireLapses = false;  // it holds no lease; the rendezvous's stores fire lapses
    agent.control = controlOptions(config, config.rdzvId, name, addr, [observing, client] {
      return std::make_unique<rendezvous::etcd::EtcdStore>(observing, client);
    });
  }
  int code;
  {
    rendezvous::ElasticRendezvous rendezvous(std::move(options));
    const auto page = watchJobPage(agent);
    code = agents::Agent(std::move(agent), rendezvous).run();
  }
  {
    rendezvous::etcd::EtcdStore store(storeOptions, client);
    expireEndedJob(config, store);
  }
  // This node may have served the last round's workers; others may still be hanging up.
  lingerForOthers(workerStore.store(), config);
  return code;
}

// --hostfile/--hosts: one agent per host over ssh (remote/fanout.h). Unless the user named a
// rendezvous, this process serves its c10d store, at its address toward the first remote host,
// on a free port, and reads the job's progress and end there.
int launchHosts(const LaunchConfig& config) {
  const HostLaunch& hosts = *config.hostLaunch;
  const std::vector<std::string>& addresses = hosts.addresses;
  remote::RemoteJob job{.dlrun = std::filesystem::read_symlink("/proc/self/exe").string(),
                        .workDir = std::filesystem::current_path().string(),
                        .env = remote::forwardedEnvironment(agents::currentEnvironment(),
                                                            hosts.exports, hosts.exportAll),
                        .flags = hosts.agentFlags,
                        .nodes = static_cast<int>(hosts.hosts.size()),
                        .nproc = hosts.nproc,
                        .backend = hosts.backend,
                        .endpoint = config.rdzvEndpoint.text,
                        .rdzvId = config.rdzvId == "none" ? newRunId() : config.rdzvId,
                        .rdzvConf = hosts.rdzvConf,
                        .entry = hosts.entry};
  const bool serve = hosts.backend.empty() && !config.rdzvEndpoint.given();
  std::optional<control::StoreWithControl> store;
  std::unique_ptr<TcpStore> client;  // this process's own view of the job
  remote::FanoutOptions options{
      .stopTimeout = config.agent.stopTimeout,
      .stopSignals = config.agent.signalsToHandle.value_or(kDefaultStopSignals)};
  if (serve) {
    auto remote = std::find_if(addresses.begin(), addresses.end(),
                               [](const std::string& a) { return !isLocalAddress(a); });
    const std::string addr = remote == addresses.end()
                                 ? addresses.front()
                                 : localAddressToward(*remote, hosts.sshPort.value_or(22));
    store.emplace(
        StoreServerOptions{.listen = {addr, 0}, .admission = jobHosts(config, addresses, addr)});
    job.backend = "c10d";
    job.endpoint = joinHostPort(addr, store->store().port());
    // The agents' machines may own the address too (a host of the list is this one).
    job.rdzvConf += std::string(job.rdzvConf.empty() ? "" : ",") + "is_host=false";
    client = std::make_unique<TcpStore>(TcpStoreOptions{.at = {addr, store->store().port()}});
    const rendezvous::elastic::Keys keys(job.rdzvId);
    options.workersStarted = [&client, keys] {
      const int round = newestRound(*client, keys);
      return round > 0 || !client->peek({keys.closed(round)})[0].empty();
    };
    options.outcome = [&client, id = job.rdzvId] { return jobEnd(*client, id); };
  }
  for (size_t i = 0; i < hosts.hosts.size(); ++i) {
    const remote::Host& host = hosts.hosts[i];
    options.nodes.push_back(
        {.host = host.name,
         .where = host.where,
         .argv = remote::sshArgv(hosts.sshCommand, hosts.sshPort, host.name,
                                 remote::agentCommand(job, static_cast<int>(i), host.slots))});
  }
  return remote::runFanout(options);
}

int launchMultiNode(const LaunchConfig& config) {
  if (config.rdzvBackend == RdzvBackend::Etcd) return launchEtcd(config);
  StorePlan plan = planStore(config);
  if (plan.serve) plan.allow = jobHosts(config, config.jobHosts, plan.store.address);
  // Before joining: a node that cannot start its workers must not hold the others up.
  agents::checkDescriptors(agentOptions(config, plan.serve));
  auto store = serveStore(plan);
  const std::string addr = nodeAddress(config, plan.store.address, plan.store.port);
  const std::string name = config.nodeName.value_or(hostName());
  int code;
  {
    rendezvous::ElasticOptions options = elasticOptions(config, addr, name);
    options.store = plan.store;
    agents::AgentOptions agent = agentOptions(config, store.has_value(), name + " (" + addr + ")");
    fitTorch(config, agent);
    listenWhereTheJobIs(agent, addr);
    if (agent.metrics && store)
      agent.metrics->storeStats = [&store] { return store->store().stats(); };
    if (config.controlPlane)
      agent.control =
          controlOptions(config, options.runId, name, addr, tcpStoreAt(plan.store.named()));
    const auto page = watchJobPage(agent);
    rendezvous::ElasticRendezvous rendezvous(std::move(options));
    code = agents::Agent(std::move(agent), rendezvous).run();
  }
  if (store) lingerForOthers(store->store(), config);
  return code;
}

// torchrun's TORCHELASTIC_HEALTH_CHECK_PORT (the parser read it): a plain liveness answer
// while this agent runs (control/liveness_server.h). A port already taken (another agent on this
// host answers there) costs a warning, not the job.
std::optional<control::LivenessServer> serveLiveness(std::optional<uint16_t> port) {
  if (!port) return std::nullopt;
  try {
    return std::make_optional<control::LivenessServer>("0.0.0.0", *port);
  } catch (const NetworkError& e) {
    log::warn(std::string(e.what()) + "; going on without it");
    return std::nullopt;
  }
}

}  // namespace

std::string newRunId() {
  // A random UUID (version 4), as torchrun's uuid.uuid4(): 8-4-4-4-12 hex digits.
  std::random_device random;
  std::array<uint8_t, 16> bytes{};
  for (auto& byte : bytes) byte = static_cast<uint8_t>(random());
  bytes[6] = static_cast<uint8_t>((bytes[6] & 0x0f) | 0x40);
  bytes[8] = static_cast<uint8_t>((bytes[8] & 0x3f) | 0x80);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id;
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) id += '-';
    id += kHex[bytes[i] >> 4];
    id += kHex[bytes[i] & 0x0f];
  }
  return id;
}

int launch(const LaunchConfig& config) {
  const auto liveness = serveLiveness(config.healthCheckPort);
  if (config.hostLaunch) return launchHosts(config);
  return config.singleNode() ? launchSingleNode(config) : launchMultiNode(config);
}

}  // namespace dlrun::launcher
