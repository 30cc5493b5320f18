"""Grouped-query and multi-query ConvNNAttention (num_kv_heads < num_heads; docs/sequences.md),
proven against explicit references: the layer with each key/value head repeated for every query
head of its group, and at k = N PyTorch's grouped-query scaled_dot_product_attention
(enable_gqa=True). float64, so the tolerances are float64 rounding."""
import pytest
import torch
import torch.nn.functional as F

from convnn.nn import ConvNNAttention

EMBED, HEADS = 16, 4
HEAD_DIM = EMBED // HEADS


def repeat_heads(weight, kv_heads):
    """[kv*d, C] -> [H*d, C]: each key/value head's rows once per query head of its group."""
    group = HEADS // kv_heads
    return weight.view(kv_heads, 1, HEAD_DIM, -1).expand(-1, group, -1, -1).reshape(HEADS * HEAD_DIM, -1)


def twins(kv_heads, k=3, **options):
    """A grouped layer and the same layer with num_kv_heads = num_heads and repeated weights."""
    torch.manual_seed(0)
    grouped = ConvNNAttention(EMBED, HEADS, k, num_kv_heads=kv_heads, **options).double().eval()
    repeated = ConvNNAttention(EMBED, HEADS, k, **options).double().eval()
    with torch.no_grad():
        grouped.kernel.uniform_(-1, 1)
        for name, parameter in grouped.named_parameters():
            target = repeated.get_parameter(name)
            shared = name.startswith(("key_projection", "value_projection"))
            target.copy_(repeat_heads(parameter.reshape(parameter.shape[0], -1), kv_heads).view_as(target)
                         if shared else parameter)
    return grouped, repeated


def test_the_key_and_value_projections_are_linear_modules_of_kv_heads_times_head_dim():
    grouped, _ = twins(2)
    assert isinstance(grouped.key_projection, torch.nn.Linear)
    assert grouped.key_projection.weight.shape == (2 * HEAD_DIM, EMBED)
    assert grouped.value_projection.weight.shape == (2 * HEAD_DIM, EMBED)
    assert grouped.query_projection.weight.shape == (EMBED, EMBED)
    assert "num_kv_heads=2" in repr(grouped)


@pytest.mark.parametrize("kv_heads", [2, 1])
@pytest.mark.parametrize("options", [{}, {"fused": False}, {"kernel_per_head": True, "bias": True},
                                     {"causal": True, "similarity": "cosine"},
                                     {"num_candidates": 4, "seed": 5},
                                     {"num_candidates": 4, "include_self": True, "seed": 5}],
                         ids=["fused", "composed", "kernel_per_head", "causal_cosine", "random", "random_self"])
def test_equals_the_layer_with_each_key_value_head_repeated(kv_heads, options):
    grouped, repeated = twins(kv_heads, **options)
    torch.manual_seed(1)
    x = torch.randn(3, 7, EMBED, dtype=torch.float64)
    padding = torch.arange(7)[None, :] >= torch.tensor([7, 4, 6])[:, None]
    got, got_neighbours = grouped.forward_with_neighbours(x, key_padding_mask=padding)
    expected, expected_neighbours = repeated.forward_with_neighbours(x, key_padding_mask=padding)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
    assert torch.equal(got_neighbours.indices, expected_neighbours.indices)

    # Gradients: a shared key/value row's is the sum of its copies'.
    upstream = torch.randn_like(got)
    (grouped(x) * upstream).sum().backward()
    (repeated(x) * upstream).sum().backward()
    for name, parameter in grouped.named_parameters():
        expected_grad = repeated.get_parameter(name).grad
        if name.startswith(("key_projection", "value_projection")):
            expected_grad = expected_grad.reshape(kv_heads, HEADS // kv_heads, HEAD_DIM, -1).sum(1).view_as(parameter)
        torch.testing.assert_close(parameter.grad, expected_grad, rtol=0, atol=1e-11, msg=name)


def test_at_k_equal_n_it_is_grouped_query_scaled_dot_product_attention():
    torch.manual_seed(2)
    b, n, kv_heads = 2, 6, 2
    attention = ConvNNAttention(EMBED, HEADS, n, num_kv_heads=kv_heads).double()
    x = torch.randn(b, n, EMBED, dtype=torch.float64)

    def heads(projection, count):
        return projection(x).view(b, n, count, HEAD_DIM).transpose(1, 2)

    dense = F.scaled_dot_product_attention(heads(attention.query_projection, HEADS),
                                           heads(attention.key_projection, kv_heads),
                                           heads(attention.value_projection, kv_heads),
                                           is_causal=True, enable_gqa=True)
    expected = attention.output_projection(dense.transpose(1, 2).reshape(b, n, EMBED))
    torch.testing.assert_close(attention(x, is_causal=True), expected, rtol=0, atol=1e-12)


def test_the_functional_form_takes_kv_heads():
    from convnn.nn import functional as CF
    q = torch.randn(1, 5, 8, dtype=torch.float64)
    kv = torch.randn(1, 5, 4, dtype=torch.float64)
    out = CF.conv_nn(q, kv, kv, torch.ones(2, 3, dtype=torch.float64), None, k=3, heads=4, kv_heads=2)
    assert out.shape == (1, 5, 8)


def test_a_compiled_grouped_layer_equals_eager():
    grouped, _ = twins(2)
    x = torch.randn(2, 9, EMBED, dtype=torch.float64)
    compiled = torch.compile(grouped, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(x), grouped(x), rtol=0, atol=1e-12)


@pytest.mark.parametrize("kv_heads, rule", [(3, r"num_kv_heads = 3 must divide num_heads = 4"),
                                            (-1, r"num_kv_heads = -1 must divide num_heads = 4")])
def test_a_kv_head_count_that_does_not_divide_the_heads_is_refused_by_name(kv_heads, rule):
    with pytest.raises(RuntimeError, match=rule):
        ConvNNAttention(EMBED, HEADS, 3, num_kv_heads=kv_heads)
