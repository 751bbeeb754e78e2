// The shared-memory tiled block of GPUs' GEMM-shaped kernels: C(m,n) = sum_k A(m,k) B(k,n).
// A workgroup computes a BM x BN block of C, BK reduction steps at a time: its invocations load
// a BK-deep slice of A's rows and B's columns once into shared memory (each element by one
// invocation, consecutive invocations along the operand's contiguous index), and each then
// takes TM x TN outputs of the block from there, strided (rows tr + i * BM/TM, columns
// tc + j * BN/TN), so that neighbouring invocations read neighbouring shared words. The next
// slice is loaded into registers while the current one is multiplied. Sums are float whatever
// the operands' storage. The tile shapes are specialization constants chosen from the device's
// properties (compute/ops/gemm.cpp, gemm_tiles); CPU devices run gemm_block.glsl instead.
//
// The including shader declares the constants A_K_FAST and B_N_FAST (whether consecutive
// invocations load along k of A, along n of B) before including this file and defines after it
//   void a_slot(int s, uint m);    // load slot s of this invocation reads row m of A (m < M)
//   float a_value(int s, uint k);  // A(that row, k), k < the reduction's end
//   void b_slot(int s, uint n);    // load slot s reads column n of B (n < N)
//   float b_value(int s, uint k);  // B(k, that column)
// A slot's row (column) is fixed for the whole reduction, so a convolution works out where its
// window lies once, in a_slot or b_slot, not on every step.
#ifndef TESSERA_GEMM_TILED_GLSL
#define TESSERA_GEMM_TILED_GLSL

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const int TM = 8;
layout(constant_id = 2) const int TN = 8;
layout(constant_id = 3) const int BM = 128;
layout(constant_id = 4) const int BN = 128;
layout(constant_id = 5) const int BK = 16;

const int GROUP = int(gl_WorkGroupSize.x);  // (BM / TM) * (BN / TN)
const int ROW_THREADS = BM / TM, COLUMN_THREADS = BN / TN;
const int A_LOADS = (BM * BK + GROUP - 1) / GROUP, B_LOADS = (BK * BN + GROUP - 1) / GROUP;
// One word of padding per k row: loads along k then store to distinct banks.
const int A_STRIDE = BM + 1, B_STRIDE = BN + 1;

shared float a_tile[BK * A_STRIDE];  // [k][m]
shared float b_tile[BK * B_STRIDE];  // [k][n]

void a_slot(int s, uint m);
float a_value(int s, uint k);
void b_slot(int s, uint n);
float b_value(int s, uint k);

float acc[TM][TN];
// Per load slot: its place in the tile ((k, m) of A, (k, n) of B) and whether it lies inside C.
uint a_k[A_LOADS], a_at[A_LOADS], b_k[B_LOADS], b_at[B_LOADS];
bool a_inside[A_LOADS], b_inside[B_LOADS];
float a_next[A_LOADS], b_next[B_LOADS];

// Row i (column j) of this invocation's outputs, within the block.
uint tile_row(int i) { return gl_LocalInvocationID.x / COLUMN_THREADS + i * ROW_THREADS; }
uint tile_column(int j) { return gl_LocalInvocationID.x % COLUMN_THREADS + j * COLUMN_THREADS; }

// Slice k0 of both operands into registers; zero past k_end, outside C, and in slots past the tile.
void load_slice(uint k0, uint k_end) {
  for (int s = 0; s < A_LOADS; ++s) {
    uint k = k0 + a_k[s];
    float value = a_value(s, min(k, k_end - 1));  // a clamped address and a select: no divergence
    a_next[s] = a_inside[s] && k < k_end ? value : 0.0;
  }
  for (int s = 0; s < B_LOADS; ++s) {
    uint k = k0 + b_k[s];
    float value = b_value(s, min(k, k_end - 1));
    b_next[s] = b_inside[s] && k < k_end ? value : 0.0;
  }
}

// acc = the block at (m0, n0) of the product over k in [k_begin, k_end), for C of M x N.
void multiply_block(uint m0, uint n0, uint M, uint N, uint k_begin, uint k_end) {
  uint t = gl_LocalInvocationID.x;
  for (int s = 0; s < A_LOADS; ++s) {
    uint e = t + s * GROUP, m = A_K_FAST ? e / BK : e % BM, k = A_K_FAST ? e % BK : e / BM;
    a_k[s] = k;
    a_at[s] = e < BM * BK ? k * A_STRIDE + m : BK * A_STRIDE;  // past the tile: stored nowhere
    a_inside[s] = e < BM * BK && m0 + m < M;
    a_slot(s, min(m0 + m, M - 1));
  }
  for (int s = 0; s < B_LOADS; ++s) {
    uint e = t + s * GROUP, n = B_N_FAST ? e % BN : e / BK, k = B_N_FAST ? e / BN : e % BK;
    b_k[s] = k;
    b_at[s] = e < BK * BN ? k * B_STRIDE + n : BK * B_STRIDE;
    b_inside[s] = e < BK * BN && n0 + n < N;
    b_slot(s, min(n0 + n, N - 1));
  }
  for (int i = 0; i < TM; ++i)
    for (int j = 0; j < TN; ++j) acc[i][j] = 0.0;
  if (k_begin < k_end) load_slice(k_begin, k_end);
  uint row = t / COLUMN_THREADS, column = t % COLUMN_THREADS;
  for (uint k0 = k_begin; k0 < k_end; k0 += BK) {
    barrier();  // every invocation is done with the previous slice
    for (int s = 0; s < A_LOADS; ++s)
      if (a_at[s] < BK * A_STRIDE) a_tile[a_at[s]] = a_next[s];
    for (int s = 0; s < B_LOADS; ++s)
      if (b_at[s] < BK * B_STRIDE) b_tile[b_at[s]] = b_next[s];
    barrier();
    if (k0 + BK < k_end) load_slice(k0 + BK, k_end);
    for (int k = 0; k < BK; ++k) {
      float a[TM], b[TN];
      for (int i = 0; i < TM; ++i) a[i] = a_tile[k * A_STRIDE + row + i * ROW_THREADS];
      for (int j = 0; j < TN; ++j) b[j] = b_tile[k * B_STRIDE + column + j * COLUMN_THREADS];
      for (int i = 0; i < TM; ++i)
        for (int j = 0; j < TN; ++j) acc[i][j] = fma(a[i], b[j], acc[i][j]);
    }
  }
}

// The workgroup's first column: y (and z where y would overflow) count column blocks.
uint tiled_first_column() { return (gl_WorkGroupID.y + gl_WorkGroupID.z * gl_NumWorkGroups.y) * BN; }

#endif
