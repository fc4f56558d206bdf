// The value parsers of the dlrun command line (launch_cli.h): one flag's text into its value,
// each error a ConfigError naming the flag. parseDlrunArgs (launch_cli.cpp) calls them.
#include "launcher/launch_cli.h"

#include <signal.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <sstream>

#include "common/error.h"
#include "common/signal_name.h"
#include "common/text.h"

namespace dlrun::launcher {
namespace {

std::optional<agents::Streams> toStreams(std::string_view text) {
  auto value = parseInteger<int>(text);
  if (!value || *value < 0 || *value > 3) return std::nullopt;
  return static_cast<agents::Streams>(*value);
}

}  // namespace

RdzvBackendFlag parseRdzvBackend(const std::string& value) {
  if (value == "c10d") return {.backend = RdzvBackend::C10d};
  if (value == "static") return {.backend = RdzvBackend::Static};
  if (value == "slurm") return {.backend = RdzvBackend::C10d, .slurm = true};
  if (value == "etcd" || value == "etcd-v3") return {.backend = RdzvBackend::Etcd};
  // torchrun's v2 backend: named apart from a typo, with what to use instead.
  if (value == "etcd-v2")
    throw ConfigError(
        "--rdzv-backend=etcd-v2: dlrun speaks etcd's v3 API; use "
        "--rdzv-backend=etcd");
  throw ConfigError("--rdzv-backend: '" + value + "' is not c10d, static, etcd or slurm");
}

std::pair<int, int> parseNnodes(const std::string& value) {
  auto parts = split(value, ':');
  if (parts.size() > 2) throw ConfigError("--nnodes: '" + value + "' is not N or MIN:MAX");
  auto low = parseInteger<int>(parts[0]);
  auto high = parts.size() == 2 ? parseInteger<int>(parts[1]) : low;
  if (!low || !high || *low < 1)
    throw ConfigError("--nnodes: '" + value + "' is not N or MIN:MAX with positive integers");
  if (*low > *high)
    throw ConfigError("--nnodes: minimum " + std::to_string(*low) + " exceeds maximum " +
                      std::to_string(*high));
  return {*low, *high};
}

int parseNprocPerNode(const std::string& value, const HostProbe& host) {
  if (value == "cpu") return host.cpuCount();
  if (value == "gpu") {
    const int gpus = host.gpuCount();
    if (gpus == 0) throw ConfigError("--nproc-per-node=gpu: no GPU found on this machine");
    return gpus;
  }
  if (value == "auto") {
    const int gpus = host.gpuCount();
    return gpus > 0 ? gpus : host.cpuCount();
  }
  auto n = parseInteger<int>(value);
  if (!n || *n < 1)
    throw ConfigError("--nproc-per-node: '" + value +
                      "' is not a positive integer, cpu, gpu or auto");
  return *n;
}

agents::StreamsByRank parseStreams(const std::string& flag, const std::string& value) {
  agents::StreamsByRank result;
  if (auto all = toStreams(value)) {
    result.all = *all;
    return result;
  }
  for (const auto& item : split(value, ',')) {
    auto pair = split(item, ':');
    auto rank = pair.size() == 2 ? parseInteger<int>(pair[0]) : std::nullopt;
    auto streams = pair.size() == 2 ? toStreams(pair[1]) : std::nullopt;
    if (!rank || *rank < 0 || !streams)
      throw ConfigError(flag + ": '" + value +
                        "' is not 0-3 or LOCAL_RANK:0-3 pairs such as 0:1,1:3");
    result.byRank[*rank] = *streams;
  }
  return result;
}

std::map<std::string, std::string> parseRdzvConf(const std::string& value) {
  std::map<std::string, std::string> conf;
  if (value.empty()) return conf;
  for (const auto& item : split(value, ',')) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0)
      throw ConfigError("--rdzv-conf: '" + item + "' is not key=value");
    conf[item.substr(0, eq)] = item.substr(eq + 1);
  }
  return conf;
}

// job_ttl's upper bound: long enough for a re-run's id to wait out, short enough that a
// forgotten job's keys go.
constexpr int64_t kMaxJobTtlSeconds = 30 * 86'400;

namespace {

// The etcd settings kept as text (etcdSecurity reads them once the backend is known): the
// member a key sets, or none for another key.
std::string RdzvSettings::*etcdText(const std::string& key) {
  static const std::map<std::string, std::string RdzvSettings::*> kTexts = {
      {"cacert", &RdzvSettings::etcdCaCert},
      {"cert", &RdzvSettings::etcdCert},
      {"key", &RdzvSettings::etcdKey},
      {"user", &RdzvSettings::etcdUser},
      {"password", &RdzvSettings::etcdPassword},
      {"password_file", &RdzvSettings::etcdPasswordFile}};
  const auto it = kTexts.find(key);
  return it == kTexts.end() ? nullptr : it->second;
}

}  // namespace

RdzvSettings parseRdzvSettings(const std::map<std::string, std::string>& conf) {
  RdzvSettings settings;
  auto seconds = [](const std::string& key, const std::string& text) {
    double value = 0;
    size_t used = 0;
    try {
      value = std::stod(text, &used);
    } catch (const std::exception&) {
    }
    // Under a millisecond it would be 0 ms, and the rendezvous would spin on waits of 0 ms.
    if (used == text.size() && value > 0 && value < 0.001)
      throw ConfigError("--rdzv-conf: " + key + "=" + text +
                        " is under a millisecond: give at least 0.001 (seconds)");
    if (used == text.size() && value > 0 && value <= 86'400)
      return std::chrono::milliseconds(static_cast<int64_t>(value * 1000));
    throw ConfigError("--rdzv-conf: " + key + "=" + text +
                      " is not a number of seconds above 0 and at most 86400");
  };
  // torch's spellings of a boolean setting (RendezvousParameters.get_as_bool).
  auto boolean = [](const std::string& key, const std::string& text) {
    std::string lower = text;
    std::transform(lower.begin(), lower.end(), lower.begin(),
                   [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
    for (const char* yes : {"1", "true", "t", "yes", "y"})
      if (lower == yes) return true;
    for (const char* no : {"0", "false", "f", "no", "n"})
      if (lower == no) return false;
    throw ConfigError("--rdzv-conf: " + key + "=" + text + " is not true or false");
  };
  for (const auto& [key, value] : conf) {
    if (key == "join_timeout") {
      settings.joinTimeout = seconds(key, value);
    } else if (key == "last_call_timeout") {
      settings.lastCall = seconds(key, value);
    } else if (key == "keep_alive_interval") {
      settings.heartbeat = seconds(key, value);
    } else if (key == "heartbeat_timeout") {
      settings.heartbeatTimeout = seconds(key, value);
    } else if (key == "store_outage_timeout") {
      settings.storeOutage = seconds(key, value);
    } else if (key == "store_type") {
      if (value != "tcp")
        throw ConfigError("--rdzv-conf: store_type=" + value +
                          ": dlrun's c10d store is served over TCP only (store_type=tcp)");
    } else if (key == "keep_alive_max_attempt") {
      auto attempts = parseInteger<int>(value);
      if (!attempts || *attempts < 1 || *attempts > 1000)
        throw ConfigError("--rdzv-conf: keep_alive_max_attempt=" + value +
                          " is not a count from 1 to 1000");
      settings.keepAliveMaxAttempt = *attempts;
    } else if (key == "is_host") {
      settings.isHost = boolean(key, value);
    } else if (key == "use_libuv") {
      boolean(key, value);  // torch's choice of its store's event loop: dlrun's store is its own
    } else if (key == "stop_policy") {
      if (value != "job" && value != "node")
        throw ConfigError("--rdzv-conf: stop_policy=" + value + " is not job or node");
      settings.stopOnlyNode = value == "node";
    } else if (key == "etcd_prefix") {
      if (value.empty() || value.find_first_of(" \t\n") != std::string::npos)
        throw ConfigError("--rdzv-conf: etcd_prefix='" + value + "' is not a key prefix");
      settings.etcdPrefix = value.ends_with('/') ? value : value + "/";
    } else if (key == "job_ttl") {
      auto ttl = parseInteger<int>(value);
      if (!ttl || *ttl < 1 || *ttl > kMaxJobTtlSeconds)
        throw ConfigError("--rdzv-conf: job_ttl=" + value +
                          " is not a whole number of seconds from 1 to 2592000 (30 days)");
      settings.jobTtl = std::chrono::seconds(*ttl);
    } else if (std::string RdzvSettings::*text = etcdText(key)) {
      settings.*text = value;
    } else if (key != "timeout" && key != "close_timeout" && key != "read_timeout") {
      // torchrun's other keys are accepted for compatibility; they have no meaning here.
      throw ConfigError("--rdzv-conf: unknown key '" + key +
                        "' (known: join_timeout, last_call_timeout, keep_alive_interval, "
                        "keep_alive_max_attempt, heartbeat_timeout, store_outage_timeout, is_host, "
                        "store_type, "
                        "stop_policy, etcd_prefix, job_ttl, cacert, cert, key, user, password, "
                        "password_file)");
    }
  }
  if (settings.heartbeatTimeout && *settings.heartbeatTimeout <= settings.heartbeat)
    throw ConfigError(
        "--rdzv-conf: heartbeat_timeout must be longer than keep_alive_interval, "
        "or a live node would be taken for dead between its heartbeats");
  return settings;
}

namespace {

// A file's whole content; a key's file that cannot be read, or is empty, is a ConfigError.
std::string readSettingFile(const std::string& key, const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  std::ostringstream content;
  if (file) content << file.rdbuf();
  if (!file || file.bad())
    throw ConfigError("--rdzv-conf: " + key + "=" + path + ": cannot read the file");
  if (content.str().empty())
    throw ConfigError("--rdzv-conf: " + key + "=" + path + ": the file is empty");
  return content.str();
}

}  // namespace

rendezvous::etcd::EtcdSecurity etcdSecurity(
    const RdzvSettings& settings, const std::vector<rendezvous::etcd::Endpoint>& endpoints) {
  rendezvous::etcd::EtcdSecurity security;
  if (settings.etcdCert.empty() != settings.etcdKey.empty())
    throw ConfigError(
        "--rdzv-conf: cert and key go together (the client certificate and its "
        "private key)");
  if (!settings.etcdPassword.empty() && !settings.etcdPasswordFile.empty())
    throw ConfigError("--rdzv-conf: give password or password_file, not both");
  const bool password = !settings.etcdPassword.empty() || !settings.etcdPasswordFile.empty();
  if (settings.etcdUser.empty() != !password)
    throw ConfigError("--rdzv-conf: user and password (or password_file) go together");
  // TLS follows the configuration: a CA (or an https:// endpoint) turns it on for every
  // endpoint; a client certificate alone is meaningless without TLS, so it turns it on too.
  security.tls = !settings.etcdCaCert.empty() || !settings.etcdCert.empty() ||
                 std::any_of(endpoints.begin(), endpoints.end(),
                             [](const auto& endpoint) { return endpoint.https; });
  if (!settings.etcdCaCert.empty())
    security.rootCerts = readSettingFile("cacert", settings.etcdCaCert);
  if (!settings.etcdCert.empty()) {
    security.certChain = readSettingFile("cert", settings.etcdCert);
    security.privateKey = readSettingFile("key", settings.etcdKey);
  }
  security.user = settings.etcdUser;
  security.password = settings.etcdPassword;
  if (!settings.etcdPasswordFile.empty()) {
    security.password = readSettingFile("password_file", settings.etcdPasswordFile);
    // A file written by echo ends in a newline that is no part of the password.
    while (!security.password.empty() &&
           (security.password.back() == '\n' || security.password.back() == '\r'))
      security.password.pop_back();
    if (security.password.empty())
      throw ConfigError("--rdzv-conf: password_file=" + settings.etcdPasswordFile +
                        ": the file is empty");
  }
  return security;
}

std::set<int> parseRanksFilter(const std::string& value) {
  std::set<int> ranks;
  for (const auto& item : split(value, ',')) {
    auto rank = parseInteger<int>(item);
    if (!rank || *rank < 0)
      throw ConfigError("--local-ranks-filter: '" + value + "' is not a list such as 0,2");
    ranks.insert(*rank);
  }
  return ranks;
}

std::string readTokenFile(const std::string& flag, const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError(flag + ": cannot read " + path);
  std::string token((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  while (!token.empty() && (token.back() == '\n' || token.back() == '\r')) token.pop_back();
  if (token.empty()) throw ConfigError(flag + ": " + path + " is empty");
  return token;
}

agents::HangAction parseHangAction(const std::string& value) {
  if (value == "report") return agents::HangAction::Report;
  if (value == "restart") return agents::HangAction::Restart;
  if (value == "exit") return agents::HangAction::Exit;
  throw ConfigError("--hang-action: '" + value + "' is not report, restart or exit");
}

agents::TfConfigMode parseTfConfig(const std::string& value) {
  if (value == "auto") return agents::TfConfigMode::Auto;
  if (value == "always") return agents::TfConfigMode::Always;
  if (value == "never") return agents::TfConfigMode::Never;
  throw ConfigError("--tf-config: '" + value + "' is not auto, always or never");
}

std::vector<int> parseSignalsToHandle(const std::string& value) {
  const std::string flag = "--signals-to-handle";
  if (value.empty()) throw ConfigError(flag + " names no signal");
  std::vector<int> signals;
  for (const std::string& item : split(value, ',')) {
    const std::optional<int> sig = parseSignal(item);
    if (!sig) throw ConfigError(flag + ": '" + item + "' is not a signal");
    if (*sig == SIGKILL || *sig == SIGSTOP)
      throw ConfigError(flag + ": " + signalName(*sig) + " cannot be handled by any process");
    if (*sig == SIGCHLD)
      throw ConfigError(flag + ": SIGCHLD is dlrun's own (it says a worker ended)");
    for (int fault : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS, SIGABRT})
      if (*sig == fault)
        throw ConfigError(flag + ": " + signalName(*sig) +
                          " reports a fault in the process it reaches, not a request to stop");
    if (std::find(signals.begin(), signals.end(), *sig) == signals.end()) signals.push_back(*sig);
  }
  return signals;
}

HostPort parseRdzvEndpoint(const std::string& value) {
  try {
    return parseHostPort(value, kDefaultRdzvPort);
  } catch (const ConfigError& e) {
    throw ConfigError("--rdzv-endpoint: '" + value + "': " + e.what());
  }
}

std::vector<std::string> parseFilterList(const std::string& value) {
  std::vector<std::string> needles(1);
  for (size_t i = 0; i < value.size(); ++i) {
    if (value[i] != ',') {
      needles.back() += value[i];
    } else if (i + 1 < value.size() && value[i + 1] == ',') {
      needles.back() += ',';
      ++i;
    } else {
      needles.emplace_back();
    }
  }
  return needles;
}

}  // namespace dlrun::launcher
