#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "kernels/common.cuh"
#include "kernels/decode_attention.cuh"

namespace dschat {
namespace kernels {
namespace {

using detail::ceil_div;

constexpr int kThreads = 128;              // per block
constexpr int kTile = kThreads;            // keys per step: one per thread in the softmax update
constexpr int kMaxVecsPerThread = 2;       // value vectors a thread accumulates (D <= 256 at V = 1)
constexpr int kPartialFloats = kThreads * 8;  // lanes * D <= kThreads * V (V <= 8), or D (<= 256)
constexpr int64_t kMinKeysPerSplit = 256;
constexpr int64_t kMaxSplits = 64;

int64_t keys_per_split(int64_t length, int64_t splits) {
  return ceil_div(ceil_div(length, splits), kTile) * kTile;
}

// One block per (split, head, row). Keys are processed in tiles of kTile with an online softmax:
// score the tile into shared memory (a group of lanes per key), rescale the running max/sum and
// the accumulators, then add p * v. With one split the block writes out[b, h, :]; with several it
// writes its unnormalised accumulator and (max, sum) to the workspace for the merge kernel.
// Workspace: partial [B, H, splits, D] then stats [B, H, splits, 2].
template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    decode_attention_kernel(const DecodeAttentionParams<T> p, int64_t split_keys, int splits) {
  __shared__ float q_s[kDecodeAttentionMaxHeadDim];  // [D] query in fp32
  __shared__ float probs[kTile];                     // [tile] scores, then probabilities
  __shared__ float scratch[32];                      // block reductions
  __shared__ float partial[kPartialFloats];          // [lanes, D] accumulators to merge

  const int split = blockIdx.x;
  const int64_t h = blockIdx.y, b = blockIdx.z;
  const int64_t kv_head = h / (p.heads / p.kv_heads);
  const int tid = threadIdx.x;
  const int dim = static_cast<int>(p.head_dim);
  const int vecs = dim / V;

  const T* q = p.q + b * p.q_stride_b + h * p.q_stride_h;                // [D]
  const T* k = p.k + b * p.k_stride_b + kv_head * p.k_stride_h;          // [S, D] at k_stride_s
  const T* v = p.v + b * p.v_stride_b + kv_head * p.v_stride_h;          // [S, D] at v_stride_s
  const int64_t* mask = p.mask == nullptr ? nullptr : p.mask + b * p.mask_stride_b;      // [S]
  const int64_t* slots = p.slots == nullptr ? nullptr : p.slots + b * p.slots_stride_b;  // [S] pool rows
  for (int d = tid; d < dim; d += kThreads) q_s[d] = detail::to_float(q[d]);

  // Scoring: `tpk` lanes (a power of two <= 32) per key, each a strided slice of D's vectors.
  int tpk = 1;
  while (tpk < vecs && tpk < 32) tpk *= 2;
  const int key_groups = kThreads / tpk, group = tid / tpk, group_lane = tid % tpk;
  // Accumulation: `tpr` threads span one value row (`vpt` vectors each); `lanes` rows at a time.
  const int vpt = (vecs + kThreads - 1) / kThreads;
  const int tpr = (vecs + vpt - 1) / vpt;
  const int lanes = kThreads / tpr, row_thread = tid % tpr, lane = tid / tpr;
  const bool accumulates = lane < lanes;

  float acc[kMaxVecsPerThread][V];
#pragma unroll
  for (int j = 0; j < kMaxVecsPerThread; ++j)
#pragma unroll
    for (int e = 0; e < V; ++e) acc[j][e] = 0.f;
  float running_max = -INFINITY, running_sum = 0.f;
  const int64_t begin = split * split_keys;
  const int64_t end = begin + split_keys < p.length ? begin + split_keys : p.length;
  __syncthreads();  // q_s

  for (int64_t tile = begin; tile < end; tile += kTile) {
    const int n = end - tile < kTile ? static_cast<int>(end - tile) : kTile;
    // The trip count is the same for every lane: the shuffles need the whole warp.
    for (int first = 0; first < n; first += key_groups) {
      const int j = first + group;
      float dot = 0.f;
      const bool real = j < n && (mask == nullptr || mask[tile + j] != 0);  // a masked key is not read
      if (real) {
        const int64_t key_row = slots == nullptr ? tile + j : slots[tile + j];
        const T* key = k + key_row * p.k_stride_s;
        for (int vi = group_lane; vi < vecs; vi += tpk) {
          float kv[V];
          detail::load_vec<T, V>(key + vi * V, kv);
#pragma unroll
          for (int e = 0; e < V; ++e) dot += q_s[vi * V + e] * kv[e];
        }
      }
      for (int offset = tpk / 2; offset > 0; offset /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, offset);
      if (j < n && group_lane == 0) probs[j] = real ? dot * p.scale : p.masked_score;
    }
    __syncthreads();

    // Online softmax over the tile: every score is finite (masked ones are masked_score), so the
    // new max is finite and a fully masked range still sums to its key count (uniform weights).
    const float score = tid < n ? probs[tid] : -INFINITY;
    const float new_max = fmaxf(running_max, detail::block_reduce<true>(score, scratch));
    const float prob = tid < n ? expf(score - new_max) : 0.f;
    probs[tid] = prob;
    const float tile_sum = detail::block_reduce<false>(prob, scratch);  // its barriers publish probs
    const float rescale = expf(running_max - new_max);                  // 0 on the first tile
    running_sum = running_sum * rescale + tile_sum;
    running_max = new_max;

    if (accumulates) {
#pragma unroll
      for (int j = 0; j < kMaxVecsPerThread; ++j)
#pragma unroll
        for (int e = 0; e < V; ++e) acc[j][e] *= rescale;
      for (int key = lane; key < n; key += lanes) {
        const float weight = probs[key];
        const int64_t value_row = slots == nullptr ? tile + key : slots[tile + key];
        const T* value = v + value_row * p.v_stride_s;
#pragma unroll
        for (int j = 0; j < kMaxVecsPerThread; ++j) {
          const int vi = row_thread + j * tpr;
          if (j < vpt && vi < vecs) {
            float vv[V];
            detail::load_vec<T, V>(value + vi * V, vv);
#pragma unroll
            for (int e = 0; e < V; ++e) acc[j][e] += weight * vv[e];
          }
        }
      }
    }
    __syncthreads();  // probs is rewritten by the next tile
  }

  if (accumulates) {
#pragma unroll
    for (int j = 0; j < kMaxVecsPerThread; ++j) {
      const int vi = row_thread + j * tpr;
      if (j < vpt && vi < vecs) {
#pragma unroll
        for (int e = 0; e < V; ++e) partial[lane * dim + vi * V + e] = acc[j][e];
      }
    }
  }
  __syncthreads();
  const int64_t row = b * p.heads + h;
  for (int d = tid; d < dim; d += kThreads) {
    float total = 0.f;
    for (int l = 0; l < lanes; ++l) total += partial[l * dim + d];
    if (splits == 1) {
      p.out[row * dim + d] = detail::from_float<T>(total / running_sum);
    } else {
      p.workspace[(row * splits + split) * dim + d] = total;
    }
  }
  if (splits > 1 && tid == 0) {
    float* stats = p.workspace + p.batch * p.heads * splits * dim + (row * splits + split) * 2;
    stats[0] = running_max;
    stats[1] = running_sum;
  }
}

// One block per (head, row): rescales each split's accumulator to the global max and normalises.
template <typename T>
__global__ void __launch_bounds__(kThreads) decode_attention_merge_kernel(const DecodeAttentionParams<T> p, int splits) {
  const int64_t row = blockIdx.y * p.heads + blockIdx.x;
  const int dim = static_cast<int>(p.head_dim);
  const float* partial = p.workspace + row * splits * dim;                                 // [splits, D]
  const float* stats = p.workspace + p.batch * p.heads * splits * dim + row * splits * 2;  // [splits, 2]
  float global_max = -INFINITY;
  for (int s = 0; s < splits; ++s) global_max = fmaxf(global_max, stats[2 * s]);
  float total_sum = 0.f;
  for (int s = 0; s < splits; ++s) total_sum += stats[2 * s + 1] * expf(stats[2 * s] - global_max);
  for (int d = threadIdx.x; d < dim; d += blockDim.x) {
    float total = 0.f;
    for (int s = 0; s < splits; ++s) total += partial[s * dim + d] * expf(stats[2 * s] - global_max);
    p.out[row * dim + d] = detail::from_float<T>(total / total_sum);
  }
}

template <typename T, int V>
cudaError_t launch(const DecodeAttentionParams<T>& p, cudaStream_t stream) {
  const int64_t split_keys = keys_per_split(p.length, p.num_splits);
  const int splits = static_cast<int>(ceil_div(p.length, split_keys));  // <= num_splits, none empty
  if (splits > 1 && p.workspace == nullptr) return cudaErrorInvalidValue;
  dim3 grid(static_cast<unsigned>(splits), static_cast<unsigned>(p.heads), static_cast<unsigned>(p.batch));
  decode_attention_kernel<T, V><<<grid, kThreads, 0, stream>>>(p, split_keys, splits);
  cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess || splits == 1) return status;
  dim3 merge_grid(static_cast<unsigned>(p.heads), static_cast<unsigned>(p.batch));
  decode_attention_merge_kernel<T><<<merge_grid, kThreads, 0, stream>>>(p, splits);
  return cudaGetLastError();
}

}  // namespace

int decode_attention_num_splits(int64_t batch, int64_t heads, int64_t length, int sm_count) {
  const int64_t blocks = batch * heads;
  const int64_t target = 4 * static_cast<int64_t>(std::max(sm_count, 1));  // 128-thread blocks: several per SM
  if (blocks == 0 || blocks >= target || length <= kMinKeysPerSplit) return 1;
  int64_t splits = std::min({ceil_div(length, kMinKeysPerSplit), ceil_div(target, blocks), kMaxSplits});
  return static_cast<int>(ceil_div(length, keys_per_split(length, splits)));
}

int64_t decode_attention_workspace_floats(int64_t batch, int64_t heads, int64_t head_dim, int num_splits) {
  return num_splits > 1 ? batch * heads * num_splits * (head_dim + 2) : 0;
}

template <typename T>
cudaError_t decode_attention(const DecodeAttentionParams<T>& p, cudaStream_t stream) {
  if (p.length < 1 || p.head_dim < 1 || p.head_dim > kDecodeAttentionMaxHeadDim || p.kv_heads < 1 ||
      p.heads % p.kv_heads != 0 || p.batch > 65535 || p.heads > 65535 || p.num_splits < 1) {
    return cudaErrorInvalidValue;
  }
  if (p.batch == 0 || p.heads == 0) return cudaSuccess;
  constexpr int kVec = detail::kVecWidth<T>;
  const bool vectorised = p.head_dim % kVec == 0 && detail::is_aligned(p.k, 16) && detail::is_aligned(p.v, 16) &&
                          p.k_stride_b % kVec == 0 && p.k_stride_h % kVec == 0 && p.k_stride_s % kVec == 0 &&
                          p.v_stride_b % kVec == 0 && p.v_stride_h % kVec == 0 && p.v_stride_s % kVec == 0;
  return vectorised ? launch<T, kVec>(p, stream) : launch<T, 1>(p, stream);
}

template cudaError_t decode_attention<float>(const DecodeAttentionParams<float>&, cudaStream_t);
template cudaError_t decode_attention<__half>(const DecodeAttentionParams<__half>&, cudaStream_t);
template cudaError_t decode_attention<__nv_bfloat16>(const DecodeAttentionParams<__nv_bfloat16>&, cudaStream_t);

}  // namespace kernels
}  // namespace dschat
