#include "nn/modules/attention_masks.h"

#include <ATen/ATen.h>

#include <limits>

#include "nn/functional/symint_forms.h"

namespace convnn::nn::detail {
namespace {

constexpr double kMinusInfinity = -std::numeric_limits<double>::infinity();

void check_mask_dtype(const at::Tensor& mask, const char* name) {
  TORCH_CHECK(mask.scalar_type() == at::kBool || at::isFloatingType(mask.scalar_type()),
              "ConvNNAttention: ", name, " must be bool or floating point (additive), got ", mask.scalar_type());
}

// attn_mask as a tensor that broadcasts against [B,H,N,N]: [N,N] as it is, [B,N,N] as [B,1,N,N].
at::Tensor broadcastable_attn_mask(const at::Tensor& mask, const c10::SymInt& batch, int64_t heads,
                                   const c10::SymInt& n) {
  check_mask_dtype(mask, "attn_mask");
  const auto dims = mask.dim();
  const auto tokens_ok = dims >= 2 ? mask.sym_size(-1).sym_eq(n) & mask.sym_size(-2).sym_eq(n) : c10::SymBool(false);
  const auto batch_ok = dims >= 3 ? mask.sym_size(0).sym_eq(batch) | mask.sym_size(0).sym_eq(1) : c10::SymBool(true);
  const auto heads_ok = dims == 4 ? mask.sym_size(1).sym_eq(heads) | mask.sym_size(1).sym_eq(1) : c10::SymBool(true);
  TORCH_SYM_CHECK(c10::SymBool(dims >= 2 && dims <= 4) & tokens_ok & batch_ok & heads_ok,
                  "ConvNNAttention: attn_mask must be [N,N], [B,N,N] or [B,H,N,N] with N = ", n, ", B = ", batch,
                  " (or 1) and H = num_heads = ", heads, " (or 1), got shape ", mask.sym_sizes());
  return dims == 3 ? mask.unsqueeze(1) : mask;
}

// key_padding_mask [B,N] as [B,1,1,N] (it masks keys, the last axis) in the merged mask's terms:
// bool true = padding becomes false = may not be selected.
at::Tensor broadcastable_key_padding(const at::Tensor& mask, const c10::SymInt& batch, const c10::SymInt& n) {
  check_mask_dtype(mask, "key_padding_mask");
  const auto shape_ok =
      mask.dim() == 2 ? mask.sym_size(0).sym_eq(batch) & mask.sym_size(1).sym_eq(n) : c10::SymBool(false);
  TORCH_SYM_CHECK(shape_ok, "ConvNNAttention: key_padding_mask must be [B,N] = [", batch, ", ", n,
                  "] (one entry per key of each sample), got shape ", mask.sym_sizes());
  const auto keys = mask.unsqueeze(1).unsqueeze(1);
  return mask.scalar_type() == at::kBool ? keys.logical_not() : keys;
}

at::Tensor checked_fixed(const at::Tensor& mask, const c10::SymInt& n) {
  check_mask_dtype(mask, "mask");
  const auto shape_ok = mask.dim() == 2 ? mask.sym_size(0).sym_eq(n) & mask.sym_size(1).sym_eq(n) : c10::SymBool(false);
  TORCH_SYM_CHECK(shape_ok, "ConvNNAttention: mask must be [N,N] = [", n, ", ", n, "] for this input, got ",
                  mask.sym_sizes());
  return mask;
}

// The pieces, combined: bool ones by `and`, float ones by addition, and where both kinds are
// present the float sum where allowed and -inf elsewhere.
class MaskCombination {
 public:
  void add(const at::Tensor& piece) {
    if (piece.scalar_type() == at::kBool) {
      allowed_ = allowed_.defined() ? allowed_.logical_and(piece) : piece;
    } else {
      additive_ = additive_.defined() ? additive_.add(piece) : piece;
    }
  }
  at::Tensor result() const {
    if (!additive_.defined()) return allowed_;
    if (!allowed_.defined()) return additive_;
    return at::where(allowed_, additive_, at::scalar_tensor(kMinusInfinity, additive_.options()));
  }

 private:
  at::Tensor allowed_, additive_;
};

}  // namespace

at::Tensor merged_attention_mask(const ConvNNAttentionOptions& o, const AttentionMasks& masks,
                                 const c10::SymInt& batch, const c10::SymInt& n, const at::Device& device) {
  MaskCombination combination;
  if (masks.fixed.defined()) combination.add(checked_fixed(masks.fixed, n).to(device));
  if (masks.attn_mask.defined()) {
    combination.add(broadcastable_attn_mask(masks.attn_mask, batch, o.num_heads(), n).to(device));
  }
  if (masks.key_padding_mask.defined()) {
    combination.add(broadcastable_key_padding(masks.key_padding_mask, batch, n).to(device));
  }
  if (o.causal()) combination.add(functional::detail::causal_mask_symint(n, device));
  const auto merged = combination.result();
  if (!merged.defined() || merged.dim() == 2) return merged;
  // Per sample ([B,1,N,N]: key padding, a [B,N,N] attn_mask): one [N,N] slice per sample, which the op
  // reads for each of the sample's heads. Per head: one slice per (sample, head), sample-major as the
  // op's slices.
  const auto per_head = merged.sym_size(1).maybe_as_int() != 1;
  const auto sample_major = merged.expand_symint({batch, per_head ? c10::SymInt(o.num_heads()) : c10::SymInt(1), n, n});
  return functional::detail::merge_leading_dims(sample_major);
}

}  // namespace convnn::nn::detail
