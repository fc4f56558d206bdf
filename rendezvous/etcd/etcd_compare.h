// The compares of etcd transactions, which the client and the store both build: etcd's messages
// alone, no gRPC (rendezvous/etcd only, not an interface).
#pragma once

#include <string>

#include "etcd/rpc.pb.h"

namespace dlrun::rendezvous::etcd::detail {

// A transaction's compare of `key`'s `target` for equality (the caller sets the value).
etcdserverpb::Compare compare(const std::string& key, etcdserverpb::Compare::CompareTarget target);
// A compare that holds while `key` is missing.
etcdserverpb::Compare missing(const std::string& key);

}  // namespace dlrun::rendezvous::etcd::detail
