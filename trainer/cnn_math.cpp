// Compiled twice, as mlp_math.cpp is (trainer/CMakeLists.txt): into dlrun-train for any x86-64
// CPU, and into dlrun-train-avx2.so with -mavx2 -mfma.
//
// Activations are NHWC (batch x height x width x channels, row-major), so each convolution is
// one batch-level GEMM: im2col makes a row of K*K*Cin inputs per output pixel of the whole
// batch, and (batch*H*W) x (Cin*K*K) times the weight's transpose gives NHWC again, with
// torch's [Cout][Cin][K][K] weight as it is. The second pool writes torch's NCHW flatten order,
// which fc1's weight expects. Every reduction is a GEMM or a plain loop in a fixed order, so no
// result depends on where a buffer sits (see the softmax's comment in mlp_math.cpp).
#include "trainer/cnn_math.h"

#include <Eigen/Dense>
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <string>

#include "common/error.h"

namespace dlrun::trainer {
namespace {

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatrixMap = Eigen::Map<RowMatrix>;
using ConstMatrixMap = Eigen::Map<const RowMatrix>;

constexpr int kSide1 = kCnnImageSide;      // conv1's input and output
constexpr int kSide2 = kCnnImageSide / 2;  // conv2's, after the first pool
constexpr int kSide3 = kCnnImageSide / 4;  // after the second pool: what fc1 sees per channel
constexpr int kFlatPixels = kSide3 * kSide3;

CnnLayout layoutOf(const CnnShape& s) {
  const size_t k2 = static_cast<size_t>(s.kernel) * s.kernel;
  const size_t c1 = s.channels1, c2 = s.channels2, h = s.hidden, classes = s.classes;
  CnnLayout l{};
  l.conv1Weight = 0;
  l.conv1Bias = l.conv1Weight + c1 * k2;
  l.conv2Weight = l.conv1Bias + c1;
  l.conv2Bias = l.conv2Weight + c2 * c1 * k2;
  l.fc1Weight = l.conv2Bias + c2;
  l.fc1Bias = l.fc1Weight + h * c2 * kFlatPixels;
  l.fc2Weight = l.fc1Bias + h;
  l.fc2Bias = l.fc2Weight + classes * h;
  l.parameterCount = l.fc2Bias + classes;
  return l;
}

// The workspace's arrays, in the order they sit in it.
enum Slot {
  kCols1,
  kAct1,
  kPool1,
  kCols2,
  kAct2,
  kFlat,
  kHidden,
  kLogits,  // forward
  kDHidden,
  kDFlat,
  kDAct2,
  kDPool1,
  kDAct1,  // backward
  kSlotCount
};

std::array<size_t, kSlotCount> slotSizes(const CnnShape& s, int batch) {
  const size_t k2 = static_cast<size_t>(s.kernel) * s.kernel;
  const size_t pixels1 = static_cast<size_t>(batch) * kSide1 * kSide1;
  const size_t pixels2 = static_cast<size_t>(batch) * kSide2 * kSide2;
  const size_t flat = static_cast<size_t>(batch) * s.channels2 * kFlatPixels;
  const size_t hidden = static_cast<size_t>(batch) * s.hidden;
  const size_t logits = static_cast<size_t>(batch) * s.classes;
  // The backward pass writes conv2's patch gradients over kCols2 (see cnnLossAndGradient).
  return {pixels1 * k2,
          pixels1 * s.channels1,
          pixels2 * s.channels1,
          pixels2 * s.channels1 * k2,
          pixels2 * s.channels2,
          flat,
          hidden,
          logits,
          hidden,
          flat,
          pixels2 * s.channels2,
          pixels2 * s.channels1,
          pixels1 * s.channels1};
}

struct Workspace {
  std::array<float*, kSlotCount> at;
  int32_t* argmax1;  // per first-pool output: its max's index in at[kAct1]
  int32_t* argmax2;  // per second-pool output (in kFlat's order): its index in at[kAct2]
};

Workspace carve(const CnnBuffers& model, int batch) {
  const std::array<size_t, kSlotCount> sizes = slotSizes(model.shape, batch);
  Workspace w{};
  float* next = model.workspace;
  for (int i = 0; i < kSlotCount; ++i) {
    w.at[i] = next;
    next += sizes[i];
  }
  w.argmax1 = model.poolIndex;
  w.argmax2 = model.poolIndex + sizes[kPool1];
  return w;
}

// Row p of `cols` is the K x K x channels patch around output pixel p (zero outside the image),
// its column c*K*K + kh*K + kw matching torch's weight [out][c][kh][kw].
void im2col(const float* in, int batch, int side, int channels, int kernel, float* cols) {
  const int pad = kernel / 2, width = channels * kernel * kernel;
  float* row = cols;
  for (int b = 0; b < batch; ++b) {
    const float* image = in + static_cast<size_t>(b) * side * side * channels;
    for (int y = 0; y < side; ++y) {
      for (int x = 0; x < side; ++x, row += width) {
        for (int kh = 0; kh < kernel; ++kh) {
          const int yy = y + kh - pad;
          for (int kw = 0; kw < kernel; ++kw) {
            const int xx = x + kw - pad;
            float* out = row + kh * kernel + kw;
            if (yy < 0 || yy >= side || xx < 0 || xx >= side) {
              for (int c = 0; c < channels; ++c) out[c * kernel * kernel] = 0.0f;
              continue;
            }
            const float* pixel = image + (static_cast<size_t>(yy) * side + xx) * channels;
            for (int c = 0; c < channels; ++c) out[c * kernel * kernel] = pixel[c];
          }
        }
      }
    }
  }
}

// im2col's adjoint: sums each patch gradient back onto the pixels it was copied from.
void col2im(const float* cols, int batch, int side, int channels, int kernel, float* in) {
  const int pad = kernel / 2, width = channels * kernel * kernel;
  std::fill(in, in + static_cast<size_t>(batch) * side * side * channels, 0.0f);
  const float* row = cols;
  for (int b = 0; b < batch; ++b) {
    float* image = in + static_cast<size_t>(b) * side * side * channels;
    for (int y = 0; y < side; ++y) {
      for (int x = 0; x < side; ++x, row += width) {
        for (int kh = 0; kh < kernel; ++kh) {
          const int yy = y + kh - pad;
          if (yy < 0 || yy >= side) continue;
          for (int kw = 0; kw < kernel; ++kw) {
            const int xx = x + kw - pad;
            if (xx < 0 || xx >= side) continue;
            float* pixel = image + (static_cast<size_t>(yy) * side + xx) * channels;
            const float* grad = row + kh * kernel + kw;
            for (int c = 0; c < channels; ++c) pixel[c] += grad[c * kernel * kernel];
          }
        }
      }
    }
  }
}

// out = in W^T + b (in: rows x inWidth; W: outWidth x inWidth, torch's Linear and, on im2col's
// rows, Conv2d weight), then ReLU where asked.
void affine(const float* in, int rows, int inWidth, const float* weights, const float* bias,
            int outWidth, bool relu, float* out) {
  MatrixMap o(out, rows, outWidth);
  o.noalias() =
      ConstMatrixMap(in, rows, inWidth) * ConstMatrixMap(weights, outWidth, inWidth).transpose();
  o.rowwise() += Eigen::Map<const Eigen::RowVectorXf>(bias, outWidth);
  if (relu) o = o.cwiseMax(0.0f);
}

// affine's backward from d = dL/dout: the weight's and bias's gradients, and dL/din where
// dIn is not null. dIn may be `in` itself: it is written last.
void affineBackward(const float* d, const float* in, int rows, int inWidth, int outWidth,
                    const float* weights, float* gradWeights, float* gradBias, float* dIn) {
  ConstMatrixMap delta(d, rows, outWidth);
  MatrixMap(gradWeights, outWidth, inWidth).noalias() =
      delta.transpose() * ConstMatrixMap(in, rows, inWidth);
  // A plain loop: each bias's sum runs over the rows in order, wherever the buffer sits.
  std::fill(gradBias, gradBias + outWidth, 0.0f);
  for (int r = 0; r < rows; ++r) {
    const float* row = d + static_cast<size_t>(r) * outWidth;
    for (int c = 0; c < outWidth; ++c) gradBias[c] += row[c];
  }
  if (dIn != nullptr) {
    MatrixMap(dIn, rows, inWidth).noalias() = delta * ConstMatrixMap(weights, outWidth, inWidth);
  }
}

// ReLU's backward: no gradient where the activation was clipped to zero.
void maskRelu(float* d, const float* activation, size_t count) {
  for (size_t i = 0; i < count; ++i) d[i] = activation[i] > 0.0f ? d[i] : 0.0f;
}

// MaxPool2d(2) of NHWC `in`; `out` is NHWC, or with channelsFirst torch's NCHW flatten order.
// argmax[o] is the index in `in` of out[o]'s max: the first in row-major window order on a tie,
// as torch picks.
void maxPool(const float* in, int batch, int side, int channels, bool channelsFirst, float* out,
             int32_t* argmax) {
  const int half = side / 2, down = side * channels;
  // The window's elements after its first, in row-major order, as offsets from it.
  const int32_t offsets[3] = {channels, down, down + channels};
  for (int b = 0; b < batch; ++b) {
    for (int y = 0; y < half; ++y) {
      for (int x = 0; x < half; ++x) {
        const size_t first = ((static_cast<size_t>(b) * side + 2 * y) * side + 2 * x) * channels;
        for (int c = 0; c < channels; ++c) {
          // The max first, then the first element equal to it: both vectorize across channels.
          const float* at = in + first + c;
          const float best =
              std::max(std::max(at[0], at[offsets[0]]), std::max(at[offsets[1]], at[offsets[2]]));
          const int32_t offset = at[0] == best            ? 0
                                 : at[offsets[0]] == best ? offsets[0]
                                 : at[offsets[1]] == best ? offsets[1]
                                                          : offsets[2];
          const size_t o = channelsFirst
                               ? ((static_cast<size_t>(b) * channels + c) * half + y) * half + x
                               : ((static_cast<size_t>(b) * half + y) * half + x) * channels + c;
          out[o] = best;
          argmax[o] = static_cast<int32_t>(first + c) + offset;
        }
      }
    }
  }
}

// maxPool's backward: each output's gradient to its max, none to the rest of its window.
void unpool(const float* dOut, const int32_t* argmax, size_t outCount, float* dIn, size_t inCount) {
  std::fill(dIn, dIn + inCount, 0.0f);
  for (size_t o = 0; o < outCount; ++o) dIn[argmax[o]] = dOut[o];
}

Workspace forward(const CnnBuffers& model, const float* x, int batch) {
  const CnnShape& s = model.shape;
  const CnnLayout l = layoutOf(s);
  const float* p = model.params;
  const Workspace w = carve(model, batch);
  const int k2 = s.kernel * s.kernel;
  const int pixels1 = batch * kSide1 * kSide1, pixels2 = batch * kSide2 * kSide2;
  im2col(x, batch, kSide1, 1, s.kernel, w.at[kCols1]);
  affine(w.at[kCols1], pixels1, k2, p + l.conv1Weight, p + l.conv1Bias, s.channels1, true,
         w.at[kAct1]);
  maxPool(w.at[kAct1], batch, kSide1, s.channels1, false, w.at[kPool1], w.argmax1);
  im2col(w.at[kPool1], batch, kSide2, s.channels1, s.kernel, w.at[kCols2]);
  affine(w.at[kCols2], pixels2, s.channels1 * k2, p + l.conv2Weight, p + l.conv2Bias, s.channels2,
         true, w.at[kAct2]);
  maxPool(w.at[kAct2], batch, kSide2, s.channels2, true, w.at[kFlat], w.argmax2);
  affine(w.at[kFlat], batch, s.channels2 * kFlatPixels, p + l.fc1Weight, p + l.fc1Bias, s.hidden,
         true, w.at[kHidden]);
  affine(w.at[kHidden], batch, s.hidden, p + l.fc2Weight, p + l.fc2Bias, s.classes, false,
         w.at[kLogits]);
  return w;
}

// The mean softmax cross-entropy; turns the logits into dL/dlogits of the mean in place. Plain
// loops for the reason mlp_math.cpp gives: Eigen's exp and sums on a row that starts off a
// packet boundary made the result depend on where malloc put the buffer.
float softmaxCrossEntropy(float* logits, const uint8_t* labels, int batch, int classes) {
  float loss = 0.0f;
  for (int i = 0; i < batch; ++i) {
    float* row = logits + static_cast<size_t>(i) * classes;
    const float max = *std::max_element(row, row + classes);
    float sum = 0.0f;
    for (int c = 0; c < classes; ++c) sum += row[c] = std::exp(row[c] - max);
    for (int c = 0; c < classes; ++c) row[c] /= sum;
    loss -= std::log(std::max(row[labels[i]], 1e-12f));
    row[labels[i]] -= 1.0f;
  }
  const float scale = 1.0f / static_cast<float>(batch);
  for (size_t i = 0; i < static_cast<size_t>(batch) * classes; ++i) logits[i] *= scale;
  return loss / static_cast<float>(batch);
}

void validate(const CnnShape& s) {
  if (s.channels1 <= 0 || s.channels2 <= 0 || s.kernel <= 0 || s.hidden <= 0 || s.classes <= 0) {
    throw ConfigError("CNN shape: channels1 " + std::to_string(s.channels1) + ", channels2 " +
                      std::to_string(s.channels2) + ", kernel " + std::to_string(s.kernel) +
                      ", hidden " + std::to_string(s.hidden) + ", classes " +
                      std::to_string(s.classes) + ": every size must be positive");
  }
  if (s.kernel % 2 == 0) {
    throw ConfigError("CNN kernel " + std::to_string(s.kernel) +
                      " is even: use an odd one, so padding K/2 keeps the image's size");
  }
}

}  // namespace

CnnLayout cnnLayout(const CnnShape& shape) {
  validate(shape);
  return layoutOf(shape);
}

size_t cnnWorkspaceFloats(const CnnShape& shape, int batch) {
  cnnPoolIndexCount(shape, batch);  // the same checks
  size_t total = 0;
  for (size_t size : slotSizes(shape, batch)) total += size;
  return total;
}

size_t cnnPoolIndexCount(const CnnShape& shape, int batch) {
  validate(shape);
  if (batch <= 0) throw ConfigError("CNN batch " + std::to_string(batch) + ": must be positive");
  // The indices point into the first convolution's output, the larger one.
  const size_t largest = static_cast<size_t>(batch) * kSide1 * kSide1 * shape.channels1;
  if (largest > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    throw ConfigError("CNN batch " + std::to_string(batch) + " with " +
                      std::to_string(shape.channels1) +
                      " first-layer channels overflows the max-pool indices: use a smaller batch");
  }
  const std::array<size_t, kSlotCount> sizes = slotSizes(shape, batch);
  return sizes[kPool1] + sizes[kFlat];
}

float cnnLossAndGradient(const CnnBuffers& model, const float* x, const uint8_t* labels,
                         int batch) {
  const Workspace w = forward(model, x, batch);
  const CnnShape& s = model.shape;
  const CnnLayout l = layoutOf(s);
  const float* p = model.params;
  float* g = model.grads;
  const int k2 = s.kernel * s.kernel, flat = s.channels2 * kFlatPixels;
  const size_t pixels1 = static_cast<size_t>(batch) * kSide1 * kSide1;
  const size_t pixels2 = static_cast<size_t>(batch) * kSide2 * kSide2;
  const float loss = softmaxCrossEntropy(w.at[kLogits], labels, batch, s.classes);

  affineBackward(w.at[kLogits], w.at[kHidden], batch, s.hidden, s.classes, p + l.fc2Weight,
                 g + l.fc2Weight, g + l.fc2Bias, w.at[kDHidden]);
  maskRelu(w.at[kDHidden], w.at[kHidden], static_cast<size_t>(batch) * s.hidden);
  affineBackward(w.at[kDHidden], w.at[kFlat], batch, flat, s.hidden, p + l.fc1Weight,
                 g + l.fc1Weight, g + l.fc1Bias, w.at[kDFlat]);
  unpool(w.at[kDFlat], w.argmax2, static_cast<size_t>(batch) * flat, w.at[kDAct2],
         pixels2 * s.channels2);
  maskRelu(w.at[kDAct2], w.at[kAct2], pixels2 * s.channels2);
  // conv2's patch gradients overwrite its patches, which its weight gradient has used: the
  // largest array, so the workspace holds it once.
  affineBackward(w.at[kDAct2], w.at[kCols2], static_cast<int>(pixels2), s.channels1 * k2,
                 s.channels2, p + l.conv2Weight, g + l.conv2Weight, g + l.conv2Bias, w.at[kCols2]);
  col2im(w.at[kCols2], batch, kSide2, s.channels1, s.kernel, w.at[kDPool1]);
  unpool(w.at[kDPool1], w.argmax1, pixels2 * s.channels1, w.at[kDAct1], pixels1 * s.channels1);
  maskRelu(w.at[kDAct1], w.at[kAct1], pixels1 * s.channels1);
  affineBackward(w.at[kDAct1], w.at[kCols1], static_cast<int>(pixels1), k2, s.channels1,
                 p + l.conv1Weight, g + l.conv1Weight, g + l.conv1Bias, nullptr);
  return loss;
}

int cnnCountCorrect(const CnnBuffers& model, const float* x, const uint8_t* labels, int batch) {
  const Workspace w = forward(model, x, batch);
  const int classes = model.shape.classes;
  int correct = 0;
  for (int i = 0; i < batch; ++i) {
    const float* row = w.at[kLogits] + static_cast<size_t>(i) * classes;
    correct += std::max_element(row, row + classes) - row == labels[i] ? 1 : 0;
  }
  return correct;
}

}  // namespace dlrun::trainer
