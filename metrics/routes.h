// What every --metrics-port serves (dlrun's agents and dlrund alike):
//   /            the live page (page.html, built into the binary: no file, no network)
//   /metrics     Prometheus's text exposition
//   /api/state   the page's JSON, polled by the page about once a second
//   /job         the whole job's page (job.html), where the process can read the job's store
//   /api/job     its JSON (control/job_watch.h), ?id=ID naming the job where the process serves
//                several
#pragma once

#include <functional>
#include <string>
#include <string_view>

#include "metrics/http_server.h"

namespace dlrun::metrics {

// The pages, as embedded at build time.
std::string_view pageHtml();
std::string_view jobHtml();

// /api/job's answer for a request's query.
using JobApi = std::function<HttpReply(std::string_view query)>;

// `metricsText`, `stateJson` and `jobApi` run on the server's io_context thread, at each
// request. Without `jobApi`, /job and /api/job are not served.
HttpHandler routes(std::function<std::string()> metricsText, std::function<std::string()> stateJson,
                   JobApi jobApi = {});

}  // namespace dlrun::metrics
