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


@pytest.mark.parametrize("causal,padded", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("rho", ["softmax", "uniform"])
def test_a_sequence_shorter_than_k_is_the_layer_of_k_equal_to_its_length(causal, padded, rho):
    """N = 4 keys < K = 7 (as nn.MultiheadAttention, any length): each row takes its valid keys and
    masked slots of weight exactly 0 (the op's short-row rule), so the layer equals one of K = N whose
    kernel is the first N taps of its own (slots in score order), forward and backward."""
    torch.manual_seed(11)
    n, k = 4, 7
    longer = ConvNNAttention(EMBED, 2, k, is_causal=causal, rho=rho, bias=True).double()
    exact = ConvNNAttention(EMBED, 2, n, is_causal=causal, rho=rho, bias=True).double()
    with torch.no_grad():
        longer.bias.normal_()
    state = longer.state_dict()
    state["kernel"] = state["kernel"][:, :n]
    exact.load_state_dict(state)
    x = torch.randn(2, n, EMBED, dtype=torch.float64, requires_grad=True)
    padding = torch.tensor([[False] * n, [False, False, True, True]]) if padded else None
    out, neighbours = longer.forward_with_neighbours(x, key_padding_mask=padding)
    expected = exact(x, key_padding_mask=padding)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)
    grad = torch.randn_like(out)
    got_grad, = torch.autograd.grad(out, x, grad)
    expected_grad, = torch.autograd.grad(expected, x, grad)
    torch.testing.assert_close(got_grad, expected_grad, rtol=0, atol=1e-12)
    # The slots past the valid keys are masked: score -inf, weight 0 (indices from N on: the padding).
    assert neighbours.indices.shape[-1] == k
    assert torch.equal(neighbours.weights[..., n:], torch.zeros_like(neighbours.weights[..., n:]))
    assert torch.isneginf(neighbours.scores[..., n:]).all()


@pytest.mark.parametrize("num_kv_heads", [4, 2])
@pytest.mark.parametrize("options", [dict(), dict(num_candidates=6), dict(num_candidates=5, include_self=True)],
                         ids=["all", "random", "random-self"])
def test_a_per_sample_mask_once_per_sample_equals_it_given_for_every_head(num_kv_heads, options):
    """A key padding mask reaches the op as one [N,N] slice per sample, read for each of the sample's
    heads (docs/operator.md, "Masks"); the same mask given per head, [B,H,N,N], is one slice per
    (sample, head). Equal outputs, random candidates drawn alike (grouped heads: the first repeats
    the key/value heads per query head, the second packs the query heads of a group)."""
    torch.manual_seed(0)
    attention = ConvNNAttention(16, 4, 3, num_kv_heads=num_kv_heads, **options).double()
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    padding = torch.arange(9)[None, :] >= torch.tensor([9, 6])[:, None]
    per_head = padding.logical_not()[:, None, None, :].expand(2, 4, 9, 9)
    torch.manual_seed(5)
    once = attention(x, key_padding_mask=padding)
    torch.manual_seed(5)
    every_head = attention(x, attn_mask=per_head)
    torch.testing.assert_close(once, every_head, rtol=0, atol=1e-12)


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
    # An additive mask is added to the scores, where NaN and +inf cannot be ranked: the op's message
    # names the mask beside the queries and keys.
    ("attn_mask", torch.full((5, 5), float("inf"), dtype=torch.float64), r"and an additive mask for NaN or \+inf"),
    ("key_padding_mask", torch.full((2, 5), float("nan"), dtype=torch.float64),
     r"and an additive mask for NaN or \+inf"),
])
def test_masks_of_the_wrong_shape_or_dtype_are_refused_by_name(argument, mask, rule):
    attention = layer(2)
    with pytest.raises(RuntimeError, match=rule):
        attention(torch.randn(2, 5, EMBED, dtype=torch.float64), **{argument: mask})


def packed_and_padded(lengths, generator_seed=4):
    """The same sequences packed ([T, C] with cu_seqlens) and padded ([B, N, C] with key padding)."""
    torch.manual_seed(generator_seed)
    longest = max(lengths)
    padded = torch.randn(len(lengths), longest, EMBED, dtype=torch.float64)
    padding = padding_of(lengths, longest)
    packed = padded[~padding]
    cu_seqlens = torch.tensor([0] + lengths).cumsum(0)
    return packed, cu_seqlens, padded, padding


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("num_kv_heads", [0, 1])
def test_a_packed_batch_equals_the_padded_batch_forward_and_backward(is_causal, num_kv_heads):
    lengths = [5, 2, 5, 7, 0, 3, 1]  # repeated, shorter than k, empty
    attention = layer(3, num_kv_heads=num_kv_heads, bias=True)
    packed, cu_seqlens, padded, padding = packed_and_padded(lengths)
    got = attention(packed, is_causal=is_causal, cu_seqlens=cu_seqlens)
    upstream = torch.randn_like(got)
    packed_grads = torch.autograd.grad((got * upstream).sum(), list(attention.parameters()))
    expected = attention(padded, is_causal=is_causal, key_padding_mask=padding)[~padding]
    padded_grads = torch.autograd.grad((expected * upstream).sum(), list(attention.parameters()))
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
    for packed_grad, padded_grad in zip(packed_grads, padded_grads):
        torch.testing.assert_close(packed_grad, padded_grad, rtol=0, atol=1e-11)


def test_a_packed_batch_takes_int32_offsets_and_refuses_masks_by_name():
    attention = layer(2)
    packed, cu_seqlens, _, _ = packed_and_padded([4, 6])
    torch.testing.assert_close(attention(packed, cu_seqlens=cu_seqlens.int()),
                               attention(packed, cu_seqlens=cu_seqlens), rtol=0, atol=0)
    with pytest.raises(ValueError, match="key_padding_mask must be None with cu_seqlens"):
        attention(packed, key_padding_mask=torch.zeros(10, dtype=torch.bool), cu_seqlens=cu_seqlens)
    with pytest.raises(RuntimeError, match=r"cu_seqlens must start at 0 and end at the token count T = 10"):
        attention(packed, cu_seqlens=torch.tensor([0, 4, 9]))
    with pytest.raises(ValueError, match="recording neighbours is not supported on a packed batch"):
        attention.forward_with_neighbours(packed, cu_seqlens=cu_seqlens)


@pytest.mark.parametrize("num_kv_heads", [0, 1])
def test_decoding_with_a_cache_equals_the_causal_forward(num_kv_heads):
    """A prompt of 4 tokens, then one token per step: each step's rows equal the causal forward's
    on the whole prefix (float64 rounding: the op sees other shapes, one row against the cache)."""
    attention = layer(3, num_kv_heads=num_kv_heads, bias=True)
    torch.manual_seed(5)
    x = torch.randn(2, 8, EMBED, dtype=torch.float64)
    full = attention(x, is_causal=True)
    cache = attention.make_cache(2, 8)
    kv_heads = num_kv_heads or HEADS
    assert cache.keys.shape == (2, kv_heads, 8, EMBED // HEADS)  # head-major
    with torch.no_grad():
        steps = [attention.forward_step(x[:, :4], cache)]
        steps += [attention.forward_step(x[:, i:i + 1], cache) for i in range(4, 8)]
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=0, atol=1e-12)
    assert cache.lengths == [8, 8]


def test_prompts_of_different_lengths_decode_as_each_alone():
    attention = layer(3)
    torch.manual_seed(6)
    x = torch.randn(2, 7, EMBED, dtype=torch.float64)
    cache = attention.make_cache(2, 7)
    prompt = attention.forward_step(x[:, :5], cache, counts=[5, 2])
    nxt = attention.forward_step(torch.stack([x[0, 5], x[1, 2]])[:, None], cache)
    assert cache.lengths == [6, 3]
    for b, length in enumerate([5, 2]):
        alone = attention(x[b:b + 1, :length + 1], is_causal=True)[0]
        torch.testing.assert_close(torch.cat([prompt[b, :length], nxt[b]]), alone, rtol=0, atol=1e-12)


def test_a_step_past_max_length_is_refused_and_changes_nothing():
    attention = layer(2)
    cache = attention.make_cache(1, 4)
    x = torch.randn(1, 3, EMBED, dtype=torch.float64)
    attention.forward_step(x, cache)
    with pytest.raises(RuntimeError, match="KVCache: sample 0 holds 3 tokens; 2 more would pass max_length = 4"):
        attention.forward_step(x[:, :2], cache)
    assert cache.lengths == [3]
    cache.reset()
    assert cache.lengths == [0]
    with pytest.raises(TypeError, match="cache must be a convnn.nn.KVCache"):
        attention.forward_step(x, (cache.keys, cache.values))


def test_a_truncated_cache_decodes_the_next_token_again_as_before():
    """truncate rolls a cache back (beam search, speculative decoding): the same token after a
    rollback gives the same row."""
    attention = layer(2)
    x = torch.randn(1, 5, EMBED, dtype=torch.float64)
    cache = attention.make_cache(1, 5)
    attention.forward_step(x[:, :4], cache)
    first = attention.forward_step(x[:, 4:], cache)
    cache.truncate(4)
    assert cache.lengths == [4]
    torch.testing.assert_close(attention.forward_step(x[:, 4:], cache), first, rtol=0, atol=0)


def test_the_python_examples_of_docs_sequences_md_run():
    """Each Python block of docs/sequences.md alone, in a namespace of its own, so it cannot rot."""
    import pathlib
    import re
    import runpy
    import tempfile
    page = pathlib.Path(__file__).resolve().parents[2] / "docs" / "sequences.md"
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)
    assert len(blocks) >= 4
    for block in blocks:
        with tempfile.NamedTemporaryFile("w", suffix=".py") as script:
            script.write(block)
            script.flush()
            runpy.run_path(script.name)


@pytest.mark.parametrize("num_kv_heads", [0, 1])
def test_a_static_cache_decodes_as_the_causal_forward(num_kv_heads):
    attention = layer(3, num_kv_heads=num_kv_heads, bias=True)
    torch.manual_seed(7)
    x = torch.randn(2, 8, EMBED, dtype=torch.float64)
    full = attention(x, is_causal=True)
    cache = attention.make_cache(2, 10, static=True)
    with torch.no_grad():
        steps = [attention.forward_step(x[:, :3], cache)]
        steps += [attention.forward_step(x[:, i:i + 1], cache) for i in range(3, 8)]
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=0, atol=1e-12)
    assert cache.lengths.tolist() == [8, 8]


def test_a_compiled_step_on_a_static_cache_compiles_once_for_every_length():
    """The step's shapes do not depend on the lengths (a tensor advanced in place): one graph serves
    every step, and the compiled steps equal the eager ones."""
    import torch._dynamo.testing
    attention = layer(3)
    torch.manual_seed(8)
    tokens = torch.randn(2, 6, EMBED, dtype=torch.float64)
    eager_cache, compiled_cache = attention.make_cache(2, 8, static=True), attention.make_cache(2, 8, static=True)
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    step = torch.compile(attention.forward_step, backend=counter, fullgraph=True)
    with torch.no_grad():
        for i in range(6):
            expected = attention.forward_step(tokens[:, i:i + 1], eager_cache)
            torch.testing.assert_close(step(tokens[:, i:i + 1], compiled_cache), expected, rtol=0, atol=1e-12)
    assert counter.frame_count == 1
    assert compiled_cache.lengths.tolist() == [6, 6]
    torch.testing.assert_close(compiled_cache.keys, eager_cache.keys, rtol=0, atol=0)


@pytest.mark.parametrize("held", [-2, 5])
def test_a_cache_whose_lengths_were_set_out_of_range_is_refused_before_any_write(held):
    # KVCache.lengths is a plain list that a caller can assign; -2 would have made narrow() write at
    # max_length - 2, over held tokens, and the step would have gone on.
    attention = layer(2)
    cache = attention.make_cache(2, 4)
    attention.forward_step(torch.randn(2, 1, EMBED, dtype=torch.float64), cache)
    keys = cache.keys.clone()
    cache.lengths = [1, held]
    with pytest.raises(RuntimeError, match=rf"KVCache: lengths\[1\] = {held} must be in \[0, max_length = 4\]"):
        attention.forward_step(torch.randn(2, 1, EMBED, dtype=torch.float64), cache)
    assert cache.lengths == [1, held]
    torch.testing.assert_close(cache.keys, keys, rtol=0, atol=0)


def test_a_static_cache_with_a_negative_length_is_refused():
    attention = layer(2)
    cache = attention.make_cache(2, 4, static=True)
    cache.lengths.copy_(torch.tensor([1, -1]))
    with pytest.raises(RuntimeError, match=r"or a length is negative: each must be in \[0, max_length - t = 3\]"):
        attention.forward_step(torch.randn(2, 1, EMBED, dtype=torch.float64), cache)


def test_a_static_step_past_max_length_and_counts_are_refused():
    attention = layer(2)
    cache = attention.make_cache(1, 4, static=True)
    x = torch.randn(1, 3, EMBED, dtype=torch.float64)
    attention.forward_step(x, cache)
    with pytest.raises(RuntimeError, match="a step of 2 tokens would pass max_length = 4"):
        attention.forward_step(x[:, :2], cache)
    with pytest.raises(ValueError, match="a StaticKVCache advances every sample"):
        attention.forward_step(x[:, :1], cache, counts=[1])
    cache.truncate(1)
    assert cache.lengths.tolist() == [1]
