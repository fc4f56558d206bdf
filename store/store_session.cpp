// One connection to the store. It waits for readability, reads what is there into the
// server's scratch buffer, runs every complete request through its engine (or the server, for
// the spaces' ops), and flushes the replies with a non-blocking write; only what the kernel
// does not take at once goes through async_write. Nothing here throws: a client that breaks
// the protocol or a limit is logged once and disconnected.
#include <cstring>

#include "common/host_port.h"
#include "common/log.h"
#include "store/store_server_impl.h"

namespace dlrun::detail {

void Session::start() {
  if (log::verbose()) log::debug("connection from " + peerName());
  error_code ec;
  socket_.non_blocking(true, ec);
  socket_.set_option(tcp::no_delay(true), ec);
  awaitReadable();
}

void Session::send(std::string_view bytes) {
  if (closed_) return;
  out_.append(bytes);
  if (!batching_) flush();
}

void Session::close(const std::string& reason) {
  if (closed_) return;
  closed_ = true;
  if (!reason.empty()) {
    log::warn("disconnecting " + peerName() + ": " + reason);
  } else if (log::verbose()) {
    log::debug("connection from " + peerName() + " closed");
  }
  engine_.disconnect(*this);
  error_code ec;
  socket_.close(ec);
  server_.forget(this, space_);  // may end the space: the last use of space_
}

void Session::refuse(const std::string& reason) {
  server_.refused_.bump();
  close(reason);
}

std::string Session::peerName() const {
  error_code ec;
  auto remote = socket_.remote_endpoint(ec);
  return ec ? "a client" : joinHostPort(remote.address().to_string(), remote.port());
}

void Session::awaitReadable() {
  auto self = shared_from_this();
  if (sniff_) {  // peek at the first byte: HTTP/2's preface goes to another server unread
    socket_.async_receive(asio::buffer(first_, 1), tcp::socket::message_peek,
                          [self](const error_code& ec, size_t n) { self->onPeeked(ec, n); });
    return;
  }
  socket_.async_read_some(asio::buffer(first_),
                          [self](const error_code& ec, size_t n) { self->onRead(ec, n); });
}

void Session::onPeeked(const error_code& ec, size_t n) {
  if (closed_) return;
  if (ec || n == 0) return close("");
  sniff_ = false;
  if (first_[0] == 'P') return handOver();
  awaitReadable();
}

void Session::onRead(const error_code& readError, size_t n) {
  if (closed_) return;
  if (readError) return close(readError == asio::error::eof ? "" : readError.message());
  // Most requests fit first_; a full one may have more behind it, read now into the scratch.
  const std::span<char> scratch = server_.scratch();
  std::memcpy(scratch.data(), first_, n);
  if (n == sizeof(first_)) {
    error_code ec;
    n += socket_.read_some(asio::buffer(scratch.data() + n, scratch.size() - n), ec);
    // Would-block: nothing more yet. End of stream: the next read says so.
    if (ec && ec != asio::error::would_block && ec != asio::error::try_again &&
        ec != asio::error::eof)
      return close(ec.message());
  }
  server_.bytesIn_.add(n);

  // Parse straight from the scratch buffer unless an earlier read left a partial request.
  std::span<const char> data(scratch.data(), n);
  if (!in_.empty()) {
    in_.append(scratch.data(), n);
    data = std::span<const char>(in_.data(), in_.size());
  }
  if (data.size() >= needed_ && !process(data)) return;
  server_.noteCounts();
  server_.armLeaseTimer();
  if (in_.size() + out_.size() > server_.limits().maxBufferedBytes) return refuse(overLimit());
  flush();
  if (!closed_) awaitReadable();
}

void Session::handOver() {
  error_code ec;
  const int fd = socket_.release(ec);
  if (ec) return close(ec.message());
  closed_ = true;  // the engine never saw this peer, so there is nothing to disconnect
  server_.foreign_.bump();
  server_.forget(this, space_);
  server_.options_.foreign(fd);
}

bool Session::process(std::span<const char> data) {
  size_t pos = 0;
  const auto now = std::chrono::steady_clock::now();
  batching_ = true;
  while (pos < data.size()) {
    if (!era_) {
      era_ = wire::detectEra(data.subspan(pos));
      if (!era_) break;
    }
    auto result = wire::parseRequest(*era_, data.subspan(pos), server_.limits(), request_);
    if (result.status == wire::ParseStatus::Incomplete) {
      needed_ = result.needed;
      break;
    }
    if (result.status == wire::ParseStatus::Invalid) {
      refuse(result.error);
      return false;
    }
    server_.ops_[static_cast<size_t>(request_.op)].bump();
    // The one place a refused request is answered: the connection goes, the server stays.
    try {
      handle(now);
    } catch (const RequestError& e) {
      refuse(e.what());
      return false;
    }
    pos += result.consumed;
    needed_ = 0;
    if (out_.size() > server_.limits().maxBufferedBytes) {
      refuse(overLimit());
      return false;
    }
  }
  batching_ = false;
  const bool fromCarry = !in_.empty();
  if (fromCarry) {
    in_.erase(0, pos);
  } else {
    in_.assign(data.data() + pos, data.size() - pos);
  }
  if (in_.empty()) in_.shrink_to_fit();  // a finished large request gives its memory back
  return true;
}

void Session::handle(std::chrono::steady_clock::time_point now) {
  const wire::Op op = request_.op;
  const bool serverOp = op == wire::Op::SpaceOpen || op == wire::Op::SpaceClose;
  if (space_ && (serverOp || op == wire::Op::Lease))
    throw RequestError(std::string(wire::opName(op)) + " on an attempt's port");
  if (!serverOp) return engine_.handle(*this, request_, now);
  std::string out;
  if (op == wire::Op::SpaceOpen) {
    wire::Encoder(out).u64(server_.openSpace(request_.keys[0], request_.number));
  } else {
    server_.closeSpaceWhenIdle(request_.keys[0]);
    wire::Encoder(out).u8(0);
  }
  send(out);
}

std::string Session::overLimit() const {
  return "more than " + std::to_string(server_.limits().maxBufferedBytes) +
         " bytes buffered for this connection (unread replies or an oversized request)";
}

void Session::flush() {
  if (writing_ || out_.empty() || closed_) return;
  error_code ec;
  const size_t n = socket_.write_some(asio::buffer(out_), ec);
  if (ec && ec != asio::error::would_block && ec != asio::error::try_again) {
    // Close later: send() may run inside another session's request handling.
    asio::post(server_.io(), [self = shared_from_this()] { self->close(""); });
    return;
  }
  out_.erase(0, n);
  server_.bytesOut_.add(n);
  if (out_.empty()) return;
  writing_ = true;
  sending_.swap(out_);
  asio::async_write(socket_, asio::buffer(sending_),
                    [self = shared_from_this()](const error_code& e, size_t n) {
                      self->server_.bytesOut_.add(n);
                      self->writing_ = false;
                      self->sending_.clear();
                      if (e) return self->close("");
                      self->flush();
                    });
}

}  // namespace dlrun::detail
