#include "jobs/mil_bags.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "common/error.h"
#include "compute/checkpoint.h"
#include "compute/feature_file.h"
#include "compute/ops/registry.h"
#include "compute/tensor.h"
#include "compute/trainer.h"
#include "jobs/train_options.h"

namespace tessera {

void Bag::to_fp16(const std::string& path) {
  for (float value : features)
    if (std::abs(value) > 65504.0f)
      throw BadInput(path + ": features hold " + std::to_string(value) +
                     ", beyond fp16's range (65504): train this head with --precision fp32");
  halves = to_half(features);
  features = {};
}

Bag read_bag_file(const std::string& path, const std::string& slide, int64_t& width, bool fp16) {
  HostArray array = read_hdf5_array(path, "features");
  if (array.shape.size() != 2 || array.shape[0] < 1 || array.shape[1] < 1)
    throw BadInput(path + ": features must be [N,D] with N and D at least 1, got " + to_string(array.shape));
  if (width && array.shape[1] != width)
    throw BadInput(path + ": features have width " + std::to_string(array.shape[1]) + ", other slides " +
                   std::to_string(width));
  for (float value : array.values)
    if (!std::isfinite(value)) throw BadInput(path + ": features hold a value that is not finite");
  width = array.shape[1];
  Bag bag{slide, 0, array.shape[0], std::move(array.values), {}};
  if (fp16) bag.to_fp16(path);
  return bag;
}

ClamSettings clam_settings(const ClamOptions& options, size_t classes) {
  ClamSettings settings;
  settings.k_sample = options.k_sample.value_or(8);
  settings.bag_weight = options.bag_weight.value_or(0.7);
  // CLAM's task_2_tumor_subtyping (3 classes) asserts --subtyping; task_1_tumor_vs_normal leaves it off.
  settings.subtyping = options.subtyping.value_or(classes > 2);
  return settings;
}

bool is_clam_head(const std::string& kind) { return kind == "clam-sb" || kind == "clam-mb"; }

namespace {

// CLAM (Lu et al. 2021) as mahmoodlab/CLAM models/model_clam.py at 0266041 defines it, the layers
// named as its state_dict's: attention_net = Sequential(fc Linear(D, 512), ReLU, Dropout, the gated
// attention Attn_Net_Gated(512, hidden) with its branches attention_a (tanh) and attention_b
// (sigmoid) and attention_c Linear(hidden, 1 or C)); softmax over the patches; CLAM-SB's
// classifiers Linear(512, C) on M = A h, CLAM-MB's one Linear(512, 1) a class on M_c = A_c h (held
// as one [C, 512] weight, class_linear); the instance classifiers (clam_instance_loss). Dropout
// is left out (p = 0 is main.py's default without --drop_out), as in the other heads.
void add_clam_layers(nlohmann::json& layers, const std::string& kind, int64_t hidden, int64_t classes, HeadUse use,
                     const ClamSettings& clam) {
  constexpr int64_t kClamWidth = 512;  // size_dict's size[1], "small" and "big" alike
  auto layer = [&](const std::string& name, const std::string& type, std::vector<std::string> inputs,
                   nlohmann::json fields = nlohmann::json::object()) {
    layers.push_back(layer_description(name, type, std::move(fields), std::move(inputs)));
  };
  int64_t columns = kind == "clam-mb" ? classes : 1;
  layer("attention_net.0", "linear", {"features"}, {{"out_features", kClamWidth}});
  layer("attention_net.1", "relu", {"attention_net.0"});
  layer("attention_net.3.attention_a.0", "linear", {"attention_net.1"}, {{"out_features", hidden}});
  layer("attention_net.3.attention_b.0", "linear", {"attention_net.1"}, {{"out_features", hidden}});
  layer("attention_net.3.gate", "attention_gate", {"attention_net.3.attention_a.0", "attention_net.3.attention_b.0"});
  layer("attention_net.3.attention_c", "linear", {"attention_net.3.gate"}, {{"out_features", columns}});
  if (use == HeadUse::tile_scores) return;  // the raw attention A_raw [M, 1 or C], as CLAM's heatmaps read it
  layer("pool", "attention_pool", {"attention_net.3.attention_c", "attention_net.1", "count"});
  if (use == HeadUse::train)
    layer("instance_classifiers", "clam_instance_loss", {"attention_net.3.attention_c", "attention_net.1", "count", "labels"},
          {{"classes", classes}, {"k_sample", clam.k_sample}, {"subtyping", clam.subtyping}});
  if (kind == "clam-mb")
    layer("classifiers", "class_linear", {"pool"}, {{"out_features", classes}});
  else
    layer("classifiers", "linear", {"pool"}, {{"out_features", classes}});
}

// TransMIL (Shao et al. 2021) as szc19990412/TransMIL models/TransMIL.py defines it, the layers
// named as its state_dict's, at width `hidden` (the source's 512): _fc1 (Linear, ReLU), the bag
// wrapped to a square after the class token (transmil_sequence), two TransLayers x +
// NystromAttention(LayerNorm(x)) (to_qkv within it; 8 heads, hidden / 2 landmarks, 6
// pseudo-inverse iterations, the residual convolution of the values) with the PPEG position
// encoding between them, the
// final LayerNorm of the class token and _fc2. Dropout (0.1 in to_out) is left out, as in the
// other heads. Nothing reads the second layer's other rows, so it computes the class token's
// alone (its attention still spans the sequence): the same logits, without two [S, D] products
// and their gradients. For tile scores, the graph ends at the second layer's attention from the
// class token to each patch.
void add_transmil_layers(nlohmann::json& layers, int64_t hidden, int64_t classes, HeadUse use, bool recompute_attention) {
  auto layer = [&](const std::string& name, const std::string& type, std::vector<std::string> inputs,
                   nlohmann::json fields = nlohmann::json::object()) {
    layers.push_back(layer_description(name, type, std::move(fields), std::move(inputs)));
  };
  layer("_fc1.0", "linear", {"features"}, {{"out_features", hidden}});
  layer("_fc1.1", "relu", {"_fc1.0"});
  layer("sequence", "transmil_sequence", {"_fc1.1", "count"});
  auto trans_layer = [&](const std::string& name, const std::string& input, const std::string& output) {
    layer(name + ".norm", "layer_norm", {input}, {{"eps", 1e-5}});
    layer(name + ".attn", "nystrom_attention", {name + ".norm", "count"},
          {{"heads", 8}, {"landmarks", hidden / 2}, {"pinv_iterations", 6}, {"residual_kernel", 33}, {"output", output},
           {"recompute", recompute_attention}});
    if (output == "class_attention") return;
    layer(name + ".attn.to_out.0", "linear", {name + ".attn"}, {{"out_features", hidden}});
    std::string residual = input;
    if (output == "class_token") {
      residual = name + ".class_token";
      layer(residual, "token_pool", {input}, {{"output", "class_token"}});
    }
    layer(name, "add", {residual, name + ".attn.to_out.0"});
  };
  trans_layer("layer1", "sequence", "values");
  layer("pos_layer", "ppeg", {"layer1", "count"});
  trans_layer("layer2", "pos_layer", use == HeadUse::tile_scores ? "class_attention" : "class_token");
  if (use == HeadUse::tile_scores) return;
  layer("norm", "layer_norm", {"layer2"}, {{"eps", 1e-5}});
  layer("_fc2", "linear", {"norm"}, {{"out_features", classes}});
}

}  // namespace

nlohmann::json head_graph(const std::string& kind, int64_t hidden, int64_t classes, HeadUse use,
                          const ClamSettings& clam, bool recompute_attention) {
  bool instance_logits = use == HeadUse::tile_scores;
  auto layer = [](const std::string& name, const std::string& type, std::vector<std::string> inputs,
                  nlohmann::json fields = nlohmann::json::object()) {
    return layer_description(name, type, std::move(fields), std::move(inputs));
  };
  nlohmann::json layers = nlohmann::json::array();
  if (is_clam_head(kind)) {
    add_clam_layers(layers, kind, hidden, classes, use, clam);
    return {{"layers", layers}};
  }
  if (kind == "transmil") {
    add_transmil_layers(layers, hidden, classes, use, recompute_attention);
    return {{"layers", layers}};
  }
  if (instance_logits) {
    layers.push_back(layer(kind == "dsmil" ? "i_classifier.fc.0" : "classifier", "linear", {"features"},
                           {{"out_features", classes}}));
    return {{"layers", layers}};
  }
  if (kind == "dsmil") {
    // DSMIL (Li et al. 2021) as binli123/dsmil-wsi at 80465ed trains it: dsmil.py's MILNet of
    // FCLayer and BClassifier(nonlinear=True, passing_v=False), as train_tcga.py builds it, so
    // V is the features themselves; the layers named as its state_dict's. The bag classifier
    // fcc, Conv1d(C, C, kernel_size=D) over B [C, D], is a linear layer over B as one row: its
    // weight is PyTorch's [C, C, D] viewed as [C, C*D].
    layers.push_back(layer("i_classifier.fc.0", "linear", {"features"}, {{"out_features", classes}}));
    layers.push_back(layer("instance_max", "instance_max", {"i_classifier.fc.0", "count"}));
    layers.push_back(layer("b_classifier.q.0", "linear", {"features"}, {{"out_features", hidden}}));
    layers.push_back(layer("b_classifier.q.1", "relu", {"b_classifier.q.0"}));
    layers.push_back(layer("b_classifier.q.2", "linear", {"b_classifier.q.1"}, {{"out_features", hidden}}));
    layers.push_back(layer("b_classifier.q.3", "tanh", {"b_classifier.q.2"}));
    layers.push_back(layer("critical", "critical_instance_scores", {"b_classifier.q.3", "i_classifier.fc.0", "count"}));
    layers.push_back(layer("pool", "attention_pool", {"critical", "features", "count"}));
    layers.push_back(layer("b_classifier.fcc", "linear", {"pool"}, {{"out_features", classes}}));
    return {{"layers", layers}};
  }
  if (kind == "attention") {
    layers.push_back(layer("attention_V", "linear", {"features"}, {{"out_features", hidden}}));
    layers.push_back(layer("attention_U", "linear", {"features"}, {{"out_features", hidden}}));
    layers.push_back(layer("attention_gate", "attention_gate", {"attention_V", "attention_U"}));
    layers.push_back(layer("attention_w", "linear", {"attention_gate"}, {{"out_features", 1}}));
    layers.push_back(layer("pool", "attention_pool", {"attention_w", "features", "count"}));
  } else if (kind == "max") {
    layers.push_back(layer("pool", "instance_max", {"features", "count"}));
  } else if (kind == "mean") {
    layers.push_back(layer("pool", "instance_mean", {"features", "count"}));
  } else {
    throw UsageError("--head: unknown head '" + kind + "'");
  }
  layers.push_back(layer("classifier", "linear", {"pool"}, {{"out_features", classes}}));
  return {{"layers", layers}};
}

void check_bags_within_kernel_loops(const vk::DeviceInfo& device, const Cohort& cohort) {
  // The heads' kernels share a bag's rows among a workgroup's invocations (shaders/bag_rows.glsl:
  // rows / 16 iterations each at most); the longest loops left are the clam heads' top-k
  // selection (--k-sample up to 64 passes over rows / 256 each: rows / 4) and the weight
  // gradients' reduction over the rows (8 rows an iteration).
  constexpr int64_t kRowsPerIteration = 4;
  if (device.kernel_loop_iterations == 0 || cohort.bags.empty()) return;
  const Bag& largest = *std::max_element(cohort.bags.begin(), cohort.bags.end(),
                                         [](const Bag& a, const Bag& b) { return a.instances < b.instances; });
  const int64_t bound = int64_t{device.kernel_loop_iterations} * kRowsPerIteration;
  if (largest.instances <= bound) return;
  throw OutOfDeviceMemory("slide " + largest.slide + "'s bag holds " + std::to_string(largest.instances) +
                          " patches; " + device.name + " ends a kernel's loops after " +
                          std::to_string(device.kernel_loop_iterations) +
                          " iterations, and the heads' kernels loop over up to a quarter of a bag's patches, so "
                          "bags of at most " + std::to_string(bound) +
                          " patches are pooled whole there: train on a GPU, or sample the slides' patches");
}

Cohort read_cohort(const MilOptions& mil, bool fp16) {
  Cohort cohort;
  cohort.rows = read_slide_labels(mil.labels, mil.features);
  auto& classes = cohort.classes;
  for (auto& row : cohort.rows) classes.push_back(row.label);
  std::sort(classes.begin(), classes.end());
  classes.erase(std::unique(classes.begin(), classes.end()), classes.end());
  if (classes.size() < 2) throw BadInput(mil.labels + ": needs at least two distinct labels");
  std::string encoder, encoder_file;  // the first encoder a file names, and that file
  for (auto& row : cohort.rows) {
    // Features of two encoders can share a width (uni and phikon-v2: 1024) yet mean nothing together.
    if (std::string named = feature_file_encoder(row.path); !named.empty()) {
      if (encoder.empty()) {
        encoder = named;
        encoder_file = row.path;
      } else if (named != encoder) {
        throw BadInput(row.path + ": features made by encoder '" + named + "', but " + encoder_file +
                       "'s by '" + encoder + "': a cohort's features come from one encoder");
      }
    }
    Bag bag = read_bag_file(row.path, row.slide, cohort.width, fp16);
    bag.label = static_cast<uint32_t>(std::lower_bound(classes.begin(), classes.end(), row.label) - classes.begin());
    cohort.bags.push_back(std::move(bag));
  }
  return cohort;
}

void set_head_losses(const std::string& kind, TrainingJob& job, const ClamSettings& clam) {
  if (is_clam_head(kind)) {
    // CLAM's core_utils.py train_loop_clam: bag_weight * the bag's cross-entropy + (1 - bag_weight)
    // * the instance loss.
    job.logits_loss_weight = static_cast<float>(clam.bag_weight);
    job.extra_losses = {{"instance_classifiers", static_cast<float>(1 - clam.bag_weight), true}};
    return;
  }
  if (kind != "dsmil") return;
  // train_tcga.py: loss = 0.5 * bag loss + 0.5 * the loss of the max over instances of the
  // instance classifier's logits. Its criterion is BCEWithLogitsLoss over multi-label targets;
  // tessera's classes are single-label, so both terms are softmax cross-entropy.
  job.logits_loss_weight = 0.5f;
  job.extra_losses = {{"instance_max", 0.5f}};
}

TrainingJob head_job(const Cohort& cohort, const MilOptions& mil, const TrainOptions& options, bool recompute_attention) {
  int64_t rows = 0;
  for (auto& bag : cohort.bags) rows = std::max(rows, bag.instances);
  TrainingJob job;
  int64_t hidden = attention_hidden(mil);
  job.model = {{"head", mil.head}, {"features", cohort.width}, {"attention_hidden", hidden},
               {"classes", cohort.classes}};
  ClamSettings clam = clam_settings(mil.clam, cohort.classes.size());
  if (is_clam_head(mil.head))
    job.model.update({{"k_sample", clam.k_sample}, {"bag_weight", clam.bag_weight}, {"subtyping", clam.subtyping}});
  job.graph =
      head_graph(mil.head, hidden, static_cast<int64_t>(cohort.classes.size()), HeadUse::train, clam, recompute_attention);
  job.staged = {{"features", {rows, cohort.width}, options.fp16 ? DType::f16 : DType::f32},
                {"count", {1}, DType::u32},
                {"labels", {1}, DType::u32},
                {"valid", {1}, DType::u32}};
  job.settings = run_settings(options);
  job.advice = "lower --attention-hidden, or raise --device-memory-limit";
  set_head_losses(mil.head, job, clam);
  return job;
}

bool recomputes_attention(vk::Context& context, const Cohort& cohort, const MilOptions& mil,
                          const TrainOptions& options) {
  if (mil.head != "transmil") return false;
  return !TrainingLoop(context, loop_settings(options), head_job(cohort, mil, options, false)).plan().fits(context);
}

void BagFeed::start_epoch(uint32_t epoch) {
  order_ = slides_;
  if (shuffle_) std::shuffle(order_.begin(), order_.end(), std::mt19937(seed_ + epoch));
  next_ = 0;
}

bool BagFeed::next(const std::map<std::string, const Tensor*>& staged) {
  if (next_ == order_.size()) return false;
  const Bag& bag = bags_[order_[next_++]];
  std::memcpy(staged.at("features")->buffer().mapped(), bag.staged_bytes(), bag.staged_size());
  auto count = static_cast<uint32_t>(bag.instances), one = 1u;
  std::memcpy(staged.at("count")->buffer().mapped(), &count, 4);
  std::memcpy(staged.at("labels")->buffer().mapped(), &bag.label, 4);
  std::memcpy(staged.at("valid")->buffer().mapped(), &one, 4);
  return true;
}

}  // namespace tessera
