// dlrun-train: the bundled data-parallel trainer ("dlrun ... train").
#include "common/cli.h"
#include "common/log.h"
#include "trainer/config.h"
#include "trainer/train.h"

int main(int argc, char** argv) {
  using namespace dlrun;
  log::setProgramName("dlrun-train");
  return guardedMain([&] {
    auto parsed = trainer::parseTrainArgs(std::vector<std::string>(argv + 1, argv + argc));
    if (parsed.exitCode) return *parsed.exitCode;
    return trainer::train(parsed.config, parsed.placement);
  });
}
