// The shared-memory tiled block of GPUs' GEMM-shaped kernels: C(m,n) = sum_k A(m,k) B(k,n).
// A workgroup computes a BM x BN block of C, BK reduction steps at a time: its invocations load
// a BK-deep slice of A's rows and B's columns once into shared memory (each element by one
// invocation, consecutive invocations along the operand's contiguous index), and each then
// takes TM x TN outputs of the block from there, in runs of four neighbouring rows (columns),
// the runs ROW_THREADS * 4 (COLUMN_THREADS * 4) apart: an invocation reads a run as one vec4,
// and the invocations of a subgroup read neighbouring vec4s (no bank conflicts). The next slice
// is loaded into registers while the current one is multiplied. Every loop over slots and
// outputs is unrolled ([[unroll]]), so that the per-slot and per-output arrays stay in
// registers. Sums are float whatever the operands' storage. The tile shapes are specialization
// constants chosen from the device's properties (compute/ops/gemm.cpp, gemm_tiles); CPU devices
// run gemm_block.glsl instead.
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
#extension GL_EXT_control_flow_attributes : require

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const int TM = 8;
layout(constant_id = 2) const int TN = 8;
layout(constant_id = 3) const int BM = 128;
layout(constant_id = 4) const int BN = 128;
layout(constant_id = 5) const int BK = 16;

const int GROUP = int(gl_WorkGroupSize.x);  // (BM / TM) * (BN / TN)
const int ROW_THREADS = BM / TM, COLUMN_THREADS = BN / TN;
const int A_LOADS = (BM * BK + GROUP - 1) / GROUP, B_LOADS = (BK * BN + GROUP - 1) / GROUP;
// An invocation's outputs come in runs of RUN_M rows (RUN_N columns): 4 where TM (TN) allows
// (TM and TN are powers of two, so a run never crosses a vec4).
const int RUN_M = TM % 4 == 0 ? 4 : TM, RUN_N = TN % 4 == 0 ? 4 : TN;
// A k row of a tile holds BM (BN) words and one vec4 of padding, so that loads along k store to
// distinct banks (gemm_tiles keeps BM and BN multiples of 4).
const int A_STRIDE = BM / 4 + 1, B_STRIDE = BN / 4 + 1;  // in vec4s

shared vec4 a_tile[BK * A_STRIDE];  // [k][m]
shared vec4 b_tile[BK * B_STRIDE];  // [k][n]

void a_slot(int s, uint m);
float a_value(int s, uint k);
void b_slot(int s, uint n);
float b_value(int s, uint k);

float acc[TM][TN];
float a_next[A_LOADS], b_next[B_LOADS];

// Row i (column j) of this invocation's outputs, within the block.
uint tile_row(int i) {
  return uint(i / RUN_M * ROW_THREADS * RUN_M) + gl_LocalInvocationID.x / COLUMN_THREADS * RUN_M + uint(i % RUN_M);
}
uint tile_column(int j) {
  return uint(j / RUN_N * COLUMN_THREADS * RUN_N) + gl_LocalInvocationID.x % COLUMN_THREADS * RUN_N + uint(j % RUN_N);
}

// Where load slot s of invocation t lies in its tile: reduction step k and row (column) at;
// false for a slot past the tile (the last slot, where the tile is no multiple of the group).
bool a_place(uint t, int s, out uint k, out uint m) {
  uint e = t + uint(s * GROUP);
  m = A_K_FAST ? e / BK : e % BM;
  k = A_K_FAST ? e % BK : e / BM;
  return e < uint(BM * BK);
}
bool b_place(uint t, int s, out uint k, out uint n) {
  uint e = t + uint(s * GROUP);
  n = B_N_FAST ? e % BN : e / BK;
  k = B_N_FAST ? e / BN : e % BK;
  return e < uint(BK * BN);
}

// Slice k0 of both operands into registers; zero past k_end, outside C, and in slots past the tile.
void load_slice(uint m0, uint n0, uint M, uint N, uint k0, uint k_end) {
  uint t = gl_LocalInvocationID.x;
  [[unroll]] for (int s = 0; s < A_LOADS; ++s) {
    uint k, m;
    bool in_tile = a_place(t, s, k, m);
    float value = a_value(s, min(k0 + k, k_end - 1));  // a clamped address and a select: no divergence
    bool inside = in_tile && m0 + m < M && k0 + k < k_end;
    a_next[s] = inside ? value : 0.0;
  }
  [[unroll]] for (int s = 0; s < B_LOADS; ++s) {
    uint k, n;
    bool in_tile = b_place(t, s, k, n);
    float value = b_value(s, min(k0 + k, k_end - 1));
    bool inside = in_tile && n0 + n < N && k0 + k < k_end;
    b_next[s] = inside ? value : 0.0;
  }
}

void store_slice() {
  uint t = gl_LocalInvocationID.x;
  [[unroll]] for (int s = 0; s < A_LOADS; ++s) {
    uint k, m;
    if (a_place(t, s, k, m)) a_tile[k * A_STRIDE + m / 4][m % 4] = a_next[s];
  }
  [[unroll]] for (int s = 0; s < B_LOADS; ++s) {
    uint k, n;
    if (b_place(t, s, k, n)) b_tile[k * B_STRIDE + n / 4][n % 4] = b_next[s];
  }
}

// acc = the block at (m0, n0) of the product over k in [k_begin, k_end), for C of M x N.
void multiply_block(uint m0, uint n0, uint M, uint N, uint k_begin, uint k_end) {
  uint t = gl_LocalInvocationID.x;
  [[unroll]] for (int s = 0; s < A_LOADS; ++s) {
    uint k, m;
    a_place(t, s, k, m);
    a_slot(s, min(m0 + m, M - 1));
  }
  [[unroll]] for (int s = 0; s < B_LOADS; ++s) {
    uint k, n;
    b_place(t, s, k, n);
    b_slot(s, min(n0 + n, N - 1));
  }
  [[unroll]] for (int i = 0; i < TM; ++i)
    [[unroll]] for (int j = 0; j < TN; ++j) acc[i][j] = 0.0;
  if (k_begin < k_end) load_slice(m0, n0, M, N, k_begin, k_end);
  uint row_run = t / COLUMN_THREADS, column_run = t % COLUMN_THREADS;
  [[dont_unroll]] for (uint k0 = k_begin; k0 < k_end; k0 += BK) {
    barrier();  // every invocation is done with the previous slice
    store_slice();
    barrier();
    if (k0 + BK < k_end) load_slice(m0, n0, M, N, k0 + BK, k_end);
    [[unroll]] for (int k = 0; k < BK; ++k) {
      float a[TM], b[TN];
      [[unroll]] for (int r = 0; r < TM / RUN_M; ++r) {
        uint first = (uint(r * ROW_THREADS) + row_run) * RUN_M;  // a run never crosses a vec4
        vec4 run = a_tile[k * A_STRIDE + first / 4];
        [[unroll]] for (int i = 0; i < RUN_M; ++i) a[r * RUN_M + i] = run[(first + i) % 4];
      }
      [[unroll]] for (int r = 0; r < TN / RUN_N; ++r) {
        uint first = (uint(r * COLUMN_THREADS) + column_run) * RUN_N;
        vec4 run = b_tile[k * B_STRIDE + first / 4];
        [[unroll]] for (int j = 0; j < RUN_N; ++j) b[r * RUN_N + j] = run[(first + j) % 4];
      }
      [[unroll]] for (int i = 0; i < TM; ++i)
        [[unroll]] for (int j = 0; j < TN; ++j) acc[i][j] = fma(a[i], b[j], acc[i][j]);
    }
  }
}

// The workgroup's first column: y (and z where y would overflow) count column blocks.
uint tiled_first_column() { return (gl_WorkGroupID.y + gl_WorkGroupID.z * gl_NumWorkGroups.y) * BN; }

#endif
