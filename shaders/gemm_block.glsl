// The register block that every GEMM-shaped kernel computes: C(m,n) = sum_k A(m,k) B(k,n).
// An invocation owns TM rows (m0, m0 + WG, ...: neighbouring invocations take neighbouring
// rows) and TN columns that the whole workgroup shares. Big blocks matter most on CPU devices
// (lavapipe), where every load costs far more than an FMA.
//
// With SHARE_B (a workgroup that is one subgroup, TN a multiple of its size) each invocation
// loads only every WG-th column of the shared B row and the subgroup exchanges them by
// shuffles: lavapipe issues every storage-buffer load lane by lane with a bounds check, even
// where all lanes read one address, so loading each B element once is several times faster.
//
// With SHARE_K instead (K_UNROLL equal to the subgroup size) invocation i loads B(k + i, n)
// for every column n of the block, once per K_UNROLL steps, and the shuffles hand row k + u to
// all: for a B whose rows (not columns) are contiguous, such as a transposed weight, so that
// the loads of one step touch one cache line rather than one line per column. Only kernels
// whose b_values honour their k argument (not seek/step counters) may turn it on.
//
// K_UNROLL reduction steps are loaded before any of their FMAs, and each accumulator then
// takes all of them in a row: on lavapipe the block lives in stack memory, so this loads and
// stores every accumulator once per K_UNROLL steps instead of once per step (1024^3 GEMM:
// 1.4x faster at 8; 16 is slower again).
//
// The including shader declares the constants TM, TN, K_UNROLL, SHARE_B and SHARE_K before
// including this file and defines after it
//   void seek_reduction(uint k);                 // position at reduction index k
//   float a_value(uint m, uint k);               // A(m,k) at the current k; m is a valid row
//   void b_values(uint k, out float b[B_LOADS]); // B(k, loaded_column(n0, q)) at the current k
//                                                // (at k itself with SHARE_K)
//   void step_reduction();                       // move to k + 1
// Index acc only in loops of constant trip count (test bounds inside them, never in the loop
// condition): one loop the compiler cannot unroll keeps acc in indexable memory, and on
// lavapipe every FMA becomes a load and a store (measured 2.9x slower at 1024^3).
//
// seek and step let convolutions keep (channel, tap) or (image, pixel) counters instead of
// dividing k on every step: integer division is not vectorised on CPU devices.
#ifndef TESSERA_GEMM_BLOCK_GLSL
#define TESSERA_GEMM_BLOCK_GLSL
#extension GL_KHR_shader_subgroup_shuffle : require

// The B columns that one invocation loads per reduction step.
const int B_LOADS = SHARE_B ? TN / int(gl_WorkGroupSize.x) : TN;
// Column q of those loaded by this invocation, for a block whose first column is n0.
uint loaded_column(uint n0, int q) {
  return SHARE_B ? n0 + q * gl_WorkGroupSize.x + gl_SubgroupInvocationID : n0 + q;
}

void seek_reduction(uint k);
float a_value(uint m, uint k);
void b_values(uint k, out float b[B_LOADS]);
void step_reduction();

float acc[TM][TN];

// A(rows[i], k) and B(k, n0 + j) of one reduction step, then on to k + 1.
void load_step(uint k, uint rows[TM], out float a[TM], out float b[TN]) {
  for (int i = 0; i < TM; ++i) a[i] = a_value(rows[i], k);
  float loaded[B_LOADS];
  b_values(k, loaded);
  for (int j = 0; j < TN; ++j)
    b[j] = SHARE_B ? subgroupShuffle(loaded[j / gl_WorkGroupSize.x], j % gl_WorkGroupSize.x) : loaded[j];
  step_reduction();
}

// Accumulates rows m0 + i*WG (clamped below M) over k in [k_begin, k_end) into acc.
void accumulate_block(uint m0, uint M, uint k_begin, uint k_end) {
  uint rows[TM];
  for (int i = 0; i < TM; ++i) rows[i] = min(m0 + i * gl_WorkGroupSize.x, M - 1);
  for (int i = 0; i < TM; ++i)
    for (int j = 0; j < TN; ++j) acc[i][j] = 0.0;
  seek_reduction(k_begin);
  uint k = k_begin;
  for (; k + K_UNROLL <= k_end; k += K_UNROLL) {
    float a[K_UNROLL][TM], b[K_UNROLL][TN];
    if (SHARE_K) {
      float own_row[B_LOADS];
      b_values(k + gl_SubgroupInvocationID, own_row);
      for (int u = 0; u < K_UNROLL; ++u) {
        for (int i = 0; i < TM; ++i) a[u][i] = a_value(rows[i], k + u);
        for (int j = 0; j < TN; ++j) b[u][j] = subgroupShuffle(own_row[j], u);
      }
    } else {
      for (int u = 0; u < K_UNROLL; ++u) load_step(k + u, rows, a[u], b[u]);
    }
    for (int i = 0; i < TM; ++i)
      for (int j = 0; j < TN; ++j)
        for (int u = 0; u < K_UNROLL; ++u) acc[i][j] = fma(a[u][i], b[u][j], acc[i][j]);
  }
  for (; k < k_end; ++k) {
    float a[TM], b[TN];
    load_step(k, rows, a, b);
    for (int i = 0; i < TM; ++i)
      for (int j = 0; j < TN; ++j) acc[i][j] = fma(a[i], b[j], acc[i][j]);
  }
}

// The workgroup's first column: y (and z where y would overflow) count column blocks.
uint block_first_column() { return (gl_WorkGroupID.y + gl_WorkGroupID.z * gl_NumWorkGroups.y) * TN; }

#endif
