#include "rendezvous/etcd/etcd_compare.h"

namespace dlrun::rendezvous::etcd::detail {

etcdserverpb::Compare compare(const std::string& key, etcdserverpb::Compare::CompareTarget target) {
  etcdserverpb::Compare c;
  c.set_key(key);
  c.set_target(target);
  c.set_result(etcdserverpb::Compare::EQUAL);
  return c;
}

etcdserverpb::Compare missing(const std::string& key) {
  auto c = compare(key, etcdserverpb::Compare::CREATE);
  c.set_create_revision(0);
  return c;
}

}  // namespace dlrun::rendezvous::etcd::detail
