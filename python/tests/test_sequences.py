"""ConvNNAttention on batches of sequences (docs/sequences.md): key_padding_mask as
torch.nn.MultiheadAttention's, attn_mask as scaled_dot_product_attention's ([N, N], [B, N, N],
[B, H, N, N]), proven against explicit references: each sequence run alone, and at k = N the dense
masked attention of PyTorch itself. float64, so the tolerances are float64 rounding."""
import pytest
import torch
import torch.nn.functional as F

from convnn.nn import ConvNNAttention

EMBED, HEADS = 8, 2


def layer(k, **options):
    torch.manual_seed(0)
    return ConvNNAttention(EMBED, HEADS, k, **options).double().eval()


def padding_of(lengths, n):
    """[B, N] bool, True at the padding positions (nn.MultiheadAttention's convention)."""
    return torch.arange(n)[None, :] >= torch.tensor(lengths)[:, None]


def dense_attention(attention, x, sdpa_mask):
    """What ConvNNAttention at k = N (scaled_dot, softmax, kernel of ones, no bias) must equal:
    scaled_dot_product_attention on its own projections with the same mask."""
    b, n, _ = x.shape
    queries, keys, values = (p(x).view(b, n, HEADS, -1).transpose(1, 2) for p in
                             (attention.query_projection, attention.key_projection, attention.value_projection))
    out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=sdpa_mask)
    return attention.output_projection(out.transpose(1, 2).reshape(b, n, EMBED))


def test_key_padding_equals_running_each_sequence_alone():
    torch.manual_seed(1)
    lengths, n = [7, 4, 5], 7
    attention = layer(3)
    x = torch.randn(len(lengths), n, EMBED, dtype=torch.float64)
    batched = attention(x, key_padding_mask=padding_of(lengths, n))
    for b, length in enumerate(lengths):
        alone = attention(x[b:b + 1, :length])
        torch.testing.assert_close(batched[b:b + 1, :length], alone, rtol=0, atol=1e-12)


def test_key_padding_selects_no_padding_key():
    torch.manual_seed(2)
    lengths, n = [6, 3], 6
    attention = layer(3)
    x = torch.randn(2, n, EMBED, dtype=torch.float64)
    _, neighbours = attention.forward_with_neighbours(x, key_padding_mask=padding_of(lengths, n))
    indices = neighbours.indices.view(2, HEADS, n, 3)
    for b, length in enumerate(lengths):
        assert int(indices[b].max()) < length


def test_at_k_equal_n_key_padding_is_multihead_attentions():
    torch.manual_seed(3)
    lengths, n = [5, 2, 4], 5
    attention = layer(n)
    mha = torch.nn.MultiheadAttention(EMBED, HEADS, bias=False, batch_first=True).double().eval()
    with torch.no_grad():
        mha.in_proj_weight.copy_(torch.cat([attention.query_projection.weight, attention.key_projection.weight,
                                            attention.value_projection.weight]))
        mha.out_proj.weight.copy_(attention.output_projection.weight)
    x = torch.randn(len(lengths), n, EMBED, dtype=torch.float64)
    padding = padding_of(lengths, n)
    expected, _ = mha(x, x, x, key_padding_mask=padding, need_weights=False)
    torch.testing.assert_close(attention(x, key_padding_mask=padding), expected, rtol=0, atol=1e-12)
    # MultiheadAttention's float form: added to the scores.
    additive = torch.zeros(padding.shape, dtype=torch.float64).masked_fill(padding, float("-inf"))
    torch.testing.assert_close(attention(x, key_padding_mask=additive), expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("shape", ["N,N", "B,N,N", "1,N,N", "B,H,N,N", "B,1,N,N", "1,H,N,N"])
@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_at_k_equal_n_attn_mask_is_scaled_dot_product_attentions(shape, kind):
    torch.manual_seed(4)
    b, n = 3, 6
    attention = layer(n)
    x = torch.randn(b, n, EMBED, dtype=torch.float64)
    sizes = [{"B": b, "H": HEADS, "N": n, "1": 1}[axis] for axis in shape.split(",")]
    allowed = torch.rand(sizes) < 0.6
    allowed |= torch.eye(n, dtype=torch.bool)  # every query keeps one key (SDPA gives NaN rows otherwise)
    mask = allowed if kind == "bool" else torch.zeros(sizes, dtype=torch.float64).masked_fill(~allowed, float("-inf"))
    sdpa_mask = mask.unsqueeze(1) if len(sizes) == 3 else mask  # SDPA broadcasts from the right
    torch.testing.assert_close(attention(x, attn_mask=mask), dense_attention(attention, x, sdpa_mask),
                               rtol=0, atol=1e-12)


def test_masks_combine_with_each_other_and_with_is_causal():
    torch.manual_seed(5)
    lengths, n = [6, 4], 6
    attention = layer(n)
    x = torch.randn(2, n, EMBED, dtype=torch.float64)
    padding = padding_of(lengths, n)
    band = (torch.arange(n)[:, None] - torch.arange(n)[None, :]).abs() <= 3
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    allowed = band & causal & ~padding[:, None, None, :]
    # A float attn_mask beside a bool key padding: the additive values where allowed, -inf elsewhere.
    bias = torch.randn(n, n, dtype=torch.float64).masked_fill(~band, float("-inf"))
    got = attention(x, attn_mask=bias, is_causal=True, key_padding_mask=padding)
    expected = dense_attention(attention, x, bias.masked_fill(~allowed, float("-inf")))
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)


def test_a_query_whose_keys_are_all_padding_outputs_the_bias_not_nan():
    """The op's empty-row rule (docs/operator.md): no selectable key, every weight 0 (SDPA gives NaN)."""
    attention = layer(3, bias=True)
    with torch.no_grad():
        attention.bias.normal_()
    x = torch.randn(1, 4, EMBED, dtype=torch.float64)
    out, neighbours = attention.forward_with_neighbours(x, key_padding_mask=torch.ones(1, 4, dtype=torch.bool))
    assert torch.isfinite(out).all()
    assert torch.equal(neighbours.weights, torch.zeros_like(neighbours.weights))


def test_one_sample_takes_a_key_padding_mask_of_its_tokens():
    torch.manual_seed(6)
    attention = layer(2)
    x = torch.randn(5, EMBED, dtype=torch.float64)
    padding = torch.tensor([False, False, False, True, True])
    torch.testing.assert_close(attention(x, key_padding_mask=padding)[:3], attention(x[:3]), rtol=0, atol=1e-12)


def test_masks_train_the_layer():
    """Gradients flow through a padded batch as through each sequence alone (the padding keys
    receive none)."""
    torch.manual_seed(7)
    lengths, n = [5, 3], 5
    attention = layer(2)
    x = torch.randn(2, n, EMBED, dtype=torch.float64, requires_grad=True)
    out = attention(x, key_padding_mask=padding_of(lengths, n))
    (out[0].sum() + out[1, :3].sum()).backward()
    assert torch.equal(x.grad[1, 3:], torch.zeros_like(x.grad[1, 3:]))
    alone = x[1:2, :3].detach().clone().requires_grad_()
    attention(alone).sum().backward()
    torch.testing.assert_close(x.grad[1:2, :3], alone.grad, rtol=0, atol=1e-12)


@pytest.mark.parametrize("argument, mask, rule", [
    ("key_padding_mask", torch.zeros(2, 6, dtype=torch.bool), r"key_padding_mask must be \[B,N\] = \[2, 5\]"),
    ("key_padding_mask", torch.zeros(5, dtype=torch.bool), r"key_padding_mask must be \[B,N\] = \[2, 5\]"),
    ("key_padding_mask", torch.zeros(2, 5, dtype=torch.long), r"key_padding_mask must be bool or floating point"),
    ("attn_mask", torch.zeros(2, 3, 5, 5, dtype=torch.bool),
     r"attn_mask must be \[N,N\], \[B,N,N\] or \[B,H,N,N\] with N = 5, B = 2 \(or 1\) and H = num_heads = 2"),
    ("attn_mask", torch.zeros(3, 5, 5, dtype=torch.bool), r"attn_mask must be \[N,N\], \[B,N,N\]"),
    ("attn_mask", torch.zeros(5, 4, dtype=torch.bool), r"attn_mask must be \[N,N\], \[B,N,N\]"),
    ("attn_mask", torch.zeros(5, 5, dtype=torch.int32), r"attn_mask must be bool or floating point"),
])
def test_masks_of_the_wrong_shape_or_dtype_are_refused_by_name(argument, mask, rule):
    attention = layer(2)
    with pytest.raises(RuntimeError, match=rule):
        attention(torch.randn(2, 5, EMBED, dtype=torch.float64), **{argument: mask})
