// dlrun-barrier-load: N simulated ranks through one store barrier as torch's init_process_group
// does it (every rank ADDs 1 to a counter; the one whose ADD returns the world size SETs a done
// key; every rank WAITs on the done key), on one io_context, non-blocking, in TCPStore's V2
// dialect (VALIDATE + magic first). bench/proxy_bench.py starts several at once, splitting one
// world between them, and combines their lines.
//
// --proxies 0: every rank connects straight to the store. --proxies P: the process first
// creates P StoreProxy objects (store/store_proxy.h), each with its own connections to the
// store, as dlrun's agents on P nodes would; the ranks are split in P blocks of consecutive
// ranks, one per proxy, as a node's workers start together.
//
// With --go the process prints "ready" once its proxies listen and starts at a line on stdin;
// with --hold it waits for stdin to close after its result line (so that its connections stay
// open while the driver reads the store's counters), then exits without tearing them down.
// The result is one JSON line: start_ns (CLOCK_MONOTONIC, just before the first connect),
// end_ns (the last of this process's WAITs answered), ranks, world, proxies, failures, finals
// (ranks whose ADD returned the world size: one across all processes), connect retries,
// store_connections (the connections this process made to the store: its ranks' own, or its
// proxies' upstream ones) and the proxies' counters summed. Any failure (a refused connect past
// its retries, a protocol error, the deadline) prints one line on stderr and exits 1.
#include <sys/resource.h>
#include <time.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "common/asio.h"
#include "store/store_proxy.h"
#include "store/wire.h"

namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using boost::system::error_code;
using dlrun::wire::Era;
using dlrun::wire::Op;

uint64_t monotonicNs() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

[[noreturn]] void die(const std::string& why) {
  std::cout.flush();
  std::fprintf(stderr, "dlrun-barrier-load: %s\n", why.c_str());
  std::fflush(stderr);
  std::_Exit(1);
}

constexpr int kMaxAttempts = 10;  // connects per rank

class Load {
 public:
  struct Options {
    std::vector<tcp::endpoint> targets;  // rank i connects to targets[i * size / ranks]
    int ranks = 0;
    int64_t world = 0;
    int window = 512;
    std::string prefix;
    // Straight ranks' source addresses: rank i binds to 127.0.0.(2 + i % sources) first (0:
    // the kernel's choice). Each source address has its own ephemeral ports, as each client
    // host of a cluster has: from one address, 19,000 connects to one port search a range of
    // 28k ports that fills up.
    int sources = 0;
  };

  Load(asio::io_context& io, Options options) : io_(io), options_(std::move(options)) {
    const std::string count = options_.prefix + "/count";
    const std::string done = options_.prefix + "/done";
    dlrun::wire::Encoder(hello_)
        .op(Era::V2, Op::Validate)
        .u32(dlrun::wire::kValidationMagic)
        .op(Era::V2, Op::Add)
        .bytes(count)
        .i64(1);
    dlrun::wire::Encoder(wait_).op(Era::V2, Op::Wait).u64(1).bytes(done);
    dlrun::wire::Encoder(setWait_).op(Era::V2, Op::Set).bytes(done).bytes("1");
    setWait_ += wait_;
    ranks_.reserve(static_cast<size_t>(options_.ranks));
    for (int i = 0; i < options_.ranks; ++i) ranks_.push_back(std::make_unique<Rank>(io_));
  }

  void start() {
    startNs = monotonicNs();
    while (next_ < options_.ranks && inFlight_ < options_.window) launch(next_++);
  }

  uint64_t startNs = 0, endNs = 0;
  int answered = 0, finals = 0, retries = 0;

 private:
  struct Rank {
    explicit Rank(asio::io_context& io) : socket(io) {}
    tcp::socket socket;
    char in[8] = {};
    int attempts = 0;
  };

  const tcp::endpoint& target(int i) const {
    return options_.targets[static_cast<size_t>(i) * options_.targets.size() /
                            static_cast<size_t>(options_.ranks)];
  }

  void launch(int i) {
    ++inFlight_;
    connect(i);
  }

  void connect(int i) {
    Rank& rank = *ranks_[static_cast<size_t>(i)];
    ++rank.attempts;
    if (options_.sources > 0) {
      const std::string source = "127.0.0." + std::to_string(2 + i % options_.sources);
      error_code ec;
      rank.socket.open(tcp::v4(), ec);
      if (!ec) rank.socket.bind({asio::ip::make_address(source), 0}, ec);
      if (ec) die("rank " + std::to_string(i) + ": cannot bind to " + source + ": " + ec.message());
    }
    rank.socket.async_connect(target(i), [this, i](const error_code& ec) { onConnect(i, ec); });
  }

  void onConnect(int i, const error_code& ec) {
    Rank& rank = *ranks_[static_cast<size_t>(i)];
    if (ec) {
      error_code ignored;
      rank.socket.close(ignored);
      if (rank.attempts >= kMaxAttempts)
        die("rank " + std::to_string(i) + ": connect to " + describe(target(i)) + " failed " +
            std::to_string(rank.attempts) + " times, last: " + ec.message());
      ++retries;
      // Backoff 1, 2, 4 ... 128 ms: the listener's backlog is full or it is not yet there.
      auto timer = std::make_shared<asio::steady_timer>(
          io_, std::chrono::milliseconds(1 << std::min(rank.attempts - 1, 7)));
      timer->async_wait([this, i, timer](const error_code&) { connect(i); });
      return;
    }
    error_code ignored;
    rank.socket.set_option(tcp::no_delay(true), ignored);
    asio::async_write(rank.socket, asio::buffer(hello_), [this, i](const error_code& e, size_t) {
      if (e) die("rank " + std::to_string(i) + ": sending VALIDATE and ADD: " + e.message());
    });
    asio::async_read(rank.socket, asio::buffer(rank.in, 8),
                     [this, i](const error_code& e, size_t) { onAdd(i, e); });
  }

  void onAdd(int i, const error_code& ec) {
    Rank& rank = *ranks_[static_cast<size_t>(i)];
    if (ec) die("rank " + std::to_string(i) + ": reading ADD's reply: " + ec.message());
    const auto value = static_cast<int64_t>(dlrun::wire::loadU64(rank.in));
    if (value < 1 || value > options_.world)
      die("rank " + std::to_string(i) + ": ADD returned " + std::to_string(value) +
          " in a world of " + std::to_string(options_.world));
    const std::string& request = value == options_.world ? setWait_ : wait_;
    if (value == options_.world) ++finals;
    asio::async_write(rank.socket, asio::buffer(request), [this, i](const error_code& e, size_t) {
      if (e) die("rank " + std::to_string(i) + ": sending WAIT: " + e.message());
    });
    asio::async_read(rank.socket, asio::buffer(rank.in, 1),
                     [this, i](const error_code& e, size_t) { onWait(i, e); });
    --inFlight_;
    while (next_ < options_.ranks && inFlight_ < options_.window) launch(next_++);
  }

  void onWait(int i, const error_code& ec) {
    Rank& rank = *ranks_[static_cast<size_t>(i)];
    if (ec) die("rank " + std::to_string(i) + ": reading WAIT's reply: " + ec.message());
    if (static_cast<uint8_t>(rank.in[0]) !=
        static_cast<uint8_t>(dlrun::wire::WaitReply::StopWaiting))
      die("rank " + std::to_string(i) + ": WAIT replied " +
          std::to_string(static_cast<uint8_t>(rank.in[0])));
    endNs = monotonicNs();
    if (++answered == options_.ranks) io_.stop();
  }

  static std::string describe(const tcp::endpoint& e) {
    return e.address().to_string() + ":" + std::to_string(e.port());
  }

  asio::io_context& io_;
  Options options_;
  std::string hello_, wait_, setWait_;
  std::vector<std::unique_ptr<Rank>> ranks_;
  int next_ = 0, inFlight_ = 0;
};

void raiseFileLimit(uint64_t needed) {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0)
    die(std::string("getrlimit: ") + std::strerror(errno));
  limit.rlim_cur = limit.rlim_max;
  if (::setrlimit(RLIMIT_NOFILE, &limit) != 0)
    die(std::string("setrlimit: ") + std::strerror(errno));
  if (limit.rlim_cur != RLIM_INFINITY && limit.rlim_cur < needed)
    die(std::to_string(needed) + " descriptors needed, RLIMIT_NOFILE's hard limit is " +
        std::to_string(limit.rlim_max) + ": split the ranks over more processes");
}

}  // namespace

int main(int argc, char** argv) {
  std::string host = "127.0.0.1", prefix;
  uint16_t port = 0;
  int ranks = 0, proxies = 0, window = 512, upstreams = 1, sources = 0;
  int64_t world = 0;
  double deadline = 120;
  bool go = false, hold = false;
  CLI::App app(
      "dlrun-barrier-load: N ranks through one ADD/SET/WAIT store barrier, straight to "
      "the store or through in-process store proxies; prints one JSON line.",
      "dlrun-barrier-load");
  app.add_option("--host", host, "Store address (numeric)")->capture_default_str();
  app.add_option("--port", port, "Store port")->required()->check(CLI::Range(1, 65535));
  app.add_option("--ranks", ranks, "Ranks in this process")
      ->required()
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--world", world, "World size (all processes' ranks; default --ranks)");
  app.add_option("--proxies", proxies, "Store proxies in this process (0: ranks go straight)")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  app.add_option("--upstream-addresses", upstreams,
                 "Proxy p reaches the store at 127.0.0.(1 + p % A), the store listening on all of "
                 "them: each address has its own ephemeral ports, which the proxies' listeners "
                 "share with their store connections (28k on Linux's default range)")
      ->check(CLI::Range(1, 254))
      ->capture_default_str();
  app.add_option("--sources", sources,
                 "Straight ranks connect from 127.0.0.2 .. 127.0.0.(1 + S), as from S client hosts "
                 "(0: the kernel's choice, 127.0.0.1)")
      ->check(CLI::Range(0, 250))
      ->capture_default_str();
  app.add_option("--key-prefix", prefix,
                 "Prefix of the barrier's keys, the same in every "
                 "process of one barrier")
      ->required();
  app.add_option("--window", window, "Ranks connecting or awaiting their ADD at once")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--deadline", deadline, "Seconds before giving up")
      ->check(CLI::Range(0.1, 3600.0))
      ->capture_default_str();
  app.add_flag("--go", go, "Print 'ready' once set up, start at a line on stdin");
  app.add_flag("--hold", hold, "After the result, exit only once stdin closes");
  CLI11_PARSE(app, argc, argv);
  if (world == 0) world = ranks;
  if (world < ranks) die("--world is below --ranks");
  if (proxies > ranks) die("more proxies than ranks");

  // Each rank's socket, each proxy's accepted one, its listener and its store connection.
  raiseFileLimit(static_cast<uint64_t>(ranks) * (proxies ? 2 : 1) +
                 static_cast<uint64_t>(proxies) * 2 + 64);

  try {
    asio::io_context io(1);
    const auto address = asio::ip::make_address(host);
    std::vector<std::unique_ptr<dlrun::StoreProxy>> stores;
    Load::Options options{.ranks = ranks,
                          .world = world,
                          .window = window,
                          .prefix = prefix,
                          .sources = proxies == 0 ? sources : 0};
    if (proxies == 0) {
      options.targets.emplace_back(address, port);
    } else {
      for (int p = 0; p < proxies; ++p) {
        const std::string upstream =
            upstreams == 1 ? host : "127.0.0." + std::to_string(1 + p % upstreams);
        // Each proxy on a loopback address of its own, as each node has its own: a listener
        // takes an ephemeral port on its address only, so 10,000 of them (and the TIME_WAITs of
        // earlier runs) do not run Linux's default range (28k) dry.
        const std::string local =
            "127.1." + std::to_string(p / 250 % 250) + "." + std::to_string(p % 250 + 1);
        stores.push_back(std::make_unique<dlrun::StoreProxy>(
            io, dlrun::StoreProxyOptions{.upstream = {upstream, port}, .listen = {local, 0}}));
        options.targets.emplace_back(asio::ip::make_address(local), stores.back()->port());
      }
    }
    Load load(io, std::move(options));
    if (go) {
      std::cout << "ready" << std::endl;
      std::string line;
      if (!std::getline(std::cin, line)) die("stdin closed before the start");
    }
    asio::steady_timer limit(io, std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                     std::chrono::duration<double>(deadline)));
    limit.async_wait([&](const error_code& ec) {
      if (ec) return;
      die("the deadline of " + std::to_string(deadline) + " s passed with " +
          std::to_string(load.answered) + " of " + std::to_string(ranks) + " WAITs answered");
    });
    load.start();
    io.run();
    if (load.answered != ranks) die("the loop ended early");

    dlrun::StoreProxyStats sum;
    for (const auto& store : stores) {
      const auto s = store->stats();
      sum.clients += s.clients;
      sum.requests += s.requests;
      sum.upstreamRequests += s.upstreamRequests;
      sum.upstreamConnections += s.upstreamConnections;
      sum.coalescedWaits += s.coalescedWaits;
      sum.coalescedAdds += s.coalescedAdds;
    }
    const uint64_t storeConnections =
        proxies ? sum.upstreamConnections : static_cast<uint64_t>(ranks);
    std::cout << "{\"start_ns\": " << load.startNs << ", \"end_ns\": " << load.endNs
              << ", \"ranks\": " << ranks << ", \"world\": " << world
              << ", \"proxies\": " << proxies << ", \"failures\": 0, \"finals\": " << load.finals
              << ", \"retries\": " << load.retries
              << ", \"store_connections\": " << storeConnections
              << ", \"proxy_clients\": " << sum.clients << ", \"proxy_requests\": " << sum.requests
              << ", \"upstream_requests\": " << sum.upstreamRequests
              << ", \"coalesced_waits\": " << sum.coalescedWaits
              << ", \"coalesced_adds\": " << sum.coalescedAdds << "}" << std::endl;
    if (hold) {
      std::string line;
      while (std::getline(std::cin, line)) {
      }
    }
  } catch (const std::exception& e) {
    die(e.what());
  }
  // The kernel closes the sockets; tearing down 100,000 of them one by one is no part of this.
  std::cout.flush();
  std::_Exit(0);
}
