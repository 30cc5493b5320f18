// Fused knn_select forward. Per task (slice g, block of kQueryBlock query rows):
//   for each block of kKeyBlock keys: transpose the keys to [D][kKeyBlock] (converted to acc_t),
//   compute the score tile with a 4 x 16 register-blocked micro-kernel
//   vectorised over keys (the similarity policy's accumulate on whole vectors; a GEMM for dot
//   products), turn it into ranking keys, apply the mask, and push every key into the row's
//   running top-K (top_k.h); a block a bool mask hides from every row is skipped once each row
//   holds K candidates (the keys past a causal block's diagonal; whole rows end at the last block
//   any of their rows may select).
// Rows of at most WholeRowTopK::kMaxColumns keys (AVX2, float, K <= 16) take one block as wide as
// the row instead, its keys transposed once per slice, and select each row whole (WholeRowTopK):
// at short rows the running top-K's insertions, not the scores, were most of the time.
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
#include <limits>
#include <optional>
#include <type_traits>
#include <vector>

#include "ops/cpu/isa.h"
#include "ops/cpu/knn_select_kernel.h"
#include "ops/cpu/top_k.h"
#include "ops/cpu/upcoming_lines.h"
#include "ops/cpu/gemm_distance.h"
#include "ops/cpu/vec_arith.h"
#include "ops/kernels/similarity.h"

namespace convnn::cpu::CONVNN_CPU_ISA {
namespace {

constexpr int64_t kQueryBlock = 64;
constexpr int64_t kKeyBlock = 128;
constexpr int64_t kRowTile = 4;     // query rows per micro-kernel call
constexpr int64_t kColumnTile = 16; // keys per micro-kernel call
// A whole-row tile's transposed keys stay within 1 MiB of acc_t (in L2 beside the score tile).
constexpr int64_t kWholeRowTileElements = int64_t{1} << 18;
constexpr int64_t kWholeRowMaxKeys = 2048;
#if defined(CPU_CAPABILITY_AVX2)
static_assert(kWholeRowMaxKeys == WholeRowTopK::kMaxColumns, "whole rows are as long as WholeRowTopK takes");
#endif
// Gaussian rows take the GEMM identity (gemm_distance.h) where its fixed cost per row (bounds, a
// top-K of them, the exact sums of about K keys) is below what the GEMM saves on the row's M x D
// pairs: from 32 features, and 1024 keys or 48 Ki pairs (measured on AMD Zen 5, 2 threads, K = 9:
// 768 keys x 64 features 9 % faster, x 32 10 % slower; 512 x 64 even, x 128 8 % faster; 1024 x 32
// 25 % faster, x 16 5 % slower, x 4 60 % slower; 2048 x 64 2x faster; 197 x 64, Table 1's heads,
// 1.5x slower).
constexpr int64_t kGemmDistanceMinFeatures = 32;
constexpr int64_t kGemmDistanceMinKeys = 1024;
constexpr int64_t kGemmDistanceMinPairs = 48 * 1024;

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// row[c] = -inf where a bool mask disallows key c. The mask read as bytes and each key loaded
// before its store, so that the loop vectorises: written `row[c] = allowed[c] ? row[c] : -inf`,
// GCC 12 compiled a compare, a branch and a conditional store per key.
template <typename acc_t>
void mask_row(acc_t* row, const bool* allowed, int64_t columns) {
  constexpr acc_t neg_inf = -std::numeric_limits<acc_t>::infinity();
  const auto* bytes = reinterpret_cast<const unsigned char*>(allowed);
  for (int64_t c = 0; c < columns; ++c) {
    const acc_t key = row[c];
    row[c] = bytes[c] != 0 ? key : neg_inf;
  }
}

// tile[r][c] for kRowTile rows and kColumnTile keys: q rows are [D] apart, kt is [D][ldk]. The
// accumulators stay in vector registers; each key vector is loaded once for kRowTile queries.
template <typename Policy, typename acc_t>
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
        acc[r][v] = Policy::accumulate(acc[r][v], query, keys[v]);
      }
    }
  }
  for (int64_t r = 0; r < kRowTile; ++r) {
    for (int64_t v = 0; v < kVecs; ++v) acc[r][v].store(tile + r * ldt + v * Vec::size());
  }
}

// One lane of the vectors the direct path accumulates in (at::vec::Vectorized<float>), as a scalar:
// Policy::accumulate on VectorLane values performs what it performs on each lane of those vectors,
// so a distance summed in VectorLane is the same bits as the direct path's. at::vec's fmadd is one
// fused multiply-add per lane in the AVX2 build (_mm256_fmadd_ps) and its generic a * b + c (a
// rounded product, then a rounded sum) in the baseline build.
struct VectorLane {
  float value;
  friend VectorLane operator-(VectorLane a, VectorLane b) { return {a.value - b.value}; }
};

}  // namespace
}  // namespace convnn::cpu::CONVNN_CPU_ISA

namespace convnn::kernels {
template <>
struct Arith<cpu::CONVNN_CPU_ISA::VectorLane> {
  using Lane = cpu::CONVNN_CPU_ISA::VectorLane;
  static Lane fmadd(Lane a, Lane b, Lane c) {
#if defined(CPU_CAPABILITY_AVX2)
    return {std::fma(a.value, b.value, c.value)};
#else
    volatile float product = a.value * b.value;  // rounded on its own, never fused into the sum
    return {product + c.value};
#endif
  }
};
}  // namespace convnn::kernels

namespace convnn::cpu::CONVNN_CPU_ISA {
namespace {

// kt is [D][width], tile [rows][width].
template <typename Policy, typename acc_t>
void score_tile(const acc_t* q, int64_t rows, int64_t d_size, const acc_t* kt, int64_t columns,
                int64_t width, acc_t* tile) {
  for (int64_t r = 0; r < rows; r += kRowTile) {
    for (int64_t c = 0; c < columns; c += kColumnTile) {
      micro_kernel<Policy>(q + r * d_size, d_size, kt + c, width, tile + r * width + c, width);
    }
  }
}

// Copies `rows` rows of length d into dst (acc_t), in one flat loop (it vectorises).
template <typename scalar_t, typename acc_t>
void load_rows(const scalar_t* src, int64_t rows, int64_t d, acc_t* dst) {
  for (int64_t e = 0; e < rows * d; ++e) dst[e] = static_cast<acc_t>(src[e]);
}

// The policy's inverse norm of each of `rows` rows of length d (cosine's factors), into out.
template <typename Policy, typename acc_t>
void inverse_norms(const acc_t* src, int64_t rows, int64_t d, acc_t* out) {
  if constexpr (Policy::kScalesByInverseNorms) {
    for (int64_t r = 0; r < rows; ++r) out[r] = Policy::inverse_norm(src + r * d, d);
  }
}

// Selects Gaussian rows of float keys from their dot products with the slice's keys, as
// gemm_distance.h proves exact: bounds, the keys they cannot rule out, and those ranked by the
// exact sums (in VectorLane, as the direct path computes them). One per task.
template <typename Policy>
class DistanceRowSelector {
 public:
  DistanceRowSelector(int64_t features, int64_t k, int64_t width)
      : d_(features),
        k_(k),
        bounds_(features),
        key_squares_(width),
        key_roots_(width),
        lower_(width),
        upper_(width),
        candidates_(width),
        candidate_keys_(width),
        tau_keys_(k),
        tau_indices_(k),
        top_keys_(k),
        top_indices_(k) {
#if defined(CPU_CAPABILITY_AVX2)
    if (k <= LaneTopK::kLanes) whole_row_top_.emplace(k);
#endif
  }

  // The slice's `columns` keys, as rows ([columns][D]) and transposed ([D][width]): their squared
  // norms and norms, summed over the features in order (any order would do: the bounds hold for
  // every order).
  void set_keys(const float* rows, const float* kt, int64_t width, int64_t columns) {
    rows_ = rows;
    columns_ = columns;
    std::fill_n(key_squares_.data(), columns, 0.0f);
    for (int64_t j = 0; j < d_; ++j) {
      for (int64_t c = 0; c < columns; ++c) key_squares_[c] += kt[j * width + c] * kt[j * width + c];
    }
    key_root_max_ = 0;
    keys_finite_ = true;
    for (int64_t c = 0; c < columns; ++c) {
      key_roots_[c] = std::sqrt(key_squares_[c]);
      key_root_max_ = std::max(key_root_max_, key_roots_[c]);
      keys_finite_ = keys_finite_ && std::isfinite(key_squares_[c]);
    }
  }

  // Selects the query row q ([D]) from its dot products with the keys, masked by allowed / added
  // (each null, or the row's), into keys_out / indices_out (slot order as index_order says);
  // returns false on an unrankable key (a NaN distance).
  bool select(const float* q, const float* dots, const bool* allowed, const float* added, bool index_order,
              float* keys_out, int64_t* indices_out) {
    float q_square = 0;
    for (int64_t j = 0; j < d_; ++j) q_square += q[j] * q[j];
    const float q_root = std::sqrt(q_square);
    int64_t count = columns_;
    if (keys_finite_ && DistanceBounds::finite(q_root, key_root_max_)) {
      bounds_.row(q_square, q_root, dots, key_squares_.data(), key_roots_.data(), columns_, lower_.data(),
                  upper_.data());
      apply_masks(lower_.data(), allowed, added);
      apply_masks(upper_.data(), allowed, added);
      count = list_candidates(kth_largest(lower_.data()));
    } else {
      for (int64_t c = 0; c < columns_; ++c) candidates_[c] = c;
    }
    if (!exact_keys(q, count, allowed, added)) return false;
    RunningTopK<float> top(top_keys_.data(), top_indices_.data(), k_);
    for (int64_t t = 0; t < count; ++t) top.offer(candidate_keys_[t], candidates_[t]);
    top.read(keys_out, indices_out, index_order);
    return true;
  }

 private:
  void apply_masks(float* row, const bool* allowed, const float* added) const {
    if (allowed != nullptr) mask_row(row, allowed, columns_);
    if (added != nullptr) {
      for (int64_t c = 0; c < columns_; ++c) row[c] += added[c];
    }
  }

  // The K-th largest of the row's lower bounds.
  float kth_largest(const float* row) {
#if defined(CPU_CAPABILITY_AVX2)
    if (whole_row_top_) {
      whole_row_top_->select(row, columns_, /*index_order=*/false, tau_keys_.data(), tau_indices_.data());
      return tau_keys_[k_ - 1];
    }
#endif
    RunningTopK<float> top(tau_keys_.data(), tau_indices_.data(), k_);
    top.offer_row(row, columns_, 0);
    return tau_keys_[k_ - 1];
  }

  // Lists, in ascending order, the keys whose upper bound reaches tau (a NaN bound would too);
  // returns how many. Few keys pass: a vector of bounds at a time, the passing lanes by their bits.
  int64_t list_candidates(float tau) {
    int64_t count = 0, c = 0;
#if defined(CPU_CAPABILITY_AVX2)
    const __m256 threshold = _mm256_set1_ps(tau);
    for (; c + 8 <= columns_; c += 8) {
      // Not less than: unordered (NaN) lanes pass too.
      int bits = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(upper_.data() + c), threshold, _CMP_NLT_UQ));
      for (; bits != 0; bits &= bits - 1) candidates_[count++] = c + __builtin_ctz(static_cast<unsigned>(bits));
    }
#endif
    for (; c < columns_; ++c) {
      if (!(upper_[c] < tau)) candidates_[count++] = c;
    }
    return count;
  }

  // The listed keys' ranking keys from their exact distances, masked as ranking_keys masks; returns
  // false on a NaN or +inf key. kChains candidates at a time, each summed in its own chain (straight
  // from the key rows), so that the chains' latencies overlap.
  bool exact_keys(const float* q, int64_t count, const bool* allowed, const float* added) {
    constexpr int64_t kChains = 8;
    for (int64_t t0 = 0; t0 < count; t0 += kChains) {
      const int64_t chains = std::min(kChains, count - t0);
      const float* keys[kChains];
      // Chains past the count repeat the first candidate; their sums are not read.
      for (int64_t t = 0; t < kChains; ++t) keys[t] = rows_ + candidates_[t0 + (t < chains ? t : 0)] * d_;
      VectorLane sums[kChains];
      for (auto& sum : sums) sum = {0.0f};
      for (int64_t j = 0; j < d_; ++j) {
        const VectorLane query{q[j]};
        for (int64_t t = 0; t < kChains; ++t) sums[t] = Policy::accumulate(sums[t], query, VectorLane{keys[t][j]});
      }
      for (int64_t t = 0; t < chains; ++t) candidate_keys_[t0 + t] = sums[t].value;
    }
    Policy::to_ranking_keys(candidate_keys_.data(), count, d_);
    int unrankable = 0;
    for (int64_t t = 0; t < count; ++t) {
      float& key = candidate_keys_[t];
      if (allowed != nullptr && !allowed[candidates_[t]]) key = -std::numeric_limits<float>::infinity();
      if (added != nullptr) key += added[candidates_[t]];
      unrankable |= !(key < std::numeric_limits<float>::infinity());
    }
    return unrankable == 0;
  }

  const int64_t d_, k_;
  const DistanceBounds bounds_;
  const float* rows_ = nullptr;  // the slice's keys, [columns_][D]
  int64_t columns_ = 0;
  float key_root_max_ = 0;
  bool keys_finite_ = false;  // every squared norm finite (a NaN would hide from key_root_max_)
  std::vector<float> key_squares_, key_roots_, lower_, upper_;
  std::vector<int64_t> candidates_;
  std::vector<float> candidate_keys_, tau_keys_;
  std::vector<int64_t> tau_indices_;
  std::vector<float> top_keys_;
  std::vector<int64_t> top_indices_;
#if defined(CPU_CAPABILITY_AVX2)
  std::optional<WholeRowTopK> whole_row_top_;
#endif
};

template <typename Policy, typename scalar_t, typename acc_t, typename TopK>
class SelectTask {
 public:
  explicit SelectTask(const KnnSelectParams<scalar_t, acc_t>& p)
      : p_(p),
        d_(p.features),
        whole_rows_(selects_whole_rows(p)),
        distance_rows_(selects_distance_rows(p)),
        width_(whole_rows_ || distance_rows_ ? round_up(p.keys_m, kColumnTile) : kKeyBlock),
        q_(round_up(kQueryBlock, kRowTile) * d_),
        kt_(d_ * width_),
        keys_block_(kTransposesInputs ? 0 : width_ * d_),
        tile_(kQueryBlock * width_),
        top_keys_(kQueryBlock * p.k),
        query_factors_(Policy::kScalesByInverseNorms ? kQueryBlock : 0),
        key_factors_(Policy::kScalesByInverseNorms ? width_ : 0),
        top_indices_(kQueryBlock * p.k),
        row_keys_(p.k),
        row_indices_(p.k) {
    tops_.reserve(kQueryBlock);
    for (int64_t r = 0; r < kQueryBlock; ++r) tops_.push_back(make_top(r));
#if defined(CPU_CAPABILITY_AVX2)
    if (whole_rows_) whole_row_top_.emplace(p.k);
#endif
    if constexpr (kGemmDistance) {
      if (distance_rows_) distance_selector_.emplace(d_, p.k, width_);
    }
  }

  // Returns false on an unrankable score.
  bool run(int64_t g, int64_t row_begin) {
    const int64_t rows = std::min(kQueryBlock, p_.queries_n - row_begin);
    std::fill(q_.begin(), q_.end(), acc_t(0));
    load_rows(p_.queries + (g * p_.queries_n + row_begin) * d_, rows, d_, q_.data());
    inverse_norms<Policy>(q_.data(), rows, d_, query_factors_.data());
    if constexpr (kGemmDistance) {
      if (distance_rows_) return run_distance_rows(g, row_begin, rows);
    }
#if defined(CPU_CAPABILITY_AVX2)
    if constexpr (std::is_same_v<TopK, LaneTopK>) {
      if (whole_rows_) return run_whole_rows(g, row_begin, rows);
    }
#endif
    for (int64_t r = 0; r < rows; ++r) tops_[r].reset();
    int64_t offered = 0;  // candidates offered to every row so far
    for (int64_t m0 = 0; m0 < p_.keys_m; m0 += kKeyBlock) {
      const int64_t columns = std::min(kKeyBlock, p_.keys_m - m0);
      // Once every row holds K candidates, keys the mask hides from all the block's rows change
      // nothing (a masked key, -inf, displaces no kept one; its score is never tested): a causal
      // block of rows scores the keys up to its diagonal only.
      if (offered >= p_.k && hidden_from_every_row(g, row_begin, rows, m0, columns)) continue;
      load_key_block(g, m0, columns);
      compute_tile(rows, columns);
      if (!push_tile(g, row_begin, rows, m0, columns)) return false;
      offered += columns;
    }
    write_rows(g, row_begin, rows);
    return true;
  }

 private:
  // Keys already in acc_t are transposed from the input, without a converted copy.
  static constexpr bool kTransposesInputs = std::is_same_v<scalar_t, acc_t>;

  static bool fits_whole_row_tile(const KnnSelectParams<scalar_t, acc_t>& p) {
    return p.keys_m <= kWholeRowMaxKeys && round_up(p.keys_m, kColumnTile) * p.features <= kWholeRowTileElements;
  }

  static bool selects_whole_rows(const KnnSelectParams<scalar_t, acc_t>& p) {
#if defined(CPU_CAPABILITY_AVX2)
    if constexpr (std::is_same_v<TopK, LaneTopK>) return fits_whole_row_tile(p);
#endif
    return false;
  }

  // Gaussian on float keys through the GEMM identity (gemm_distance.h): whole rows of a slice.
  static constexpr bool kGemmDistance =
      std::is_same_v<Policy, kernels::GaussianSimilarity> && std::is_same_v<acc_t, float>;

  static bool selects_distance_rows(const KnnSelectParams<scalar_t, acc_t>& p) {
    return kGemmDistance && fits_whole_row_tile(p) && p.features >= kGemmDistanceMinFeatures &&
           (p.keys_m >= kGemmDistanceMinKeys || p.keys_m * p.features >= kGemmDistanceMinPairs);
  }

  TopK make_top(int64_t r) {
    if constexpr (std::is_constructible_v<TopK, int64_t>) {
      return TopK(p_.k);
    } else {
      return TopK(top_keys_.data() + r * p_.k, top_indices_.data() + r * p_.k, p_.k);
    }
  }

  // kt_ = the block's keys as [D][width_] acc_t, zero in the padding columns the tile reads.
  // Returns the block's keys as acc_t rows ([columns][D]).
  const acc_t* load_key_block(int64_t g, int64_t m0, int64_t columns) {
    const scalar_t* src = p_.keys + g * p_.keys_slice_stride + m0 * d_;
    const acc_t* rows = nullptr;
    if constexpr (kTransposesInputs) {
      rows = src;  // already acc_t: transposed straight from the input
    } else {
      load_rows(src, columns, d_, keys_block_.data());
      rows = keys_block_.data();
    }
    inverse_norms<Policy>(rows, columns, d_, key_factors_.data());
    transpose_rows(rows, columns);
    const int64_t padded = round_up(columns, kColumnTile);
    for (int64_t j = 0; j < d_; ++j) std::fill(kt_.data() + j * width_ + columns, kt_.data() + j * width_ + padded, acc_t(0));
    return rows;
  }

  // kt_[j][c] = rows[c][j] for c < columns, in 8 x 8 blocks (vectorised where ATen has them).
  void transpose_rows(const acc_t* rows, int64_t columns) {
    constexpr int64_t kBlock = 8;
    for (int64_t c0 = 0; c0 < columns; c0 += kBlock) {
      const int64_t c_count = std::min(kBlock, columns - c0);
      for (int64_t j0 = 0; j0 < d_; j0 += kBlock) {
        const int64_t j_count = std::min(kBlock, d_ - j0);
        const acc_t* from = rows + c0 * d_ + j0;
        acc_t* to = kt_.data() + j0 * width_ + c0;
        if (c_count == kBlock && j_count == kBlock) {
          at::vec::transpose_mxn<acc_t, kBlock, kBlock>(from, d_, to, width_);
        } else {
          at::vec::transpose_mxn<acc_t>(from, d_, to, width_, static_cast<int>(c_count), static_cast<int>(j_count));
        }
      }
    }
  }

  void compute_tile(int64_t rows, int64_t columns) {
    const int64_t padded_rows = round_up(rows, kRowTile), padded_columns = round_up(columns, kColumnTile);
    // A dot-product tile is a GEMM: the BLAS micro-kernel (oneDNN's where the CPU has one)
    // outruns the generic register-blocked loop below. Distance rows' tiles are dot products too.
    if constexpr (std::is_same_v<acc_t, float>) {
      if (Policy::kIsDotProduct || distance_rows_) {
        at::native::cpublas::brgemm(padded_rows, padded_columns, d_, d_, width_, width_,
                                    /*add_C=*/false, q_.data(), kt_.data(), tile_.data(),
                                    /*is_vnni=*/false);
        return;
      }
    }
    score_tile<Policy>(q_.data(), padded_rows, d_, kt_.data(), padded_columns, width_, tile_.data());
  }

  // Turns the raw tile row of query row r into ranking keys (as the reference defines them) with
  // the mask applied; returns false on a NaN or +inf key.
  bool ranking_keys(acc_t* row, int64_t r, int64_t columns, int64_t mask_offset) const {
    constexpr acc_t pos_inf = std::numeric_limits<acc_t>::infinity();
    if constexpr (Policy::kScalesByInverseNorms) {
      const acc_t query_factor = query_factors_[r];
      for (int64_t c = 0; c < columns; ++c) row[c] = row[c] * query_factor * key_factors_[c];
    }
    Policy::to_ranking_keys(row, columns, d_);
    if (p_.mask_bool) mask_row(row, p_.mask_bool + mask_offset, columns);
    if (p_.mask_additive) {
      const acc_t* added = p_.mask_additive + mask_offset;
      for (int64_t c = 0; c < columns; ++c) row[c] += added[c];
    }
    // NaN and +inf both fail `< +inf`; an integer OR keeps the loop vectorisable.
    int unrankable = 0;
    for (int64_t c = 0; c < columns; ++c) unrankable |= !(row[c] < pos_inf);
    return unrankable == 0;
  }

  // Whether a bool mask (and no additive one, whose +inf on a masked key is reported) allows none
  // of keys m0 .. m0 + columns - 1 to any of the rows.
  bool hidden_from_every_row(int64_t g, int64_t row_begin, int64_t rows, int64_t m0, int64_t columns) const {
    if (p_.mask_bool == nullptr || p_.mask_additive != nullptr) return false;
    for (int64_t r = 0; r < rows; ++r) {
      // Bytes, ORed without an early exit inside the row, so that the loop vectorises.
      const auto* allowed = reinterpret_cast<const unsigned char*>(
          p_.mask_bool + p_.mask_slice_offset(g) + (row_begin + r) * p_.keys_m + m0);
      unsigned char any = 0;
      for (int64_t c = 0; c < columns; ++c) any |= allowed[c];
      if (any != 0) return false;
    }
    return true;
  }

  // One past the last block of kKeyBlock keys that a bool mask does not hide from every row (M
  // without a bool mask).
  int64_t allowed_extent(int64_t g, int64_t row_begin, int64_t rows) const {
    int64_t extent = p_.keys_m;
    while (extent > 0) {
      const int64_t m0 = (extent - 1) / kKeyBlock * kKeyBlock;
      if (!hidden_from_every_row(g, row_begin, rows, m0, extent - m0)) break;
      extent = m0;
    }
    return extent;
  }

  bool push_tile(int64_t g, int64_t row_begin, int64_t rows, int64_t m0, int64_t columns) {
    for (int64_t r = 0; r < rows; ++r) {
      if (m0 == 0) upcoming_.step();
      acc_t* row = tile_.data() + r * width_;
      if (!ranking_keys(row, r, columns, p_.mask_slice_offset(g) + (row_begin + r) * p_.keys_m + m0)) return false;
      tops_[r].offer_row(row, columns, m0);
    }
    return true;
  }

#if defined(CPU_CAPABILITY_AVX2)
  // One tile holds every key of the slice: its keys are transposed once for all the slice's blocks
  // of rows this task runs, and each row is selected whole.
  bool run_whole_rows(int64_t g, int64_t row_begin, int64_t rows) {
    if (g != transposed_slice_) {
      load_key_block(g, 0, p_.keys_m);
      transposed_slice_ = g;
    }
    // The keys past the last block any row may select are left out, as the streamed blocks skip
    // them; at least K keys stay, so a short row's masked slots are the same lowest indices.
    const int64_t columns = std::max(allowed_extent(g, row_begin, rows), p_.k);
    compute_tile(rows, columns);
    for (int64_t r = 0; r < rows; ++r) {
      upcoming_.step();
      acc_t* row = tile_.data() + r * width_;
      if (!ranking_keys(row, r, columns, p_.mask_slice_offset(g) + (row_begin + r) * p_.keys_m)) {
        return false;
      }
      whole_row_top_->select(row, columns, p_.index_order, row_keys_.data(), row_indices_.data());
      write_row(g, row_begin + r);
    }
    return true;
  }
#endif

  // Gaussian rows through the GEMM identity: the slice's keys transposed once per slice (their
  // norms with them), one GEMM of dot products per block of rows, then each row by the selector.
  bool run_distance_rows(int64_t g, int64_t row_begin, int64_t rows) {
    if (g != transposed_slice_) {
      const acc_t* key_rows = load_key_block(g, 0, p_.keys_m);
      distance_selector_->set_keys(key_rows, kt_.data(), width_, p_.keys_m);
      transposed_slice_ = g;
    }
    compute_tile(rows, p_.keys_m);
    for (int64_t r = 0; r < rows; ++r) {
      upcoming_.step();
      const int64_t mask_offset = p_.mask_slice_offset(g) + (row_begin + r) * p_.keys_m;
      const bool* allowed = p_.mask_bool ? p_.mask_bool + mask_offset : nullptr;
      const acc_t* added = p_.mask_additive ? p_.mask_additive + mask_offset : nullptr;
      if (!distance_selector_->select(q_.data() + r * d_, tile_.data() + r * width_, allowed, added,
                                      p_.index_order, row_keys_.data(), row_indices_.data())) {
        return false;
      }
      write_row(g, row_begin + r);
    }
    return true;
  }

  void write_rows(int64_t g, int64_t row_begin, int64_t rows) {
    for (int64_t r = 0; r < rows; ++r) {
      tops_[r].read(row_keys_.data(), row_indices_.data(), p_.index_order);
      write_row(g, row_begin + r);
    }
  }

  // Writes row_keys_ / row_indices_ out as query i's scores and indices.
  void write_row(int64_t g, int64_t i) {
    const int64_t out = (g * p_.queries_n + i) * p_.k;
    for (int64_t s = 0; s < p_.k; ++s) {
      const acc_t key = row_keys_[s];
      const bool masked = key == -std::numeric_limits<acc_t>::infinity();
      p_.scores[out + s] = static_cast<scalar_t>(masked ? key : Policy::reported_score(key));
      p_.indices[out + s] = row_indices_[s];
    }
  }

  const KnnSelectParams<scalar_t, acc_t>& p_;
  const int64_t d_;
  const UpcomingLinesCursor upcoming_;
  const bool whole_rows_;
  const bool distance_rows_;  // Gaussian through the GEMM identity (selects_distance_rows)
  const int64_t width_;  // keys per score tile
  int64_t transposed_slice_ = -1;  // whole rows: the slice whose keys kt_ holds
  std::vector<acc_t> q_, kt_, keys_block_, tile_, top_keys_;
  // Cosine's inverse norms of the block's query rows and of the tile's keys (empty otherwise).
  std::vector<acc_t> query_factors_, key_factors_;
  std::vector<int64_t> top_indices_;
  std::vector<acc_t> row_keys_;
  std::vector<int64_t> row_indices_;
  std::vector<TopK> tops_;
#if defined(CPU_CAPABILITY_AVX2)
  std::optional<WholeRowTopK> whole_row_top_;
#endif
  std::optional<DistanceRowSelector<Policy>> distance_selector_;
};

template <typename Policy, typename scalar_t, typename acc_t, typename TopK>
bool select_blocks(const KnnSelectParams<scalar_t, acc_t>& p) {
  const int64_t blocks_per_slice = (p.queries_n + kQueryBlock - 1) / kQueryBlock;
  std::atomic<bool> rankable{true};
  at::parallel_for(0, p.slices * blocks_per_slice, 1, [&](int64_t begin, int64_t end) {
    SelectTask<Policy, scalar_t, acc_t, TopK> task(p);
    for (int64_t t = begin; t < end && rankable.load(std::memory_order_relaxed); ++t) {
      if (!task.run(t / blocks_per_slice, (t % blocks_per_slice) * kQueryBlock)) rankable = false;
    }
  });
  return rankable.load();
}

}  // namespace

template <typename scalar_t, typename acc_t>
bool knn_select_forward(const KnnSelectParams<scalar_t, acc_t>& p) {
  return kernels::dispatch_similarity(p.similarity, [&](auto policy) {
    using Policy = decltype(policy);
#if defined(CPU_CAPABILITY_AVX2)
    if constexpr (std::is_same_v<acc_t, float>) {
      if (p.k <= LaneTopK::kLanes && p.keys_m <= std::numeric_limits<int32_t>::max()) {
        return select_blocks<Policy, scalar_t, acc_t, LaneTopK>(p);
      }
    }
#endif
    return select_blocks<Policy, scalar_t, acc_t, RunningTopK<acc_t>>(p);
  });
}

template bool knn_select_forward(const KnnSelectParams<float, float>&);
template bool knn_select_forward(const KnnSelectParams<double, double>&);
template bool knn_select_forward(const KnnSelectParams<c10::BFloat16, float>&);
template bool knn_select_forward(const KnnSelectParams<c10::Half, float>&);

}  // namespace convnn::cpu::CONVNN_CPU_ISA