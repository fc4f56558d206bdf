// The pure parts of warm starts (agents/warm_start_wire.h, zygoteEnvironment in warm_start.h):
// which commands a zygote runs, --preload's names, the frames byte by byte.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "agents/warm_start.h"
#include "agents/warm_start_wire.h"
#include "agents/worker_env.h"
#include "common/error.h"

namespace dlrun::agents::warm {
namespace {

using Args = std::vector<std::string>;

TEST(PythonCommandTest, AScriptUnderDlrunsOwnInterpreter) {
  const PythonCommand c = parsePythonCommand({"python3", "-u", "train.py", "--lr", "1"}, "python3");
  EXPECT_EQ(c.interpreter, (Args{"python3", "-u"}));
  EXPECT_FALSE(c.module);
  EXPECT_EQ(c.target, "train.py");
}

TEST(PythonCommandTest, AModuleWithClusteredOptions) {
  const PythonCommand c =
      parsePythonCommand({"/usr/bin/python3.11", "-uB", "-X", "dev", "-m", "pkg.main", "-m"}, "x");
  EXPECT_EQ(c.interpreter, (Args{"/usr/bin/python3.11", "-u", "-B", "-X", "dev"}));
  EXPECT_TRUE(c.module);
  EXPECT_EQ(c.target, "pkg.main");
  const PythonCommand glued = parsePythonCommand({"python", "-um", "pkg", "a"}, "x");
  EXPECT_EQ(glued.interpreter, (Args{"python", "-u"}));
  EXPECT_EQ(glued.target, "pkg");
  const PythonCommand w = parsePythonCommand({"python", "-Werror", "--", "-odd.py"}, "x");
  EXPECT_EQ(w.interpreter, (Args{"python", "-W", "error"}));
  EXPECT_EQ(w.target, "-odd.py");
}

TEST(PythonCommandTest, AnInterpreterDlrunPicksNeedsNoPythonName) {
  EXPECT_EQ(parsePythonCommand({"/opt/py", "-u", "x.py"}, "/opt/py").target, "x.py");
}

TEST(PythonCommandTest, WhatCannotBeForkedIsOneLine) {
  for (const Args& argv : std::vector<Args>{{"/usr/bin/dlrun-train"},
                                            {"./a.out", "x.py"},
                                            {"python3", "-c", "print(1)"},
                                            {"python3", "-"},
                                            {"python3", "-i", "x.py"},
                                            {"python3", "--version"},
                                            {"python3", "-u"},
                                            {"python3", "-m"},
                                            {"python3x", "x.py"}}) {
    try {
      parsePythonCommand(argv, "python3");
      ADD_FAILURE() << argv.front() << " " << (argv.size() > 1 ? argv[1] : "") << " accepted";
    } catch (const ConfigError& e) {
      const std::string what = e.what();
      EXPECT_TRUE(what.starts_with("--warm-start: ")) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    }
  }
}

TEST(PreloadTest, DottedNamesOnly) {
  EXPECT_EQ(parsePreload("torch,numpy,torch.distributed,_x1"),
            (Args{"torch", "numpy", "torch.distributed", "_x1"}));
  for (const char* bad : {"", "torch,", "1torch", "torch..x", ".torch", "torch.", "a-b", "a b"})
    EXPECT_THROW(parsePreload(bad), ConfigError) << bad;
}

TEST(WireTest, SpawnFrameByteByByte) {
  const std::string frame = encodeSpawn(
      {.agentPid = 0x01020304, .argv = {"py", "x"}, .envp = {"A=1"}, .cwd = "/w", .cpus = {3}});
  const std::string body = std::string("\x01", 1) +              // kind
                           std::string("\x04\x03\x02\x01", 4) +  // agent pid
                           std::string("\x02\0\0\0", 4) + std::string("\x02\0\0\0py", 6) +
                           std::string("\x01\0\0\0x", 5) +  // argv
                           std::string("\x01\0\0\0", 4) + std::string("\x03\0\0\0A=1", 7) +
                           std::string("\x02\0\0\0/w", 6) +         // cwd
                           std::string("\x01\0\0\0\x03\0\0\0", 8);  // cpus
  ASSERT_EQ(frame.size(), 4 + body.size());
  EXPECT_EQ(static_cast<unsigned char>(frame[0]), body.size());
  EXPECT_EQ(frame.substr(1, 3), std::string(3, '\0'));
  EXPECT_EQ(frame.substr(4), body);
}

TEST(WireTest, RepliesRoundTripAndWaitForTheirLastByte) {
  for (const Reply& reply : {Reply{.kind = Reply::Kind::Ready, .text = "torch imported"},
                             Reply{.kind = Reply::Kind::Refused, .text = "CUDA"},
                             Reply{.kind = Reply::Kind::Spawned, .pid = 4242},
                             Reply{.kind = Reply::Kind::Failed, .text = ""}}) {
    const std::string frame = encodeReply(reply) + "next";
    size_t used = 0;
    for (size_t cut = 0; cut < frame.size() - 4; ++cut)
      EXPECT_FALSE(decodeReply(std::string_view(frame).substr(0, cut), used)) << cut;
    const auto decoded = decodeReply(frame, used);
    ASSERT_TRUE(decoded);
    EXPECT_EQ(used, frame.size() - 4);
    EXPECT_EQ(decoded->kind, reply.kind);
    EXPECT_EQ(decoded->pid, reply.pid);
    EXPECT_EQ(decoded->text, reply.text);
  }
}

TEST(WireTest, GarbledRepliesAreProtocolErrors) {
  size_t used = 0;
  const std::string unknownKind("\x01\0\0\0\x09", 5);
  const std::string empty("\0\0\0\0", 4);
  const std::string huge("\xff\xff\xff\xff", 4);
  const std::string shortPid("\x03\0\0\0\x03\x01\x02", 7);
  const std::string textPastEnd("\x05\0\0\0\x01\x09\0\0\0", 9);
  const std::string trailing("\x06\0\0\0\x03\x01\0\0\0\x07", 10);
  for (const std::string& bad : {unknownKind, empty, huge, shortPid, textPastEnd, trailing})
    EXPECT_THROW(decodeReply(bad, used), ProtocolError);
}

}  // namespace
}  // namespace dlrun::agents::warm

namespace dlrun::agents {
namespace {

// The zygote imports what the workers import with the workers' values of the variables read at
// import (libgomp's OMP_NUM_THREADS): those a fresh worker gets unless set.
TEST(ZygoteEnvironmentTest, TheWorkersDefaultsAndNothingOfTheRound) {
  rendezvous::World world;
  world.localWorldSize = world.worldSize = 4;
  for (const Environment& inherited :
       {Environment{{"PATH", "/bin"}},
        Environment{{"OMP_NUM_THREADS", "8"}, {"NCCL_ASYNC_ERROR_HANDLING", "0"}}}) {
    const Environment services{{"TORCHELASTIC_SIGNALS_TO_HANDLE", "SIGTERM"}};
    const Environment zygote = zygoteEnvironment(inherited, 4, services);
    const Environment worker =
        NodeEnvironment(inherited, world, {.services = services}).forWorker(0, "/e");
    for (const auto& [key, value] : zygote) {
      ASSERT_TRUE(worker.contains(key)) << key;
      EXPECT_EQ(worker.at(key), value) << key;
    }
    for (const char* key : {"OMP_NUM_THREADS", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
                            "NCCL_ASYNC_ERROR_HANDLING", "TORCHELASTIC_SIGNALS_TO_HANDLE"})
      EXPECT_TRUE(zygote.contains(key)) << key;
    EXPECT_FALSE(zygote.contains("RANK"));
    EXPECT_FALSE(zygote.contains("MASTER_PORT"));
  }
  EXPECT_FALSE(zygoteEnvironment({}, 1, {}).contains("OMP_NUM_THREADS"));
}

}  // namespace
}  // namespace dlrun::agents
