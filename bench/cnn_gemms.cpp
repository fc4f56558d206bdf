// dlrun-cnn-gemms: the roofline of dlrun-train's CNN step on this CPU, for train_bench.sh: the
// time of the step's GEMMs alone, the same products on the same shapes and layouts as
// trainer/cnn_math.cpp (Eigen, row-major, one thread), without the im2col, pooling, softmax,
// SGD and data copying around them. Built with AVX2 and FMA, as the trainer's module that runs
// the step where the CPU has both: run it only on such a CPU (train_bench.sh checks). Prints
// one JSON line: batch, the GEMMs' GFLOP, and the median milliseconds over --repeats.
#include <CLI/CLI.hpp>
#include <Eigen/Dense>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

namespace {

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// One layer as cnn_math.cpp multiplies it: rows x in activations, an out x in weight.
struct Layer {
  long rows, in, out;
  bool inputGradient;  // the backward pass computes dL/din (all but the first convolution)
};

struct Buffers {
  RowMatrix x, w, y, d, gw, dx;
  explicit Buffers(const Layer& l)
      : x(RowMatrix::Random(l.rows, l.in)),
        w(RowMatrix::Random(l.out, l.in)),
        y(l.rows, l.out),
        d(RowMatrix::Random(l.rows, l.out)),
        gw(l.out, l.in),
        dx(l.rows, l.in) {}
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("dlrun-cnn-gemms: the GEMMs of one dlrun-train CNN step, timed alone");
  long batch = 64;
  int repeats = 50;
  app.add_option("--batch", batch, "Images per step")->check(CLI::Range(1, 4096));
  app.add_option("--repeats", repeats, "Timed steps (the median is printed)")
      ->check(CLI::Range(1, 100000));
  CLI11_PARSE(app, argc, argv);

  // The default CnnShape (16 and 32 channels, 3x3 kernels, 128 hidden, 10 classes).
  const std::vector<Layer> layers = {{batch * 28 * 28, 9, 16, false},
                                     {batch * 14 * 14, 16 * 9, 32, true},
                                     {batch, 32 * 7 * 7, 128, true},
                                     {batch, 128, 10, true}};
  std::vector<Buffers> buffers(layers.begin(), layers.end());
  double flop = 0;
  for (const Layer& l : layers) flop += 2.0 * l.rows * l.in * l.out * (l.inputGradient ? 3 : 2);

  std::vector<double> ms;
  for (int r = 0; r <= repeats; ++r) {  // the first, warming caches, is not counted
    const auto start = std::chrono::steady_clock::now();
    for (size_t i = 0; i < layers.size(); ++i) {
      Buffers& b = buffers[i];
      b.y.noalias() = b.x * b.w.transpose();                    // forward
      b.gw.noalias() = b.d.transpose() * b.x;                   // the weight's gradient
      if (layers[i].inputGradient) b.dx.noalias() = b.d * b.w;  // the input's
    }
    const std::chrono::duration<double, std::milli> took = std::chrono::steady_clock::now() - start;
    if (r > 0) ms.push_back(took.count());
  }
  std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
  std::printf("{\"batch\": %ld, \"gflop\": %.4f, \"ms\": %.3f}\n", batch, flop / 1e9,
              ms[ms.size() / 2]);
  return 0;
}
