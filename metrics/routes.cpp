#include "metrics/routes.h"

#include "metrics/exposition.h"

namespace dlrun::metrics {

HttpHandler routes(std::function<std::string()> metricsText, std::function<std::string()> stateJson,
                   JobApi jobApi) {
  return [metricsText = std::move(metricsText), stateJson = std::move(stateJson),
          jobApi = std::move(jobApi)](std::string_view path, std::string_view query) -> HttpReply {
    if (path == "/" || path == "/index.html")
      return {.contentType = "text/html; charset=utf-8", .body = std::string(pageHtml())};
    if (path == "/metrics")
      return {.contentType = std::string(kContentType), .body = metricsText()};
    if (path == "/api/state") return {.contentType = "application/json", .body = stateJson()};
    if (jobApi && path == "/job")
      return {.contentType = "text/html; charset=utf-8", .body = std::string(jobHtml())};
    if (jobApi && path == "/api/job") return jobApi(query);
    return {.status = 404,
            .body = jobApi ? "not found: try /, /job, /metrics, /api/state or /api/job\n"
                           : "not found: try /, /metrics or /api/state\n"};
  };
}

}  // namespace dlrun::metrics
