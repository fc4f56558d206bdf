#include "trainer/cpu_engine.h"

#include "trainer/math_dispatch.h"
#include "trainer/model_factory.h"

namespace dlrun::trainer {
namespace {

class CpuEngine final : public Engine {
 public:
  CpuEngine(const EngineOptions& options, Collective& collective, const MlpMath& math)
      : model_(makeModel(options.model, options.seed, math)),
        sgd_(options.sgd, model_->params().size(), math),
        collective_(collective),
        exchange_(model_->params().size() + 2) {}

  StepResult step(const float* x, const uint8_t* labels, int batch, float learningRate,
                  bool stopVote) override {
    // One all-reduce carries the gradients, then the loss and the stop votes.
    const size_t n = model_->params().size();
    exchange_[n] = model_->lossAndGradient(x, labels, batch, exchange_.data());
    exchange_[n + 1] = stopVote ? 1.0f : 0.0f;
    collective_.allreduceSum(exchange_.data(), exchange_.size());
    // The mean gradient over the global batch, applied in the same pass as the update.
    const float scale = 1.0f / static_cast<float>(collective_.size());
    sgd_.setLearningRate(learningRate);
    sgd_.step(model_->params(), exchange_.data(), scale);
    return {exchange_[n] * scale, exchange_[n + 1] > 0.0f};
  }

  int countCorrect(const float* x, const uint8_t* labels, int batch) override {
    return model_->countCorrect(x, labels, batch);
  }

  std::vector<float> params() const override { return model_->params(); }
  std::vector<float> velocity() const override { return sgd_.velocity(); }

  void load(const std::vector<float>& params, const std::vector<float>& velocity) override {
    model_->params() = params;
    sgd_.velocity() = velocity;
  }

  const char* device() const override { return "cpu"; }

 private:
  std::unique_ptr<Model> model_;
  Sgd sgd_;
  Collective& collective_;
  std::vector<float> exchange_;
};

}  // namespace

std::unique_ptr<Engine> makeCpuEngine(const EngineOptions& options, Collective& collective) {
  return std::make_unique<CpuEngine>(options, collective, cpuMath(options.cpuMath));
}

}  // namespace dlrun::trainer
