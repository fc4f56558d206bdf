// What the files of EtcdStore share (etcd_store.cpp, etcd_store_leases.cpp,
// etcd_store_watch.cpp): rendezvous/etcd only, not an interface.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "common/error.h"
#include "rendezvous/etcd/etcd_client.h"
#include "rendezvous/etcd/etcd_store.h"

namespace etcdserverpb {
class RangeResponse;
}

namespace dlrun::rendezvous::etcd {
namespace detail {

using Tripwires = std::vector<std::pair<std::string, std::string>>;

// A tripwire record's tripwires (its format: etcd_store_leases.cpp); nullopt for a record some
// other program wrote: it is not fired.
std::optional<Tripwires> decodeTripwires(std::string_view text);

// The first key of a range read: key, value and modRevision, or nothing when it found none.
std::optional<KeyValue> firstKey(const etcdserverpb::RangeResponse& range);

}  // namespace detail

// EtcdStore::retrying (etcd_store.h), here for every file of the store to use.
template <typename Write>
auto EtcdStore::retrying(Write&& write) {
  const auto start = Clock::now();
  while (true) {
    requireOpen();  // an abort() ends the retries, named as such
    try {
      return write();
    } catch (const NetworkError&) {
      if (Clock::now() - start >= options_.client.connectTimeout) throw;
    } catch (const TimeoutError&) {
      if (Clock::now() - start >= options_.client.connectTimeout) throw;
    }
    // Members without a leader refuse at once while an election runs: pace the next try.
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace dlrun::rendezvous::etcd
