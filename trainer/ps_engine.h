// A worker's engine under --strategy ps: the CPU model computes the gradient, the parameter
// servers apply it (ps_server.h) and send back their shards, which become the model's
// parameters. Blocking sockets on the training thread, which has nothing else to do meanwhile.
#pragma once

#include <memory>
#include <optional>

#include "store/store.h"
#include "trainer/checkpoint.h"
#include "trainer/engine.h"
#include "trainer/ps_layout.h"
#include "trainer/ps_wire.h"

namespace dlrun::trainer {

class PsEngine : public Engine {
 public:
  // Where the worker stands after the step it is about to take (sent with its push).
  virtual void setPosition(const ps::Position& after) = 0;
  // The chief inits the servers with `init` (its checkpoint, or the seed's weights at the
  // start; servers already set keep theirs); then every worker takes their parameters. Returns
  // this worker's position: its last push's when it was restarted alone, else the Init's.
  virtual ps::Position join(const std::optional<Checkpoint>& init) = 0;
  // This worker trained its last step.
  virtual void done() = 0;
};

// Connects to every server, whose addresses it waits for in `store` (the job's, namespaced per
// attempt). Throws ConfigError when the servers would hold no parameter.
std::unique_ptr<PsEngine> makePsEngine(const EngineOptions& options, const PsPlace& place,
                                       Store& store);

}  // namespace dlrun::trainer
