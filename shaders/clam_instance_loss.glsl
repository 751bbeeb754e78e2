// Shared by the clam_instance_loss kernels: the push constants and the layout of the slots.
// Slot s = c * 2K + j of class c: j < K the j-th highest attention row, j >= K the (j-K)-th
// lowest, K = k_sample; only the first k = min(K, instances) of each side are used, and the
// bottom side only for the label class, the top side of other classes only with subtyping.
layout(push_constant) uniform Push { uint rows, width, classes, k_sample, columns, subtyping, accumulate; } p;

const uint kUnused = 0xffffffffu;

// k: the rows a side takes from a bag of `count` instances.
uint rows_taken(uint count) { return min(p.k_sample, min(count, p.rows)); }

// Whether slot s takes part in a bag of this label and instance count.
bool slot_used(uint s, uint label, uint count) {
  uint c = s / (2u * p.k_sample), j = s % (2u * p.k_sample);
  bool top = j < p.k_sample;
  uint rank = top ? j : j - p.k_sample;
  if (rank >= rows_taken(count)) return false;
  return c == label || (top && p.subtyping != 0u);
}

// The slot's target (1: a positive of its class) and its weight in the loss: the mean over its
// class's 2k (label class) or k (others) rows, then the mean over classes with subtyping.
uint slot_target(uint s, uint label) {
  return s / (2u * p.k_sample) == label && s % (2u * p.k_sample) < p.k_sample ? 1u : 0u;
}
float slot_weight(uint s, uint label, uint count) {
  float rows = float(rows_taken(count)) * (s / (2u * p.k_sample) == label ? 2.0 : 1.0);
  return 1.0 / (rows * (p.subtyping != 0u ? float(p.classes) : 1.0));
}
