// The graph's fusion plan (Network::plan_fusion): which layers run in the store of the op before
// them, in the one vocabulary of compute/op.h's Epilogue.
#include "compute/network.h"

namespace tessera {

void Network::set_fusion(bool enabled) {
  fusion_enabled_ = enabled;
  plan_fusion();
}

bool Network::joins(const Fused& host, EpilogueStep step, bool training) const {
  // Training: a ReLU's backward masks by the output; every other step needs its input in
  // backward (GELU, SiLU, a batch norm's statistics) or runs in inference only.
  if (training && step != EpilogueStep::relu) return false;
  const bool activated = host.activation != Epilogue::Activation::none;
  const bool residual_last = host.residual >= 0 && !host.residual_first;
  switch (step) {
    case EpilogueStep::batch_norm: return host.batch_norm < 0 && !activated && host.scale < 0 && host.residual < 0;
    case EpilogueStep::relu:
    case EpilogueStep::gelu:
    case EpilogueStep::silu: return !activated && host.scale < 0 && !residual_last;
    case EpilogueStep::scale: return host.scale < 0 && !residual_last;
    case EpilogueStep::residual: return host.residual < 0;
    case EpilogueStep::none: return false;
  }
  return false;
}

void Network::plan_fusion() {
  std::vector<int> consumers(layers_.size(), 0);
  for (auto& l : layers_)
    for (int producer : l.inputs)
      if (producer >= 0) ++consumers[static_cast<size_t>(producer)];
  folded_.resize(layers_.size());
  for (bool training : {false, true}) {
    auto& fused = fusion_[training];
    fused.assign(layers_.size(), Fused{});
    if (!fusion_enabled_) continue;
    // The layer whose pass computes layer l's output.
    std::vector<int> computed_by(layers_.size());
    // The layer that runs the pass writing graph tensor `producer` (-1: a graph input, there first).
    auto writer = [&](int producer) { return producer < 0 ? -1 : computed_by[static_cast<size_t>(producer)]; };
    for (size_t l = 0; l < layers_.size(); ++l) {
      computed_by[l] = static_cast<int>(l);
      const EpilogueStep step = layers_[l].op->as_epilogue().step;
      const auto& inputs = layers_[l].inputs;
      // The input that the host's store computes, and for an add the other, added there.
      int chained = -1;
      size_t other = 0;
      for (size_t j = 0; j < inputs.size(); ++j) {
        if (inputs[j] < 0 || consumers[static_cast<size_t>(inputs[j])] != 1) continue;
        if (step == EpilogueStep::residual) {
          if (inputs.size() != 2 || inputs[0] == inputs[1] || writer(inputs[1 - j]) >= writer(inputs[j])) continue;
          other = 1 - j;
        } else if (inputs.size() != 1) {
          continue;
        }
        chained = inputs[j];
      }
      if (step == EpilogueStep::none || chained < 0) continue;
      auto host = static_cast<size_t>(computed_by[static_cast<size_t>(chained)]);
      Fused& h = fused[host];
      if (!layers_[host].op->fusions().contains(step) || !joins(h, step, training)) continue;
      switch (step) {
        case EpilogueStep::batch_norm: h.batch_norm = static_cast<int>(l); break;
        case EpilogueStep::relu: h.activation = Epilogue::Activation::relu; break;
        case EpilogueStep::gelu: h.activation = Epilogue::Activation::gelu; break;
        case EpilogueStep::silu: h.activation = Epilogue::Activation::silu; break;
        case EpilogueStep::scale: h.scale = static_cast<int>(l); break;
        case EpilogueStep::residual:
          h.residual = static_cast<int>(l);
          h.residual_input = other;
          h.residual_first = h.activation == Epilogue::Activation::none && h.scale < 0;
          break;
        case EpilogueStep::none: break;
      }
      fused[l].skipped = true;
      h.writes_output_of = static_cast<int>(l);
      computed_by[l] = static_cast<int>(host);
    }
  }
}

}  // namespace tessera
