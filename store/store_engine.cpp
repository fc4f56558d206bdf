#include "store/store_engine.h"

#include <algorithm>

namespace dlrun {
namespace {

using wire::Op;

std::string encodeI64(int64_t value) {
  std::string out;
  wire::Encoder(out).i64(value);
  return out;
}

std::string encodeBytes(std::string_view value) {
  std::string out;
  wire::Encoder(out).bytes(value);
  return out;
}

// The integer at the start of `text` as C's strtoll reads it, which is how torch reads counters:
// leading white space, an optional sign, then at least one digit; whatever follows is ignored.
// nullopt without digits or beyond 64 bits.
std::optional<int64_t> leadingInteger(std::string_view text) {
  size_t i = text.find_first_not_of(" \t\n\v\f\r");
  if (i == std::string_view::npos) return std::nullopt;
  const bool negative = text[i] == '-';
  if (text[i] == '-' || text[i] == '+') ++i;
  const uint64_t limit = negative ? uint64_t{1} << 63 : (uint64_t{1} << 63) - 1;
  uint64_t magnitude = 0;
  const size_t first = i;
  for (; i < text.size() && text[i] >= '0' && text[i] <= '9'; ++i) {
    const auto digit = static_cast<uint64_t>(text[i] - '0');
    if (magnitude > (limit - digit) / 10) return std::nullopt;
    magnitude = magnitude * 10 + digit;
  }
  if (i == first) return std::nullopt;
  return negative ? static_cast<int64_t>(0 - magnitude) : static_cast<int64_t>(magnitude);
}

}  // namespace

void StoreEngine::handle(Peer& peer, const wire::Request& r, TimePoint now) {
  renewLeases(peer, now);
  switch (r.op) {
    case Op::Validate:  // the parser has checked the magic; VALIDATE has no reply
    case Op::WatchKey:  // refused by the parser
      return;
    case Op::SpaceOpen:  // the server's, which opens ports: an engine holds one space's keys
    case Op::SpaceClose:
      throw RequestError(std::string(wire::opName(r.op)) + " is not served here");
    case Op::Set: setValue(r.keys[0], r.values[0]); return;
    case Op::CompareSet: compareSet(peer, r); return;
    case Op::Get: {
      // Clients WAIT before GET; a key deleted in between reads as empty rather than hanging.
      auto it = data_.find(r.keys[0]);
      reply(peer, encodeBytes(it == data_.end() ? std::string_view() : it->second));
      return;
    }
    case Op::Add: return add(peer, r);
    case Op::Check: {
      const bool ready =
          std::all_of(r.keys.begin(), r.keys.end(), [&](std::string_view k) { return present(k); });
      replyByte(peer,
                static_cast<uint8_t>(ready ? wire::CheckReply::Ready : wire::CheckReply::NotReady));
      return;
    }
    case Op::Wait:
    case Op::GroupWait: wait(peer, r); return;
    case Op::GroupCancel: cancelGroupWait(peer, static_cast<uint64_t>(r.number)); return;
    case Op::GetNumKeys: reply(peer, encodeI64(static_cast<int64_t>(data_.size()))); return;
    case Op::DeleteKey: {
      auto it = data_.find(r.keys[0]);
      const bool found = it != data_.end();
      if (found) {
        dropLease(it->first);  // deleting a leased key is its holder's clean release
        data_.erase(it);
      }
      reply(peer, encodeI64(found ? 1 : 0));
      return;
    }
    case Op::Append: {
      auto it = data_.find(r.keys[0]);
      if (it == data_.end()) {
        setValue(r.keys[0], r.values[0]);
      } else {
        it->second.append(r.values[0]);
        keyWritten(it->first);
      }
      return;
    }
    case Op::MultiGet: {
      std::string out;
      wire::Encoder encoder(out);
      for (auto key : r.keys) {
        auto it = data_.find(key);
        encoder.bytes(it == data_.end() ? std::string_view() : it->second);
      }
      reply(peer, out);
      return;
    }
    case Op::MultiSet:
      for (size_t i = 0; i < r.keys.size(); ++i) setValue(r.keys[i], r.values[i]);
      return;
    case Op::CancelWait:
      cancelWaits(peer);
      replyByte(peer, static_cast<uint8_t>(wire::WaitReply::WaitCanceled));
      return;
    case Op::Ping: {
      std::string out;
      wire::Encoder(out).u32(r.word);
      reply(peer, out);
      return;
    }
    case Op::QueuePush: {
      const std::string key(r.keys[0]);
      queues_[key].emplace_back(r.values[0]);
      wakeOne(key);  // one new item satisfies one blocked pop, as in PyTorch
      return;
    }
    case Op::QueuePop: queuePop(peer, r); return;
    case Op::QueueLen: {
      auto it = queues_.find(r.keys[0]);
      reply(peer, encodeI64(it == queues_.end() ? 0 : static_cast<int64_t>(it->second.size())));
      return;
    }
    case Op::ListKeys: {
      std::string out;
      wire::Encoder encoder(out);
      encoder.i64(static_cast<int64_t>(data_.size()));
      for (const auto& entry : data_) encoder.bytes(entry.first);
      reply(peer, out);
      return;
    }
    case Op::Barrier: return barrier(peer, r);
    case Op::Lease:
      lease(peer, r, now);
      replyByte(peer, 0);
      return;
  }
  throw RequestError("unhandled op");
}

void StoreEngine::compareSet(Peer& peer, const wire::Request& r) {
  // PyTorch's semantics: a missing key is created only when `expected` is empty; the reply is
  // always the value now stored (or `expected` when the key is missing and not created).
  auto it = data_.find(r.keys[0]);
  if (it == data_.end()) {
    // Unlike torch's libuv server, waiters on the missing key stay asleep: it still is missing.
    if (r.values[0].empty()) setValue(r.keys[0], r.values[1]);
    reply(peer, encodeBytes(r.values[0].empty() ? r.values[1] : r.values[0]));
    return;
  }
  if (it->second == r.values[0]) it->second.assign(r.values[1]);
  keyWritten(it->first);  // a write even when nothing changed, as in torch: it ends barriers
  reply(peer, encodeBytes(it->second));
}

int64_t StoreEngine::sum(wire::Op op, std::string_view key, int64_t delta) const {
  const auto refused = [&](const std::string& why) {
    return RequestError(std::string(wire::opName(op)) + " refused: " + why);
  };
  int64_t current = 0;
  auto it = data_.find(key);
  if (it != data_.end()) {
    auto parsed = leadingInteger(it->second);
    if (!parsed)
      throw refused("'" + std::string(key) + "' holds no integer (or one beyond 64 bits)");
    current = *parsed;
  }
  int64_t updated = 0;
  // torch wraps around (signed overflow); a counter that jumps sign helps nobody.
  if (__builtin_add_overflow(current, delta, &updated))
    throw refused("adding to '" + std::string(key) + "' overflows a 64-bit integer");
  return updated;
}

void StoreEngine::add(Peer& peer, const wire::Request& r) {
  const int64_t updated = sum(r.op, r.keys[0], r.number);
  setValue(r.keys[0], std::to_string(updated));
  reply(peer, encodeI64(updated));
}

void StoreEngine::barrier(Peer& peer, const wire::Request& r) {
  // Each arrival adds 1 to the key. The one that reaches the world size is answered at once and
  // wakes every waiter on the key; earlier ones wait on the key like a WAIT, so any later
  // write to it also ends their wait (as in torch), but another arrival short of the world
  // size does not.
  const int64_t count = sum(r.op, r.keys[0], 1);
  if (count >= r.number) {
    setValue(r.keys[0], std::to_string(count));
    replyByte(peer, static_cast<uint8_t>(wire::WaitReply::StopWaiting));
    return;
  }
  if (auto it = data_.find(r.keys[0]); it != data_.end()) {
    it->second = std::to_string(count);
  } else {
    setValue(r.keys[0], std::to_string(count));  // unlike torch, WAITs on the key see it appear
  }
  addWaiter(peer, {std::string(r.keys[0])});
}

void StoreEngine::queuePop(Peer& peer, const wire::Request& r) {
  // Reply: int64 queue length before the pop, then the popped value when it was not empty.
  // A blocking pop is the client's WAIT on the queue's key followed by this non-blocking pop.
  auto it = queues_.find(r.keys[0]);
  std::string out;
  wire::Encoder encoder(out);
  if (it == queues_.end() || it->second.empty()) {
    encoder.i64(0);
  } else {
    encoder.i64(static_cast<int64_t>(it->second.size())).bytes(it->second.front());
    it->second.pop_front();
    if (it->second.empty()) queues_.erase(it);
  }
  reply(peer, out);
}

void StoreEngine::setValue(std::string_view key, std::string_view value) {
  auto it = data_.find(key);
  if (it == data_.end()) it = data_.emplace(std::string(key), std::string()).first;
  it->second.assign(value);
  keyWritten(it->first);
}

bool StoreEngine::present(std::string_view key) const {
  if (data_.contains(key)) return true;
  auto queue = queues_.find(key);
  return queue != queues_.end() && !queue->second.empty();
}

void StoreEngine::wait(Peer& peer, const wire::Request& r) {
  std::vector<std::string> missing;
  for (auto key : r.keys) {
    if (!present(key) && std::find(missing.begin(), missing.end(), key) == missing.end())
      missing.emplace_back(key);
  }
  if (r.op == wire::Op::GroupWait) {
    const uint64_t tag = peer.groupWaits_++;
    if (missing.empty()) return replyGroup(peer, tag, wire::WaitReply::StopWaiting);
    return addWaiter(peer, std::move(missing), tag);
  }
  if (missing.empty()) return replyByte(peer, static_cast<uint8_t>(wire::WaitReply::StopWaiting));
  addWaiter(peer, std::move(missing));
}

void StoreEngine::addWaiter(Peer& peer, std::vector<std::string> keys,
                            std::optional<uint64_t> group) {
  const uint64_t id = nextWaiterId_++;
  for (const auto& key : keys) waitersByKey_[key].push_back(id);
  peer.waiters_.push_back(id);
  const size_t remaining = keys.size();
  waiters_.emplace(id, Waiter{&peer, std::move(keys), remaining, group});
}

void StoreEngine::keyWritten(const std::string& key) {
  auto byKey = waitersByKey_.find(key);
  if (byKey == waitersByKey_.end()) return;
  std::vector<uint64_t> ids = std::move(byKey->second);
  waitersByKey_.erase(byKey);
  for (uint64_t id : ids) keyArrivedFor(id);
}

void StoreEngine::keyArrivedFor(uint64_t id, bool pushed) {
  auto it = waiters_.find(id);
  if (it == waiters_.end()) return;
  it->second.pushed = it->second.pushed || pushed;
  if (--it->second.remaining > 0) return;
  Peer* peer = it->second.peer;
  const std::optional<uint64_t> group = it->second.group;
  const bool pushedOne = it->second.pushed;
  forgetWaiter(id);
  if (!group) return replyByte(*peer, static_cast<uint8_t>(wire::WaitReply::StopWaiting));
  replyGroup(*peer, *group,
             pushedOne ? wire::WaitReply::StopWaitingOne : wire::WaitReply::StopWaiting);
}

void StoreEngine::cancelGroupWait(Peer& peer, uint64_t tag) {
  for (uint64_t id : peer.waiters_) {
    if (waiters_.at(id).group != tag) continue;
    forgetWaiter(id);  // changes peer.waiters_: return at once
    return;
  }
}

void StoreEngine::reply(Peer& peer, std::string_view bytes) {
  // An empty reply (MULTI_GET of no keys) stays nothing, framed or not.
  if (bytes.empty() || peer.groupWaits_ == 0) return peer.send(bytes);
  std::string framed(1, static_cast<char>(wire::FramedReply::InOrder));
  framed.append(bytes);
  peer.send(framed);
}

void StoreEngine::replyByte(Peer& peer, uint8_t value) {
  const char byte = static_cast<char>(value);
  reply(peer, std::string_view(&byte, 1));
}

void StoreEngine::replyGroup(Peer& peer, uint64_t tag, wire::WaitReply value) {
  std::string framed;
  wire::Encoder(framed)
      .u8(static_cast<uint8_t>(wire::FramedReply::GroupWait))
      .u64(tag)
      .u8(static_cast<uint8_t>(value));
  peer.send(framed);
}

void StoreEngine::wakeOne(const std::string& key) {
  auto byKey = waitersByKey_.find(key);
  if (byKey == waitersByKey_.end()) return;
  const uint64_t id = byKey->second.front();
  byKey->second.erase(byKey->second.begin());
  if (byKey->second.empty()) waitersByKey_.erase(byKey);
  keyArrivedFor(id, true);
}

void StoreEngine::forgetWaiter(uint64_t id) {
  auto it = waiters_.find(id);
  if (it == waiters_.end()) return;
  for (const auto& key : it->second.missing) {
    auto byKey = waitersByKey_.find(key);
    if (byKey == waitersByKey_.end()) continue;
    std::erase(byKey->second, id);
    if (byKey->second.empty()) waitersByKey_.erase(byKey);
  }
  std::erase(it->second.peer->waiters_, id);
  waiters_.erase(it);
}

void StoreEngine::cancelWaits(Peer& peer) {
  for (uint64_t id : std::vector<uint64_t>(peer.waiters_)) forgetWaiter(id);
}

void StoreEngine::disconnect(Peer& peer) {
  cancelWaits(peer);  // first, so the peer is not answered for its own tripwires
  peer.groupWaits_ = 0;
  for (const auto& key : std::vector<std::string>(peer.leases_)) fireLease(key);
}

void StoreEngine::lease(Peer& peer, const wire::Request& r, TimePoint now) {
  const std::string key(r.keys[0]);
  dropLease(key);  // a new lease replaces the key's old one, whoever held it
  setValue(key, r.values[0]);
  const std::chrono::milliseconds ttl(r.ttlMs);
  Lease held{&peer, ttl, now + ttl, {}};
  for (size_t i = 1; i < r.keys.size(); ++i) held.tripwires.emplace_back(r.keys[i], r.values[i]);
  leaseDeadlines_.emplace(held.deadline, key);
  peer.leases_.push_back(key);
  leases_.emplace(key, std::move(held));
}

void StoreEngine::renewLeases(Peer& peer, TimePoint now) {
  for (const auto& key : peer.leases_) {
    Lease& lease = leases_.find(key)->second;
    auto entry = leaseDeadlines_.extract({lease.deadline, key});
    lease.deadline = now + lease.ttl;
    entry.value().first = lease.deadline;
    leaseDeadlines_.insert(std::move(entry));
  }
}

std::optional<StoreEngine::Lease> StoreEngine::dropLease(std::string_view key) {
  auto it = leases_.find(key);
  if (it == leases_.end()) return std::nullopt;
  // From here on only the extracted node names the key: `key` may view an index entry.
  auto node = leases_.extract(it);
  const std::string& name = node.key();
  Lease& lease = node.mapped();
  leaseDeadlines_.erase({lease.deadline, name});
  std::erase(lease.owner->leases_, name);
  return std::move(lease);
}

void StoreEngine::fireLease(std::string_view key) {
  // The key goes without waking anyone (nobody waits for a key that exists); the tripwires
  // are what waiters watch. An existing tripwire keeps its value: the first writer wins.
  if (auto it = data_.find(key); it != data_.end()) data_.erase(it);
  auto lease = dropLease(key);
  for (const auto& [tripwire, value] : lease->tripwires) {
    if (!data_.contains(tripwire)) setValue(tripwire, value);
  }
}

void StoreEngine::expireLeases(TimePoint now) {
  while (!leaseDeadlines_.empty() && leaseDeadlines_.begin()->first <= now)
    fireLease(leaseDeadlines_.begin()->second);
}

std::optional<StoreEngine::TimePoint> StoreEngine::nextLeaseDeadline() const {
  if (leaseDeadlines_.empty()) return std::nullopt;
  return leaseDeadlines_.begin()->first;
}

}  // namespace dlrun
