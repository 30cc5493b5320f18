// Fused knn_select forward. Per task (slice g, block of kQueryBlock query rows):
//   for each block of kKeyBlock keys: transpose the keys to [D][kKeyBlock] (converted to acc_t),
//   compute the score tile with a 4 x 16 register-blocked micro-kernel
//   vectorised over keys (the similarity policy's accumulate on whole vectors; a GEMM for dot
//   products), turn it into ranking keys, apply the mask, and push every key into the row's
//   running top-K (top_k.h).
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
#include "ops/cpu/vec_arith.h"
#include "ops/kernels/similarity.h"

namespace convnn::cpu::CONVNN_CPU_ISA {
namespace {

constexpr int64_t kQueryBlock = 64;
constexpr int64_t kKeyBlock = 128;
constexpr int64_t kRowTile = 4;     // query rows per micro-kernel call
constexpr int64_t kColumnTile = 16; // keys per micro-kernel call
#if defined(CPU_CAPABILITY_AVX2)
// A whole-row tile's transposed keys stay within 1 MiB of acc_t (in L2 beside the score tile).
constexpr int64_t kWholeRowTileElements = int64_t{1} << 18;
#endif

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

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

template <typename Policy, typename scalar_t, typename acc_t, typename TopK>
class SelectTask {
 public:
  explicit SelectTask(const KnnSelectParams<scalar_t, acc_t>& p)
      : p_(p),
        d_(p.features),
        whole_rows_(selects_whole_rows(p)),
        width_(whole_rows_ ? round_up(p.keys_m, kColumnTile) : kKeyBlock),
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
  }

  // Returns false on an unrankable score.
  bool run(int64_t g, int64_t row_begin) {
    const int64_t rows = std::min(kQueryBlock, p_.queries_n - row_begin);
    std::fill(q_.begin(), q_.end(), acc_t(0));
    load_rows(p_.queries + (g * p_.queries_n + row_begin) * d_, rows, d_, q_.data());
    inverse_norms<Policy>(q_.data(), rows, d_, query_factors_.data());
#if defined(CPU_CAPABILITY_AVX2)
    if constexpr (std::is_same_v<TopK, LaneTopK>) {
      if (whole_rows_) return run_whole_rows(g, row_begin, rows);
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
  // Keys already in acc_t are transposed from the input, without a converted copy.
  static constexpr bool kTransposesInputs = std::is_same_v<scalar_t, acc_t>;

  static bool selects_whole_rows(const KnnSelectParams<scalar_t, acc_t>& p) {
#if defined(CPU_CAPABILITY_AVX2)
    if constexpr (std::is_same_v<TopK, LaneTopK>) {
      return p.keys_m <= WholeRowTopK::kMaxColumns &&
             round_up(p.keys_m, kColumnTile) * p.features <= kWholeRowTileElements;
    }
#endif
    return false;
  }

  TopK make_top(int64_t r) {
    if constexpr (std::is_constructible_v<TopK, int64_t>) {
      return TopK(p_.k);
    } else {
      return TopK(top_keys_.data() + r * p_.k, top_indices_.data() + r * p_.k, p_.k);
    }
  }

  // kt_ = the block's keys as [D][width_] acc_t, zero in the padding columns the tile reads.
  void load_key_block(int64_t g, int64_t m0, int64_t columns) {
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
    if constexpr (Policy::kIsDotProduct && std::is_same_v<acc_t, float>) {
      // A dot-product tile is a GEMM: the BLAS micro-kernel (oneDNN's where the CPU has one)
      // outruns the generic register-blocked loop below.
      at::native::cpublas::brgemm(padded_rows, padded_columns, d_, d_, width_, width_,
                                  /*add_C=*/false, q_.data(), kt_.data(), tile_.data(),
                                  /*is_vnni=*/false);
    } else {
      score_tile<Policy>(q_.data(), padded_rows, d_, kt_.data(), padded_columns, width_, tile_.data());
    }
  }

  // Turns the raw tile row of query row r into ranking keys (as the reference defines them) with
  // the mask applied; returns false on a NaN or +inf key.
  bool ranking_keys(acc_t* row, int64_t r, int64_t columns, int64_t mask_offset) const {
    constexpr acc_t neg_inf = -std::numeric_limits<acc_t>::infinity();
    constexpr acc_t pos_inf = std::numeric_limits<acc_t>::infinity();
    if constexpr (Policy::kScalesByInverseNorms) {
      const acc_t query_factor = query_factors_[r];
      for (int64_t c = 0; c < columns; ++c) row[c] = row[c] * query_factor * key_factors_[c];
    }
    Policy::to_ranking_keys(row, columns, d_);
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
      if (m0 == 0) prefetch_upcoming_lines();
      acc_t* row = tile_.data() + r * width_;
      if (!ranking_keys(row, r, columns, g * p_.mask_slice_stride + (row_begin + r) * p_.keys_m + m0)) return false;
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
    compute_tile(rows, p_.keys_m);
    for (int64_t r = 0; r < rows; ++r) {
      prefetch_upcoming_lines();
      acc_t* row = tile_.data() + r * width_;
      if (!ranking_keys(row, r, p_.keys_m, g * p_.mask_slice_stride + (row_begin + r) * p_.keys_m)) {
        return false;
      }
      whole_row_top_->select(row, p_.keys_m, p_.index_order, row_keys_.data(), row_indices_.data());
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
  const bool whole_rows_;
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