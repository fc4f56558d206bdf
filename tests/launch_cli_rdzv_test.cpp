// The dlrun command line's rendezvous: --rdzv-conf and the settings read from it, the store's
// flags, the backend each set of flags picks, spares started ahead, and etcd's endpoints, TLS and
// authentication; with the fake HostProbe of launch_cli_testing.h.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "launcher/launch_cli.h"
#include "tests/launch_cli_testing.h"

namespace dlrun::launcher {
namespace {

// --- parseRdzvConf -----------------------------------------------------------------------

TEST(ParseRdzvConf, KeyValuePairs) {
  EXPECT_TRUE(parseRdzvConf("").empty());
  auto conf = parseRdzvConf("timeout=900,join_timeout=30,url=a=b");
  EXPECT_EQ(conf.size(), 3u);
  EXPECT_EQ(conf["timeout"], "900");
  EXPECT_EQ(conf["join_timeout"], "30");
  EXPECT_EQ(conf["url"], "a=b");  // only the first '=' separates
}

TEST(ParseRdzvConf, RejectsMalformedItems) {
  for (const std::string value : {"timeout", "=5", "a=1,,b=2", "a=1,b", ","}) {
    SCOPED_TRACE(value);
    const std::string message = configError([&] { parseRdzvConf(value); });
    EXPECT_TRUE(contains(message, "--rdzv-conf")) << message;
  }
}

// --- parseRdzvSettings -------------------------------------------------------------------

TEST(ParseRdzvSettings, DefaultsDetectALostNodeWithinThreeSeconds) {
  const RdzvSettings s = parseRdzvSettings({});
  EXPECT_EQ(s.heartbeat, std::chrono::seconds(1));
  EXPECT_EQ(s.leaseTtl(), std::chrono::seconds(3));
  EXPECT_EQ(s.lastCall, std::chrono::seconds(1));
  EXPECT_FALSE(s.isHost);
  EXPECT_FALSE(s.stopOnlyNode);
}

TEST(ParseRdzvSettings, HeartbeatTimeoutAndStoreTypeAsTorchrunReadsThem) {
  const RdzvSettings s = parseRdzvSettings({{"heartbeat_timeout", "10"}, {"store_type", "tcp"}});
  EXPECT_EQ(s.leaseTtl(), std::chrono::seconds(10));  // in place of interval x attempts
  const std::string file = configError([] { parseRdzvSettings({{"store_type", "file"}}); });
  EXPECT_TRUE(contains(file, "store_type=file") && contains(file, "TCP only")) << file;
  const std::string shorter = configError([] {
    parseRdzvSettings({{"heartbeat_timeout", "1"}, {"keep_alive_interval", "2"}});
  });
  EXPECT_TRUE(contains(shorter, "heartbeat_timeout must be longer")) << shorter;
}

TEST(ParseRdzvSettings, StoreOutageTimeoutIsAMinuteUnlessSet) {
  EXPECT_EQ(parseRdzvSettings({}).storeOutage, std::chrono::seconds(60));
  EXPECT_EQ(parseRdzvSettings({{"store_outage_timeout", "2.5"}}).storeOutage,
            std::chrono::milliseconds(2500));
  const std::string bad = configError([] { parseRdzvSettings({{"store_outage_timeout", "-1"}}); });
  EXPECT_TRUE(contains(bad, "store_outage_timeout=-1")) << bad;
}

TEST(ParseRdzvSettings, TorchrunKeys) {
  const RdzvSettings s = parseRdzvSettings({{"join_timeout", "30"},
                                            {"last_call_timeout", "0.5"},
                                            {"keep_alive_interval", "0.25"},
                                            {"keep_alive_max_attempt", "4"},
                                            {"is_host", "true"},
                                            {"stop_policy", "node"},
                                            {"read_timeout", "60"}});
  EXPECT_EQ(s.joinTimeout, std::chrono::seconds(30));
  EXPECT_EQ(s.lastCall, std::chrono::milliseconds(500));
  EXPECT_EQ(s.leaseTtl(), std::chrono::seconds(1));
  EXPECT_EQ(s.isHost, true);
  EXPECT_TRUE(s.stopOnlyNode);
  // torch's boolean spellings; use_libuv (torch 2.x) is checked and means nothing here.
  EXPECT_EQ(parseRdzvSettings({{"is_host", "No"}}).isHost, false);
  EXPECT_EQ(parseRdzvSettings({{"is_host", "y"}, {"use_libuv", "0"}}).isHost, true);
  EXPECT_FALSE(parseRdzvSettings({{"use_libuv", "True"}}).isHost);
}

TEST(ParseRdzvSettings, TimeoutsArePositiveSecondsAndTheRefusalSaysSo) {
  EXPECT_EQ(parseRdzvSettings({{"last_call_timeout", "0.5"}}).lastCall,
            std::chrono::milliseconds(500));
  for (const char* value : {"0", "-2", "86401", "nan"}) {
    SCOPED_TRACE(value);
    EXPECT_EQ(configError([&] {
                parseRdzvSettings({{"last_call_timeout", value}});
              }),
              std::string("--rdzv-conf: last_call_timeout=") + value +
                  " is not a number of seconds above 0 and at most 86400");
  }
}

// Under a millisecond a setting would be 0 ms, and the rendezvous would spin on it.
TEST(ParseRdzvSettings, ASettingUnderAMillisecondIsRefusedInOneLine) {
  for (const char* key : {"join_timeout", "last_call_timeout", "keep_alive_interval",
                          "heartbeat_timeout", "store_outage_timeout"}) {
    SCOPED_TRACE(key);
    EXPECT_EQ(configError([&] {
                parseRdzvSettings({{key, "0.0004"}});
              }),
              std::string("--rdzv-conf: ") + key +
                  "=0.0004 is under a millisecond: give at least 0.001 (seconds)");
  }
  EXPECT_EQ(parseRdzvSettings({{"keep_alive_interval", "0.001"}}).heartbeat,
            std::chrono::milliseconds(1));
}

TEST(ParseRdzvSettings, JobTtlIsWholeSecondsAnHourByDefault) {
  EXPECT_EQ(parseRdzvSettings({}).jobTtl, std::chrono::hours(1));
  EXPECT_EQ(parseRdzvSettings({{"job_ttl", "5"}}).jobTtl, std::chrono::seconds(5));
  EXPECT_EQ(parseRdzvSettings({{"job_ttl", "2592000"}}).jobTtl, std::chrono::days(30));
  for (const char* value : {"0", "-1", "1.5", "2592001", "soon", ""}) {
    SCOPED_TRACE(value);
    EXPECT_EQ(configError([&] {
                parseRdzvSettings({{"job_ttl", value}});
              }),
              std::string("--rdzv-conf: job_ttl=") + value +
                  " is not a whole number of seconds from 1 to 2592000 (30 days)");
  }
}

TEST(ParseRdzvSettings, BadValuesNameTheKey) {
  for (const auto& [key, value] :
       std::vector<std::pair<std::string, std::string>>{{"join_timeout", "-1"},
                                                        {"last_call_timeout", "soon"},
                                                        {"keep_alive_max_attempt", "0"},
                                                        {"is_host", "maybe"},
                                                        {"stop_policy", "all"},
                                                        {"use_libuv", "sometimes"},
                                                        {"lease", "3"}}) {
    try {
      parseRdzvSettings({{key, value}});
      FAIL() << key << "=" << value << " was accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  }
}

// --- parseDlrunArgs: the store and the nodes ---------------------------------------------

TEST(ParseDlrunArgs, StoreProxyIsOnFromSixtyFourWorkersOrAsAsked) {
  EXPECT_FALSE(parse({"--nproc-per-node=63", "env"}).agent.storeProxy);
  EXPECT_TRUE(parse({"--nproc-per-node=64", "env"}).agent.storeProxy);
  EXPECT_TRUE(parse({"--store-proxy=on", "env"}).agent.storeProxy);
  EXPECT_FALSE(parse({"--store-proxy=off", "--nproc-per-node=64", "env"}).agent.storeProxy);
  const std::string message = configError([] { parse({"--store-proxy=yes", "env"}); });
  EXPECT_TRUE(contains(message, "--store-proxy: 'yes'")) << message;
}

TEST(ParseDlrunArgs, StoreAllowAdmitsItsNetworksAndLoopback) {
  EXPECT_TRUE(parse({"env"}).storeAllow.empty());
  const AdmissionRule rule = parse({"--store-allow=10.9.0.0/16,fd00::/8", "env"}).storeAllow;
  for (const char* admitted : {"10.9.3.4", "fd00::1", "127.0.0.1", "::1"})
    EXPECT_TRUE(rule.allows(*AdmissionRule::address(admitted))) << admitted;
  for (const char* refused : {"10.8.0.1", "127.0.0.2", "192.0.2.1"})
    EXPECT_FALSE(rule.allows(*AdmissionRule::address(refused))) << refused;
  const std::string message = configError([] { parse({"--store-allow=node1", "env"}); });
  EXPECT_TRUE(contains(message, "--store-allow")) << message;
}

TEST(ParseDlrunArgs, StandaloneUsesItsOwnStore) {
  auto c = parse({"--standalone", "--nproc-per-node=4", "env"});
  EXPECT_TRUE(c.standalone);
  EXPECT_EQ(c.rdzvBackend, RdzvBackend::C10d);
  EXPECT_TRUE(c.singleNode());
}

TEST(ParseDlrunArgs, NodeRankAndNnodes) {
  auto c =
      parse({"--nnodes=2:4", "--rdzv-backend=c10d", "--rdzv-endpoint=h:1", "--node-rank=3", "env"});
  EXPECT_EQ(c.minNodes, 2);
  EXPECT_EQ(c.maxNodes, 4);
  EXPECT_EQ(c.nodeRank, 3);
  EXPECT_FALSE(c.singleNode());
}

// HOST:PORT with a port that is not a number is bad input even on one node (torchrun refuses
// it too), not something to ignore until a multi-node run trips over it.
TEST(ParseDlrunArgs, RdzvEndpointWithANonNumericPortIsRejected) {
  for (const std::string endpoint : {"127.0.0.1:abc", "host:", "[::1]:x", "h:70000"}) {
    SCOPED_TRACE(endpoint);
    const std::string message = configError([&] {
      parse({"--rdzv-backend=c10d", "--rdzv-endpoint=" + endpoint, "env"});
    });
    EXPECT_TRUE(contains(message, "--rdzv-endpoint")) << message;
  }
  // Host alone, host:port and bracketed IPv6 are fine.
  for (const std::string endpoint : {"127.0.0.1", "127.0.0.1:29400", "node1:29400", "[::1]:29400"})
    EXPECT_EQ(
        parse({"--rdzv-backend=c10d", "--rdzv-endpoint=" + endpoint, "env"}).rdzvEndpoint.text,
        endpoint);
  // Without a port, torchrun's.
  EXPECT_EQ(parse({"--nnodes=2", "--rdzv-endpoint=[::1]", "env"}).rdzvEndpoint.store(),
            (HostPort{"::1", kDefaultRdzvPort}));
}

// --- parseDlrunArgs: the rendezvous backend ----------------------------------------------

TEST(ParseRdzvBackend, TheSpellingsDlrunHas) {
  EXPECT_EQ(parseRdzvBackend("static").backend, RdzvBackend::Static);
  EXPECT_FALSE(parseRdzvBackend("static").slurm);
  EXPECT_EQ(parseRdzvBackend("c10d").backend, RdzvBackend::C10d);
  EXPECT_FALSE(parseRdzvBackend("c10d").slurm);
  EXPECT_EQ(parseRdzvBackend("slurm").backend, RdzvBackend::C10d);
  EXPECT_TRUE(parseRdzvBackend("slurm").slurm);
  EXPECT_EQ(parseRdzvBackend("etcd").backend, RdzvBackend::Etcd);
  EXPECT_EQ(parseRdzvBackend("etcd-v3").backend, RdzvBackend::Etcd);
  EXPECT_FALSE(parseRdzvBackend("etcd").slurm);
  for (const std::string value : {"", "C10D", "bogus", "etcd2"}) {
    SCOPED_TRACE(value);
    const std::string message = configError([&] { parseRdzvBackend(value); });
    EXPECT_TRUE(contains(message, "--rdzv-backend")) << message;
  }
}

// torchrun's etcd-v2 backend is refused when the flags are read, not when the nodes meet.
TEST(ParseDlrunArgs, EtcdV2IsRefusedAtParseTime) {
  for (const Args& args :
       {Args{"--rdzv-backend=etcd-v2", "env"},
        Args{"--nnodes=2", "--rdzv-backend=etcd-v2", "--rdzv-endpoint=h:1", "env"}}) {
    const std::string message = configError([&] { parse(args); });
    EXPECT_EQ(message,
              "--rdzv-backend=etcd-v2: dlrun speaks etcd's v3 API; use "
              "--rdzv-backend=etcd");
  }
  ScopedEnv backend("PET_RDZV_BACKEND", "etcd-v2");
  EXPECT_TRUE(contains(configError([] { parse({"env"}); }), "--rdzv-backend=etcd-v2"));
}

TEST(ParseDlrunArgs, BackendDefaultsToC10dUnlessTheClassicStaticFlagsAreGiven) {
  EXPECT_EQ(parse({"env"}).rdzvBackend, RdzvBackend::C10d);
  EXPECT_EQ(parse({"--nnodes=2", "--rdzv-endpoint=h:1", "env"}).rdzvBackend, RdzvBackend::C10d);
  EXPECT_EQ(parse({"--nnodes=2", "--master-addr=h", "env"}).rdzvBackend, RdzvBackend::Static);
  EXPECT_EQ(parse({"--nnodes=2", "--master-port=5", "--node-rank=1", "env"}).rdzvBackend,
            RdzvBackend::Static);
  EXPECT_EQ(parse({"--master-addr=h", "env"}).rdzvBackend, RdzvBackend::Static);
  // An endpoint means the elastic rendezvous even beside the static flags.
  EXPECT_EQ(parse({"--nnodes=2", "--master-addr=h", "--rdzv-endpoint=h:1", "env"}).rdzvBackend,
            RdzvBackend::C10d);
  {
    ScopedEnv port("PET_MASTER_PORT", "5");  // a PET_ variable counts as given
    EXPECT_EQ(parse({"--nnodes=2", "env"}).rdzvBackend, RdzvBackend::Static);
  }
}

TEST(ParseDlrunArgs, AnExplicitBackendWins) {
  EXPECT_EQ(
      parse({"--nnodes=2", "--master-addr=h", "--rdzv-backend=c10d", "--rdzv-endpoint=h:1", "env"})
          .rdzvBackend,
      RdzvBackend::C10d);
  EXPECT_EQ(
      parse({"--nnodes=2", "--rdzv-backend=static", "--rdzv-endpoint=h:1", "env"}).rdzvBackend,
      RdzvBackend::Static);
  EXPECT_EQ(parse({"--rdzv_backend=static", "env"}).rdzvBackend, RdzvBackend::Static);
  // --standalone serves its own store, whatever the backend says.
  EXPECT_EQ(parse({"--standalone", "--rdzv-backend=static", "env"}).rdzvBackend, RdzvBackend::C10d);
}

// A c10d job of several nodes needs a store every node reaches: refused when the flags are
// read, before any worker or network.
TEST(ParseDlrunArgs, SeveralC10dNodesNeedAnEndpoint) {
  for (const Args& args : {Args{"--nnodes=2", "env"}, Args{"--nnodes=1:3", "env"},
                           Args{"--nnodes=2", "--rdzv-backend=c10d", "--master-addr=h", "env"}}) {
    SCOPED_TRACE(args.front());
    const std::string message = configError([&] { parse(args); });
    EXPECT_TRUE(contains(message, "--rdzv-endpoint")) << message;
    EXPECT_TRUE(contains(message, args.front())) << message;
    EXPECT_FALSE(contains(message, "\n")) << message;
  }
  EXPECT_TRUE(parse({"--rdzv-backend=c10d", "env"}).singleNode());  // one node: its own store
}

TEST(ParseDlrunArgs, ANetworkProbeThatCouldOutlastTheNodesLeaseIsRefused) {
  // The probe holds the thread whose requests keep the node's lease (3 s unless set): it must
  // end a heartbeat before the lease lapses, or the node is taken for lost every round.
  const Args c10d{"--nnodes=2", "--rdzv-endpoint=h:29400"};
  auto with = [&](Args more) {
    Args args = c10d;
    args.insert(args.end(), more.begin(), more.end());
    args.push_back("env");
    return args;
  };
  const std::string message = configError([&] { parse(with({"--network-probe-timeout=6"})); });
  EXPECT_EQ(message,
            "--network-probe-timeout 6 s does not end a heartbeat (1 s) before the node's "
            "rendezvous lease of 3 s lapses: lower it, or raise --rdzv-conf heartbeat_timeout");
  EXPECT_TRUE(parse(with({"--network-probe-timeout=2"})).agent.networkProbe);  // the default's
  EXPECT_TRUE(parse(with({"--network-probe-timeout=6", "--rdzv-conf=heartbeat_timeout=7"}))
                  .agent.networkProbe);
  EXPECT_FALSE(parse(with({"--network-probe-timeout=6", "--no-network-probe"})).agent.networkProbe);
  EXPECT_NO_THROW(parse({"--network-probe-timeout=6", "env"}));  // one node: no lease
}

// --- the etcd backend ------------------------------------------------------------------------

TEST(ParseDlrunArgs, EtcdTakesAnEndpointListWithEtcdsDefaultPort) {
  const auto c = parse({"--nnodes=2:3", "--rdzv-backend=etcd",
                        "--rdzv-endpoint=e1,10.0.0.2:2380,[fd00::3]", "--rdzv-id=j", "env"});
  EXPECT_EQ(c.rdzvBackend, RdzvBackend::Etcd);
  using rendezvous::etcd::Endpoint;
  EXPECT_EQ(c.rdzvEndpoint.etcd(),
            (std::vector<Endpoint>{{"e1", 2379}, {"10.0.0.2", 2380}, {"fd00::3", 2379}}));
  EXPECT_EQ(c.rdzv.etcdPrefix, "/dlrun/");
  EXPECT_EQ(c.minNodes, 2);
  EXPECT_EQ(
      parse({"--nnodes=2", "--rdzv-backend=etcd-v3", "--rdzv-endpoint=e1", "env"}).rdzvBackend,
      RdzvBackend::Etcd);
}

// Workers started ahead (a spare's, a running node's for its replacements) wait in
// dlrun.recovery's loop, forked from the zygote.
TEST(ParseDlrunArgs, WorkersStartedAheadNeedInProcessRecoveryAndWarmStarts) {
  EXPECT_FALSE(parse({"script.py"}).agent.readySpares);
  EXPECT_FALSE(parse({"script.py"}).agent.readyReplacements);
  EXPECT_TRUE(parse({"--recovery=in-process", "--warm-start", "--ready-spares", "script.py"})
                  .agent.readySpares);
  EXPECT_TRUE(parse({"--recovery=in-process", "--warm-start", "--ready-replacements", "script.py"})
                  .agent.readyReplacements);
  for (const std::string flag : {"--ready-spares", "--ready-replacements"}) {
    for (const Args& args : {Args{flag, "script.py"}, Args{flag, "--warm-start", "script.py"},
                             Args{flag, "--recovery=in-process", "script.py"}})
      EXPECT_EQ(configError([&] { parse(args); }),
                flag +
                    " needs --recovery=in-process and --warm-start (workers started ahead wait "
                    "in dlrun.recovery's loop, forked from the warm interpreter)");
    EXPECT_TRUE(contains(configError([&] {
                           parse({"--recovery=in-process", "--warm-start", flag,
                                  "--virtual-local-rank", "script.py"});
                         }),
                         flag + " and --virtual-local-rank conflict"));
  }
}

TEST(ParseDlrunArgs, EtcdPrefixComesFromRdzvConf) {
  const auto c = parse({"--nnodes=2", "--rdzv-backend=etcd", "--rdzv-endpoint=e1",
                        "--rdzv-conf=etcd_prefix=/site/jobs", "env"});
  EXPECT_EQ(c.rdzv.etcdPrefix, "/site/jobs/");  // keys under PREFIX/ID/
  EXPECT_TRUE(contains(configError([] {
                         parseRdzvSettings({{"etcd_prefix", ""}});
                       }),
                       "etcd_prefix"));
}

TEST(ParseDlrunArgs, EtcdEndpointsMayComeFromTheEnvironmentTheFlagWinning) {
  HostProbe host = fakeHost();
  host.env["DLRUN_ETCD_ENDPOINTS"] = "e1:1,e2:2";
  EXPECT_EQ(parse({"--nnodes=2", "--rdzv-backend=etcd", "env"}, host).rdzvEndpoint.etcd().size(),
            2u);
  EXPECT_EQ(parse({"--nnodes=2", "--rdzv-backend=etcd", "--rdzv-endpoint=e3", "env"}, host)
                .rdzvEndpoint.etcd(),
            (std::vector<rendezvous::etcd::Endpoint>{{"e3", 2379}}));
}

// A malformed list, or none, is one line naming the flag when the flags are read.
TEST(ParseDlrunArgs, EtcdEndpointErrorsAreOneLineAtParseTime) {
  for (const std::string list : {"e1,,e2", "e1:0", "fd00::1", " "}) {
    SCOPED_TRACE(list);
    const std::string message = configError([&] {
      parse({"--nnodes=2", "--rdzv-backend=etcd", "--rdzv-endpoint=" + list, "env"});
    });
    EXPECT_TRUE(contains(message, "--rdzv-endpoint")) << message;
    EXPECT_FALSE(contains(message, "\n")) << message;
  }
  const std::string none = configError([] { parse({"--nnodes=2", "--rdzv-backend=etcd", "env"}); });
  EXPECT_TRUE(contains(none, "--rdzv-endpoint")) << none;
  EXPECT_TRUE(contains(none, "DLRUN_ETCD_ENDPOINTS")) << none;
}

// A file of the test's own under TMPDIR (or /tmp), removed with the object.
class TempFile {
 public:
  explicit TempFile(const std::string& content) {
    const char* dir = std::getenv("TMPDIR");
    path_ = std::string(dir ? dir : "/tmp") + "/dlrun_cli_test_XXXXXX";
    const int fd = ::mkstemp(path_.data());
    EXPECT_GE(fd, 0);
    if (fd >= 0) {
      EXPECT_EQ(::write(fd, content.data(), content.size()), ssize_t(content.size()));
      ::close(fd);
    }
  }
  ~TempFile() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// cacert, cert and key are read when the flags are, and turn TLS on; user with password or
// password_file (its trailing newline dropped) authenticates.
TEST(ParseDlrunArgs, EtcdTlsAndAuthSettings) {
  const TempFile ca("CA PEM"), cert("CERT PEM"), key("KEY PEM"), password("s3cret\n");
  const auto c = parse({"--nnodes=2", "--rdzv-backend=etcd", "--rdzv-endpoint=e1",
                        "--rdzv-conf=cacert=" + ca.path() + ",cert=" + cert.path() +
                            ",key=" + key.path() + ",user=root,password_file=" + password.path(),
                        "env"});
  EXPECT_TRUE(c.etcdSecurity.tls);
  EXPECT_EQ(c.etcdSecurity.rootCerts, "CA PEM");
  EXPECT_EQ(c.etcdSecurity.certChain, "CERT PEM");
  EXPECT_EQ(c.etcdSecurity.privateKey, "KEY PEM");
  EXPECT_EQ(c.etcdSecurity.user, "root");
  EXPECT_EQ(c.etcdSecurity.password, "s3cret");
  // Without settings: no TLS, no user; an https:// endpoint turns TLS on (the system's CAs).
  const auto plain = parse({"--nnodes=2", "--rdzv-backend=etcd", "--rdzv-endpoint=e1", "env"});
  EXPECT_EQ(plain.etcdSecurity, rendezvous::etcd::EtcdSecurity{});
  const auto https =
      parse({"--nnodes=2", "--rdzv-backend=etcd", "--rdzv-endpoint=https://e1", "env"});
  EXPECT_TRUE(https.etcdSecurity.tls);
  EXPECT_TRUE(https.etcdSecurity.rootCerts.empty());
  const auto inline_ = parse({"--nnodes=2", "--rdzv-backend=etcd", "--rdzv-endpoint=e1",
                              "--rdzv-conf=user=u,password=p", "env"});
  EXPECT_FALSE(inline_.etcdSecurity.tls);
  EXPECT_EQ(inline_.etcdSecurity.password, "p");
}

TEST(ParseDlrunArgs, EtcdSecurityErrorsAreOneLineAtParseTime) {
  const TempFile pem("PEM"), empty("");
  const std::string etcd[] = {"--nnodes=2", "--rdzv-backend=etcd", "--rdzv-endpoint=e1"};
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"cacert=/nonexistent/ca.pem", "cannot read"},
      {"cacert=" + empty.path(), "empty"},
      {"cert=" + pem.path(), "cert and key"},
      {"key=" + pem.path(), "cert and key"},
      {"user=u", "user and password"},
      {"password=p", "user and password"},
      {"user=u,password=p,password_file=" + pem.path(), "not both"},
      {"user=u,password_file=/nonexistent/pw", "password_file"},
  };
  for (const auto& [conf, part] : cases) {
    SCOPED_TRACE(conf);
    const std::string message = configError([&] {
      parse({etcd[0], etcd[1], etcd[2], "--rdzv-conf=" + conf, "env"});
    });
    EXPECT_TRUE(contains(message, part)) << message;
    EXPECT_FALSE(contains(message, "\n")) << message;
  }
  // Another backend has no use for them.
  const std::string c10d = configError([&] {
    parse({"--nnodes=2", "--rdzv-endpoint=h:1", "--rdzv-conf=cacert=" + pem.path(), "env"});
  });
  EXPECT_TRUE(contains(c10d, "--rdzv-backend=etcd")) << c10d;
}

}  // namespace
}  // namespace dlrun::launcher
