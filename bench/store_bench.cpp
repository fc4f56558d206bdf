// dlrun-store-bench: drives one TCPStore server, dlrund or torch's own, with a fixed load and
// prints one result line; bench/store_bench.sh runs it against both servers and compares.
//
// --era picks the wire dialect: 1, the 1.x numbering with no handshake, the only one torch 1.13's
// server understands; 2 (the default), VALIDATE first and the 2.x numbering, the only one torch
// 2.13's server accepts. dlrund detects the era per connection.
//
//   ops --clients K --seconds S   K processes, one connection each, each running a synchronous
//       [--depth D]               SET/GET/ADD loop for S seconds (D triples in flight at once).
//                                 Prints "ops_per_sec X".
//   barrier --clients N           one process, N connections: ADD on every connection, the one
//                                 that sees N SETs the done key, every connection WAITs on it.
//                                 Prints "barrier_seconds X", first ADD to last wait reply.
//     [--native]                  instead, every connection sends torch 2.13's BARRIER (era 2).
#include <arpa/inet.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/error.h"
#include "store/backoff.h"
#include "store/tcp_stream.h"
#include "store/wire.h"

namespace {

using namespace dlrun;
using wire::Era;
using wire::Op;
using Seconds = std::chrono::duration<double>;

constexpr int kKeySpace = 64;
constexpr auto kConnectTimeout = std::chrono::seconds(10);
constexpr auto kIoGrace = std::chrono::seconds(10);
constexpr auto kBarrierTimeout = std::chrono::seconds(60);

struct Target {
  std::string host;
  uint16_t port = 0;
  Era era = Era::V2;
};

std::string setRequest(Era era, std::string_view key, std::string_view value) {
  std::string out;
  wire::Encoder(out).op(era, Op::Set).bytes(key).bytes(value);
  return out;
}

std::string getRequest(Era era, std::string_view key) {
  std::string out;
  wire::Encoder(out).op(era, Op::Get).bytes(key);
  return out;
}

std::string addRequest(Era era, std::string_view key, int64_t delta) {
  std::string out;
  wire::Encoder(out).op(era, Op::Add).bytes(key).i64(delta);
  return out;
}

// CHECK and WAIT carry a key count, then the keys.
std::string keysRequest(Era era, Op op, std::string_view key) {
  std::string out;
  wire::Encoder(out).op(era, op).u64(1).bytes(key);
  return out;
}

bool isLoopback(const std::string& host) {
  in_addr v4{};
  in6_addr v6{};
  if (::inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  return ::inet_pton(AF_INET6, host.c_str(), &v6) == 1 && IN6_IS_ADDR_LOOPBACK(&v6);
}

// A server accepting thousands of connections at once may refuse some while its backlog is full.
TcpStream connectWithRetry(const Target& target, Clock::time_point deadline) {
  ExponentialBackoff backoff(std::chrono::milliseconds(1), std::chrono::milliseconds(50));
  while (true) {
    try {
      TcpStream stream = TcpStream::connect(target.host, target.port, deadline);
      if (target.era == Era::V2) {  // the handshake has no reply
        std::string validate;
        wire::Encoder(validate).op(Era::V2, Op::Validate).u32(wire::kValidationMagic);
        stream.writeAll(validate, deadline);
      }
      return stream;
    } catch (const NetworkError&) {
      const auto pause = backoff.next();
      if (Clock::now() + pause >= deadline) throw;
      std::this_thread::sleep_for(pause);
    }
  }
}

int64_t readI64(TcpStream& stream, Clock::time_point deadline) {
  return static_cast<int64_t>(wire::loadU64(stream.readExact(8, deadline).data()));
}

// ---- ops ----

// What a client process reports to the parent; smaller than PIPE_BUF, so written atomically.
struct ClientResult {
  uint64_t ops = 0;
  double seconds = 0;
  bool ok = false;
};

void writeFully(int fd, const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the parent is gone; nothing left to tell
    p += n;
    size -= static_cast<size_t>(n);
  }
}

// The loop of one client: SET a value, GET it back, ADD to a counter, on keys that rotate
// through a small key space. Every GET reads a key this client has just set, because torch
// 1.13's server drops a connection that GETs a missing key. With depth D, D such triples go
// out in one write before the replies are read (pipelining, as a busy agent's requests would).
ClientResult runClient(TcpStream& stream, Era era, int index, Seconds duration, int depth) {
  std::vector<std::string> batches;
  for (int k = 0; k < kKeySpace; ++k) {
    std::string batch;
    for (int d = 0; d < depth; ++d) {
      const std::string suffix = std::to_string((k + d) % kKeySpace);
      batch += setRequest(era, "bench/value/" + suffix, std::string(32, 'v'));
      batch += getRequest(era, "bench/value/" + suffix);
      batch += addRequest(era, "bench/counter/" + suffix, 1);
    }
    batches.push_back(std::move(batch));
  }
  const size_t replyBytes = static_cast<size_t>(depth) * (8 + 32 + 8);
  const auto start = Clock::now();
  const auto end = start + std::chrono::duration_cast<Clock::duration>(duration);
  const auto deadline = end + kIoGrace;
  ClientResult result;
  for (size_t i = static_cast<size_t>(index) * 7; Clock::now() < end; ++i) {
    stream.writeAll(batches[i % kKeySpace], deadline);
    const std::string replies = stream.readExact(replyBytes, deadline);
    for (int d = 0; d < depth; ++d) {
      const int64_t length = static_cast<int64_t>(wire::loadU64(replies.data() + d * 48));
      if (length != 32) throw ProtocolError("GET returned " + std::to_string(length) + " bytes");
    }
    result.ops += 3 * static_cast<uint64_t>(depth);
  }
  result.seconds = Seconds(Clock::now() - start).count();
  result.ok = true;
  return result;
}

// Runs in a forked child: connects, reports ready, waits for the start signal (EOF on goFd; a
// byte there instead means abort), runs the loop and writes its ClientResult. A failed client
// reports ok = false.
[[noreturn]] void clientProcess(const Target& target, int index, Seconds duration, int depth,
                                int readyFd, int goFd, int resultFd) {
  ClientResult result;
  bool ready = false;
  try {
    TcpStream stream = connectWithRetry(target, Clock::now() + kConnectTimeout);
    const char byte = 'r';
    writeFully(readyFd, &byte, 1);
    ready = true;
    char abort;
    ssize_t n;
    while ((n = ::read(goFd, &abort, 1)) < 0 && errno == EINTR) {
    }
    if (n == 0) result = runClient(stream, target.era, index, duration, depth);
  } catch (const std::exception& e) {
    std::cerr << "client " << index << ": " << e.what() << std::endl;
  }
  if (!ready) {
    const char byte = 'e';
    writeFully(readyFd, &byte, 1);
  }
  writeFully(resultFd, &result, sizeof(result));
  ::_exit(result.ok ? 0 : 1);
}

int runOps(const Target& target, int clients, Seconds duration, int depth) {
  int readyPipe[2], goPipe[2], resultPipe[2];
  if (::pipe(readyPipe) != 0 || ::pipe(goPipe) != 0 || ::pipe(resultPipe) != 0)
    throw Error(std::string("pipe: ") + std::strerror(errno));
  std::cout.flush();
  std::vector<pid_t> children;
  for (int i = 0; i < clients; ++i) {
    const pid_t pid = ::fork();
    if (pid < 0) {
      std::cerr << "dlrun-store-bench: fork: " << std::strerror(errno) << "\n";
      break;
    }
    if (pid == 0) {
      ::close(readyPipe[0]);
      ::close(goPipe[1]);
      ::close(resultPipe[0]);
      clientProcess(target, i, duration, depth, readyPipe[1], goPipe[0], resultPipe[1]);
    }
    children.push_back(pid);
  }
  ::close(readyPipe[1]);
  ::close(goPipe[0]);
  ::close(resultPipe[1]);

  const int started = static_cast<int>(children.size());
  int ready = 0;
  for (char byte; ready < started && ::read(readyPipe[0], &byte, 1) == 1 && byte == 'r';) ++ready;
  if (ready < clients) {
    const std::string abort(static_cast<size_t>(started), 'x');
    writeFully(goPipe[1], abort.data(), abort.size());
  }
  ::close(goPipe[1]);

  bool ok = ready == clients;
  double opsPerSecond = 0;
  int reported = 0;
  ClientResult one;
  while (::read(resultPipe[0], &one, sizeof(one)) == static_cast<ssize_t>(sizeof(one))) {
    ++reported;
    ok = ok && one.ok;
    if (one.seconds > 0) opsPerSecond += static_cast<double>(one.ops) / one.seconds;
  }
  for (pid_t pid : children) ::waitpid(pid, nullptr, 0);
  if (!ok || reported != clients) {
    std::cerr << "dlrun-store-bench: " << ready << " of " << clients
              << " clients started, not all finished\n";
    return 1;
  }
  std::cout << "ops_per_sec " << static_cast<uint64_t>(opsPerSecond) << "\n";
  return 0;
}

// ---- barrier ----

void raiseFileLimit(int connections) {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0)
    throw Error(std::string("getrlimit: ") + std::strerror(errno));
  limit.rlim_cur = limit.rlim_max;
  if (::setrlimit(RLIMIT_NOFILE, &limit) != 0)
    throw Error(std::string("setrlimit: ") + std::strerror(errno));
  if (limit.rlim_cur != RLIM_INFINITY && limit.rlim_cur < static_cast<rlim_t>(connections) + 64)
    throw ConfigError(std::to_string(connections) +
                      " connections need more file descriptors "
                      "than RLIMIT_NOFILE's hard limit of " +
                      std::to_string(limit.rlim_max));
}

// What the server replies to each arrival: one WAIT reply byte.
void expectStopWaiting(TcpStream& stream, Clock::time_point deadline) {
  const std::string reply = stream.readExact(1, deadline);
  if (static_cast<uint8_t>(reply[0]) != static_cast<uint8_t>(wire::WaitReply::StopWaiting))
    throw ProtocolError("the barrier replied " + std::to_string(static_cast<uint8_t>(reply[0])));
}

int runBarrier(const Target& target, int n, bool native) {
  raiseFileLimit(n);
  const auto deadline = Clock::now() + kBarrierTimeout;
  std::vector<TcpStream> streams;
  streams.reserve(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i)
    streams.push_back(connectWithRetry(target, std::min(deadline, Clock::now() + kConnectTimeout)));

  // Keys unique to this run, since the servers outlive it.
  const std::string prefix = "barrier/" + std::to_string(::getpid()) + "/" +
                             std::to_string(Clock::now().time_since_epoch().count());
  const std::string countKey = prefix + "/count";
  const std::string doneKey = prefix + "/done";

  // Connections may still wait in the server's accept queue; one answered CHECK on each keeps
  // accepting out of the timed part.
  const std::string check = keysRequest(target.era, Op::Check, doneKey);
  for (auto& stream : streams) stream.writeAll(check, deadline);
  for (auto& stream : streams) stream.readExact(1, deadline);

  const std::string add = addRequest(target.era, countKey, 1);
  const std::string set = setRequest(target.era, doneKey, "1");
  const std::string wait = keysRequest(target.era, Op::Wait, doneKey);
  std::string arrive;
  wire::Encoder(arrive).op(Era::V2, Op::Barrier).bytes(countKey).i64(n);
  const auto start = Clock::now();
  if (native) {
    for (auto& stream : streams) stream.writeAll(arrive, deadline);
    for (auto& stream : streams) expectStopWaiting(stream, deadline);
    std::cout << "barrier_seconds " << Seconds(Clock::now() - start).count() << "\n";
    return 0;
  }
  for (auto& stream : streams) stream.writeAll(add, deadline);
  int last = 0;
  for (auto& stream : streams) {
    const int64_t count = readI64(stream, deadline);
    if (count < 1 || count > n) throw ProtocolError("ADD returned " + std::to_string(count));
    if (count == n) {
      ++last;
      stream.writeAll(set, deadline);
    }
    stream.writeAll(wait, deadline);
  }
  if (last != 1) throw ProtocolError(std::to_string(last) + " connections saw the final count");
  for (auto& stream : streams) expectStopWaiting(stream, deadline);
  const double seconds = Seconds(Clock::now() - start).count();
  std::cout << "barrier_seconds " << seconds << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Target target{"127.0.0.1", 0};
  int clients = 1;
  int depth = 1;
  double seconds = 2.0;

  int era = 2;
  bool native = false;
  CLI::App app("Drives a TCPStore server (dlrund or torch's) and prints one result line.",
               "dlrun-store-bench");
  app.add_option("--host", target.host, "Server address (loopback only)")->capture_default_str();
  app.add_option("--port", target.port, "Server port")->required()->check(CLI::Range(1, 65535));
  app.add_option("--era", era, "Wire dialect: 1 (torch 1.x) or 2 (torch 2.x, VALIDATE first)")
      ->check(CLI::IsMember({1, 2}))
      ->capture_default_str();
  auto* ops = app.add_subcommand("ops", "K client processes in a synchronous SET/GET/ADD loop");
  ops->add_option("--clients", clients, "Client processes")->check(CLI::Range(1, 256));
  ops->add_option("--seconds", seconds, "How long each client runs")->check(CLI::Range(0.1, 60.0));
  ops->add_option("--depth", depth, "SET/GET/ADD triples sent before reading their replies")
      ->check(CLI::Range(1, 256));
  auto* barrier = app.add_subcommand("barrier", "N connections through an add-then-wait barrier");
  barrier->add_option("--clients", clients, "Connections")->check(CLI::Range(1, 16384));
  barrier->add_flag("--native", native, "torch 2.13's BARRIER op instead of ADD, SET and WAIT");
  app.require_subcommand(1);
  CLI11_PARSE(app, argc, argv);

  target.era = era == 1 ? Era::V1 : Era::V2;
  if (native && target.era == Era::V1) {
    std::cerr << "dlrun-store-bench: --native needs --era 2 (BARRIER is torch 2.13's)\n";
    return 2;
  }
  if (!isLoopback(target.host)) {
    std::cerr << "dlrun-store-bench: --host must be a numeric loopback address\n";
    return 2;
  }
  try {
    if (ops->parsed()) return runOps(target, clients, Seconds(seconds), depth);
    return runBarrier(target, clients, native);
  } catch (const ConfigError& e) {
    std::cerr << "dlrun-store-bench: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "dlrun-store-bench: " << e.what() << "\n";
    return 1;
  }
}
