// GEMM and convolution throughput of the kernels behind linear and conv2d. Prints one JSON
// object: GFLOPS of a 1024^3 matrix product (row-major, and with each operand transposed) and
// of the forward and backward passes of convolutions from resnet18 and small-cnn. Each case
// is recorded once into a Program and submitted repeatedly; the time is the mean over several
// submits after a warm-up. `--gemm N [--precision fp16]` times only a row-major N^3 product
// (fp16: operands and result in fp16, sums in fp32), as bench/gpu/ compares with PyTorch;
// `--linear` only ViT-L/16's four linear layers, each way (linear_gflops).
//
// --as-gpu: with the kernel variant and tiles this device would get were it a GPU (its own
// limits, device type discrete-gpu, subgroups of at least 32): on lavapipe, the shared-memory
// tiles beside the register blocks it keeps. Last, a batch norm's training step and a bias
// gradient with each reduction variant (subgroup sums where the device has them, shared memory
// alone), timed in one run.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>
#include <sys/resource.h>

#include "compute/network.h"
#include "compute/ops/batch_norm2d.h"
#include "compute/ops/conv2d.h"
#include "compute/ops/gemm.h"
#include "compute/ops/linear.h"
#include "compute/vk/context.h"

using namespace tessera;

namespace {

// CPU seconds of every thread of this process (lavapipe's workers included).
double process_cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  auto seconds = [](const timeval& t) { return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) / 1e6; };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

// Seconds per submit of a recorded program: one warm-up run (pipelines, caches), then at
// least `min_runs` runs and at least half a second. `cpu_seconds`, where given, gets the
// process's CPU seconds per run: on a CPU device (lavapipe) on a shared machine, the work a
// kernel takes whatever the other processes take of the cores (wall time varies 2-4x there).
template <class Record>
double seconds_per_run(vk::Context& context, Record record, int min_runs = 1, double* cpu_seconds = nullptr) {
  vk::Program program(context);
  {
    vk::Recorder recorder(context, program);
    record(recorder);
    recorder.finish();
  }
  program.run();
  int runs = 0;
  double cpu_start = process_cpu_seconds();
  auto start = std::chrono::steady_clock::now();
  double elapsed = 0;
  while (runs < min_runs || elapsed < 0.5) {
    program.run();
    ++runs;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  if (cpu_seconds) *cpu_seconds = (process_cpu_seconds() - cpu_start) / runs;
  return elapsed / runs;
}

// GFLOPS of c[n,n] = a[n,n] b[n,n] with each operand row-major ("n") or transposed, that is
// column-major ("t"), as the backward passes of dense layers read them; `per_cpu_second`, where
// given, gets GFLOPS per CPU second of the process.
double gemm_gflops(vk::Context& context, uint32_t n, bool a_transposed = false, bool b_transposed = false,
                   DType dtype = DType::f32, double* per_cpu_second = nullptr) {
  // Random operands: zeros or ones could let a device skip work that real data needs.
  std::vector<float> values(static_cast<size_t>(n) * n);
  std::mt19937 random(1);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (auto& v : values) v = uniform(random);
  Tensor a(context, "a", {n, n}, dtype), b(context, "b", {n, n}, dtype), c(context, "c", {n, n}, dtype);
  a.upload(values);
  b.upload(values);
  auto view = [n](const Tensor& t, bool transposed) {
    return transposed ? MatrixView{&t, 1, n} : MatrixView{&t, n, 1};
  };
  double cpu_seconds = 0;
  double seconds = seconds_per_run(context, [&](vk::Recorder& recorder) {
    record_gemm(recorder, context.kernels(), n, n, n, view(a, a_transposed), view(b, b_transposed),
                {&c, n, 1}, false);
  }, 1, &cpu_seconds);
  double flops = 2.0 * n * n * n;
  if (per_cpu_second) *per_cpu_second = flops / cpu_seconds / 1e9;
  return flops / seconds / 1e9;
}

struct ConvCase {
  std::string name;
  Shape input;
  int64_t out_channels, kernel, stride, padding;
  bool input_grad;  // false for a first layer: no gradient flows to the images
};

nlohmann::json conv_gflops(vk::Context& context, const ConvCase& c) {
  auto conv = std::make_shared<Conv2d>(c.out_channels, c.kernel, c.kernel, c.stride, c.padding, false);
  // A one-layer graph: the executor binds the op's tensors as in every model.
  Network graph(conv, {{"x", c.input, DType::f32, c.input_grad}}, true);
  graph.allocate(context);
  Tensor x(context, "x", c.input);
  OpTensors t = graph.bindings(0, {{"x", &x}}, {true, 0, nullptr, 0}, true);
  auto& kernels = context.kernels();
  double forward = seconds_per_run(context, [&](vk::Recorder& r) { conv->forward(r, kernels, t); });
  double backward = seconds_per_run(context, [&](vk::Recorder& r) { conv->backward(r, kernels, t); });
  double flops = conv->forward_flops();
  return {{"name", c.name},
          {"input", c.input},
          {"out_channels", c.out_channels},
          {"kernel", c.kernel},
          {"stride", c.stride},
          {"input_grad", c.input_grad},
          {"forward_gflops", flops / forward / 1e9},
          // the data and the weight gradient each take as many FLOPs as forward
          {"backward_gflops", (c.input_grad ? 2 : 1) * flops / backward / 1e9}};
}

// Milliseconds of a training batch norm's forward and backward (with the input gradient, and
// the bias gradient of a conv2d over the same activation), with the channel sums within
// subgroups first and through shared memory alone (op.h's reduction_kernel): the least of
// three rounds that alternate the two, so that a shared machine's load weighs on both alike.
nlohmann::json reduction_milliseconds(vk::Context& context, const Shape& input) {
  auto norm = std::make_shared<BatchNorm2d>(1e-5f, 0.1f);
  Network graph(norm, {{"x", input, DType::f32, true}}, true);
  graph.allocate(context);
  Tensor x(context, "x", input), dbias(context, "dbias", {input[1]});
  x.upload(std::vector<float>(static_cast<size_t>(element_count(input)), 1.0f));
  OpTensors t = graph.bindings(0, {{"x", &x}}, {true, 0, nullptr, 0}, true);
  auto& kernels = context.kernels();
  vk::TileTarget own = kernels.tile_target();
  nlohmann::json result{{"input", input}};
  for (int round = 0; round < 3; ++round)
    for (bool subgroup : {true, false}) {
      if (subgroup && !own.subgroup_arithmetic) continue;
      vk::TileTarget target = own;  // subgroup sums as a GPU gets them (op.h's subgroup_reductions)
      if (subgroup) {
        target.device_type = "discrete-gpu";
        target.subgroup_size = std::max(target.subgroup_size, 32u);
      }
      target.subgroup_arithmetic = subgroup;
      kernels.set_tile_target(target);
      double milliseconds = 1e3 * seconds_per_run(context, [&](vk::Recorder& r) {
        norm->forward(r, kernels, t);
        norm->backward(r, kernels, t);
        record_bias_backward(r, kernels, *t.output_grad, dbias, static_cast<uint32_t>(input[0]),
                             static_cast<uint32_t>(input[1]), static_cast<uint32_t>(input[2] * input[3]));
      });
      const char* key = subgroup ? "subgroup_ms" : "shared_memory_ms";
      if (round == 0 || milliseconds < result[key].get<double>()) result[key] = milliseconds;
    }
  kernels.set_tile_target(own);
  return result;
}

// A ViT-L/16 linear layer (UNI's shape) over `tokens` rows of x [tokens, in]: GFLOPS of the Linear
// op itself in a one-layer inference graph, before Network::prepare (op_unprepared: W [out, in]
// as stored, as training reads it) and after (op_prepared: W^T [in, out]), with its bias; then
// the bare products (no bias): out_rows_nt, y^T = W x^T with W as stored; out_rows_tt, the same
// with W^T; token_rows_nt, y = x W^T with rows of x across the invocations. Best of three
// rounds that alternate them, wall and per CPU second of the process.
nlohmann::json linear_gflops(vk::Context& context, const std::string& name, uint32_t tokens, uint32_t in,
                             uint32_t out) {
  auto linear = std::make_shared<Linear>(out, true);
  Network graph(linear, {{"x", {tokens, in}, DType::f32, false}}, false);
  graph.allocate(context);
  graph.initialise(1);
  Tensor x(context, "x", {tokens, in});
  x.upload(std::vector<float>(static_cast<size_t>(tokens) * in, 0.5f));
  const Tensor& weight = *graph.layers()[0].tensors[0];
  const Tensor& y = graph.output();
  auto& kernels = context.kernels();
  double flops = linear->forward_flops();
  nlohmann::json result{{"layer", name}, {"tokens", tokens}, {"in", in}, {"out", out}};
  // Best of three rounds that alternate the variants, wall and per CPU second of the process.
  std::vector<std::pair<std::string, std::function<void(vk::Recorder&)>>> variants;
  OpTensors unprepared = graph.bindings(0, {{"x", &x}}, {}, false);
  variants.emplace_back("op_unprepared", [&](vk::Recorder& r) { linear->forward(r, kernels, unprepared); });
  graph.prepare(context);
  OpTensors prepared = graph.bindings(0, {{"x", &x}}, {}, false);
  variants.emplace_back("op_prepared", [&](vk::Recorder& r) { linear->forward(r, kernels, prepared); });
  const Tensor& transposed = weight;  // prepared: W^T in the weight's own buffer
  variants.emplace_back("out_rows_tt", [&](vk::Recorder& r) {
    record_gemm(r, kernels, out, tokens, in, {&transposed, 1, out}, {&x, 1, in}, {&y, 1, out}, false);
  });
  // (The weight's buffer read as W [out, in]: other values, the same loads.)
  variants.emplace_back("out_rows_nt", [&](vk::Recorder& r) {
    record_gemm(r, kernels, out, tokens, in, {&weight, in, 1}, {&x, 1, in}, {&y, 1, out}, false);
  });
  variants.emplace_back("token_rows_nt", [&](vk::Recorder& r) {
    record_gemm(r, kernels, tokens, out, in, {&x, in, 1}, {&weight, 1, in}, {&y, out, 1}, false);
  });
  for (int round = 0; round < 3; ++round)
    for (auto& [key, record] : variants) {
      double cpu_seconds = 0;
      double wall = flops / seconds_per_run(context, record, 1, &cpu_seconds) / 1e9, cpu = flops / cpu_seconds / 1e9;
      if (round == 0 || wall > result[key].get<double>()) result[key] = wall;
      if (round == 0 || cpu > result[key + "_per_cpu_second"].get<double>()) result[key + "_per_cpu_second"] = cpu;
    }
  return result;
}

// ViT-L/16's four linear layers over `tokens` rows (197 a tile).
nlohmann::json vit_l_linear_gflops(vk::Context& context, uint32_t tokens) {
  nlohmann::json layers = nlohmann::json::array();
  for (auto [name, in, out] : {std::tuple{"qkv", 1024u, 3072u}, {"proj", 1024u, 1024u}, {"fc1", 1024u, 4096u},
                               {"fc2", 4096u, 1024u}})
    layers.push_back(linear_gflops(context, name, tokens, in, out));
  return layers;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"GEMM and convolution GFLOPS of tessera's kernels (JSON on stdout)"};
  uint32_t only_gemm = 0;
  std::string precision = "fp32";
  app.add_option("--gemm", only_gemm, "time only a row-major N x N x N product of random values");
  app.add_option("--precision", precision, "of --gemm's operands and result")->check(CLI::IsMember({"fp32", "fp16"}));
  bool only_linear = false;
  app.add_flag("--linear", only_linear, "time only ViT-L/16's linear layers, each layout and the op before and after prepare");
  uint32_t tokens = 197 * 4;
  app.add_option("--tokens", tokens, "--linear: rows of x (197 a tile; default a batch of 4)")->check(CLI::Range(1u, 1u << 16));
  bool only_layouts = false;
  app.add_flag("--layouts", only_layouts, "time only the 1024^3 product in each layout (nn, nt, tn, tt)");
  bool as_gpu = false;
  app.add_flag("--as-gpu", as_gpu, "with the kernel variant and tiles this device would get were it a GPU");
  CLI11_PARSE(app, argc, argv);
  vk::Context context;
  if (as_gpu) {
    vk::TileTarget target = context.kernels().tile_target();
    target.device_type = "discrete-gpu";
    target.subgroup_size = std::max(target.subgroup_size, 32u);
    context.kernels().set_tile_target(target);
  }
  if (only_gemm) {
    double per_cpu_second = 0;
    double gflops = gemm_gflops(context, only_gemm, false, false, precision == "fp16" ? DType::f16 : DType::f32,
                                &per_cpu_second);
    nlohmann::json result = {{"device", context.info().name}, {"driver", context.info().driver},
                             {"n", only_gemm}, {"precision", precision}, {"tflops", gflops / 1e3},
                             {"gflops_per_cpu_second", per_cpu_second}};
    std::printf("%s\n", result.dump().c_str());
    return 0;
  }
  if (only_linear) {
    nlohmann::json result = {{"device", context.info().name}, {"tokens", tokens},
                             {"vit_l_linear_gflops", vit_l_linear_gflops(context, tokens)}};
    std::printf("%s\n", result.dump(2).c_str());
    return 0;
  }
  if (only_layouts) {
    nlohmann::json result = {{"device", context.info().name}};
    for (bool a_transposed : {false, true})
      for (bool b_transposed : {false, true}) {
        double per_cpu_second = 0;
        std::string layout = std::string(a_transposed ? "t" : "n") + (b_transposed ? "t" : "n");
        result["gemm_1024_gflops_by_layout"][layout] =
            gemm_gflops(context, 1024, a_transposed, b_transposed, DType::f32, &per_cpu_second);
        result["gemm_1024_gflops_per_cpu_second_by_layout"][layout] = per_cpu_second;
      }
    std::printf("%s\n", result.dump().c_str());
    return 0;
  }
  GemmTiles tiles = gemm_tiles(context.kernels().tile_target(), 1024);
  nlohmann::json result;
  result["device"] = context.info().name;
  result["tiles"] = {{"kind", tiles.kind == GemmKind::registers ? "registers" : "shared_memory"},
                     {"group", tiles.group},
                     {"rows", tiles.rows},
                     {"columns", tiles.columns},
                     {"reduction_unroll", tiles.reduction_unroll},
                     {"block_rows", tiles.block_rows},
                     {"block_columns", tiles.block_columns},
                     {"depth", tiles.depth}};
  result["gemm_1024_gflops"] = gemm_gflops(context, 1024);
  for (bool a_transposed : {false, true})
    for (bool b_transposed : {false, true})
      result["gemm_1024_gflops_by_layout"][std::string(a_transposed ? "t" : "n") + (b_transposed ? "t" : "n")] =
          gemm_gflops(context, 1024, a_transposed, b_transposed);
  std::vector<ConvCase> cases = {
      {"small-cnn conv2 (batch 64, 32x48x48 -> 64, 3x3)", {64, 32, 48, 48}, 64, 3, 1, 1, true},
      {"resnet18 conv1 (batch 16, 3x224x224 -> 64, 7x7/2)", {16, 3, 224, 224}, 64, 7, 2, 3, false},
      {"resnet18 layer3 conv (batch 16, 256x14x14 -> 256, 3x3)", {16, 256, 14, 14}, 256, 3, 1, 1, true},
  };
  for (auto& c : cases) result["conv"].push_back(conv_gflops(context, c));
  result["batch_norm_and_bias_backward"] = reduction_milliseconds(context, {16, 64, 56, 56});
  std::printf("%s\n", result.dump(2).c_str());
}
