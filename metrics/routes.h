// What every --metrics-port serves (dlrun's agents and dlrund alike):
//   /            the live page (page.html, built into the binary: no file, no network)
//   /metrics     Prometheus's text exposition
//   /api/state   the page's JSON, polled by the page about once a second
#pragma once

#include <functional>
#include <string>
#include <string_view>

#include "metrics/http_server.h"

namespace dlrun::metrics {

// The page, as embedded at build time.
std::string_view pageHtml();

// `metricsText` and `stateJson` run on the server's io_context thread, at each request.
HttpHandler routes(std::function<std::string()> metricsText,
                   std::function<std::string()> stateJson);

}  // namespace dlrun::metrics
