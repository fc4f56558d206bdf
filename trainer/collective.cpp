#include "trainer/collective.h"

#include <gloo/allreduce.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <algorithm>
#include <cstring>

#include "common/error.h"

namespace dlrun::trainer {
namespace {

class ReportingCollective : public Collective {
 public:
  ReportingCollective(std::unique_ptr<Collective> inner, ProgressReporter& progress)
      : inner_(std::move(inner)), progress_(progress) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  void allreduceSum(float* data, size_t count) override {
    progress_.phase(ProgressPhase::Collective);
    inner_->allreduceSum(data, count);
    progress_.phase(ProgressPhase::Computing);
  }

 private:
  std::unique_ptr<Collective> inner_;
  ProgressReporter& progress_;
};

class SoloCollective : public Collective {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void allreduceSum(float*, size_t) override {}
};

// Gloo's rendezvous store over the dlrun store.
class GlooStore : public gloo::rendezvous::Store {
 public:
  explicit GlooStore(std::shared_ptr<dlrun::Store> store) : store_(std::move(store)) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    store_->set(key, std::string(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    std::string value = store_->get(key);
    return {value.begin(), value.end()};
  }
  void wait(const std::vector<std::string>& keys) override {
    store_->wait(keys, dlrun::Store::kDefaultTimeout);
  }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    store_->wait(keys, timeout);
  }

 private:
  std::shared_ptr<dlrun::Store> store_;
};

class GlooCollective : public Collective {
 public:
  GlooCollective(std::shared_ptr<Store> store, int rank, int size, const std::string& localAddr)
      : rank_(rank), size_(size) {
    gloo::transport::tcp::attr attr;
    attr.hostname = localAddr;
    device_ = gloo::transport::tcp::CreateDevice(attr);
    context_ = std::make_shared<gloo::rendezvous::Context>(rank, size);
    GlooStore glooStore(std::move(store));
    context_->connectFullMesh(glooStore, device_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void allreduceSum(float* data, size_t count) override {
    // Flattened buckets: large gradients go in pieces so no single message is huge.
    for (size_t offset = 0; offset < count; offset += kBucket) {
      gloo::AllreduceOptions options(context_);
      options.setOutput(data + offset, std::min(kBucket, count - offset));
      options.setReduceFunction(
          static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
      options.setTag(tag_++);
      gloo::allreduce(options);
    }
  }

 private:
  static constexpr size_t kBucket = 1 << 20;  // floats per all-reduce
  int rank_, size_;
  uint32_t tag_ = 0;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::rendezvous::Context> context_;
};

}  // namespace

std::unique_ptr<Collective> reportingProgress(std::unique_ptr<Collective> inner,
                                              ProgressReporter& progress) {
  if (!progress.active()) return inner;
  return std::make_unique<ReportingCollective>(std::move(inner), progress);
}

std::unique_ptr<Collective> makeSoloCollective() { return std::make_unique<SoloCollective>(); }

std::unique_ptr<Collective> makeGlooCollective(std::shared_ptr<Store> store, int rank, int size,
                                               const std::string& localAddr) {
  try {
    return std::make_unique<GlooCollective>(std::move(store), rank, size, localAddr);
  } catch (const ::gloo::Exception& e) {
    throw Error(std::string("cannot connect the Gloo all-reduce: ") + e.what());
  }
}

}  // namespace dlrun::trainer
