#include "metrics/routes.h"

#include "metrics/exposition.h"

namespace dlrun::metrics {

HttpHandler routes(std::function<std::string()> metricsText,
                   std::function<std::string()> stateJson) {
  return [metricsText = std::move(metricsText), stateJson = std::move(stateJson)](
             std::string_view path, std::string_view) -> HttpReply {
    if (path == "/" || path == "/index.html")
      return {.contentType = "text/html; charset=utf-8", .body = std::string(pageHtml())};
    if (path == "/metrics")
      return {.contentType = std::string(kContentType), .body = metricsText()};
    if (path == "/api/state") return {.contentType = "application/json", .body = stateJson()};
    return {.status = 404, .body = "not found: try /, /metrics or /api/state\n"};
  };
}

}  // namespace dlrun::metrics
