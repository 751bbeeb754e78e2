#version 450
// selected[slot]: for class c = i / 2 and side i % 2 (0: highest attention first, 1: lowest),
// the rows in that order, ties to the lowest row; kUnused where the slot takes no part. A
// workgroup per class and side, i = the workgroup: for each slot its 256 invocations scan the bag
// in strides for the first row after the previous slot's, then reduce their candidates. Not one
// invocation scanning the whole bag k times: llvmpipe (lavapipe) ends a shader invocation's loops
// after 65535 iterations in all, silently, and k x 9,000 rows passes that.
#include "common.glsl"
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer Scores { ACT scores[]; };
layout(std430, binding = 1) readonly buffer Count { uint count; };
layout(std430, binding = 2) readonly buffer Labels { uint label; };
layout(std430, binding = 3) writeonly buffer Selected { uint selected[]; };
#include "clam_instance_loss.glsl"

shared uint candidates[256];

float score(uint n, uint column) { return float(scores[n * p.columns + column]); }

// Whether row a comes before row b: the larger score (the smaller when bottom), then the lower row.
bool before(uint a, uint b, uint column, bool bottom) {
  float sa = score(a, column), sb = score(b, column);
  if (sa == sb) return a < b;
  return bottom ? sa < sb : sa > sb;
}

void main() {
  uint i = gl_WorkGroupID.x, lane = gl_LocalInvocationID.x;
  uint c = i / 2u, column = p.columns == 1u ? 0u : c;
  bool bottom = i % 2u == 1u;
  uint instances = min(count, p.rows), first = c * 2u * p.k_sample + (bottom ? p.k_sample : 0u);
  uint previous = kUnused;
  for (uint j = 0u; j < p.k_sample; ++j) {
    uint s = first + j;
    if (!slot_used(s, label, count)) {  // the same for every invocation: the barriers stay uniform
      if (lane == 0u) selected[s] = kUnused;
      continue;
    }
    // This invocation's first row after `previous` in the order; a NaN score compares false and
    // is never chosen past the first (the loss is NaN then anyway, and the run stops as diverged).
    uint best = kUnused;
    for (uint n = lane; n < instances; n += 256u)
      if ((previous == kUnused || before(previous, n, column, bottom)) && (best == kUnused || before(n, best, column, bottom)))
        best = n;
    candidates[lane] = best;
    barrier();
    for (uint stride = 128u; stride > 0u; stride >>= 1u) {
      if (lane < stride) {
        uint other = candidates[lane + stride], mine = candidates[lane];
        if (other != kUnused && (mine == kUnused || before(other, mine, column, bottom))) candidates[lane] = other;
      }
      barrier();
    }
    best = candidates[0];
    barrier();  // every invocation has read it before the next slot's candidates replace it
    if (best == kUnused) best = previous == kUnused ? 0u : previous;
    if (lane == 0u) selected[s] = best;
    previous = best;
  }
}
