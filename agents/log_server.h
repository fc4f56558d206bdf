// `dlrun logs` on a node (docs/design/control.md, "Logs"): answers the control plane's requests
// for its ranks' output (control/state/log_mailbox.h) from the log tree on this node's disk,
// attempt_N/LOCAL/stdout.log and stderr.log, which --redirects and --tee write. Nothing is kept
// for it besides where each attempt's folder is: it costs nothing until someone asks.
//
// Threads: one of its own, started by the first request, because reading files and the store
// block while the agent's io_context must not; it serves every request it holds in turn, a
// chunk at a time, so a follow never holds up another request.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "control/state/log_mailbox.h"
#include "store/leasing_store.h"

namespace dlrun::agents {

// One attempt of this node's workers: where their files are and which ranks they were.
struct AttemptFiles {
  int attempt = 0;  // N of attempt_N
  std::filesystem::path dir;
  int baseRank = 0;
  int workers = 0;  // local ranks 0..workers-1, ranks baseRank + local
};

class LogServer {
 public:
  LogServer(std::string runId, std::string nodeName,
            std::function<std::unique_ptr<LeasingStore>()> connect);
  ~LogServer();  // tells the service every answer it was sending ended, then stops
  LogServer(const LogServer&) = delete;
  LogServer& operator=(const LogServer&) = delete;

  // Any thread.
  void attempt(AttemptFiles files);
  // Request `n` of the job, answered as agent `agent` (its id in the job). Any thread.
  void serve(int64_t n, int64_t agent);

  struct Serving;  // one request being answered (log_server.cpp)

 private:
  void run();
  // One step of `s`: false once it is over.
  bool step(LeasingStore& store, Serving& s);
  void begin(LeasingStore& store, Serving& s);

  const std::string nodeName_;
  const control::LogKeys keys_;
  const std::function<std::unique_ptr<LeasingStore>()> connect_;

  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<AttemptFiles> attempts_;
  std::deque<std::pair<int64_t, int64_t>> asked_;  // (request, agent) not yet begun
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace dlrun::agents
