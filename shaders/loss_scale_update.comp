#version 450
// The dynamic loss scale after a step, by PyTorch GradScaler's rules. state: [0] scale,
// [1] clean steps since the scale last changed (growth tracker), [2] skipped steps, [3] found_inf.
// A step that found a non-finite gradient was skipped: scale *= backoff, tracker = 0,
// skipped += 1. Otherwise tracker += 1, and after `interval` clean steps scale *= growth.
// found_inf is cleared for the next step.
layout(local_size_x = 1) in;
layout(std430, binding = 0) buffer State { float state[]; };
layout(push_constant) uniform Push { float growth, backoff; uint interval; } p;
void main() {
  if (state[3] != 0.0) {
    state[0] *= p.backoff;
    state[1] = 0.0;
    state[2] += 1.0;
  } else if (uint(state[1]) + 1u >= p.interval) {
    state[0] *= p.growth;
    state[1] = 0.0;
  } else {
    state[1] += 1.0;
  }
  state[3] = 0.0;
}
