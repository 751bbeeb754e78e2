// Shared by every kernel: the element index of a dispatch made with Recorder::dispatch_elements,
// and the storage type of activations.
#ifndef TESSERA_COMMON_GLSL
#define TESSERA_COMMON_GLSL

// Activations and their gradients are stored as ACT (ACT4: four of them): float, or in a
// kernel's fp16 variant (cmake/shaders.cmake, -DTESSERA_FP16) float16_t. Only 16-bit storage
// is enabled, not 16-bit arithmetic, so the compiler refuses any arithmetic on ACT values:
// every load converts to float (float(x[i]), vec4(y[i])) and every store rounds once
// (ACT(v)), as PyTorch's kernels compute in float (opmath) between half-precision loads and
// stores; sums and products accumulate in float.
#ifdef TESSERA_FP16
#extension GL_EXT_shader_16bit_storage : require
#define ACT float16_t
#define ACT4 f16vec4
#define ACT_TEXELS r16f
#define ACT4_TEXELS rgba16f
#else
#define ACT float
#define ACT4 vec4
#define ACT_TEXELS r32f
#define ACT4_TEXELS rgba32f
#endif
// The format of a GEMM's operand B, whose type is its own (cmake/shaders.cmake: <name>_b16).
#ifdef TESSERA_B_FP16
#define B_TEXELS r16f
#define B4_TEXELS rgba16f
#else
#define B_TEXELS r32f
#define B4_TEXELS rgba32f
#endif

// A kernel reads at most one operand as a sampled texel buffer (samplerBuffer, texelFetch); any
// other that it reads as texels is a storage texel buffer (readonly imageBuffer, imageLoad),
// which a CPU device loads as fast. Mesa 22.3's llvmpipe keys a compiled kernel on the sampler
// state of every sampled view but clears that state only for the first, so with a second
// samplerBuffer the key held stale stack bytes: one process compiled the same pipeline again
// (a ResNet-18 training step: 40 pipelines, 68 compiles) and other processes missed the disk
// cache. An image that a kernel leaves unread (a specialization constant turns its read off)
// below one it reads is keyed on stale bytes too: declare only images that every variant reads.
// An imageBuffer's format is fixed: ACT_TEXELS (ACT4_TEXELS: four a texel) for activations of
// the kernel's variant, r32f (rgba32f) for float tensors, B_TEXELS for an operand of its own type.

// A macro, not a function: gl_WorkGroupSize is the size a shader declares only after its
// layout(local_size_x_id) line, and a function in this file, included before that line, was
// compiled with the default size 1. A dispatch of more than 32768 workgroups (y > 1: 8.4M
// elements at 256 a group) then had its rows overlap, two invocations racing on one element,
// and left most elements out (an optimizer never updated most of a 128x262144 weight).
#define global_index() (gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * gl_WorkGroupSize.x)

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
