#include "trainer/nccl_id.h"

#include <cstring>
#include <string>

#include "common/error.h"
#include "trainer/cuda_check.h"

namespace dlrun::trainer {
namespace {

constexpr const char* kKey = "nccl_unique_id";

}  // namespace

ncclUniqueId newNcclId() {
  ncclUniqueId id;
  cuda::check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  return id;
}

ncclUniqueId shareNcclId(Store& store, int rank) {
  ncclUniqueId id;
  if (rank == 0) {
    id = newNcclId();
    store.set(kKey, std::string(id.internal, sizeof(id.internal)));
    return id;
  }
  const std::string value = store.get(kKey);
  if (value.size() != sizeof(id.internal))
    throw Error("the NCCL id in the job's store has " + std::to_string(value.size()) +
                " bytes, not " + std::to_string(sizeof(id.internal)) +
                ": another program uses key '" + kKey + "'");
  std::memcpy(id.internal, value.data(), sizeof(id.internal));
  return id;
}

}  // namespace dlrun::trainer
