// The exception tree every dlrun library throws. Library code throws; each main catches once
// at the top, prints the message on one line and picks the exit code (ConfigError -> 2).
// Asynchronous handlers inside the store server never throw: they pass error codes and close
// the offending connection instead.
#pragma once

#include <stdexcept>
#include <string>

namespace dlrun {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Bad user input: a flag, a config value, an entry point. Mains exit 2 on it.
class ConfigError : public Error {
 public:
  using Error::Error;
};

// Something other than a dlrun store answers where one should be (a wrong --rdzv-endpoint or
// MASTER_PORT): bad input, so mains exit 2 on it too.
class NotAStoreError : public ConfigError {
 public:
  using ConfigError::ConfigError;
};

// A server that accepted the connection and sent nothing back: another kind of server that
// waits for its client to speak first, or a dlrun store stopped (SIGSTOP) or overloaded.
class SilentServerError : public NotAStoreError {
 public:
  using NotAStoreError::NotAStoreError;
};

// A deadline passed (a store wait, a connect).
class TimeoutError : public Error {
 public:
  using Error::Error;
};

// A socket failed or a peer went away.
class NetworkError : public Error {
 public:
  using Error::Error;
};

// A peer sent bytes that do not follow the wire protocol.
class ProtocolError : public Error {
 public:
  using Error::Error;
};

}  // namespace dlrun
