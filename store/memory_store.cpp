#include "store/memory_store.h"

#include "common/error.h"
#include "store/wire.h"

namespace dlrun {
namespace {

using wire::Op;

// The request as the parser would have produced it; the views point into the caller's strings,
// which outlive the call.
wire::Request makeRequest(Op op, std::vector<std::string_view> keys = {},
                          std::vector<std::string_view> values = {}) {
  wire::Request request;
  request.op = op;
  request.keys = std::move(keys);
  request.values = std::move(values);
  return request;
}

std::vector<std::string_view> views(const std::vector<std::string>& strings) {
  return {strings.begin(), strings.end()};
}

// Reads the engine's reply bytes with the framing TcpStore reads off the socket. A view: the
// bytes (often a temporary of the same full expression) outlive it.
class Reply {
 public:
  explicit Reply(std::string_view bytes) : bytes_(bytes) {}
  uint8_t u8() { return static_cast<uint8_t>(take(1).front()); }
  int64_t i64() { return static_cast<int64_t>(wire::loadU64(take(8).data())); }
  std::string bytes() { return std::string(take(wire::loadU64(take(8).data()))); }

 private:
  std::string_view take(uint64_t n) {
    if (bytes_.size() - pos_ < n) throw ProtocolError("the store engine sent a short reply");
    std::string_view out = bytes_.substr(pos_, n);
    pos_ += n;
    return out;
  }
  std::string_view bytes_;
  size_t pos_ = 0;
};

Clock::time_point deadlineAfter(Clock::time_point now, std::chrono::milliseconds timeout) {
  // Saturates, so that "wait practically forever" cannot overflow the clock.
  const auto room =
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::time_point::max() - now);
  return timeout >= room ? Clock::time_point::max() : now + timeout;
}

}  // namespace

MemoryStore::MemoryStore(std::chrono::milliseconds timeout)
    : MemoryStore(std::make_shared<MemoryStoreServer>(), timeout) {}

MemoryStore::MemoryStore(std::shared_ptr<MemoryStoreServer> server,
                         std::chrono::milliseconds timeout)
    : server_(std::move(server)), timeout_(timeout) {}

MemoryStore::~MemoryStore() {
  std::lock_guard lock(server_->mutex_);
  if (!aborted_) server_->engine_.disconnect(connection_);
  server_->changed_.notify_all();  // its tripwires may answer waits
}

void MemoryStore::abort() {
  std::lock_guard lock(server_->mutex_);
  if (aborted_) return;
  aborted_ = true;
  server_->engine_.disconnect(connection_);
  server_->aborted(this);
}

void MemoryStore::requireOpen() const {
  if (aborted_) throw NetworkError("the connection to the in-memory store was aborted");
}

std::string MemoryStore::request(const wire::Request& request) {
  requireOpen();
  server_->handle(connection_, request);
  return std::exchange(connection_.replies, {});
}

std::string MemoryStore::call(const wire::Request& r) {
  std::lock_guard lock(server_->mutex_);
  return request(r);
}

void MemoryStore::set(const std::string& key, const std::string& value) {
  call(makeRequest(Op::Set, {key}, {value}));
}

std::string MemoryStore::get(const std::string& key) {
  wait({key}, timeout_);
  return Reply(call(makeRequest(Op::Get, {key}))).bytes();
}

int64_t MemoryStore::add(const std::string& key, int64_t delta) {
  wire::Request r = makeRequest(Op::Add, {key});
  r.number = delta;
  return Reply(call(r)).i64();
}

std::string MemoryStore::compareSet(const std::string& key, const std::string& expected,
                                    const std::string& desired) {
  return Reply(call(makeRequest(Op::CompareSet, {key}, {expected, desired}))).bytes();
}

bool MemoryStore::deleteKey(const std::string& key) {
  return Reply(call(makeRequest(Op::DeleteKey, {key}))).i64() == 1;
}

bool MemoryStore::check(const std::vector<std::string>& keys) {
  return Reply(call(makeRequest(Op::Check, views(keys)))).u8() ==
         static_cast<uint8_t>(wire::CheckReply::Ready);
}

int64_t MemoryStore::numKeys() { return Reply(call(makeRequest(Op::GetNumKeys))).i64(); }

void MemoryStore::append(const std::string& key, const std::string& value) {
  call(makeRequest(Op::Append, {key}, {value}));
}

std::vector<std::string> MemoryStore::multiGet(const std::vector<std::string>& keys) {
  wait(keys, timeout_);
  return peek(keys);
}

std::vector<std::string> MemoryStore::peek(const std::vector<std::string>& keys) {
  const std::string bytes = call(makeRequest(Op::MultiGet, views(keys)));
  Reply reply(bytes);
  std::vector<std::string> values;
  values.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) values.push_back(reply.bytes());
  return values;
}

void MemoryStore::multiSet(const std::vector<std::string>& keys,
                           const std::vector<std::string>& values) {
  requireSameLength(keys, values);
  call(makeRequest(Op::MultiSet, views(keys), views(values)));
}

void MemoryStore::lease(const std::string& key, const std::string& value,
                        std::chrono::milliseconds ttl,
                        const std::vector<std::pair<std::string, std::string>>& tripwires) {
  requirePositiveTtl(key, ttl);
  wire::Request r = makeRequest(Op::Lease, {key}, {value});
  r.ttlMs = static_cast<uint64_t>(ttl.count());
  for (const auto& [tripwire, tripValue] : tripwires) {
    r.keys.push_back(tripwire);
    r.values.push_back(tripValue);
  }
  if (const uint8_t reply = Reply(call(r)).u8(); reply != 0)
    throw ProtocolError("the store engine answered LEASE with " + std::to_string(reply));
}

bool MemoryStore::waitFor(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  const wire::Request wait = makeRequest(Op::Wait, views(keys));
  std::unique_lock lock(server_->mutex_);
  // Over TCP the WAIT (and a CANCEL_WAIT) renews the connection's leases; here the wait is a
  // peer of its own, so a PING on the connection stands in for that renewal.
  request(makeRequest(Op::Ping));
  MemoryStoreServer::Wait waiting(*server_, this, deadlineAfter(server_->nowLocked(), timeout));
  server_->handle(waiting, wait);
  // Whatever ends the wait, the engine must forget it before `waiting` goes: CANCEL_WAIT, as
  // TcpStore sends after a timeout, answered by WAIT_CANCELED.
  auto cancel = [&] {
    if (!aborted_) request(makeRequest(Op::Ping));
    server_->handle(waiting, makeRequest(Op::CancelWait));
  };
  try {
    server_->block(lock, waiting);
  } catch (...) {
    cancel();
    throw;
  }
  if (!waiting.replies.empty()) {
    if (Reply(waiting.replies).u8() != static_cast<uint8_t>(wire::WaitReply::StopWaiting))
      throw ProtocolError("the store engine answered WAIT with an unexpected reply");
    return true;
  }
  cancel();
  requireOpen();  // aborted while waiting
  return false;
}

}  // namespace dlrun
