#include "store/tcp_store.h"

#include <unistd.h>

#include <thread>

#include "common/error.h"
#include "common/host_port.h"
#include "common/port_holder.h"
#include "store/address.h"
#include "store/backoff.h"
#include "store/wire.h"

namespace dlrun {
namespace {

using wire::Encoder;
using wire::Era;
using wire::Op;

// A reply longer than this is taken as a broken server rather than allocated.
constexpr uint64_t kMaxReplyBytes = uint64_t{1} << 32;

// What a wrong server sent, as one line of text: printable bytes as they are, others escaped.
std::string shownBytes(std::string_view bytes) {
  static constexpr size_t kShown = 40;
  std::string text = "\"";
  for (const char c : bytes.substr(0, kShown)) {
    if (c == '\n') break;
    if (c >= 0x20 && c < 0x7f) {
      text += c;
    } else {
      static constexpr char kHex[] = "0123456789abcdef";
      const auto byte = static_cast<unsigned char>(c);
      text += std::string("\\x") + kHex[byte >> 4] + kHex[byte & 0xf];
    }
  }
  return text + (bytes.size() > kShown ? "...\"" : "\"");
}

std::string request(Op op) {
  std::string out;
  Encoder(out).op(Era::V2, op);
  return out;
}

std::string keysRequest(Op op, const std::vector<std::string>& keys) {
  std::string out;
  Encoder e(out);
  e.op(Era::V2, op).u64(keys.size());
  for (const auto& key : keys) e.bytes(key);
  return out;
}

std::string keyRequest(Op op, const std::string& key) {
  std::string out;
  Encoder(out).op(Era::V2, op).bytes(key);
  return out;
}

ProtocolError unexpectedReply(uint8_t reply, Op op) {
  return ProtocolError("the store sent the unexpected reply " + std::to_string(reply) + " to " +
                       std::string(wire::opName(op)));
}

}  // namespace

TcpStore::TcpStore(TcpStoreOptions options) : options_(std::move(options)) {
  std::lock_guard lock(mutex_);
  connect();
}

template <typename Fn>
auto TcpStore::locked(Fn&& fn) {
  std::lock_guard lock(mutex_);
  try {
    if (!usable()) {
      if (!options_.reconnect) throw NetworkError(lostConnection());
      connect();
    }
    return fn();
  } catch (...) {
    closeStream();
    throw;
  }
}

void TcpStore::connect() {
  const auto deadline = Clock::now() + options_.connectTimeout;
  ExponentialBackoff backoff;
  while (true) {
    try {
      adopt(TcpStream::connect(options_.at.socketHost(), options_.at.port, deadline));
      handshake();
      return;
    } catch (const NetworkError& e) {
      closeStream();
      if (abortPending()) throw;
      // Retrying covers a server that is still starting; the deadline bounds it.
      const auto pause = backoff.next();
      if (Clock::now() + pause >= deadline) {
        const std::string message = std::string(e.what()) + " (gave up after " +
                                    std::to_string(options_.connectTimeout.count()) + " ms)";
        if (dynamic_cast<const ConnectionRefused*>(&e)) throw ConnectionRefused(message);
        throw TimeoutError(message);
      }
      std::this_thread::sleep_for(pause);
    }
  }
}

void TcpStore::handshake() {
  const auto deadline = Clock::now() + options_.handshakeTimeout;
  std::string hello;
  const uint32_t nonce = static_cast<uint32_t>(::getpid());
  Encoder(hello).op(Era::V2, Op::Validate).u32(wire::kValidationMagic);
  Encoder(hello).op(Era::V2, Op::Ping).u32(nonce);
  const std::string endpoint = options_.at.text();
  // Named with the program holding the port where it is on this machine (a shared node's usual
  // case); looked up only once the server proved to be something else.
  const auto where = [&] {
    std::optional<std::string> holder;
    try {
      if (isLocalAddress(options_.at.socketHost())) holder = portHolder(options_.at.port);
    } catch (const NetworkError&) {
    }
    return "the server at " + endpoint + (holder ? " (" + *holder + ")" : "") +
           " is not a dlrun store (check the endpoint): it ";
  };
  std::string reply;
  try {
    stream_.writeAll(hello, deadline);
    while (reply.size() < 4) {
      std::string more = stream_.readSome(64, deadline);
      if (more.empty()) throw NetworkError("the store at " + endpoint + " closed the connection");
      reply += more;
    }
  } catch (const TimeoutError&) {
    if (reply.empty())
      throw SilentServerError(where() + "accepted the connection but sent nothing back for " +
                              std::to_string(options_.handshakeTimeout.count()) + " ms");
  }
  if (reply.size() != 4 || wire::loadU32(reply.data()) != nonce)
    throw NotAStoreError(where() + "answered " + shownBytes(reply));
}

bool TcpStore::usable() {
  std::lock_guard lock(streamMutex_);
  if (std::exchange(aborted_, false)) stream_.close();
  return stream_.isOpen();
}

void TcpStore::adopt(TcpStream stream) {
  std::lock_guard lock(streamMutex_);
  if (aborted_) throw NetworkError(lostConnection());
  stream_ = std::move(stream);
}

void TcpStore::closeStream() {
  std::lock_guard lock(streamMutex_);
  stream_.close();
}

bool TcpStore::abortPending() {
  std::lock_guard lock(streamMutex_);
  return aborted_;
}

void TcpStore::abort() {
  std::lock_guard lock(streamMutex_);
  aborted_ = true;
  stream_.shutdown();
}

std::string TcpStore::lostConnection() const {
  return "lost the connection to the store at " + options_.at.text();
}

void TcpStore::send(const std::string& bytes) { stream_.writeAll(bytes, replyDeadline()); }

uint8_t TcpStore::readU8() {
  return static_cast<uint8_t>(stream_.readExact(1, replyDeadline())[0]);
}

int64_t TcpStore::readI64() {
  return static_cast<int64_t>(wire::loadU64(stream_.readExact(8, replyDeadline()).data()));
}

std::string TcpStore::readBytes() {
  const auto deadline = replyDeadline();
  const uint64_t length = wire::loadU64(stream_.readExact(8, deadline).data());
  if (length > kMaxReplyBytes)
    throw ProtocolError("the store sent a reply of " + std::to_string(length) + " bytes");
  return stream_.readExact(length, deadline);
}

void TcpStore::set(const std::string& key, const std::string& value) {
  std::string out;
  Encoder(out).op(Era::V2, Op::Set).bytes(key).bytes(value);
  locked([&] { send(out); });
}

std::string TcpStore::get(const std::string& key) {
  wait({key}, options_.timeout);
  return locked([&] {
    send(keyRequest(Op::Get, key));
    return readBytes();
  });
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  std::string out;
  Encoder(out).op(Era::V2, Op::Add).bytes(key).i64(delta);
  return locked([&] {
    send(out);
    return readI64();
  });
}

std::string TcpStore::compareSet(const std::string& key, const std::string& expected,
                                 const std::string& desired) {
  std::string out;
  Encoder(out).op(Era::V2, Op::CompareSet).bytes(key).bytes(expected).bytes(desired);
  return locked([&] {
    send(out);
    return readBytes();
  });
}

bool TcpStore::deleteKey(const std::string& key) {
  return locked([&] {
    send(keyRequest(Op::DeleteKey, key));
    return readI64() == 1;
  });
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  return locked([&] {
    send(keysRequest(Op::Check, keys));
    return readU8() == static_cast<uint8_t>(wire::CheckReply::Ready);
  });
}

bool TcpStore::waitFor(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  return locked([&] {
    send(keysRequest(Op::Wait, keys));
    try {
      const uint8_t reply = static_cast<uint8_t>(stream_.readExact(1, Clock::now() + timeout)[0]);
      if (reply != static_cast<uint8_t>(wire::WaitReply::StopWaiting))
        throw unexpectedReply(reply, Op::Wait);
      return true;
    } catch (const TimeoutError&) {
    }
    // Cancel so the server forgets this wait; it may have answered STOP_WAITING just before.
    send(request(Op::CancelWait));
    uint8_t reply = readU8();
    if (reply == static_cast<uint8_t>(wire::WaitReply::StopWaiting)) reply = readU8();
    if (reply != static_cast<uint8_t>(wire::WaitReply::WaitCanceled))
      throw unexpectedReply(reply, Op::CancelWait);
    return false;
  });
}

int64_t TcpStore::numKeys() {
  return locked([&] {
    send(request(Op::GetNumKeys));
    return readI64();
  });
}

void TcpStore::append(const std::string& key, const std::string& value) {
  std::string out;
  Encoder(out).op(Era::V2, Op::Append).bytes(key).bytes(value);
  locked([&] { send(out); });
}

std::vector<std::string> TcpStore::multiGet(const std::vector<std::string>& keys) {
  wait(keys, options_.timeout);
  return peek(keys);
}

std::vector<std::string> TcpStore::peek(const std::vector<std::string>& keys) {
  return locked([&] {
    send(keysRequest(Op::MultiGet, keys));
    std::vector<std::string> values;
    values.reserve(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) values.push_back(readBytes());
    return values;
  });
}

void TcpStore::multiSet(const std::vector<std::string>& keys,
                        const std::vector<std::string>& values) {
  requireSameLength(keys, values);
  std::string out;
  Encoder e(out);
  e.op(Era::V2, Op::MultiSet).u64(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) e.bytes(keys[i]).bytes(values[i]);
  locked([&] { send(out); });
}

void TcpStore::ping() {
  const uint32_t nonce = static_cast<uint32_t>(::getpid());
  std::string out;
  Encoder(out).op(Era::V2, Op::Ping).u32(nonce);
  locked([&] {
    send(out);
    if (wire::loadU32(stream_.readExact(4, replyDeadline()).data()) != nonce)
      throw ProtocolError("the store answered PING with a wrong nonce");
  });
}

void TcpStore::queuePush(const std::string& key, const std::string& value) {
  std::string out;
  Encoder(out).op(Era::V2, Op::QueuePush).bytes(key).bytes(value);
  locked([&] { send(out); });
}

std::optional<std::string> TcpStore::queuePop(const std::string& key, bool block) {
  if (block) wait({key}, options_.timeout);
  return locked([&]() -> std::optional<std::string> {
    send(keyRequest(Op::QueuePop, key));
    if (readI64() == 0) return std::nullopt;
    return readBytes();
  });
}

int64_t TcpStore::queueLen(const std::string& key) {
  return locked([&] {
    send(keyRequest(Op::QueueLen, key));
    return readI64();
  });
}

void TcpStore::lease(const std::string& key, const std::string& value,
                     std::chrono::milliseconds ttl,
                     const std::vector<std::pair<std::string, std::string>>& tripwires) {
  requirePositiveTtl(key, ttl);
  std::string out;
  Encoder e(out);
  e.op(Era::V2, Op::Lease).bytes(key).bytes(value).u64(static_cast<uint64_t>(ttl.count()));
  e.u64(tripwires.size());
  for (const auto& [tripwire, tripValue] : tripwires) e.bytes(tripwire).bytes(tripValue);
  locked([&] {
    send(out);
    if (const uint8_t reply = readU8(); reply != 0) throw unexpectedReply(reply, Op::Lease);
  });
}

uint16_t TcpStore::openSpace(const std::string& group, int64_t attempt) {
  std::string out;
  Encoder(out).op(Era::V2, Op::SpaceOpen).bytes(group).i64(attempt);
  const int64_t port = locked([&] {
    send(out);
    return readI64();
  });
  if (port < 0 || port > 65535)
    throw ProtocolError("the store answered SPACE_OPEN with port " + std::to_string(port));
  return static_cast<uint16_t>(port);
}

void TcpStore::closeSpace(const std::string& group) {
  locked([&] {
    send(keyRequest(Op::SpaceClose, group));
    if (const uint8_t reply = readU8(); reply != 0) throw unexpectedReply(reply, Op::SpaceClose);
  });
}

}  // namespace dlrun
