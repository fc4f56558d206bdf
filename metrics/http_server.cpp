#include "metrics/http_server.h"

#include <optional>
#include <unordered_map>
#include <vector>

#include "common/asio.h"
#include "common/error.h"
#include "common/listen.h"
#include "common/log.h"

#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

namespace dlrun::metrics {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using asio::ip::tcp;
using boost::system::error_code;

namespace detail {

namespace {
constexpr size_t kHeaderLimit = 8 * 1024;  // a scrape's or a browser's request is far smaller
constexpr size_t kBodyLimit = 8 * 1024;
}  // namespace

class HttpSession;

class HttpServerImpl : public std::enable_shared_from_this<HttpServerImpl> {
 public:
  HttpServerImpl(asio::io_context& io, HttpServerOptions options, HttpHandler handler)
      : options_(std::move(options)),
        handler_(std::move(handler)),
        listener_(listen(io, options_)) {}

  static tcp::acceptor listen(asio::io_context& io, const HttpServerOptions& options);
  void accept();
  void stop();

  const HttpServerOptions options_;
  const HttpHandler handler_;
  Listener listener_;
  std::unordered_map<HttpSession*, std::weak_ptr<HttpSession>> sessions_;
};

class HttpSession : public std::enable_shared_from_this<HttpSession> {
 public:
  HttpSession(std::shared_ptr<HttpServerImpl> server, tcp::socket socket)
      : server_(std::move(server)), stream_(std::move(socket)) {}

  void read() {
    parser_.emplace();
    parser_->header_limit(kHeaderLimit);
    parser_->body_limit(kBodyLimit);
    stream_.expires_after(server_->options_.requestTimeout);
    http::async_read(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](const error_code& ec, size_t) { self->onRequest(ec); });
  }

  void close() {
    error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.close();
    server_->sessions_.erase(this);
  }

 private:
  void onRequest(const error_code& ec) {
    if (ec) return close();  // garbage, too large, too slow, or the client hung up
    const auto& request = parser_->get();
    response_ = {};
    response_.version(request.version());
    response_.keep_alive(request.keep_alive());
    response_.set(http::field::server, "dlrun");
    response_.set(http::field::cache_control, "no-store");
    if (request.method() != http::verb::get && request.method() != http::verb::head) {
      response_.result(http::status::method_not_allowed);
      response_.set(http::field::allow, "GET, HEAD");
      response_.set(http::field::content_type, "text/plain; charset=utf-8");
      response_.body() = "only GET and HEAD\n";
    } else {
      const std::string_view target(request.target().data(), request.target().size());
      const size_t q = target.find('?');
      HttpReply reply = server_->handler_(target.substr(0, q),
                                          q == std::string_view::npos ? "" : target.substr(q + 1));
      response_.result(static_cast<unsigned>(reply.status));
      response_.set(http::field::content_type, reply.contentType);
      if (request.method() == http::verb::get)
        response_.body() = std::move(reply.body);
      else
        response_.content_length(reply.body.size());
    }
    if (request.method() == http::verb::get) response_.prepare_payload();
    http::async_write(stream_, response_, [self = shared_from_this()](const error_code& e, size_t) {
      if (e || !self->response_.keep_alive()) return self->close();
      self->read();
    });
  }

  std::shared_ptr<HttpServerImpl> server_;  // outlives the session's last handler
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_{kHeaderLimit};
  std::optional<http::request_parser<http::string_body>> parser_;
  http::response<http::string_body> response_;
};

// A port that cannot be had is bad input: the flag's value is wrong.
tcp::acceptor HttpServerImpl::listen(asio::io_context& io, const HttpServerOptions& options) {
  error_code ec;
  const auto address = asio::ip::make_address(options.host, ec);
  if (ec) throw ConfigError(options.flag + ": '" + options.host + "' is not a numeric address");
  tcp::acceptor acceptor(io);
  ec = openListener(acceptor, {address, options.port}, asio::socket_base::max_listen_connections);
  if (ec)
    throw ConfigError(
        options.flag + " " + std::to_string(options.port) + ": cannot listen on " + options.host +
        ": " + ec.message() +
        (ec == asio::error::address_in_use ? " (pick another port, or 0 for any)" : ""));
  return acceptor;
}

void HttpServerImpl::accept() {
  listener_.start(
      [self = shared_from_this()](tcp::socket socket) {
        auto session = std::make_shared<HttpSession>(self, std::move(socket));
        self->sessions_.emplace(session.get(), session);
        session->read();
      },
      [](const error_code& ec) { log::debug("metrics: accept failed: " + ec.message()); });
}

void HttpServerImpl::stop() {
  if (!listener_.stop()) return;
  std::vector<std::shared_ptr<HttpSession>> open;
  for (auto& [raw, weak] : sessions_)
    if (auto session = weak.lock()) open.push_back(std::move(session));
  for (auto& session : open) session->close();
  sessions_.clear();
}

}  // namespace detail

HttpServer::HttpServer(asio::io_context& io, HttpServerOptions options, HttpHandler handler)
    : impl_(std::make_shared<detail::HttpServerImpl>(io, std::move(options), std::move(handler))) {
  impl_->accept();
}

HttpServer::~HttpServer() { impl_->stop(); }

uint16_t HttpServer::port() const { return impl_->listener_.local().port(); }

std::string HttpServer::address() const { return impl_->listener_.local().address().to_string(); }

void HttpServer::stop() { impl_->stop(); }

}  // namespace dlrun::metrics
