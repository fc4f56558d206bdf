// Everything one dlrun invocation was asked to do, parsed once from flags and PET_* variables
// and never changed afterwards. Downstream parts (rendezvous, agent) read it; nothing writes it.
// The parser checks every rule it can without the network, so a LaunchConfig that exists is
// valid: what is left to fail later is name resolution and binding.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "agents/agent.h"
#include "common/host_port.h"
#include "remote/hostfile.h"
#include "rendezvous/etcd/endpoints.h"
#include "rendezvous/round_end.h"
#include "store/admission.h"

namespace dlrun::launcher {

// --rdzv-conf settings of the multi-node rendezvous (torchrun's names where it has them).
struct RdzvSettings {
  std::chrono::milliseconds joinTimeout{600'000};  // join_timeout: too few nodes for this long
  std::chrono::milliseconds lastCall{1'000};       // last_call_timeout: after MIN have joined
  std::chrono::milliseconds heartbeat{1'000};      // keep_alive_interval
  int keepAliveMaxAttempt = 3;  // keep_alive_max_attempt: silent heartbeats before a node is dead
  // heartbeat_timeout: how long a silent node lives, where given (else the two above's product)
  std::optional<std::chrono::milliseconds> heartbeatTimeout;
  // store_outage_timeout: how long the rendezvous store may be away before a node gives up
  // its round (its workers run on meanwhile)
  std::chrono::milliseconds storeOutage{60'000};
  std::optional<bool> isHost;  // is_host: whether this agent serves the store at the endpoint
  // stop_policy: a deliberate stop (SIGINT, SIGTERM, SIGHUP) of one node stops the whole job,
  // or only that node leaves (the others go on while at least MIN remain)
  bool stopOnlyNode = false;
  // etcd_prefix: the etcd backend keeps a job's keys under this + the job id + "/"
  std::string etcdPrefix = "/dlrun/";
  std::string etcdJobPrefix(const std::string& jobId) const { return etcdPrefix + jobId + "/"; }
  // job_ttl: how long an ended job's keys stay in etcd (its id is refused meanwhile); c10d's
  // store holds no TTL, so there it means nothing
  std::chrono::seconds jobTtl{3'600};
  // cacert, cert, key (PEM paths), user, password, password_file: etcd's TLS and authentication,
  // read by etcdSecurity() once the backend is known (they mean nothing to another backend)
  std::string etcdCaCert, etcdCert, etcdKey, etcdUser, etcdPassword, etcdPasswordFile;
  bool etcdSecurityGiven() const {
    return !etcdCaCert.empty() || !etcdCert.empty() || !etcdKey.empty() || !etcdUser.empty() ||
           !etcdPassword.empty() || !etcdPasswordFile.empty();
  }
  std::chrono::milliseconds leaseTtl() const {
    return heartbeatTimeout.value_or(heartbeat * keepAliveMaxAttempt);
  }
};

// How the nodes of a multi-node job find each other (the parser picks it from --rdzv-backend,
// --master-addr/--master-port, --standalone and Slurm; one node needs neither).
// --worker-store: where torch workers meet (agents/torch_probe.h).
enum class WorkerStore {
  Auto,      // dlrun's store, unless the workers' torch cannot be its client (no libuv)
  Agent,     // dlrun's store
  RankZero,  // a store rank 0's torch serves
};

enum class RdzvBackend {
  Static,  // torchrun's classic launch: a fixed world, the store on --master-addr, ranks given
  C10d,    // the elastic rendezvous on the store at --rdzv-endpoint (set, or derived from Slurm)
  Etcd,    // the same elastic rendezvous on an etcd v3 cluster: no node serves it; the workers'
           // store is served by each round's group rank 0
};

// --hostfile or --hosts: this dlrun starts one agent per host over ssh and runs no worker itself.
struct HostLaunch {
  std::vector<remote::Host> hosts;
  std::vector<std::string> addresses;          // each host's numeric address, in hosts' order
  std::vector<std::string> sshCommand{"ssh"};  // --ssh-command, split into words
  std::optional<uint16_t> sshPort;             // --ssh-port
  std::vector<std::string> exports;            // --export VAR (or VAR=VALUE), repeatable
  bool exportAll = false;                      // --export-all
  std::vector<std::string> agentFlags;  // this command line's flags that the agents get as they are
  std::string nproc;     // --nproc-per-node as given (each host evaluates it); empty: the slots
  std::string backend;   // --rdzv-backend as given; empty: c10d on a store this dlrun serves
  std::string rdzvConf;  // --rdzv-conf as given
  std::vector<std::string> entry;  // the entry point and its arguments, as given
};

// torchrun's --rdzv-endpoint port, where the endpoint names none (the launch and `dlrun status`).
inline constexpr uint16_t kDefaultRdzvPort = 29400;

// Where the nodes meet, as --rdzv-endpoint (else DLRUN_ETCD_ENDPOINTS, Slurm or mpirun) names
// it: parsed once, by the parser, into the backend's form, and read as that form downstream.
struct RdzvEndpoint {
  std::string text;  // as given: for messages, and for the agents a --hostfile launch starts
  // None where no endpoint is given. Etcd: the cluster's endpoints. Any other backend: the
  // c10d store, kDefaultRdzvPort where the text names no port (only launch() resolves it).
  std::variant<std::monostate, HostPort, std::vector<rendezvous::etcd::Endpoint>> where;

  bool given() const { return !text.empty(); }
  const HostPort& store() const { return std::get<HostPort>(where); }
  const std::vector<rendezvous::etcd::Endpoint>& etcd() const {
    return std::get<std::vector<rendezvous::etcd::Endpoint>>(where);
  }
};

struct LaunchConfig {
  int minNodes = 1;
  int maxNodes = 1;
  std::optional<int> nodeRank;  // --node-rank: the static rank, or a group-rank hint
  RdzvBackend rdzvBackend = RdzvBackend::C10d;
  // Given on several nodes, except where a --hostfile launch serves the store itself.
  RdzvEndpoint rdzvEndpoint;
  // Etcd: TLS (the PEM files' contents) and user/password, from --rdzv-conf.
  rendezvous::etcd::EtcdSecurity etcdSecurity;
  std::string rdzvId = "none";
  RdzvSettings rdzv;  // from --rdzv-conf
  bool standalone = false;
  rendezvous::RestartPolicy restarts;  // --max-restarts
  // What the flags ask of this node's agent: the workers' command, count, roles, output, stop
  // and signals, hang watch and metrics. What only launch() learns (whether this node serves
  // the store, its address in messages, the control plane's connection, the store host's
  // watch) it adds to its own copy.
  agents::AgentOptions agent;
  bool controlPlane = true;           // publish to the control plane (--no-control-plane: not)
  control::StragglerRule stragglers;  // --straggler-fraction, --straggler-window
  std::optional<uint16_t> healthCheckPort;  // TORCHELASTIC_HEALTH_CHECK_PORT: liveness answers
  std::string token;                        // --token-file or DLRUN_TOKEN; empty: none
  std::optional<std::string> localAddr;
  std::optional<std::string> nodeName;  // this node in messages (SLURMD_NODENAME), else hostname
  bool refuseLostNodes = false;         // in a Slurm allocation a lost node's place goes to a spare
  std::string masterAddr = "127.0.0.1";
  std::optional<uint16_t> masterPort;  // unset: a free port on the single-node path

  // --store-allow: who may connect to a store this launch serves (the networks given, and
  // loopback); empty: anyone
  AdmissionRule storeAllow;
  // The job's hosts by name where the scheduler says (Slurm's step): a store this launch serves
  // admits them too, and then only them (with storeAllow and this machine).
  std::vector<std::string> jobHosts;

  std::optional<HostLaunch> hostLaunch;  // --hostfile, --hosts
  // As the user wrote it, for messages; agent.command is the resolved command, its argv[0] an
  // absolute path or a name on PATH.
  std::string entrypoint;
  // agent.command's interpreter when the workers run Python (empty otherwise): launch() asks it
  // what its torch needs of the store (launcher/torch_probe.h).
  std::string workerPython;
  WorkerStore workerStore = WorkerStore::Auto;

  bool singleNode() const { return maxNodes == 1; }
};

}  // namespace dlrun::launcher
