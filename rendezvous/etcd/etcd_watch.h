// EtcdWatch: key ranges of an EtcdClient (etcd_client.h) watched over one Watch stream, driven
// by its owner's thread. Its code: etcd_watch.cpp.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "rendezvous/etcd/etcd_client.h"

namespace grpc {
class Channel;
}

namespace dlrun::rendezvous::etcd {

// A watch of one or more key ranges on its own Watch stream, driven by its owner's thread
// through a completion queue: next() waits for the next batch of events up to a timeout. Each
// range's events arrive in revision order, each once; a batch holds one range's events (the
// ranges of a stream interleave in no promised order). cancel() may be called from any thread
// and makes a blocked next() throw.
//
// Fail-over: when the stream fails (UNAVAILABLE, its end, a member without a leader), next()
// opens a new one on another endpoint of the client, each range from its lastRevision() + 1,
// trying for up to the client's connectTimeout (next() may return that much after its own
// timeout).
class EtcdWatch {
 public:
  // Opens the watch (with fail-over across the client's endpoints); returns once etcd confirmed
  // every range.
  EtcdWatch(EtcdClient& client, std::vector<WatchRange> ranges);
  EtcdWatch(EtcdClient& client, std::string key, std::string rangeEnd, int64_t startRevision);
  ~EtcdWatch();
  EtcdWatch(const EtcdWatch&) = delete;
  EtcdWatch& operator=(const EtcdWatch&) = delete;

  // The next events, or none when `timeout` passed first. Throws NetworkError when the stream
  // ends and no endpoint takes the watch again, or after cancel(); Error when etcd cancelled the
  // watch (its start revision was compacted, named in the message: re-read, then watch again
  // from the read's revision + 1).
  std::vector<WatchEvent> next(std::chrono::milliseconds timeout);
  void cancel();
  // The revision of the last event of range `range` delivered (or the revision it started
  // after): that range resumed from lastRevision() + 1 misses nothing and repeats nothing.
  int64_t lastRevision(size_t range = 0) const { return ranges_.at(range).lastRevision; }
  // The endpoint the stream uses now.
  std::string endpoint() const;
  // How many times the watch moved to another stream.
  int reconnects() const { return reconnects_; }

 private:
  struct Stream;
  // Opens a stream from lastRevision_ + 1 (from now the first time when startRevision was 0),
  // on the endpoints of the client, avoiding `failed` first; throws after connectTimeout.
  void connect(const std::string& failed, const std::string& why);
  // `token`: etcd's auth token, sent as metadata (empty: none).
  void open(const std::string& endpoint, const std::shared_ptr<grpc::Channel>& channel,
            const std::string& token);
  [[noreturn]] void throwCancelled() const;
  std::string what() const;  // "watch of KEY" for messages
  // The events of one response of the stream, new to their range (kept for next() while the
  // stream opens); throws Error when etcd cancelled a range.
  std::vector<WatchEvent> take(const std::string& endpoint);

  struct Range {
    WatchRange range;
    bool fromNow;
    int64_t lastRevision;
  };
  EtcdClient& client_;
  std::vector<Range> ranges_;      // watch id i + 1 is range i
  std::vector<WatchEvent> early_;  // events that came while the stream opened
  int reconnects_ = 0;
  std::atomic<bool> cancelled_{false};
  mutable std::mutex mutex_;  // stream_ (swapped here, cancelled from cancel()), endpoint_
  std::unique_ptr<Stream> stream_;
  std::string endpoint_;
};

}  // namespace dlrun::rendezvous::etcd
