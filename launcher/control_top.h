// `dlrun top`: the job's one view in a terminal (ARCHITECTURE.md section 10), for clusters whose
// nodes no browser reaches. It asks the control plane as `dlrun status` does (GetJob, and the
// events since the last look) once a --interval, and redraws every node and rank with its step,
// pace and time since its last step, stragglers first and marked, the job's last events below.
// Plain text and two ANSI sequences (home, clear): any terminal, over ssh, no library. It ends
// with the job (its last frame stays on the screen) or with Ctrl-C; --once prints one frame.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "dlrun/v1/control.grpc.pb.h"
#include "launcher/control_cli.h"

namespace dlrun::launcher {

// One frame (pure, for tests): at most `height` lines of at most `width` columns.
std::string formatTop(const v1::Job& job, const std::deque<v1::Event>& recent, int width,
                      int height);

// How top asks the control plane; each throws ConfigError as `dlrun status` does.
struct TopSource {
  std::function<v1::Job()> job;
  std::function<std::vector<v1::Event>(int64_t since)> events;  // those after `since`
};

// Runs until the job ended or the user stops it; returns the exit code: 0, or 1 when the
// control plane went away before the job was seen to end. Throws ConfigError when the first
// look fails.
int top(const ControlRequest& request, const TopSource& source);

}  // namespace dlrun::launcher
