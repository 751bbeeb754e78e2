// The register block that every GEMM-shaped kernel computes: C(m,n) = sum_k A(m,k) B(k,n).
// An invocation owns TM rows (m0, m0 + WG, ...: neighbouring invocations take neighbouring
// rows) and TN columns that the whole workgroup shares. Big blocks matter most on CPU devices
// (lavapipe), where every load costs far more than an FMA.
//
// The including shader declares the constants TM and TN and, before including this file,
//   void seek_reduction(uint k);             // position at reduction index k
//   float a_value(uint m, uint k);           // A(m,k) at the current k; m is a valid row
//   void b_values(uint k, out float b[TN]);  // B(k, n0..n0+TN-1) at the current k
//   void step_reduction();                   // move to k + 1
// seek and step let convolutions keep (channel, tap) or (image, pixel) counters instead of
// dividing k on every step: integer division is not vectorised on CPU devices.
#ifndef TESSERA_GEMM_BLOCK_GLSL
#define TESSERA_GEMM_BLOCK_GLSL

float acc[TM][TN];

// Accumulates rows m0 + i*WG (clamped below M) over k in [k_begin, k_end) into acc.
void accumulate_block(uint m0, uint M, uint k_begin, uint k_end) {
  uint rows[TM];
  for (int i = 0; i < TM; ++i) rows[i] = min(m0 + i * gl_WorkGroupSize.x, M - 1);
  for (int i = 0; i < TM; ++i)
    for (int j = 0; j < TN; ++j) acc[i][j] = 0.0;
  seek_reduction(k_begin);
  for (uint k = k_begin; k < k_end; ++k) {
    float a[TM];
    for (int i = 0; i < TM; ++i) a[i] = a_value(rows[i], k);
    float b[TN];
    b_values(k, b);
    for (int i = 0; i < TM; ++i)
      for (int j = 0; j < TN; ++j) acc[i][j] = fma(a[i], b[j], acc[i][j]);
    step_reduction();
  }
}

// The workgroup's first column: y (and z where y would overflow) count column blocks.
uint block_first_column() { return (gl_WorkGroupID.y + gl_WorkGroupID.z * gl_NumWorkGroups.y) * TN; }

#endif
