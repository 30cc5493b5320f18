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

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <vector>

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
    bool rankable = true;
    for (int64_t c = 0; c < columns; ++c) rankable &= !(std::isnan(row[c]) || row[c] == pos_inf);
    return rankable;
  }

  bool push_tile(int64_t g, int64_t row_begin, int64_t rows, int64_t m0, int64_t columns,
                 std::vector<RunningTopK<acc_t>>& tops) {
    for (int64_t r = 0; r < rows; ++r) {
      acc_t* row = tile_.data() + r * kKeyBlock;
      if (!ranking_keys(row, columns, g * p_.mask_slice_stride + (row_begin + r) * p_.keys_m + m0)) return false;
      auto& top = tops[r];
      for (int64_t c = 0; c < columns; ++c) {
        // Fast path: once the row holds K candidates, most scores do not beat the K-th.
        if (top.count == top.k && !(row[c] > top.keys[top.k - 1])) continue;
        top.push(row[c], m0 + c);
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
