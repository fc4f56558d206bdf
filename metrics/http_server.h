// The HTTP side of --metrics-port: a small HTTP/1.1 server on the caller's io_context
// (Boost.Beast parses and writes HTTP; no thread of its own, no thread per connection). It
// answers GET and HEAD through one handler and keeps connections alive for the next scrape.
// A client that sends what is not HTTP, or more than a small request, is disconnected; one that
// never finishes its request is disconnected at a deadline. Neither holds up anyone else, since
// every connection only waits on its own socket.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace boost::asio {
class io_context;
}

namespace dlrun::metrics {

struct HttpReply {
  int status = 200;
  std::string contentType = "text/plain; charset=utf-8";
  std::string body;
};

struct HttpServerOptions {
  std::string host = "0.0.0.0";         // numeric address to bind
  uint16_t port = 0;                    // 0 picks a free one; read it back with port()
  std::string flag = "--metrics-port";  // named in the error when the port cannot be had
  std::chrono::milliseconds requestTimeout{10'000};  // to receive a whole request
};

// `path` is the request target without its query; `query` what followed '?'. Runs on the
// io_context's thread.
using HttpHandler = std::function<HttpReply(std::string_view path, std::string_view query)>;

namespace detail {
class HttpServerImpl;
}

class HttpServer {
 public:
  // Binds and listens at once. Throws ConfigError naming options.flag when the address cannot
  // be bound (the port is taken, the address is not this host's).
  HttpServer(boost::asio::io_context& io, HttpServerOptions options, HttpHandler handler);
  ~HttpServer();  // stop()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  uint16_t port() const;
  std::string address() const;
  // Closes the listener and every connection. Call on the io_context's thread.
  void stop();

 private:
  std::shared_ptr<detail::HttpServerImpl> impl_;
};

}  // namespace dlrun::metrics
