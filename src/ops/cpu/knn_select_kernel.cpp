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

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <vector>

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

// tile[r][c] for kRowTile rows and kColumnTile keys: q rows are [D] apart, kt is [D][ldk].
template <Accumulate mode, typename acc_t>
inline void micro_kernel(const acc_t* q, int64_t d_size, const acc_t* kt, int64_t ldk, acc_t* tile,
                         int64_t ldt) {
  acc_t acc[kRowTile][kColumnTile] = {};
  for (int64_t d = 0; d < d_size; ++d) {
    const acc_t* kv = kt + d * ldk;
    for (int64_t r = 0; r < kRowTile; ++r) {
      const acc_t qv = q[r * d_size + d];
      for (int64_t c = 0; c < kColumnTile; ++c) {
        if constexpr (mode == Accumulate::Dot) {
          acc[r][c] += qv * kv[c];
        } else if constexpr (mode == Accumulate::SquaredDistance) {
          const acc_t diff = qv - kv[c];
          acc[r][c] += diff * diff;
        } else {
          // Not std::max: a NaN coordinate must stay NaN so the score is reported unrankable.
          const acc_t diff = std::abs(qv - kv[c]);
          acc[r][c] = (diff > acc[r][c] || diff != diff) ? diff : acc[r][c];
        }
      }
    }
  }
  for (int64_t r = 0; r < kRowTile; ++r) {
    for (int64_t c = 0; c < kColumnTile; ++c) tile[r * ldt + c] = acc[r][c];
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
  for (int64_t r = 0; r < rows; ++r) {
    acc_t norm_sq = 0;
    for (int64_t j = 0; j < d; ++j) {
      dst[r * d + j] = static_cast<acc_t>(src[r * d + j]);
      norm_sq += dst[r * d + j] * dst[r * d + j];
    }
    if (normalise) {
      const acc_t scale = acc_t(1) / std::max(std::sqrt(norm_sq), static_cast<acc_t>(kCosineEps));
      for (int64_t j = 0; j < d; ++j) dst[r * d + j] *= scale;
    }
  }
}

// Sorted-descending running top-K of one row.
template <typename acc_t>
struct RunningTopK {
  acc_t* keys;
  int64_t* indices;
  int64_t count;
  int64_t k;

  void push(acc_t value, int64_t index) {
    int64_t pos;
    if (count == k) {
      if (!(value > keys[k - 1])) return;
      pos = k - 1;
    } else {
      pos = count++;
    }
    while (pos > 0 && keys[pos - 1] < value) {
      keys[pos] = keys[pos - 1];
      indices[pos] = indices[pos - 1];
      --pos;
    }
    keys[pos] = value;
    indices[pos] = index;
  }
};

template <typename scalar_t, typename acc_t>
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
        top_indices_(kQueryBlock * p.k) {}

  // Returns false on an unrankable score.
  bool run(int64_t g, int64_t row_begin) {
    const int64_t rows = std::min(kQueryBlock, p_.queries_n - row_begin);
    std::fill(q_.begin(), q_.end(), acc_t(0));
    load_rows(p_.queries + (g * p_.queries_n + row_begin) * d_, rows, d_, normalise_, q_.data());
    std::vector<RunningTopK<acc_t>> tops;
    tops.reserve(rows);
    for (int64_t r = 0; r < rows; ++r) {
      tops.push_back({top_keys_.data() + r * p_.k, top_indices_.data() + r * p_.k, 0, p_.k});
    }
    for (int64_t m0 = 0; m0 < p_.keys_m; m0 += kKeyBlock) {
      const int64_t columns = std::min(kKeyBlock, p_.keys_m - m0);
      load_key_block(g, m0, columns);
      compute_tile(rows, columns);
      if (!push_tile(g, row_begin, rows, m0, columns, tops)) return false;
    }
    write_rows(g, row_begin, rows);
    return true;
  }

 private:
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
        score_tile<Accumulate::Dot>(q_.data(), padded_rows, d_, kt_.data(), padded_columns, tile_.data());
        break;
      case Accumulate::SquaredDistance:
        score_tile<Accumulate::SquaredDistance>(q_.data(), padded_rows, d_, kt_.data(), padded_columns, tile_.data());
        break;
      case Accumulate::MaxAbsDifference:
        score_tile<Accumulate::MaxAbsDifference>(q_.data(), padded_rows, d_, kt_.data(), padded_columns, tile_.data());
        break;
    }
  }

  // The ranking key of one tile entry, as the reference defines it.
  acc_t ranking_key(acc_t raw) const {
    switch (p_.similarity) {
      case Similarity::ScaledDot: return raw / std::sqrt(static_cast<acc_t>(d_));
      case Similarity::Gaussian:
      case Similarity::Chebyshev: return -raw;
      default: return raw;
    }
  }

  bool push_tile(int64_t g, int64_t row_begin, int64_t rows, int64_t m0, int64_t columns,
                 std::vector<RunningTopK<acc_t>>& tops) {
    constexpr acc_t neg_inf = -std::numeric_limits<acc_t>::infinity();
    constexpr acc_t pos_inf = std::numeric_limits<acc_t>::infinity();
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t mask_row = g * p_.mask_slice_stride + (row_begin + r) * p_.keys_m + m0;
      const acc_t* tile_row = tile_.data() + r * kKeyBlock;
      for (int64_t c = 0; c < columns; ++c) {
        acc_t key = ranking_key(tile_row[c]);
        if (p_.mask_bool && !p_.mask_bool[mask_row + c]) key = neg_inf;
        if (p_.mask_additive) key += p_.mask_additive[mask_row + c];
        if (std::isnan(key) || key == pos_inf) return false;
        tops[r].push(key, m0 + c);
      }
    }
    return true;
  }

  void write_rows(int64_t g, int64_t row_begin, int64_t rows) {
    const bool distance = is_distance_similarity(p_.similarity);
    for (int64_t r = 0; r < rows; ++r) {
      acc_t* keys = top_keys_.data() + r * p_.k;
      int64_t* indices = top_indices_.data() + r * p_.k;
      if (p_.index_order) sort_by_index(keys, indices, p_.k);
      const int64_t out = (g * p_.queries_n + row_begin + r) * p_.k;
      for (int64_t s = 0; s < p_.k; ++s) {
        const acc_t key = keys[s];
        const bool masked = key == -std::numeric_limits<acc_t>::infinity();
        p_.scores[out + s] = static_cast<scalar_t>(distance && !masked ? std::exp(key) : key);
        p_.indices[out + s] = indices[s];
      }
    }
  }

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

  const KnnSelectParams<scalar_t, acc_t>& p_;
  const int64_t d_;
  const bool normalise_;
  std::vector<acc_t> q_, kt_, keys_block_, tile_, top_keys_;
  std::vector<int64_t> top_indices_;
};

}  // namespace

template <typename scalar_t, typename acc_t>
bool knn_select_forward(const KnnSelectParams<scalar_t, acc_t>& p) {
  const int64_t blocks_per_slice = (p.queries_n + kQueryBlock - 1) / kQueryBlock;
  std::atomic<bool> rankable{true};
  at::parallel_for(0, p.slices * blocks_per_slice, 1, [&](int64_t begin, int64_t end) {
    SelectTask<scalar_t, acc_t> task(p);
    for (int64_t t = begin; t < end && rankable.load(std::memory_order_relaxed); ++t) {
      if (!task.run(t / blocks_per_slice, (t % blocks_per_slice) * kQueryBlock)) rankable = false;
    }
  });
  return rankable.load();
}

template bool knn_select_forward(const KnnSelectParams<float, float>&);
template bool knn_select_forward(const KnnSelectParams<double, double>&);
template bool knn_select_forward(const KnnSelectParams<c10::BFloat16, float>&);
template bool knn_select_forward(const KnnSelectParams<c10::Half, float>&);

}  // namespace convnn::cpu::CONVNN_CPU_ISA
