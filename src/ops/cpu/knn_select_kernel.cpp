// Fused knn_select forward. Per task (slice g, block of kQueryBlock query rows):
//   for each block of kKeyBlock keys: transpose the keys to [D][kKeyBlock] (converted to acc_t,
//   normalised for cosine), compute the score tile with a 4 x 16 register-blocked micro-kernel
//   vectorised over keys, apply the mask, and push every score into the row's running top-K.
// Candidates arrive in ascending index order and only a strictly larger score displaces a kept
// one, so equal scores keep the lower index, as the reference's stable sort does.
// This file is compiled once per instruction set (CONVNN_CPU_ISA); see src/ops/cpu/isa.h.
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/native/CPUBlas.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#if defined(CPU_CAPABILITY_AVX2)
#include <immintrin.h>
#endif

#include "ops/cpu/inverse_index.h"
#include "ops/cpu/isa.h"
#include "ops/cpu/knn_select_kernel.h"

namespace convnn::cpu::CONVNN_CPU_ISA {
namespace {

constexpr int64_t kQueryBlock = 64;
constexpr int64_t kKeyBlock = 128;
constexpr int64_t kRowTile = 4;     // query rows per micro-kernel call
constexpr int64_t kColumnTile = 16; // keys per micro-kernel call

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

enum class Accumulate { Dot, SquaredDistance, MaxAbsDifference };

Accumulate accumulation_of(Similarity s) {
  switch (s) {
    case Similarity::Gaussian: return Accumulate::SquaredDistance;
    case Similarity::Chebyshev: return Accumulate::MaxAbsDifference;
    default: return Accumulate::Dot;
  }
}

// tile[r][c] for kRowTile rows and kColumnTile keys: q rows are [D] apart, kt is [D][ldk]. The
// accumulators stay in vector registers; each key vector is loaded once for kRowTile queries.
template <Accumulate mode, typename acc_t>
inline void micro_kernel(const acc_t* q, int64_t d_size, const acc_t* kt, int64_t ldk, acc_t* tile,
                         int64_t ldt) {
  using Vec = at::vec::Vectorized<acc_t>;
  constexpr int64_t kVecs = kColumnTile / Vec::size();
  static_assert(kColumnTile % Vec::size() == 0, "a column tile is a whole number of vectors");
  Vec acc[kRowTile][kVecs];
  for (int64_t r = 0; r < kRowTile; ++r) {
    for (int64_t v = 0; v < kVecs; ++v) acc[r][v] = Vec(acc_t(0));
  }
  for (int64_t d = 0; d < d_size; ++d) {
    Vec keys[kVecs];
    for (int64_t v = 0; v < kVecs; ++v) keys[v] = Vec::loadu(kt + d * ldk + v * Vec::size());
    for (int64_t r = 0; r < kRowTile; ++r) {
      const Vec query(q[r * d_size + d]);
      for (int64_t v = 0; v < kVecs; ++v) {
        if constexpr (mode == Accumulate::Dot) {
          acc[r][v] = at::vec::fmadd(query, keys[v], acc[r][v]);
        } else if constexpr (mode == Accumulate::SquaredDistance) {
          const Vec diff = query - keys[v];
          acc[r][v] = at::vec::fmadd(diff, diff, acc[r][v]);
        } else {
          // maximum propagates NaN, so a NaN coordinate is reported as unrankable.
          acc[r][v] = at::vec::maximum(acc[r][v], (query - keys[v]).abs());
        }
      }
    }
  }
  for (int64_t r = 0; r < kRowTile; ++r) {
    for (int64_t v = 0; v < kVecs; ++v) acc[r][v].store(tile + r * ldt + v * Vec::size());
  }
}

template <Accumulate mode, typename acc_t>
void score_tile(const acc_t* q, int64_t rows, int64_t d_size, const acc_t* kt, int64_t columns,
                acc_t* tile) {
  for (int64_t r = 0; r < rows; r += kRowTile) {
    for (int64_t c = 0; c < columns; c += kColumnTile) {
      micro_kernel<mode>(q + r * d_size, d_size, kt + c, kKeyBlock, tile + r * kKeyBlock + c,
                         kKeyBlock);
    }
  }
}

// Copies `rows` rows of length d into dst (acc_t), optionally scaled to unit length (cosine).
template <typename scalar_t, typename acc_t>
void load_rows(const scalar_t* src, int64_t rows, int64_t d, bool normalise, acc_t* dst) {
  // The conversion is one flat loop (it vectorises); norms only where they are used.
  for (int64_t e = 0; e < rows * d; ++e) dst[e] = static_cast<acc_t>(src[e]);
  if (!normalise) return;
  for (int64_t r = 0; r < rows; ++r) {
    acc_t* row = dst + r * d;
    acc_t norm_sq = 0;
    for (int64_t j = 0; j < d; ++j) norm_sq += row[j] * row[j];
    const acc_t scale = acc_t(1) / std::max(std::sqrt(norm_sq), static_cast<acc_t>(kCosineEps));
    for (int64_t j = 0; j < d; ++j) row[j] *= scale;
  }
}

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

// The top-K of a whole row of at most 32 candidates (K <= columns), by ranks: candidate j's rank
// is the number of candidates before it in (key descending, index ascending) order, and the K of
// rank below K are kept. The ranks of all 32 lanes grow together, one broadcast candidate l at a
// time (l outranks j when key_l > key_j, or key_l >= key_j with l < j): no dependency chain and no
// data-dependent branch, where the running top-K's insertions chain. With few candidates (random
// candidates, r = 32) that is faster.
constexpr int64_t kRankColumns = 32;
constexpr int64_t kRankVectors = kRankColumns / 8;
static_assert(kRankVectors == 4, "top_k_by_rank adds the outranking of four segments");

// Adds to the ranks what candidates l in [8U, end) outrank. Lanes of vectors before U come before
// l (strict comparison), lanes of vectors after U after it (>=); only vector U is mixed.
template <int64_t U>
inline void add_outranking(const int32_t* keys, int64_t end, const __m256i* key_vectors,
                           const __m256i* key_minus_one, __m256i* rank) {
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
    for (int64_t v = U + 1; v < kRankVectors; ++v) {
      rank[v] = _mm256_sub_epi32(rank[v], _mm256_cmpgt_epi32(key, key_minus_one[v]));
    }
  }
}

inline void top_k_by_rank(const float* row, int64_t columns, int64_t k, bool index_order,
                          float* keys_out, int64_t* indices_out) {
  constexpr int64_t kVectors = kRankVectors;
  alignas(32) int32_t keys[kRankColumns];
  // Lanes past the row hold INT32_MIN, below every ordered float: they outrank nothing (and are
  // never kept).
  for (int64_t c = 0; c < kRankColumns; ++c) {
    keys[c] = c < columns ? ordered_bits(row[c]) : std::numeric_limits<int32_t>::min();
  }
  __m256i key_vectors[kVectors], key_minus_one[kVectors], rank[kVectors];
  for (int64_t v = 0; v < kVectors; ++v) {
    key_vectors[v] = _mm256_load_si256(reinterpret_cast<const __m256i*>(keys + v * 8));
    // x > key - 1 is x >= key; only the INT32_MIN of lanes past the row wraps.
    key_minus_one[v] = _mm256_sub_epi32(key_vectors[v], _mm256_set1_epi32(1));
    rank[v] = _mm256_setzero_si256();
  }
  const auto segment_end = [&](int64_t u) { return std::min(columns, 8 * (u + 1)); };
  add_outranking<0>(keys, segment_end(0), key_vectors, key_minus_one, rank);
  add_outranking<1>(keys, segment_end(1), key_vectors, key_minus_one, rank);
  add_outranking<2>(keys, segment_end(2), key_vectors, key_minus_one, rank);
  add_outranking<3>(keys, segment_end(3), key_vectors, key_minus_one, rank);
  alignas(32) int32_t rank_of[kRankColumns];
  uint32_t kept = 0;
  const __m256i top = _mm256_set1_epi32(static_cast<int32_t>(k));
  for (int64_t v = 0; v < kVectors; ++v) {
    _mm256_store_si256(reinterpret_cast<__m256i*>(rank_of + v * 8), rank[v]);
    kept |= sign_mask(_mm256_cmpgt_epi32(top, rank[v])) << (8 * v);
  }
  kept &= static_cast<uint32_t>((uint64_t{1} << columns) - 1);
  for (int64_t slot = 0; kept != 0; kept &= kept - 1, ++slot) {
    const int j = __builtin_ctz(kept);
    const int64_t out = index_order ? slot : rank_of[j];
    keys_out[out] = from_ordered_bits(keys[j]);
    indices_out[out] = j;
  }
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
#endif

template <typename scalar_t, typename acc_t, typename TopK>
class SelectTask {
 public:
  explicit SelectTask(const KnnSelectParams<scalar_t, acc_t>& p)
      : p_(p),
        d_(p.features),
        normalise_(p.similarity == Similarity::Cosine),
        q_(round_up(kQueryBlock, kRowTile) * d_),
        kt_(d_ * kKeyBlock),
        keys_block_(kKeyBlock * d_),
        tile_(kQueryBlock * kKeyBlock),
        top_keys_(kQueryBlock * p.k),
        top_indices_(kQueryBlock * p.k),
        row_keys_(p.k),
        row_indices_(p.k) {
    tops_.reserve(kQueryBlock);
    for (int64_t r = 0; r < kQueryBlock; ++r) tops_.push_back(make_top(r));
  }

  // Returns false on an unrankable score.
  bool run(int64_t g, int64_t row_begin) {
    const int64_t rows = std::min(kQueryBlock, p_.queries_n - row_begin);
    std::fill(q_.begin(), q_.end(), acc_t(0));
    load_rows(p_.queries + (g * p_.queries_n + row_begin) * d_, rows, d_, normalise_, q_.data());
#if defined(CPU_CAPABILITY_AVX2)
    if constexpr (std::is_same_v<TopK, LaneTopK>) {
      if (p_.keys_m <= kRankColumns) return run_by_rank(g, row_begin, rows);
    }
#endif
    for (int64_t r = 0; r < rows; ++r) tops_[r].reset();
    for (int64_t m0 = 0; m0 < p_.keys_m; m0 += kKeyBlock) {
      const int64_t columns = std::min(kKeyBlock, p_.keys_m - m0);
      load_key_block(g, m0, columns);
      compute_tile(rows, columns);
      if (!push_tile(g, row_begin, rows, m0, columns)) return false;
    }
    write_rows(g, row_begin, rows);
    return true;
  }

 private:
  TopK make_top(int64_t r) {
    if constexpr (std::is_constructible_v<TopK, int64_t>) {
      return TopK(p_.k);
    } else {
      return TopK(top_keys_.data() + r * p_.k, top_indices_.data() + r * p_.k, p_.k);
    }
  }

  void load_key_block(int64_t g, int64_t m0, int64_t columns) {
    load_rows(p_.keys + (g * p_.keys_m + m0) * d_, columns, d_, normalise_, keys_block_.data());
    std::fill(kt_.begin(), kt_.end(), acc_t(0));
    for (int64_t c = 0; c < columns; ++c) {
      for (int64_t j = 0; j < d_; ++j) kt_[j * kKeyBlock + c] = keys_block_[c * d_ + j];
    }
  }

  void compute_tile(int64_t rows, int64_t columns) {
    const int64_t padded_rows = round_up(rows, kRowTile), padded_columns = round_up(columns, kColumnTile);
    switch (accumulation_of(p_.similarity)) {
      case Accumulate::Dot:
        if constexpr (std::is_same_v<acc_t, float>) {
          // A dot-product tile is a GEMM: the BLAS micro-kernel (oneDNN's where the CPU has one)
          // outruns the generic register-blocked loop below.
          at::native::cpublas::brgemm(padded_rows, padded_columns, d_, d_, kKeyBlock, kKeyBlock,
                                      /*add_C=*/false, q_.data(), kt_.data(), tile_.data(),
                                      /*is_vnni=*/false);
        } else {
          score_tile<Accumulate::Dot>(q_.data(), padded_rows, d_, kt_.data(), padded_columns, tile_.data());
        }
        break;
      case Accumulate::SquaredDistance:
        score_tile<Accumulate::SquaredDistance>(q_.data(), padded_rows, d_, kt_.data(), padded_columns, tile_.data());
        break;
      case Accumulate::MaxAbsDifference:
        score_tile<Accumulate::MaxAbsDifference>(q_.data(), padded_rows, d_, kt_.data(), padded_columns, tile_.data());
        break;
    }
  }

  // Turns the raw tile row into ranking keys (as the reference defines them) with the mask
  // applied; returns false on a NaN or +inf key.
  bool ranking_keys(acc_t* row, int64_t columns, int64_t mask_offset) const {
    constexpr acc_t neg_inf = -std::numeric_limits<acc_t>::infinity();
    constexpr acc_t pos_inf = std::numeric_limits<acc_t>::infinity();
    if (p_.similarity == Similarity::ScaledDot) {
      const acc_t root = std::sqrt(static_cast<acc_t>(d_));
      for (int64_t c = 0; c < columns; ++c) row[c] /= root;
    } else if (is_distance_similarity(p_.similarity)) {
      for (int64_t c = 0; c < columns; ++c) row[c] = -row[c];
    }
    if (p_.mask_bool) {
      const bool* allowed = p_.mask_bool + mask_offset;
      for (int64_t c = 0; c < columns; ++c) row[c] = allowed[c] ? row[c] : neg_inf;
    }
    if (p_.mask_additive) {
      const acc_t* added = p_.mask_additive + mask_offset;
      for (int64_t c = 0; c < columns; ++c) row[c] += added[c];
    }
    // NaN and +inf both fail `< +inf`; an integer OR keeps the loop vectorisable.
    int unrankable = 0;
    for (int64_t c = 0; c < columns; ++c) unrankable |= !(row[c] < pos_inf);
    return unrankable == 0;
  }

  bool push_tile(int64_t g, int64_t row_begin, int64_t rows, int64_t m0, int64_t columns) {
    for (int64_t r = 0; r < rows; ++r) {
      acc_t* row = tile_.data() + r * kKeyBlock;
      if (!ranking_keys(row, columns, g * p_.mask_slice_stride + (row_begin + r) * p_.keys_m + m0)) return false;
      tops_[r].offer_row(row, columns, m0);
    }
    return true;
  }

#if defined(CPU_CAPABILITY_AVX2)
  // All candidates fit one key block of at most kRankColumns: rank each row whole.
  bool run_by_rank(int64_t g, int64_t row_begin, int64_t rows) {
    load_key_block(g, 0, p_.keys_m);
    compute_tile(rows, p_.keys_m);
    for (int64_t r = 0; r < rows; ++r) {
      acc_t* row = tile_.data() + r * kKeyBlock;
      if (!ranking_keys(row, p_.keys_m, g * p_.mask_slice_stride + (row_begin + r) * p_.keys_m)) {
        return false;
      }
      top_k_by_rank(row, p_.keys_m, p_.k, p_.index_order, row_keys_.data(), row_indices_.data());
      write_row(g, row_begin + r);
    }
    return true;
  }
#endif

  void write_rows(int64_t g, int64_t row_begin, int64_t rows) {
    for (int64_t r = 0; r < rows; ++r) {
      tops_[r].read(row_keys_.data(), row_indices_.data(), p_.index_order);
      write_row(g, row_begin + r);
    }
  }

  // Writes row_keys_ / row_indices_ out as query i's scores and indices.
  void write_row(int64_t g, int64_t i) {
    const bool distance = is_distance_similarity(p_.similarity);
    const int64_t out = (g * p_.queries_n + i) * p_.k;
    for (int64_t s = 0; s < p_.k; ++s) {
      const acc_t key = row_keys_[s];
      const bool masked = key == -std::numeric_limits<acc_t>::infinity();
      p_.scores[out + s] = static_cast<scalar_t>(distance && !masked ? std::exp(key) : key);
      p_.indices[out + s] = row_indices_[s];
    }
  }

  const KnnSelectParams<scalar_t, acc_t>& p_;
  const int64_t d_;
  const bool normalise_;
  std::vector<acc_t> q_, kt_, keys_block_, tile_, top_keys_;
  std::vector<int64_t> top_indices_;
  std::vector<acc_t> row_keys_;
  std::vector<int64_t> row_indices_;
  std::vector<TopK> tops_;
};

// ---- Backward ------------------------------------------------------------------------------------

template <typename scalar_t, typename acc_t>
void load_row(const scalar_t* src, int64_t d, acc_t* dst) {
  for (int64_t j = 0; j < d; ++j) dst[j] = static_cast<acc_t>(src[j]);
}

template <typename acc_t>
acc_t dot(const acc_t* a, const acc_t* b, int64_t d) {
  acc_t sum = 0;
  for (int64_t j = 0; j < d; ++j) sum += a[j] * b[j];
  return sum;
}

// out += g * d sim(q, k) / d(q) when wrt_query, else d sim(q, k) / d(k); the formulas of the
// reference backward (src/ops/reference/knn_select.cpp).
template <typename acc_t>
void add_pair_gradient(Similarity similarity, const acc_t* q, const acc_t* k, int64_t d, acc_t g,
                       bool wrt_query, acc_t* out) {
  const acc_t* other = wrt_query ? k : q;
  switch (similarity) {
    case Similarity::Dot:
    case Similarity::ScaledDot: {
      const acc_t scale = similarity == Similarity::Dot ? g : g / std::sqrt(static_cast<acc_t>(d));
      for (int64_t j = 0; j < d; ++j) out[j] += scale * other[j];
      return;
    }
    case Similarity::Cosine: {
      const acc_t eps = static_cast<acc_t>(kCosineEps);
      const acc_t q_norm = std::sqrt(dot(q, q, d)), k_norm = std::sqrt(dot(k, k, d));
      const acc_t q_scale = acc_t(1) / std::max(q_norm, eps), k_scale = acc_t(1) / std::max(k_norm, eps);
      const acc_t s = dot(q, k, d) * q_scale * k_scale;
      const acc_t self_norm = wrt_query ? q_norm : k_norm;
      const acc_t self_scale = wrt_query ? q_scale : k_scale, other_scale = wrt_query ? k_scale : q_scale;
      const acc_t* self = wrt_query ? q : k;
      if (self_norm > eps) {
        for (int64_t j = 0; j < d; ++j) out[j] += g * (other[j] * other_scale - s * self[j] * self_scale) / self_norm;
      } else {
        for (int64_t j = 0; j < d; ++j) out[j] += g * other[j] * other_scale / eps;
      }
      return;
    }
    case Similarity::Gaussian: {
      acc_t distance_sq = 0;
      for (int64_t j = 0; j < d; ++j) distance_sq += (q[j] - k[j]) * (q[j] - k[j]);
      const acc_t scale = (wrt_query ? -2 : 2) * g * std::exp(-distance_sq);
      for (int64_t j = 0; j < d; ++j) out[j] += scale * (q[j] - k[j]);
      return;
    }
    case Similarity::Chebyshev: {
      int64_t arg = 0;  // the first coordinate of largest |q - k|, as at::max picks
      for (int64_t j = 1; j < d; ++j) {
        if (std::abs(q[j] - k[j]) > std::abs(q[arg] - k[arg])) arg = j;
      }
      const acc_t diff = q[arg] - k[arg];
      const acc_t sign = diff > 0 ? acc_t(1) : (diff < 0 ? acc_t(-1) : acc_t(0));
      out[arg] += (wrt_query ? -1 : 1) * g * std::exp(-std::abs(diff)) * sign;
      return;
    }
  }
}

template <typename scalar_t, typename acc_t>
bool slot_contributes(const KnnSelectBackwardParams<scalar_t, acc_t>& p, int64_t g, int64_t i, int64_t s) {
  return static_cast<acc_t>(p.scores.at(g, i, s)) != -std::numeric_limits<acc_t>::infinity() &&
         static_cast<acc_t>(p.grad_scores.at(g, i, s)) != acc_t(0);
}

template <typename scalar_t, typename acc_t>
void store_row(const acc_t* src, int64_t d, scalar_t* dst) {
  for (int64_t j = 0; j < d; ++j) dst[j] = static_cast<scalar_t>(src[j]);
}

template <typename scalar_t, typename acc_t>
void grad_queries_pass(const KnnSelectBackwardParams<scalar_t, acc_t>& p) {
  const int64_t d = p.features;
  at::parallel_for(0, p.slices * p.queries_n, 16, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> q(d), key(d), out(d);
    for (int64_t row = begin; row < end; ++row) {
      const int64_t g = row / p.queries_n, i = row % p.queries_n;
      load_row(p.queries + row * d, d, q.data());
      std::fill(out.begin(), out.end(), acc_t(0));
      for (int64_t s = 0; s < p.k; ++s) {
        if (!slot_contributes(p, g, i, s)) continue;
        load_row(p.keys + (g * p.keys_m + p.indices.at(g, i, s)) * d, d, key.data());
        add_pair_gradient(p.similarity, q.data(), key.data(), d,
                          static_cast<acc_t>(p.grad_scores.at(g, i, s)), true, out.data());
      }
      store_row(out.data(), d, p.grad_queries + row * d);
    }
  });
}

template <typename scalar_t, typename acc_t>
void grad_keys_pass(const KnnSelectBackwardParams<scalar_t, acc_t>& p) {
  const int64_t d = p.features;
  const InverseIndex inverse(p.indices, p.slices, p.queries_n, p.k, p.keys_m);
  at::parallel_for(0, p.slices * p.keys_m, 16, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> q(d), key(d), out(d);
    for (int64_t row = begin; row < end; ++row) {
      const int64_t g = row / p.keys_m, j = row % p.keys_m;
      load_row(p.keys + row * d, d, key.data());
      std::fill(out.begin(), out.end(), acc_t(0));
      for (const int64_t* slot = inverse.begin(g, j); slot != inverse.end(g, j); ++slot) {
        const int64_t i = inverse.query(*slot), s = inverse.tap(*slot);
        if (!slot_contributes(p, g, i, s)) continue;
        load_row(p.queries + (g * p.queries_n + i) * d, d, q.data());
        add_pair_gradient(p.similarity, q.data(), key.data(), d,
                          static_cast<acc_t>(p.grad_scores.at(g, i, s)), false, out.data());
      }
      store_row(out.data(), d, p.grad_keys + row * d);
    }
  });
}

}  // namespace

template <typename scalar_t, typename acc_t>
void knn_select_backward(const KnnSelectBackwardParams<scalar_t, acc_t>& p) {
  grad_queries_pass(p);
  grad_keys_pass(p);
}

template void knn_select_backward(const KnnSelectBackwardParams<float, float>&);
template void knn_select_backward(const KnnSelectBackwardParams<double, double>&);
template void knn_select_backward(const KnnSelectBackwardParams<c10::BFloat16, float>&);
template void knn_select_backward(const KnnSelectBackwardParams<c10::Half, float>&);

namespace {

template <typename scalar_t, typename acc_t, typename TopK>
bool select_blocks(const KnnSelectParams<scalar_t, acc_t>& p) {
  const int64_t blocks_per_slice = (p.queries_n + kQueryBlock - 1) / kQueryBlock;
  std::atomic<bool> rankable{true};
  at::parallel_for(0, p.slices * blocks_per_slice, 1, [&](int64_t begin, int64_t end) {
    SelectTask<scalar_t, acc_t, TopK> task(p);
    for (int64_t t = begin; t < end && rankable.load(std::memory_order_relaxed); ++t) {
      if (!task.run(t / blocks_per_slice, (t % blocks_per_slice) * kQueryBlock)) rankable = false;
    }
  });
  return rankable.load();
}

}  // namespace

template <typename scalar_t, typename acc_t>
bool knn_select_forward(const KnnSelectParams<scalar_t, acc_t>& p) {
#if defined(CPU_CAPABILITY_AVX2)
  if constexpr (std::is_same_v<acc_t, float>) {
    if (p.k <= LaneTopK::kLanes && p.keys_m <= std::numeric_limits<int32_t>::max()) {
      return select_blocks<scalar_t, acc_t, LaneTopK>(p);
    }
  }
#endif
  return select_blocks<scalar_t, acc_t, RunningTopK<acc_t>>(p);
}

template bool knn_select_forward(const KnnSelectParams<float, float>&);
template bool knn_select_forward(const KnnSelectParams<double, double>&);
template bool knn_select_forward(const KnnSelectParams<c10::BFloat16, float>&);
template bool knn_select_forward(const KnnSelectParams<c10::Half, float>&);

}  // namespace convnn::cpu::CONVNN_CPU_ISA
