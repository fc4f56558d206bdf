#include "trainer/cuda_engine.h"

#include <algorithm>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "trainer/cuda_check.h"
#include "trainer/cuda_kernels.h"
#include "trainer/nccl_id.h"

namespace dlrun::trainer {
namespace {

using cuda::check;

// Device memory for `count` elements, grown on demand (the contents do not survive growth).
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer() { cudaFree(data_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void reserve(size_t count) {
    if (count <= capacity_) return;
    cudaFree(data_);
    data_ = nullptr;
    capacity_ = 0;
    check(cudaMalloc(&data_, count * sizeof(T)), "cudaMalloc");
    capacity_ = count;
  }
  T* get() const { return data_; }

 private:
  T* data_ = nullptr;
  size_t capacity_ = 0;
};

// Owners of the stream and the library handles, so a constructor that throws halfway frees
// what it made.
struct StreamDestroy {
  void operator()(cudaStream_t stream) const { cudaStreamDestroy(stream); }
};
struct CublasDestroy {
  void operator()(cublasHandle_t handle) const { cuda::cublasApi().destroy(handle); }
};
struct NcclAbort {
  // Abort, not destroy: every collective has finished by the end of a step, and after an error
  // a peer may be gone, which abort does not wait for.
  void operator()(ncclComm_t comm) const { ncclCommAbort(comm); }
};
using Stream = std::unique_ptr<std::remove_pointer_t<cudaStream_t>, StreamDestroy>;
using Cublas = std::unique_ptr<std::remove_pointer_t<cublasHandle_t>, CublasDestroy>;
using NcclComm = std::unique_ptr<std::remove_pointer_t<ncclComm_t>, NcclAbort>;

class CudaEngine final : public Engine {
 public:
  // `ncclId`: sum the gradients with NCCL; nullopt: through host memory with `collective`.
  CudaEngine(const EngineOptions& options, Collective& collective, int device,
             std::optional<ncclUniqueId> ncclId)
      : shape_(options.model.mlp),
        layers_(shape_.layers()),
        sgd_(options.sgd),
        collective_(collective),
        n_(shape_.parameterCount()),
        activations_(layers_.size()) {
    check(cudaSetDevice(device), "cudaSetDevice");
    cudaStream_t stream = nullptr;
    check(cudaStreamCreate(&stream), "cudaStreamCreate");
    stream_.reset(stream);
    cublasHandle_t handle = nullptr;
    check(cuda::cublasApi().create(&handle), "cublasCreate");
    cublas_.reset(handle);
    check(cuda::cublasApi().setStream(handle, stream), "cublasSetStream");
    if (ncclId) {
      ncclComm_t comm = nullptr;
      check(ncclCommInitRank(&comm, collective.size(), *ncclId, collective.rank()),
            "ncclCommInitRank");
      nccl_.reset(comm);
    }
    params_.reserve(n_);
    velocity_.reserve(n_);
    exchange_.reserve(n_ + 2);  // the gradients, then the loss and the stop votes
    // The same initial weights as the CPU model: made on the host by the same code.
    load(Mlp(shape_, options.seed).params(), std::vector<float>(n_, 0.0f));
  }

  StepResult step(const float* x, const uint8_t* labels, int batch, float learningRate,
                  bool stopVote) override {
    upload(x, labels, batch);
    forward(batch);
    float* logits = activations_.back().get();
    cuda::softmaxCrossEntropy(logits, labels_.get(), batch, shape_.classes, exchange_.get() + n_,
                              stream());
    backward(batch);
    const float vote = stopVote ? 1.0f : 0.0f;
    check(cudaMemcpyAsync(exchange_.get() + n_ + 1, &vote, sizeof(vote), cudaMemcpyHostToDevice,
                          stream()),
          "cudaMemcpyAsync of the stop vote");
    sumOverRanks(exchange_.get(), n_ + 2);
    // The mean gradient over the global batch, applied in the same pass as the update.
    const float scale = 1.0f / static_cast<float>(collective_.size());
    cuda::sgdStep(params_.get(), velocity_.get(), exchange_.get(), n_, learningRate, sgd_.momentum,
                  sgd_.weightDecay, scale, stream());
    float tail[2];
    download(tail, exchange_.get() + n_, 2);
    return {tail[0] * scale, tail[1] > 0.0f};
  }

  int countCorrect(const float* x, const uint8_t* labels, int batch) override {
    upload(x, nullptr, batch);
    forward(batch);
    predictions_.reserve(batch);
    cuda::argmaxRows(activations_.back().get(), batch, shape_.classes, predictions_.get(),
                     stream());
    std::vector<int> predicted(batch);
    download(predicted.data(), predictions_.get(), predicted.size());
    int correct = 0;
    for (int i = 0; i < batch; ++i) correct += predicted[i] == labels[i] ? 1 : 0;
    return correct;
  }

  std::vector<float> params() const override { return copyOut(params_.get()); }
  std::vector<float> velocity() const override { return copyOut(velocity_.get()); }

  void load(const std::vector<float>& params, const std::vector<float>& velocity) override {
    check(cudaMemcpy(params_.get(), params.data(), n_ * sizeof(float), cudaMemcpyHostToDevice),
          "cudaMemcpy of the parameters");
    check(cudaMemcpy(velocity_.get(), velocity.data(), n_ * sizeof(float), cudaMemcpyHostToDevice),
          "cudaMemcpy of the momentum");
  }

  const char* device() const override { return "cuda"; }

 private:
  cudaStream_t stream() const { return stream_.get(); }

  // Copies the batch in (labels may be null) and makes room for its activations.
  void upload(const float* x, const uint8_t* labels, int batch) {
    const size_t values = static_cast<size_t>(batch) * shape_.inputs;
    input_.reserve(values);
    check(
        cudaMemcpyAsync(input_.get(), x, values * sizeof(float), cudaMemcpyHostToDevice, stream()),
        "cudaMemcpyAsync of the batch");
    if (labels != nullptr) {
      labels_.reserve(batch);
      check(cudaMemcpyAsync(labels_.get(), labels, batch, cudaMemcpyHostToDevice, stream()),
            "cudaMemcpyAsync of the labels");
    }
    for (size_t l = 0; l < layers_.size(); ++l)
      activations_[l].reserve(static_cast<size_t>(batch) * layers_[l].out);
  }

  // Waits for the stream, then copies `count` values from the device.
  template <typename T>
  void download(T* host, const T* device, size_t count) const {
    check(cudaMemcpyAsync(host, device, count * sizeof(T), cudaMemcpyDeviceToHost, stream()),
          "cudaMemcpyAsync to the host");
    check(cudaStreamSynchronize(stream()), "cudaStreamSynchronize");
  }

  std::vector<float> copyOut(const float* device) const {
    std::vector<float> host(n_);
    download(host.data(), device, n_);
    return host;
  }

  // Row-major matrices are column-major transposes, so each product below is written for
  // cuBLAS's column-major view: C^T = B^T A^T.
  void gemm(cublasOperation_t opA, cublasOperation_t opB, int m, int n, int k, const float* a,
            int lda, const float* b, int ldb, float* c, int ldc) {
    const float one = 1.0f, zero = 0.0f;
    check(cuda::cublasApi().sgemm(cublas_.get(), opA, opB, m, n, k, &one, a, lda, b, ldb, &zero, c,
                                  ldc),
          "cublasSgemm");
  }

  // a_{l+1} = relu(a_l W_l^T + b_l); the last layer (the logits) without relu.
  void forward(int batch) {
    const float* input = input_.get();
    for (size_t l = 0; l < layers_.size(); ++l) {
      const MlpShape::Layer& layer = layers_[l];
      float* out = activations_[l].get();
      // out (batch x out) = input (batch x in) * W^T, W being out x in.
      gemm(CUBLAS_OP_T, CUBLAS_OP_N, layer.out, batch, layer.in, params_.get() + layer.weights,
           layer.in, input, layer.in, out, layer.out);
      cuda::addBias(out, params_.get() + layer.bias, batch, layer.out, l + 1 < layers_.size(),
                    stream());
      input = out;
    }
  }

  // From dL/dlogits (in the last activations) down to the first layer's gradients.
  void backward(int batch) {
    int widest = 0;  // of the layers' inputs that get a gradient
    for (size_t l = 1; l < layers_.size(); ++l) widest = std::max(widest, layers_[l].in);
    for (auto& buffer : deltas_) buffer.reserve(static_cast<size_t>(batch) * widest);
    float* grads = exchange_.get();
    const float* delta = activations_.back().get();  // dL/d(pre-activation) of layer l
    float* below = deltas_[0].get();
    float* spare = deltas_[1].get();
    for (size_t l = layers_.size(); l-- > 0;) {
      const MlpShape::Layer& layer = layers_[l];
      const float* in = l == 0 ? input_.get() : activations_[l - 1].get();
      // dW (out x in) = delta^T (out x batch) * in (batch x in).
      gemm(CUBLAS_OP_N, CUBLAS_OP_T, layer.in, layer.out, batch, in, layer.in, delta, layer.out,
           grads + layer.weights, layer.in);
      cuda::columnSums(delta, batch, layer.out, grads + layer.bias, stream());
      if (l == 0) break;
      // dIn (batch x in) = delta (batch x out) * W (out x in), then ReLU's mask.
      gemm(CUBLAS_OP_N, CUBLAS_OP_N, layer.in, batch, layer.out, params_.get() + layer.weights,
           layer.in, delta, layer.out, below, layer.in);
      cuda::reluBackward(below, in, static_cast<size_t>(batch) * layer.in, stream());
      delta = below;
      std::swap(below, spare);
    }
  }

  void sumOverRanks(float* data, size_t count) {
    if (nccl_) {
      check(ncclAllReduce(data, data, count, ncclFloat, ncclSum, nccl_.get(), stream()),
            "ncclAllReduce");
      return;
    }
    staging_.resize(count);
    download(staging_.data(), data, count);
    collective_.allreduceSum(staging_.data(), count);
    check(cudaMemcpyAsync(data, staging_.data(), count * sizeof(float), cudaMemcpyHostToDevice,
                          stream()),
          "cudaMemcpyAsync of the summed gradients");
  }

  const MlpShape shape_;
  const std::vector<MlpShape::Layer> layers_;
  const SgdOptions sgd_;
  Collective& collective_;
  const size_t n_;  // parameters
  // Declared before the device's handles and buffers, so destroyed after them.
  Stream stream_;
  Cublas cublas_;
  NcclComm nccl_;
  DeviceBuffer<float> params_, velocity_, exchange_;
  DeviceBuffer<float> input_;
  DeviceBuffer<uint8_t> labels_;
  std::vector<DeviceBuffer<float>> activations_;  // per layer output; the last, the logits
  DeviceBuffer<float> deltas_[2];                 // backward's scratch, used in turn
  DeviceBuffer<int> predictions_;
  std::vector<float> staging_;  // host copy for a sum through `collective`
};

}  // namespace

CudaDevices findCudaDevices() {
  CudaDevices found;
  const cudaError_t status = cudaGetDeviceCount(&found.count);
  if (status != cudaSuccess) {
    found.count = 0;
    found.problem = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(status);
    cudaGetLastError();  // not sticky: clear it so later calls do not report it again
  } else if (found.count == 0) {
    found.problem = "cudaGetDeviceCount found none";
  }
  return found;
}

std::unique_ptr<Engine> makeCudaEngine(const EngineOptions& options, const Placement& placement,
                                       Collective& collective, std::shared_ptr<Store> store) {
  const CudaDevices devices = findCudaDevices();
  if (devices.count == 0) throw Error("no usable CUDA device: " + devices.problem);
  // NCCL refuses two ranks on one device. Any rank with too few devices turns every rank to
  // the sum through host memory, so all make the same collective calls.
  float crowded = placement.localWorldSize > devices.count ? 1.0f : 0.0f;
  collective.allreduceSum(&crowded, 1);
  std::optional<ncclUniqueId> id;
  if (crowded == 0.0f) id = store ? shareNcclId(*store, collective.rank()) : newNcclId();
  return std::make_unique<CudaEngine>(options, collective, placement.localRank % devices.count, id);
}

}  // namespace dlrun::trainer
