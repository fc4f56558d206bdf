// The store proxy's inside (store_proxy.h): the proxy, its connections to the store
// (Upstream) and its clients (Client, store_proxy_links.cpp). Only the proxy's files include it.
#pragma once

#include <array>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/asio.h"
#include "common/listen.h"
#include "store/store_proxy.h"

namespace dlrun::detail {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using boost::system::error_code;
using wire::Op;

// Who takes a reply: the reply's bytes, as the store sent them.
using Take = std::function<void(std::string_view)>;
// Withdraws a blocking request whose client gave up on it (CANCEL_WAIT, or gone).
using Cancel = std::function<void()>;
// Runs its argument once the client has had the reply to its next request, or sends a blocking
// one (a WAIT or BARRIER, whose reply may hang on what waits for it), or is gone.
using AfterNext = std::function<void(std::function<void()>)>;

// Bytes for a socket, one async_write at a time: what is queued meanwhile goes next.
class Outbox {
 public:
  std::string& queued() { return out_; }
  // Writes what is queued unless a write is in flight; `then(error)` runs once it is done
  // (and holds the owner alive).
  template <typename Then>
  void write(tcp::socket& socket, Then then) {
    if (writing_ || out_.empty()) return;
    writing_ = true;
    sending_.swap(out_);
    asio::async_write(socket, asio::buffer(sending_),
                      [this, then = std::move(then)](const error_code& ec, size_t) mutable {
                        writing_ = false;
                        sending_.clear();
                        then(ec);
                      });
  }

 private:
  std::string out_, sending_;
  bool writing_ = false;
};

class ProxyImpl;

// One connection to the store, in one era: requests go out in order, and replies, which an
// immediate op's store answers in order, go to their takers in that order. GROUP_WAITs share
// it: from the first on, the store frames its replies (wire.h) and wakes come out of turn.
class Upstream : public std::enable_shared_from_this<Upstream> {
 public:
  Upstream(ProxyImpl& proxy, wire::Era era);
  void start();
  // Sends `request`; `take` gets its reply (none for an op without one).
  void send(std::string_view request, Op op, size_t keys, Take take);
  // Sends a GROUP_WAIT (V2); `take` gets its one-byte reply. Returns what withdraws it.
  Cancel sendGroupWait(std::string_view request, Take take);
  bool idle() const { return expected_.empty() && groups_.empty(); }
  void close();

 private:
  struct Expected {
    Op op;
    size_t keys;
    Take take;
    bool framed;  // sent after the first GROUP_WAIT
  };
  void read();
  void onRead(const error_code& ec, size_t n);
  // Hands the reply at the start of `data` to its taker: its size, or nullopt while incomplete.
  std::optional<size_t> takeReply(std::span<const char> data);
  void flush();
  void fail(const std::string& why);

  ProxyImpl& proxy_;
  tcp::socket socket_;
  wire::Era era_;
  bool connected_ = false, closed_ = false;
  Outbox outbox_;
  std::string in_;
  std::vector<char> buffer_ = std::vector<char>(16 * 1024);
  std::deque<Expected> expected_;
  bool framed_ = false;
  uint64_t groupsSent_ = 0;
  std::unordered_map<uint64_t, Take> groups_;  // GROUP_WAITs out, by number
};

class Client;
// A worker's connection, served from now on; closeClient ends it.
std::shared_ptr<Client> startClient(ProxyImpl& proxy, tcp::socket socket);
void closeClient(Client& client);

class ProxyImpl : public std::enable_shared_from_this<ProxyImpl> {
 public:
  ProxyImpl(asio::io_context& io, StoreProxyOptions options)
      : io_(io),
        options_(std::move(options)),
        listener_(listenOn(io,
                           tcp::endpoint(asio::ip::make_address(options_.listen.socketHost()),
                                         options_.listen.port),
                           "the store proxy on " + options_.listen.host)),
        upstream_(asio::ip::make_address(options_.upstream.socketHost()), options_.upstream.port) {}

  void start();
  void stop();
  uint16_t port() const { return listener_.local().port(); }

  asio::io_context& io() { return io_; }
  const wire::Limits& limits() const { return options_.limits; }
  const tcp::endpoint& upstream() const { return upstream_; }
  std::span<char> scratch() { return scratch_; }
  void forget(Client* client) { clients_.erase(client); }  // it closed
  // The store's connection failed: every client's goes too, as it would without the proxy.
  void failAll(const std::string& why);

  // An immediate request on the era's shared connection.
  void forward(wire::Era era, std::string_view request, Op op, size_t keys, Take take);
  std::shared_ptr<Upstream>& shared(wire::Era era);
  // A blocking request (BARRIER) on a connection of its own, back to the pool once answered,
  // sent once a PING on the shared connection is answered: the client's earlier requests there
  // (a SET has no reply to wait for) are applied first, as on one connection. Its cancel closes
  // that connection: the store then forgets the request, as CANCEL_WAIT would have it.
  Cancel forwardBlocking(wire::Era era, std::string_view request, Op op, Take take);
  // WAIT on the keys of `request`: joins a WAIT already sent for the same keys, else sends one.
  // Its cancel leaves the group; the last to leave withdraws the store's WAIT.
  Cancel wait(wire::Era era, std::string_view request, Take take, AfterNext afterNext);
  // ADD of `delta` to `key`, coalesced with the ADDs that arrive while one is in flight.
  void add(wire::Era era, std::string_view key, int64_t delta, Take take);

  struct Counters {
    std::atomic<uint64_t> clients{0}, requests{0}, upstreamRequests{0}, upstreamConnections{0},
        coalescedWaits{0}, coalescedAdds{0};
  } counters;

 private:
  std::shared_ptr<Upstream> connect(wire::Era era);
  std::shared_ptr<Upstream> pooled(wire::Era era);
  void release(wire::Era era, std::shared_ptr<Upstream> upstream);
  void drop(const std::shared_ptr<Upstream>& upstream);
  void sendGroupWait(const std::string& id);
  void groupWoken(const std::string& id, std::string_view reply);
  void releaseCovered(const std::string& id);
  void checkLate(const std::string& id);
  void sendAdds(const std::string& id);
  // Sends the ADDs held for the end of this loop turn (add()); every other request goes up
  // after them, so a client's requests reach the store in the order it sent them.
  void sendPostedAdds();

  struct AddBatch {
    wire::Era era;
    std::string key;
    bool inFlight = false;  // an ADD of this key is sent, or held in posted_ to be
    std::vector<std::pair<int64_t, Take>> queued;
  };

  asio::io_context& io_;
  StoreProxyOptions options_;
  Listener listener_;
  tcp::endpoint upstream_;
  std::vector<char> scratch_ = std::vector<char>(64 * 1024);
  std::unordered_map<Client*, std::shared_ptr<Client>> clients_;
  std::unordered_set<std::shared_ptr<Upstream>> upstreams_;  // every open one
  std::array<std::shared_ptr<Upstream>, 2> shared_;          // by era
  std::array<std::vector<std::shared_ptr<Upstream>>, 2> pool_;
  struct Member {
    Take take;
    AfterNext afterNext;
  };
  struct WaitGroup {
    uint64_t serial = 0;                 // this group's own (a later one may take its keys)
    std::string request;                 // the GROUP_WAIT
    std::map<uint64_t, Member> members;  // in arrival order
    Cancel withdraw;                     // the store's GROUP_WAIT while it is out
    bool checking = false;               // a CHECK of the keys is out (checkLate)
    // Members numbered below it joined before the GROUP_WAIT or CHECK out was sent: its answer
    // holds for them alone.
    uint64_t covered = 0;
  };
  std::map<std::string, WaitGroup> waits_;  // by era and the WAIT's keys
  uint64_t nextMember_ = 0;
  std::map<std::string, AddBatch> adds_;  // by era and key
  std::vector<std::string> posted_;       // batches held for the end of this loop turn, unsent
  bool failing_ = false;
};

}  // namespace dlrun::detail
