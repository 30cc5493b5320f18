#pragma once
// The running top-K structures of the fused knn_select forward, one per instruction set (included
// only by per-ISA kernel files, so it lives in convnn::cpu::CONVNN_CPU_ISA; see ops/cpu/isa.h).
// All keep the lower index among equal keys, as the reference's stable sort does.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

#if defined(CPU_CAPABILITY_AVX2)
#include <immintrin.h>
#endif

namespace convnn::cpu::CONVNN_CPU_ISA {

// Sorted-descending running top-K of one row, any K and key type. A key only displaces a kept
// one when strictly larger, so equal keys keep the lower (earlier) index.
template <typename acc_t>
class RunningTopK {
 public:
  RunningTopK(acc_t* keys, int64_t* indices, int64_t k) : keys_(keys), indices_(indices), k_(k) {}

  void reset() { count_ = 0; }

  void offer(acc_t value, int64_t index) {
    // Fast path: once the row holds K candidates, most keys do not beat the K-th.
    if (count_ == k_ && !(value > keys_[k_ - 1])) return;
    int64_t pos = count_ == k_ ? k_ - 1 : count_++;
    while (pos > 0 && keys_[pos - 1] < value) {
      keys_[pos] = keys_[pos - 1];
      indices_[pos] = indices_[pos - 1];
      --pos;
    }
    keys_[pos] = value;
    indices_[pos] = index;
  }

  void offer_row(const acc_t* row, int64_t columns, int64_t first) {
    for (int64_t c = 0; c < columns; ++c) offer(row[c], first + c);
  }

  // The K kept candidates, by descending key or (index_order) by ascending index.
  void read(acc_t* keys, int64_t* indices, bool index_order) const {
    std::copy_n(keys_, k_, keys);
    std::copy_n(indices_, k_, indices);
    if (index_order) sort_by_index(keys, indices, k_);
  }

 private:
  static void sort_by_index(acc_t* keys, int64_t* indices, int64_t k) {
    for (int64_t i = 1; i < k; ++i) {
      const acc_t key = keys[i];
      const int64_t index = indices[i];
      int64_t j = i;
      for (; j > 0 && indices[j - 1] > index; --j) {
        keys[j] = keys[j - 1];
        indices[j] = indices[j - 1];
      }
      keys[j] = key;
      indices[j] = index;
    }
  }

  acc_t* keys_;
  int64_t* indices_;
  int64_t k_;
  int64_t count_ = 0;
};

// Integer image of a float that orders as the float does (NaN excluded: ranking rejects it).
// -0 is folded into +0 first: they compare equal, so their order must fall to the index.
inline int32_t ordered_bits(float value) {
  value += 0.0f;
  int32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits >= 0 ? bits : bits ^ 0x7fffffff;
}

inline float from_ordered_bits(int32_t key) {
  const int32_t bits = key >= 0 ? key : key ^ 0x7fffffff;
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

#if defined(CPU_CAPABILITY_AVX2)
// ordered_bits of 8 floats.
inline __m256i ordered_bits(__m256 values) {
  const __m256i bits = _mm256_castps_si256(_mm256_add_ps(values, _mm256_setzero_ps()));
  const __m256i negative = _mm256_srai_epi32(bits, 31);
  return _mm256_xor_si256(bits, _mm256_and_si256(negative, _mm256_set1_epi32(0x7fffffff)));
}

inline uint32_t sign_mask(__m256i lanes) {
  return static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(lanes)));
}

// mask ? b : a per 32-bit lane, mask all-ones or all-zeros. Through blendv_ps, which reads one
// sign bit per lane: GCC lowers blendv_epi8 on a compare result to two instructions.
inline __m256i blend_lanes(__m256i a, __m256i b, __m256i mask) {
  return _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(a), _mm256_castsi256_ps(b),
                                              _mm256_castsi256_ps(mask)));
}

constexpr int64_t kRankColumns = 32;
constexpr int64_t kRankVectors = kRankColumns / 8;

// Adds to the ranks what candidates l in [8U, end) outrank. Lanes of vectors before U come before
// l (strict comparison), lanes of vectors after U after it (>=); only vector U is mixed.
template <int64_t U, int64_t Vectors>
inline void add_outranking(const int32_t* keys, int64_t end, const __m256i* key_vectors,
                           const __m256i* key_minus_one, __m256i* rank) {
  if constexpr (U < Vectors) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (int64_t l = 8 * U; l < end; ++l) {
      const __m256i key = _mm256_set1_epi32(keys[l]);
      // Compare results are -1 / 0: subtracting counts.
      for (int64_t v = 0; v < U; ++v) {
        rank[v] = _mm256_sub_epi32(rank[v], _mm256_cmpgt_epi32(key, key_vectors[v]));
      }
      const __m256i later_lane =
          _mm256_cmpgt_epi32(lane, _mm256_set1_epi32(static_cast<int32_t>(l - 8 * U)));
      rank[U] = _mm256_sub_epi32(
          rank[U], blend_lanes(_mm256_cmpgt_epi32(key, key_vectors[U]),
                               _mm256_cmpgt_epi32(key, key_minus_one[U]), later_lane));
      for (int64_t v = U + 1; v < Vectors; ++v) {
        rank[v] = _mm256_sub_epi32(rank[v], _mm256_cmpgt_epi32(key, key_minus_one[v]));
      }
    }
  }
}

// top_k_of_ranked over the first Vectors x 8 lanes (columns <= 8 * Vectors): the work grows with
// the lanes compared, so few candidates use few vectors.
template <int64_t Vectors>
inline void top_k_of_ranked_in(const int32_t* keys, const int32_t* index_of, int64_t columns, int64_t k,
                               bool index_order, float* keys_out, int64_t* indices_out) {
  __m256i key_vectors[Vectors], key_minus_one[Vectors], rank[Vectors];
  for (int64_t v = 0; v < Vectors; ++v) {
    key_vectors[v] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(keys + v * 8));
    // x > key - 1 is x >= key; only the INT32_MIN of lanes past the row wraps.
    key_minus_one[v] = _mm256_sub_epi32(key_vectors[v], _mm256_set1_epi32(1));
    rank[v] = _mm256_setzero_si256();
  }
  const auto segment_end = [&](int64_t u) { return std::min(columns, 8 * (u + 1)); };
  add_outranking<0, Vectors>(keys, segment_end(0), key_vectors, key_minus_one, rank);
  add_outranking<1, Vectors>(keys, segment_end(1), key_vectors, key_minus_one, rank);
  add_outranking<2, Vectors>(keys, segment_end(2), key_vectors, key_minus_one, rank);
  add_outranking<3, Vectors>(keys, segment_end(3), key_vectors, key_minus_one, rank);
  alignas(32) int32_t rank_of[8 * Vectors];
  uint32_t kept = 0;
  const __m256i top = _mm256_set1_epi32(static_cast<int32_t>(k));
  for (int64_t v = 0; v < Vectors; ++v) {
    _mm256_store_si256(reinterpret_cast<__m256i*>(rank_of + v * 8), rank[v]);
    kept |= sign_mask(_mm256_cmpgt_epi32(top, rank[v])) << (8 * v);
  }
  kept &= static_cast<uint32_t>((uint64_t{1} << columns) - 1);
  for (int64_t slot = 0; kept != 0; kept &= kept - 1, ++slot) {
    const int j = __builtin_ctz(kept);
    const int64_t out = index_order ? slot : rank_of[j];
    keys_out[out] = from_ordered_bits(keys[j]);
    indices_out[out] = index_of != nullptr ? index_of[j] : j;
  }
}

// The top-K of at most kRankColumns candidates (K <= columns), by ranks: candidate j's rank is the
// number of candidates before it in (key descending, index ascending) order, and the K of rank
// below K are kept. The ranks of all lanes grow together, one broadcast candidate l at a time (l
// outranks j when key_l > key_j, or key_l >= key_j with l < j): no dependency chain and no
// data-dependent branch, where a running top-K's insertions chain. keys: the candidates'
// ordered_bits, kRankColumns entries, lanes past `columns` INT32_MIN; index_of: each candidate's
// index (null: its position). Candidates come in ascending index order, so equal keys keep the
// lower index.
inline void top_k_of_ranked(const int32_t* keys, const int32_t* index_of, int64_t columns, int64_t k,
                            bool index_order, float* keys_out, int64_t* indices_out) {
  switch ((columns + 7) / 8) {
    case 0:
    case 1: return top_k_of_ranked_in<1>(keys, index_of, columns, k, index_order, keys_out, indices_out);
    case 2: return top_k_of_ranked_in<2>(keys, index_of, columns, k, index_order, keys_out, indices_out);
    case 3: return top_k_of_ranked_in<3>(keys, index_of, columns, k, index_order, keys_out, indices_out);
    default: return top_k_of_ranked_in<kRankVectors>(keys, index_of, columns, k, index_order, keys_out, indices_out);
  }
}

// top_k_of_ranked of a whole row of float keys. With few candidates (random candidates, r = 32) it
// is faster than a running top-K.
inline void top_k_by_rank(const float* row, int64_t columns, int64_t k, bool index_order,
                          float* keys_out, int64_t* indices_out) {
  alignas(32) int32_t keys[kRankColumns];
  // Lanes past the row hold INT32_MIN, below every ordered float: they outrank nothing (and are
  // never kept).
  for (int64_t c = 0; c < kRankColumns; ++c) {
    keys[c] = c < columns ? ordered_bits(row[c]) : std::numeric_limits<int32_t>::min();
  }
  top_k_of_ranked(keys, nullptr, columns, k, index_order, keys_out, indices_out);
}

// The running top-K for float keys, K <= 16 and int32 indices, in AVX2 registers: keys (as
// ordered_bits) and indices fill 16 lanes each, sorted descending, and an insertion is the same
// shift-and-blend whatever the new key's rank. The scalar insertion sort mispredicts a branch per
// shifted slot; with few candidates per row (random candidates) that was most of the select time.
class LaneTopK {
 public:
  static constexpr int64_t kLanes = 16;

  explicit LaneTopK(int64_t k) : k_(k) { reset(); }

  void reset() {
    // INT32_MIN is below every ordered float (-inf included), so the first K keys always enter.
    for (auto& v : keys_) v = _mm256_set1_epi32(std::numeric_limits<int32_t>::min());
    for (auto& v : indices_) v = _mm256_setzero_si256();
  }

  // Offers row[c] with index first + c, for c < columns, in order.
  void offer_row(const float* row, int64_t columns, int64_t first) {
    // The lanes live in locals for the row, so they stay in registers.
    Lanes lanes{keys_[0], keys_[1], indices_[0], indices_[1]};
    const __m256i kth_lane = _mm256_set1_epi32(static_cast<int32_t>((k_ - 1) % 8));
    alignas(32) int32_t group[8];
    int64_t c = 0;
    for (; c + 8 <= columns; c += 8) {
      const __m256i keys = ordered_bits(_mm256_loadu_ps(row + c));
      // Once the row holds K keys most groups hold none above the K-th: skip them whole.
      const __m256i kth = _mm256_permutevar8x32_epi32(k_ <= 8 ? lanes.k0 : lanes.k1, kth_lane);
      int above = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(keys, kth)));
      if (above == 0) continue;
      _mm256_store_si256(reinterpret_cast<__m256i*>(group), keys);
      // A key that falls to or below the K-th during the group is still safe to insert: see insert.
      for (; above != 0; above &= above - 1) {
        const int lane = __builtin_ctz(above);
        insert(lanes, group[lane], first + c + lane);
      }
    }
    for (; c < columns; ++c) insert(lanes, ordered_bits(row[c]), first + c);
    keys_[0] = lanes.k0, keys_[1] = lanes.k1, indices_[0] = lanes.i0, indices_[1] = lanes.i1;
  }

  // The K kept candidates, by descending key or (index_order) by ascending index. Index order
  // places each slot at its rank, the number of kept indices below its own (they are distinct):
  // one compare per slot instead of an insertion sort's mispredicted branches.
  void read(float* keys, int64_t* indices, bool index_order) const {
    alignas(32) int32_t key_lanes[kLanes], index_lanes[kLanes];
    _mm256_store_si256(reinterpret_cast<__m256i*>(key_lanes), keys_[0]);
    _mm256_store_si256(reinterpret_cast<__m256i*>(key_lanes + 8), keys_[1]);
    _mm256_store_si256(reinterpret_cast<__m256i*>(index_lanes), indices_[0]);
    _mm256_store_si256(reinterpret_cast<__m256i*>(index_lanes + 8), indices_[1]);
    const uint32_t kept = (uint32_t{1} << k_) - 1;
    for (int64_t s = 0; s < k_; ++s) {
      int64_t rank = s;
      if (index_order) {
        const __m256i index = _mm256_set1_epi32(index_lanes[s]);
        const uint32_t below =
            static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(index, indices_[0])))) |
            static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(index, indices_[1])))) << 8;
        rank = __builtin_popcount(below & kept);
      }
      keys[rank] = from_ordered_bits(key_lanes[s]);
      indices[rank] = index_lanes[s];
    }
  }

 private:
  static __m256i ordered_bits(__m256 values) { return CONVNN_CPU_ISA::ordered_bits(values); }
  static int32_t ordered_bits(float value) { return CONVNN_CPU_ISA::ordered_bits(value); }

  // A lane whose key is >= the new one stays (ties keep the earlier index); the first other lane
  // takes the new key; the lanes after it shift by one. A key at or below the K-th leaves lanes
  // < K as they are: only unused lanes change, and shifts never carry those back.
  struct Lanes {
    __m256i k0, k1, i0, i1;
  };

  static void insert(Lanes& lanes, int32_t key, int64_t index) {
    const __m256i rotate = _mm256_setr_epi32(7, 0, 1, 2, 3, 4, 5, 6);
    const __m256i top = _mm256_set1_epi32(std::numeric_limits<int32_t>::max());
    const __m256i v = _mm256_set1_epi32(key), slot = _mm256_set1_epi32(static_cast<int32_t>(index));
    auto& [k0, k1, i0, i1] = lanes;
    // previous[l] = lane l - 1, with lane -1 a key nothing exceeds.
    const __m256i r0 = _mm256_permutevar8x32_epi32(k0, rotate), r1 = _mm256_permutevar8x32_epi32(k1, rotate);
    const __m256i p0 = _mm256_blend_epi32(r0, top, 1), p1 = _mm256_blend_epi32(r1, r0, 1);
    const __m256i q0 = _mm256_permutevar8x32_epi32(i0, rotate), r1i = _mm256_permutevar8x32_epi32(i1, rotate);
    const __m256i q1 = _mm256_blend_epi32(r1i, q0, 1);
    const __m256i moves0 = _mm256_cmpgt_epi32(v, k0), moves1 = _mm256_cmpgt_epi32(v, k1);
    const __m256i takes0 = _mm256_cmpgt_epi32(v, p0), takes1 = _mm256_cmpgt_epi32(v, p1);
    k0 = blend_lanes(k0, blend_lanes(v, p0, takes0), moves0);
    k1 = blend_lanes(k1, blend_lanes(v, p1, takes1), moves1);
    i0 = blend_lanes(i0, blend_lanes(slot, q0, takes0), moves0);
    i1 = blend_lanes(i1, blend_lanes(slot, q1, takes1), moves1);
  }


  __m256i keys_[2];
  __m256i indices_[2];
  int64_t k_;
};

// For each 8-bit mask, the lanes whose bit is set, in ascending order, one per byte: the
// permutation that packs a vector's selected lanes to its front (AVX2 has no compress).
struct CompactionTable {
  uint64_t lanes[256] = {};
  constexpr CompactionTable() {
    for (int mask = 0; mask < 256; ++mask) {
      int out = 0;
      for (int lane = 0; lane < 8; ++lane) {
        if ((mask >> lane) & 1) lanes[mask] |= static_cast<uint64_t>(lane) << (8 * out++);
      }
    }
  }
};
inline constexpr CompactionTable kCompaction{};

// The top-K of a whole row of at most kMaxColumns float keys, K <= 16: a gate, then ranks, with no
// insertion chain and no branch per key. The row's keys are dealt, vector by vector, to `subsets_`
// x 8 disjoint lane subsets (at least 2K of them, at most 32); t, the K-th largest of the subsets'
// maxima, has at least K keys >= t (those K maxima), so the K-th largest key is >= t: every member
// of the top-K, ties at the K-th key included, passes `key >= t`, and every key that fails is below
// all of them. The keys that pass (about 1.3 K on random rows of 197 to 1024 keys, simulated) are packed
// in index order and ranked by top_k_of_ranked. When more than kRankColumns pass (many equal keys:
// integer grids, duplicates), the row goes through LaneTopK. Both keep LaneTopK's indices, tie rule
// and slot order exactly.
class WholeRowTopK {
 public:
  // Measured at the Table 1 head size (64 features): rows of 2048 keys were 12 % faster whole than
  // streamed; at 4096 the 64-row score tile (1 MiB) no longer stays in L2 and streaming won.
  static constexpr int64_t kMaxColumns = 2048;

  explicit WholeRowTopK(int64_t k)
      : k_(k), subsets_(std::min<int64_t>(kMaxSubsets, (2 * k + 7) / 8)), fallback_(k) {}

  void select(const float* row, int64_t columns, bool index_order, float* keys_out, int64_t* indices_out) {
    if (columns <= kRankColumns) {
      top_k_by_rank(row, columns, k_, index_order, keys_out, indices_out);
      return;
    }
    const int64_t vectors = (columns + 7) / 8;
    store_ordered_row(row, columns, vectors);
    const int64_t passed = pack_passing(threshold(vectors), vectors);
    if (passed >= 0) {
      top_k_of_ranked(passed_keys_, passed_indices_, passed, k_, index_order, keys_out, indices_out);
      return;
    }
    fallback_.reset();
    fallback_.offer_row(row, columns, 0);
    fallback_.read(keys_out, indices_out, index_order);
  }

 private:
  static constexpr int64_t kMaxSubsets = 4;

  // keys_[0, 8 * vectors): the row's ordered_bits, INT32_MIN past its end (below every key).
  void store_ordered_row(const float* row, int64_t columns, int64_t vectors) {
    int64_t c = 0;
    for (; c + 8 <= columns; c += 8) {
      _mm256_store_si256(reinterpret_cast<__m256i*>(keys_ + c), ordered_bits(_mm256_loadu_ps(row + c)));
    }
    for (; c < 8 * vectors; ++c) keys_[c] = c < columns ? ordered_bits(row[c]) : std::numeric_limits<int32_t>::min();
  }

  // Subset s holds vectors s, s + S, s + 2S, ... (S = Subsets); with more than kRankColumns >= 8S
  // keys every lane of every subset holds a key of the row. The K-th largest of the 8S maxima is
  // the least maximum with fewer than K maxima above it, found by counting (no sort, no branch).
  template <int64_t Subsets>
  int32_t threshold_of(int64_t vectors) const {
    __m256i m[Subsets];
    for (int64_t s = 0; s < Subsets; ++s) m[s] = _mm256_set1_epi32(std::numeric_limits<int32_t>::min());
    int64_t v = 0;
    for (; v + Subsets <= vectors; v += Subsets) {
      for (int64_t s = 0; s < Subsets; ++s) {
        m[s] = _mm256_max_epi32(m[s], _mm256_load_si256(reinterpret_cast<const __m256i*>(keys_ + 8 * (v + s))));
      }
    }
    for (int64_t s = 0; v + s < vectors; ++s) {
      m[s] = _mm256_max_epi32(m[s], _mm256_load_si256(reinterpret_cast<const __m256i*>(keys_ + 8 * (v + s))));
    }
    alignas(32) int32_t maxima[8 * Subsets];
    __m256i above[Subsets];
    for (int64_t s = 0; s < Subsets; ++s) {
      _mm256_store_si256(reinterpret_cast<__m256i*>(maxima + 8 * s), m[s]);
      above[s] = _mm256_setzero_si256();
    }
    for (int64_t j = 0; j < 8 * Subsets; ++j) {
      const __m256i other = _mm256_set1_epi32(maxima[j]);
      // Compare results are -1 / 0: subtracting counts.
      for (int64_t s = 0; s < Subsets; ++s) above[s] = _mm256_sub_epi32(above[s], _mm256_cmpgt_epi32(other, m[s]));
    }
    const __m256i none = _mm256_set1_epi32(std::numeric_limits<int32_t>::max());
    const __m256i k = _mm256_set1_epi32(static_cast<int32_t>(k_));
    __m256i least = none;
    for (int64_t s = 0; s < Subsets; ++s) {
      least = _mm256_min_epi32(least, blend_lanes(none, m[s], _mm256_cmpgt_epi32(k, above[s])));
    }
    __m128i half = _mm_min_epi32(_mm256_castsi256_si128(least), _mm256_extracti128_si256(least, 1));
    half = _mm_min_epi32(half, _mm_shuffle_epi32(half, _MM_SHUFFLE(1, 0, 3, 2)));
    half = _mm_min_epi32(half, _mm_shuffle_epi32(half, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(half);
  }

  int32_t threshold(int64_t vectors) const {
    switch (subsets_) {
      case 1: return threshold_of<1>(vectors);
      case 2: return threshold_of<2>(vectors);
      case 3: return threshold_of<3>(vectors);
      default: return threshold_of<4>(vectors);
    }
  }

  // Packs the keys >= threshold and their indices, in index order, into passed_keys_ /
  // passed_indices_ and pads the keys to kRankColumns with INT32_MIN; returns how many, or -1 when
  // more than kRankColumns pass. threshold is a key of the row, so threshold - 1 cannot wrap.
  int64_t pack_passing(int32_t threshold, int64_t vectors) {
    const __m256i below = _mm256_set1_epi32(threshold - 1);
    int64_t count = 0;
    for (int64_t v = 0; v < vectors; ++v) {
      const __m256i keys = _mm256_load_si256(reinterpret_cast<const __m256i*>(keys_ + 8 * v));
      const uint32_t mask = sign_mask(_mm256_cmpgt_epi32(keys, below));
      const __m256i lanes = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(&kCompaction.lanes[mask])));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(passed_keys_ + count), _mm256_permutevar8x32_epi32(keys, lanes));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(passed_indices_ + count),
                          _mm256_add_epi32(lanes, _mm256_set1_epi32(static_cast<int32_t>(8 * v))));
      count += __builtin_popcount(mask);
      if (count > kRankColumns) return -1;
    }
    std::fill(passed_keys_ + count, passed_keys_ + kRankColumns, std::numeric_limits<int32_t>::min());
    return count;
  }

  static __m256i ordered_bits(__m256 values) { return CONVNN_CPU_ISA::ordered_bits(values); }
  static int32_t ordered_bits(float value) { return CONVNN_CPU_ISA::ordered_bits(value); }

  int64_t k_;
  int64_t subsets_;
  LaneTopK fallback_;
  alignas(32) int32_t keys_[kMaxColumns];
  // A vector's store may run 7 lanes past the last kept key before the count is checked.
  alignas(32) int32_t passed_keys_[kRankColumns + 8];
  int32_t passed_indices_[kRankColumns + 8];
};
#endif

}  // namespace convnn::cpu::CONVNN_CPU_ISA
