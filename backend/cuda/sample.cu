// Sampling on the device: greedy rows reduce to their argmax (ties: the smallest id, as on the
// CPU); sampled rows to their top candidates and softmax normaliser, from which the host
// finishes the draw (cpu::sample_candidates). Ids are offset by the first id of the rank's
// vocab slice. Draws the candidates do not cover (a top-p over a flat row) run over whole
// sorted rows here too (launch_sample_rows).
#include <algorithm>
#include <cstdint>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_radix_sort.cuh>
#include <cuda/functional>
#include <stdexcept>
#include <string>

#include "backend/cuda/kernels.h"
#include "cuda_common/common.cuh"

namespace moeserve::cuda {

namespace {

__global__ void argmax_kernel(const float* logits, int32_t* tokens, float* values, int64_t vocab, int64_t id_offset) {
  pdl_enter();
  __shared__ float best_values[32];
  __shared__ int best_ids[32];
  const float* row = logits + blockIdx.x * vocab;
  float best = -INFINITY;
  int best_id = 0x7fffffff;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x)
    if (row[i] > best) {  // first occurrence within this thread's stride
      best = row[i];
      best_id = static_cast<int>(i);
    }
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float v = __shfl_xor_sync(0xffffffffu, best, offset);
    const int id = __shfl_xor_sync(0xffffffffu, best_id, offset);
    if (v > best || (v == best && id < best_id)) {
      best = v;
      best_id = id;
    }
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    best_values[warp] = best;
    best_ids[warp] = best_id;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < static_cast<int>(blockDim.x >> 5); ++w)
      if (best_values[w] > best || (best_values[w] == best && best_ids[w] < best_id)) {
        best = best_values[w];
        best_id = best_ids[w];
      }
    tokens[blockIdx.x] = static_cast<int32_t>(best_id + id_offset);
    if (values) values[blockIdx.x] = best;
  }
}

// ---- Sampling candidates (ops::TopCandidatesParams) ----
//
// Stage 1, one block per (row, segment of the row): the segment's maximum, its softmax sum
// relative to that maximum (fp64), and its top `count` by a radix select on order-preserving
// 32-bit keys (four 8-bit digit passes over the segment, which stays in L2), ties at the
// threshold taken in id order. Stage 2, one block per row: the segments' candidates (in shared
// memory) selected again the same way, sorted (value descending, id ascending), and the
// segments' sums rescaled to the row maximum and added in segment order.
constexpr int kCandidateThreads = 512;
constexpr int kMergeCapacity = 4608;  // stage-2 candidates per row held in shared memory (36 KB)
constexpr int kMaxCandidates = 1024;  // count per row
constexpr int kMinSegment = 2048;

// Floats to keys whose unsigned order is the float order (-0 is taken as +0, so equal floats
// have equal keys), and back.
__device__ __forceinline__ uint32_t key_of(float v) {
  const uint32_t bits = __float_as_uint(v == 0.0f ? 0.0f : v);
  return (bits & 0x80000000u) ? ~bits : bits | 0x80000000u;
}
__device__ __forceinline__ float float_of(uint32_t key) {
  return __uint_as_float((key & 0x80000000u) ? key & 0x7fffffffu : ~key);
}

struct SelectScratch {
  unsigned histogram[256];
  unsigned prefix;
  int remaining;
  int taken;
  int64_t min_id;
};

// Indices (into [0, n)) of the `count` largest keys, ties at the threshold by smallest id,
// into `chosen` (unordered; count <= n). key_at(i) / id_at(i) read element i.
template <typename KeyAt, typename IdAt>
__device__ void select_top(int n, int count, KeyAt key_at, IdAt id_at, int* chosen, SelectScratch& s) {
  if (count >= n) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) chosen[i] = i;
    __syncthreads();
    return;
  }
  // The threshold key K: fewer than `count` keys above it, at least `count` at or above.
  uint32_t prefix = 0, mask = 0;
  int remaining = count;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += blockDim.x) s.histogram[b] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      const uint32_t k = key_at(i);
      if ((k & mask) == prefix) atomicAdd(&s.histogram[(k >> shift) & 0xffu], 1u);
    }
    __syncthreads();
    if (threadIdx.x < 32) {
      // Lane l holds digits 255 - 8l down to 248 - 8l (descending); find the digit where the
      // count of larger keys first reaches `remaining`.
      const int lane = threadIdx.x;
      unsigned lane_sum = 0;
      for (int j = 0; j < 8; ++j) lane_sum += s.histogram[255 - 8 * lane - j];
      unsigned before = lane_sum;  // inclusive scan over lanes, then exclusive
      for (int offset = 1; offset < 32; offset <<= 1) {
        const unsigned other = __shfl_up_sync(0xffffffffu, before, offset);
        if (lane >= offset) before += other;
      }
      before -= lane_sum;
      if (before < static_cast<unsigned>(remaining) && static_cast<unsigned>(remaining) <= before + lane_sum) {
        unsigned cumulative = before;
        for (int j = 0; j < 8; ++j) {
          const int digit = 255 - 8 * lane - j;
          if (cumulative + s.histogram[digit] >= static_cast<unsigned>(remaining)) {
            s.prefix = prefix | (static_cast<uint32_t>(digit) << shift);
            s.remaining = remaining - static_cast<int>(cumulative);
            break;
          }
          cumulative += s.histogram[digit];
        }
      }
    }
    __syncthreads();
    prefix = s.prefix;
    remaining = s.remaining;
    mask |= 0xffu << shift;
    __syncthreads();
  }
  // Every key above K, then `remaining` keys equal to K in id order.
  if (threadIdx.x == 0) s.taken = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x)
    if (key_at(i) > prefix) chosen[atomicAdd(&s.taken, 1)] = i;
  __syncthreads();
  int64_t last = -1;
  for (int t = 0; t < remaining; ++t) {
    if (threadIdx.x == 0) s.min_id = INT64_MAX;
    __syncthreads();
    int64_t best = INT64_MAX;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
      if (key_at(i) == prefix) {
        const int64_t id = id_at(i);
        if (id > last && id < best) best = id;
      }
    atomicMin(reinterpret_cast<unsigned long long*>(&s.min_id), static_cast<unsigned long long>(best));
    __syncthreads();
    last = s.min_id;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
      if (key_at(i) == prefix && id_at(i) == last) chosen[s.taken] = i;
    __syncthreads();
    if (threadIdx.x == 0) ++s.taken;
    __syncthreads();
  }
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float m = scratch[0];
  for (int w = 1; w < static_cast<int>(blockDim.x >> 5); ++w) m = fmaxf(m, scratch[w]);
  return m;
}

// Stage-1 output per (row, segment): `count` slots of (value, id) (the first min(count,
// segment length) used), the segment maximum and its softmax sum.
struct CandidateSegments {
  float* values;  // [rows, segments, count]
  int32_t* ids;   // [rows, segments, count], ids within the row (no offset)
  float* max;     // [rows, segments]
  double* sum;    // [rows, segments]
};

__global__ void __launch_bounds__(kCandidateThreads)
    segment_candidates_kernel(const float* logits, const float* temperatures, CandidateSegments out, int64_t vocab,
                              int segment, int count) {
  pdl_enter();
  __shared__ SelectScratch scratch;
  __shared__ int chosen[kMaxCandidates];
  __shared__ float max_scratch[32];
  __shared__ double sum_scratch[32];
  const int row = blockIdx.y, seg = blockIdx.x, segments = gridDim.x;
  const int64_t begin = static_cast<int64_t>(seg) * segment;
  const int n = static_cast<int>(vocab - begin < segment ? vocab - begin : segment);
  const float* x = logits + row * vocab + begin;
  float local_max = -INFINITY;
  for (int i = threadIdx.x; i < n; i += blockDim.x) local_max = fmaxf(local_max, x[i]);
  const float seg_max = block_max(local_max, max_scratch);
  const float temperature = temperatures[row];
  double local_sum = 0.0;
  if (temperature > 0.0f)
    for (int i = threadIdx.x; i < n; i += blockDim.x)
      local_sum += exp((static_cast<double>(x[i]) - seg_max) / temperature);
  const double seg_sum = block_sum(local_sum, sum_scratch);
  const int take = min(count, n);
  select_top(
      n, take, [&](int i) { return key_of(x[i]); }, [&](int i) { return static_cast<int64_t>(i); }, chosen, scratch);
  const int64_t slot = (static_cast<int64_t>(row) * segments + seg);
  for (int j = threadIdx.x; j < take; j += blockDim.x) {
    out.values[slot * count + j] = x[chosen[j]] == 0.0f ? 0.0f : x[chosen[j]];
    out.ids[slot * count + j] = static_cast<int32_t>(begin + chosen[j]);
  }
  if (threadIdx.x == 0) {
    out.max[slot] = seg_max;
    out.sum[slot] = seg_sum;
  }
}

__global__ void __launch_bounds__(kCandidateThreads)
    merge_candidates_kernel(CandidateSegments in, const ops::TopCandidatesParams p, int segment, int segments) {
  const float* const temperatures = p.temperatures;
  float* const values = p.values;
  int32_t* const ids = p.ids;
  double* const normaliser = p.normaliser;
  const int64_t vocab = p.vocab, id_offset = p.id_offset;
  const int count = static_cast<int>(p.count);
  pdl_enter();
  // After the selection, the sort reuses `keys` (kMaxCandidates 8-byte entries fit in it).
  __shared__ __align__(16) uint32_t keys[kMergeCapacity];
  __shared__ int32_t cand_ids[kMergeCapacity];
  __shared__ SelectScratch scratch;
  __shared__ int chosen[kMaxCandidates];
  static_assert(kMergeCapacity * 4 >= kMaxCandidates * 8, "the sort buffer aliases keys");
  auto* order = reinterpret_cast<unsigned long long*>(keys);
  const int row = blockIdx.x;
  // Gather the segments' candidates: segment s contributed min(count, its length).
  int n = 0;
  for (int s = 0; s < segments; ++s) {
    const int64_t left = vocab - static_cast<int64_t>(s) * segment;
    const int len = static_cast<int>(left < segment ? left : segment);
    const int take = min(count, len);
    const int64_t slot = static_cast<int64_t>(row) * segments + s;
    for (int j = threadIdx.x; j < take; j += blockDim.x) {
      keys[n + j] = key_of(in.values[slot * count + j]);
      cand_ids[n + j] = in.ids[slot * count + j];
    }
    n += take;
  }
  __syncthreads();
  select_top(
      n, count, [&](int i) { return keys[i]; }, [&](int i) { return static_cast<int64_t>(cand_ids[i]); }, chosen,
      scratch);
  // Bitonic sort, descending, of (key, inverted id): value descending, then id ascending.
  int padded = 1;
  while (padded < count) padded <<= 1;
  constexpr int kPerThread = kMaxCandidates / kCandidateThreads;
  unsigned long long mine[kPerThread];
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const int j = threadIdx.x + k * kCandidateThreads;
    mine[k] = j < count ? (static_cast<unsigned long long>(keys[chosen[j]]) << 32) |
                              (0xffffffffu - static_cast<uint32_t>(cand_ids[chosen[j]]))
                        : 0ull;
  }
  __syncthreads();
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const int j = threadIdx.x + k * kCandidateThreads;
    if (j < padded) order[j] = mine[k];
  }
  __syncthreads();
  for (int size = 2; size <= padded; size <<= 1)
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int j = threadIdx.x; j < padded; j += blockDim.x) {
        const int partner = j ^ stride;
        if (partner > j) {
          const bool descending = (j & size) == 0;
          const unsigned long long a = order[j], b = order[partner];
          if (descending ? a < b : a > b) {
            order[j] = b;
            order[partner] = a;
          }
        }
      }
      __syncthreads();
    }
  for (int j = threadIdx.x; j < count; j += blockDim.x) {
    values[static_cast<int64_t>(row) * count + j] = float_of(static_cast<uint32_t>(order[j] >> 32));
    ids[static_cast<int64_t>(row) * count + j] =
        static_cast<int32_t>(0xffffffffu - static_cast<uint32_t>(order[j] & 0xffffffffu) + id_offset);
  }
  if (threadIdx.x == 0) {
    const float temperature = temperatures[row];
    float m = -INFINITY;
    for (int s = 0; s < segments; ++s) m = fmaxf(m, in.max[static_cast<int64_t>(row) * segments + s]);
    double total = 0.0;
    for (int s = 0; s < segments; ++s) {
      const int64_t slot = static_cast<int64_t>(row) * segments + s;
      total += in.sum[slot] * exp((static_cast<double>(in.max[slot]) - m) / temperature);
    }
    normaliser[row] = temperature > 0.0f ? total : 1.0;
  }
}

// Segments per row: as many as the merge holds (count candidates each), each at least
// kMinSegment long.
int candidate_segments(int64_t vocab, int64_t count) {
  const int64_t by_length = (vocab + kMinSegment - 1) / kMinSegment;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(by_length, kMergeCapacity / count)));
}

int64_t segment_length(int64_t vocab, int segments) { return (vocab + segments - 1) / segments; }

CandidateSegments segments_in(void* workspace, int64_t rows, int segments, int64_t count) {
  char* p = static_cast<char*>(workspace);
  const int64_t slots = rows * segments;
  CandidateSegments s;
  s.sum = reinterpret_cast<double*>(p);
  p += slots * 8;
  s.max = reinterpret_cast<float*>(p);
  p += slots * 4;
  s.values = reinterpret_cast<float*>(p);
  p += slots * count * 4;
  s.ids = reinterpret_cast<int32_t*>(p);
  return s;
}

// ---- Whole-row draws (ops::SampleParams) ----
//
// The rows are sorted on the device (one radix sort of 64-bit keys: the row in the high bits,
// the logit's descending-order key in the low 32; stable, so equal logits keep id order, as
// the host's sort does), then one block per row runs cpu::sample_row's filters and draw over
// the sorted row: the normaliser, the min-p and top-p cuts and the inverse-CDF draw, with the
// fp64 sums of a block-wide scan instead of the host's running sum.
constexpr int kDrawThreads = 512;
constexpr int kDrawItems = 4;  // per thread and tile: tiles of 2048 sorted entries

__global__ void sort_keys_kernel(const float* logits, const int32_t* row_ids, int64_t logit_rows, int64_t slices,
                                 int64_t vocab, int row0, uint64_t* keys, int32_t* ids) {
  const int r = blockIdx.y;
  const int64_t width = vocab / slices, logit_row = row_ids[row0 + r];
  for (int64_t v = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; v < vocab;
       v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t slice = v / width;
    const float logit = logits[(slice * logit_rows + logit_row) * width + (v - slice * width)];
    keys[r * vocab + v] = (static_cast<uint64_t>(r) << 32) | ~key_of(logit);  // ascending keys: descending logits
    ids[r * vocab + v] = static_cast<int32_t>(v);
  }
}

struct DrawScratch {
  typename cub::BlockScan<double, kDrawThreads>::TempStorage scan;
  typename cub::BlockReduce<double, kDrawThreads>::TempStorage sum;
  typename cub::BlockReduce<int64_t, kDrawThreads>::TempStorage first;
  double carry, found_cumulative;
  int64_t found;
};

// Over the sorted entries [0, n): the first i whose running sum of weight(i) / total meets
// `crossed(cumulative)`, and that sum; (n - 1, the whole sum) when none does.
template <typename Weight, typename Crossed>
__device__ void first_crossing(int64_t n, Weight weight, double total, Crossed crossed, DrawScratch& s, int64_t* index,
                               double* cumulative) {
  __syncthreads();  // every thread has read the previous call's results
  if (threadIdx.x == 0) s.carry = 0.0;
  __syncthreads();
  constexpr int64_t kTile = static_cast<int64_t>(kDrawThreads) * kDrawItems;
  for (int64_t tile = 0; tile < n; tile += kTile) {
    double mass[kDrawItems];
    const int64_t base = tile + static_cast<int64_t>(threadIdx.x) * kDrawItems;
    for (int j = 0; j < kDrawItems; ++j) mass[j] = base + j < n ? weight(base + j) / total : 0.0;
    double tile_sum;
    cub::BlockScan<double, kDrawThreads>(s.scan).InclusiveSum(mass, mass, tile_sum);
    const double carry = s.carry;
    int64_t mine = INT64_MAX;
    for (int j = kDrawItems - 1; j >= 0; --j)
      if (base + j < n && crossed(carry + mass[j])) mine = base + j;
    const int64_t first = cub::BlockReduce<int64_t, kDrawThreads>(s.first).Reduce(mine, ::cuda::minimum<>{});
    __syncthreads();
    if (threadIdx.x == 0) {
      s.found = first;
      s.carry = carry + tile_sum;
    }
    __syncthreads();
    if (s.found != INT64_MAX) {
      for (int j = 0; j < kDrawItems; ++j)
        if (base + j == s.found) s.found_cumulative = carry + mass[j];
      __syncthreads();
      *index = s.found;
      *cumulative = s.found_cumulative;
      return;
    }
    // The last tile's entries past n add zero: the carry is the whole sum.
    if (tile + kTile >= n) {
      *index = n - 1;
      *cumulative = s.carry;
      return;
    }
  }
}

__global__ void __launch_bounds__(kDrawThreads)
    draw_rows_kernel(const uint64_t* keys, const int32_t* ids, const DrawOptions* options, int32_t* tokens,
                     int64_t vocab, int row0) {
  __shared__ DrawScratch s;
  const int r = blockIdx.x;
  const DrawOptions o = options[row0 + r];
  const uint64_t* row_keys = keys + r * vocab;
  const int32_t* row_ids = ids + r * vocab;
  if (o.temperature <= 0.0f || o.top_k == 1) {
    if (threadIdx.x == 0) tokens[row0 + r] = row_ids[0];
    return;
  }
  auto logit = [&](int64_t i) { return float_of(~static_cast<uint32_t>(row_keys[i])); };
  const double max_logit = logit(0), temperature = o.temperature;
  auto weight = [&](int64_t i) { return exp((static_cast<double>(logit(i)) - max_logit) / temperature); };
  // The normaliser: over the top_k entries, or over the whole row.
  const int64_t keep_k = o.top_k > 0 && o.top_k < vocab ? o.top_k : vocab;
  double partial = 0.0;
  for (int64_t i = threadIdx.x; i < keep_k; i += kDrawThreads) partial += weight(i);
  const double sum = cub::BlockReduce<double, kDrawThreads>(s.sum).Sum(partial);
  if (threadIdx.x == 0) s.carry = sum;
  __syncthreads();
  const double total = s.carry;
  __syncthreads();
  // min_p: the entries from the first whose weight (probability over the top one's) is below it.
  int64_t keep = keep_k;
  if (o.min_p > 0.0f) {
    int64_t mine = INT64_MAX;
    for (int64_t i = 1 + threadIdx.x; i < keep; i += kDrawThreads)
      if (weight(i) < o.min_p) {
        mine = i;
        break;
      }
    const int64_t first = cub::BlockReduce<int64_t, kDrawThreads>(s.first).Reduce(mine, ::cuda::minimum<>{});
    if (threadIdx.x == 0) s.found = first;
    __syncthreads();
    keep = s.found == INT64_MAX ? keep : s.found;
    __syncthreads();
  }
  // top_p: the shortest prefix whose mass reaches it; the kept prefix's mass.
  double kept_mass = 1.0;
  int64_t last = 0;
  if (o.top_p < 1.0f) {
    const double top_p = o.top_p;
    first_crossing(
        keep, weight, total, [=](double c) { return c >= top_p; }, s, &last, &kept_mass);
    keep = last + 1;
  } else if (keep < vocab) {
    first_crossing(
        keep, weight, total, [](double) { return false; }, s, &last, &kept_mass);
  }
  const double target = static_cast<double>(o.u) * kept_mass;
  first_crossing(
      keep, weight, total, [=](double c) { return target < c; }, s, &last, &kept_mass);
  if (threadIdx.x == 0) tokens[row0 + r] = row_ids[last];
}

void cuda_check(cudaError_t status) {
  if (status != cudaSuccess) throw std::runtime_error(std::string("sample: ") + cudaGetErrorString(status));
}

int row_bits(int64_t rows) {
  int bits = 1;
  while ((int64_t{1} << bits) < rows) ++bits;
  return bits;
}

struct SampleWorkspace {
  uint64_t* keys[2];
  int32_t* ids[2];
  DrawOptions* options;
  int32_t* row_ids;
  void* sort_temp;
  size_t sort_temp_bytes;
  size_t bytes;  // of the whole workspace
};

size_t sort_temp_bytes(int64_t items, int64_t rows) {
  size_t bytes = 0;
  cub::DoubleBuffer<uint64_t> keys(nullptr, nullptr);
  cub::DoubleBuffer<int32_t> ids(nullptr, nullptr);
  cub::DeviceRadixSort::SortPairs(nullptr, bytes, keys, ids, static_cast<int>(items), 0, 32 + row_bits(rows));
  return bytes;
}

// The workspace's parts at `base` (0: only `bytes` is meaningful).
SampleWorkspace sample_workspace_at(uintptr_t base, int64_t rows, int64_t vocab) {
  const int64_t chunk = std::min<int64_t>(rows, kSampleRowsPerSort), items = chunk * vocab;
  auto align = [](size_t n) { return (n + 255) / 256 * 256; };
  size_t offset = 0;
  auto take = [&](size_t n) {
    const uintptr_t at = base + offset;
    offset += align(n);
    return at;
  };
  SampleWorkspace w;
  for (int b = 0; b < 2; ++b) w.keys[b] = reinterpret_cast<uint64_t*>(take(items * 8));
  for (int b = 0; b < 2; ++b) w.ids[b] = reinterpret_cast<int32_t*>(take(items * 4));
  w.options = reinterpret_cast<DrawOptions*>(take(rows * sizeof(DrawOptions)));
  w.row_ids = reinterpret_cast<int32_t*>(take(rows * 4));
  w.sort_temp_bytes = sort_temp_bytes(items, chunk);
  w.sort_temp = reinterpret_cast<void*>(take(w.sort_temp_bytes));
  w.bytes = offset;
  return w;
}

}  // namespace

void launch_argmax_rows(const ops::ArgmaxRowsParams& p, cudaStream_t stream) {
  if (p.rows == 0) return;
  launch_pdl(argmax_kernel, p.rows, 1024, 0, stream, p.logits, p.ids, p.values, p.vocab, p.id_offset);
}

int64_t top_candidates_workspace_bytes(const ops::TopCandidatesParams& p) {
  const int64_t slots = p.rows * candidate_segments(p.vocab, p.count);
  return slots * (8 + 4) + slots * p.count * 8;
}

void launch_top_candidates(const ops::TopCandidatesParams& p, void* workspace, cudaStream_t stream) {
  const float* const logits = p.logits;
  const float* const temperatures = p.temperatures;
  const int64_t rows = p.rows, vocab = p.vocab, count = p.count;
  if (rows == 0) return;
  if (count < 1 || count > kMaxCandidates || count > vocab)
    throw std::invalid_argument("top_candidates: count " + std::to_string(count) + " must be in [1, min(" +
                                std::to_string(kMaxCandidates) + ", vocab " + std::to_string(vocab) + ")]");
  const int segments = candidate_segments(vocab, count);
  const int64_t segment = segment_length(vocab, segments);
  const CandidateSegments ws = segments_in(workspace, rows, segments, count);
  launch_pdl(segment_candidates_kernel, dim3(static_cast<unsigned>(segments), static_cast<unsigned>(rows)),
             kCandidateThreads, 0, stream, logits, temperatures, ws, vocab, static_cast<int>(segment),
             static_cast<int>(count));
  launch_pdl(merge_candidates_kernel, static_cast<unsigned>(rows), kCandidateThreads, 0, stream, ws, p,
             static_cast<int>(segment), segments);
}

int64_t sample_rows_workspace_bytes(int64_t rows, int64_t vocab) {
  return static_cast<int64_t>(sample_workspace_at(0, rows, vocab).bytes);
}

void launch_sample_rows(const SampleRowsParams& p, void* workspace, cudaStream_t stream) {
  const float* const logits = p.logits;
  const int64_t rows = p.rows, vocab = p.vocab, logit_rows = p.logit_rows, slices = p.slices;
  if (rows == 0) return;
  if (slices < 1 || vocab % slices != 0 || vocab > (int64_t{1} << 31) / 2)
    throw std::invalid_argument("sample: vocab " + std::to_string(vocab) + " in " + std::to_string(slices) +
                                " slices (equal slices, vocab < 2^30)");
  const SampleWorkspace w = sample_workspace_at(reinterpret_cast<uintptr_t>(workspace), rows, vocab);
  cuda_check(cudaMemcpyAsync(w.options, p.options, rows * sizeof(DrawOptions), cudaMemcpyHostToDevice, stream));
  cuda_check(cudaMemcpyAsync(w.row_ids, p.row_ids, rows * 4, cudaMemcpyHostToDevice, stream));
  for (int64_t row0 = 0; row0 < rows; row0 += kSampleRowsPerSort) {
    const int64_t chunk = std::min<int64_t>(kSampleRowsPerSort, rows - row0), items = chunk * vocab;
    const dim3 grid(static_cast<unsigned>(std::min<int64_t>(blocks_for(vocab, 256), 64)), static_cast<unsigned>(chunk));
    sort_keys_kernel<<<grid, 256, 0, stream>>>(logits, w.row_ids, logit_rows, slices, vocab, static_cast<int>(row0),
                                               w.keys[0], w.ids[0]);
    cuda_check(cudaGetLastError());
    cub::DoubleBuffer<uint64_t> keys(w.keys[0], w.keys[1]);
    cub::DoubleBuffer<int32_t> ids(w.ids[0], w.ids[1]);
    size_t temp_bytes = w.sort_temp_bytes;
    cuda_check(cub::DeviceRadixSort::SortPairs(w.sort_temp, temp_bytes, keys, ids, static_cast<int>(items), 0,
                                               32 + row_bits(chunk), stream));
    draw_rows_kernel<<<static_cast<unsigned>(chunk), kDrawThreads, 0, stream>>>(
        keys.Current(), ids.Current(), w.options, p.tokens, vocab, static_cast<int>(row0));
    cuda_check(cudaGetLastError());
  }
}

}  // namespace moeserve::cuda
