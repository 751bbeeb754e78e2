// The loss and parameter gradients of one training step of a slide-level head, for a test to
// compare with PyTorch (tests/test_mil_heads_torch.py): the head's graph (jobs/mil_bags.h) and the
// loss the training loop adds after it (each term weighted, jobs/mil_bags.h's set_head_losses), on one bag, from given weights, forward and backward once
// on the device, as the loop records them (without the optimizer).
// Usage: head_gradients SPEC.json OUT.json, SPEC being {"head", "attention_hidden", "classes",
// "features": bag.h5, "label", "params": weights.h5 (a dataset per parameter, by its PyTorch
// name), "precision": fp32|fp16, and for clam heads "k_sample", "bag_weight", "subtyping"}. OUT.json
// gets {"loss", "gradients": {name: {"shape", "values"}}}.
#include <cstdio>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "compute/checkpoint.h"
#include "compute/network.h"
#include "compute/training_job.h"
#include "compute/vk/recorder.h"
#include "jobs/mil_bags.h"

using namespace tessera;

int main(int argc, char** argv) try {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s SPEC.json OUT.json\n", argv[0]);
    return 2;
  }
  nlohmann::json spec = nlohmann::json::parse(std::ifstream(argv[1]));
  bool fp16 = spec.value("precision", "fp32") == "fp16";
  int64_t width = 0;
  Bag bag = read_bag_file(spec["features"], "", width, fp16);
  ClamSettings clam;
  clam.k_sample = spec.value("k_sample", clam.k_sample);
  clam.bag_weight = spec.value("bag_weight", clam.bag_weight);
  clam.subtyping = spec.value("subtyping", clam.subtyping);
  nlohmann::json graph = head_graph(spec["head"], spec["attention_hidden"], spec["classes"], HeadUse::train, clam);
  std::vector<GraphInput> inputs{{"features", {bag.instances, width}, fp16 ? DType::f16 : DType::f32},
                                 {"count", {1}, DType::u32},
                                 {"labels", {1}, DType::u32}};
  TrainingJob losses;
  set_head_losses(spec["head"], losses, clam);
  vk::Context context;
  Network network(graph, inputs, true, nlohmann::json::array(), loss_layers(graph, losses.extra_losses));
  network.set_activation_dtype(fp16 ? DType::f16 : DType::f32);
  network.allocate(context);
  network.initialise(0);
  const std::string params = spec["params"];
  for (auto& named : network.named_tensors()) {
    named.tensor->upload(read_hdf5_array(params, named.name).values);
    if (named.grad) named.grad->upload(std::vector<float>(static_cast<size_t>(named.grad->count()), 0.0f));
  }
  Tensor features(context, "features", inputs[0].shape, inputs[0].dtype), count(context, "count", {1}, DType::u32),
      labels(context, "labels", {1}, DType::u32), step(context, "step", {2}, DType::u32);
  features.upload(bag.staged_bytes(), bag.staged_size());
  auto instances = static_cast<uint32_t>(bag.instances), label = spec["label"].get<uint32_t>();
  uint32_t steps[2] = {0, 0};
  count.upload(&instances, 4);
  labels.upload(&label, 4);
  step.upload(steps, sizeof steps);
  // Each term's loss layer gets its weight as its gradient: the loss is their weighted sum.
  std::vector<std::pair<std::string, float>> terms{{"loss", losses.logits_loss_weight}};
  for (auto& term : losses.extra_losses) terms.push_back({extra_loss_name(term), term.weight});
  for (auto& [name, weight] : terms) network.layer(name).output_grad->upload(std::vector<float>{weight});
  Network::Bound bound{{"features", &features}, {"count", &count}, {"labels", &labels}};
  Network::Pass pass{true, 0, &step, 0};
  vk::Program program(context);
  {
    vk::Recorder recorder(context, program);
    network.record_forward(recorder, context.kernels(), bound, pass);
    network.record_backward(recorder, context.kernels(), bound, pass);
    recorder.finish();
  }
  program.run();
  double loss = 0;
  for (auto& [name, weight] : terms) loss += weight * network.layer(name).output->download()[0];
  nlohmann::json out = {{"loss", loss}, {"gradients", nlohmann::json::object()}};
  for (auto& named : network.named_tensors())
    if (named.grad) out["gradients"][named.name] = {{"shape", named.spec.shape}, {"values", named.grad->download()}};
  std::ofstream(argv[2]) << out.dump();
  return 0;
} catch (const std::exception& error) {
  std::fprintf(stderr, "head_gradients: %s\n", error.what());
  return 1;
}
