// Shared by every kernel: the element index of a dispatch made with Recorder::dispatch_elements.
#ifndef TESSERA_COMMON_GLSL
#define TESSERA_COMMON_GLSL

uint global_index() {
  return gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * gl_WorkGroupSize.x;
}

// A counter-based random number in [0, 1): the same (seed, stream, index) always gives the
// same number, on every device, so dropout masks are recomputed in backward instead of stored.
uint hash_u32(uint x) {
  x ^= x >> 16; x *= 0x7feb352du;
  x ^= x >> 15; x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}
float uniform_random(uint seed, uint stream, uint index) {
  uint h = hash_u32(seed ^ hash_u32(stream ^ hash_u32(index)));
  return float(h >> 8) * (1.0 / 16777216.0);
}

// ReLU that keeps NaN, as PyTorch does (GLSL leaves max(NaN, 0) undefined: it may give 0, which
// would hide a diverged run).
float relu(float x) { return x < 0.0 ? 0.0 : x; }

#endif
