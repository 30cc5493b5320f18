"""ONNX export (issue 39 §3): torch.onnx.export(model, args, dynamo=True) of ConvNN layers and models
gives a graph of standard ONNX operators (the convnn ops decomposed by convnn/_decompositions.py)
that onnxruntime runs, with a dynamic batch, equal to PyTorch within float32 rounding where no
two candidates are within rounding of a tie, and with the ops' tie rule (the lower index) at exact
ties."""
import numpy as np
import onnxruntime
import pytest
import torch

import convnn
from convnn.nn import BranchingConv2d, ConvNN2d, ConvNNAttention

_ops = torch.ops.convnn
BATCH = torch.export.Dim("batch", min=1, max=64)


def _onnx_program(module, inputs):
    """torch.onnx.export's program of module at inputs, the first input's batch dynamic."""
    shapes = tuple({0: BATCH} if i == 0 else None for i in range(len(inputs)))
    return torch.onnx.export(module, inputs, dynamo=True, dynamic_shapes=shapes, verbose=False)


def _export(module, inputs):
    """(ONNX program, onnxruntime session) of module at inputs, the first input's batch dynamic."""
    program = _onnx_program(module, inputs)
    return program, onnxruntime.InferenceSession(program.model_proto.SerializeToString())


def _run(session, *inputs):
    return session.run(None, {i.name: x.numpy() for i, x in zip(session.get_inputs(), inputs)})


def _only_standard_operators(program):
    domains = {node.domain for node in program.model_proto.graph.node}
    assert domains <= {"", "ai.onnx"}, f"non-standard ONNX domains in the graph: {domains}"
    assert not program.model_proto.functions, "the graph calls ONNX functions instead of standard operators"


def _assert_runs_as_pytorch(module, session, *inputs):
    with torch.no_grad():
        expected = module(*inputs)
    got = _run(session, *inputs)[0]
    torch.testing.assert_close(torch.from_numpy(got), expected, rtol=1e-4, atol=1e-5)


def test_attention_exports_with_a_dynamic_batch_and_runs_in_onnxruntime():
    torch.manual_seed(0)
    layer = ConvNNAttention(16, 2, 3, qkv_bias=True).eval()
    program, session = _export(layer, (torch.randn(2, 10, 16),))
    _only_standard_operators(program)
    for batch in (1, 2, 5):
        _assert_runs_as_pytorch(layer, session, torch.randn(batch, 10, 16))


def test_grouped_query_attention_exports():
    """num_kv_heads: the packed query groups are plain reshapes around the same ops."""
    torch.manual_seed(0)
    layer = ConvNNAttention(16, 4, 3, num_kv_heads=2, causal=True).eval()
    program, session = _export(layer, (torch.randn(2, 9, 16),))
    _only_standard_operators(program)
    for batch in (1, 3):
        _assert_runs_as_pytorch(layer, session, torch.randn(batch, 9, 16))


class _MaskedBy(torch.nn.Module):
    """layer(x, **{keyword: mask}) with the mask as a positional input, which the exporter takes."""

    def __init__(self, keyword, layer):
        super().__init__()
        self.keyword, self.layer = keyword, layer

    def forward(self, x, mask):
        return self.layer(x, **{self.keyword: mask})


def test_an_attention_mask_and_the_causal_option_export():
    torch.manual_seed(0)
    layer = ConvNNAttention(8, 2, 3, causal=True, rho="softmax").eval()
    mask = torch.rand(7, 7) > 0.3
    module = _MaskedBy("attn_mask", layer).eval()
    program, session = _export(module, (torch.randn(2, 7, 8), mask))
    _only_standard_operators(program)
    _assert_runs_as_pytorch(module, session, torch.randn(3, 7, 8), mask)


def test_a_key_padding_mask_exports():
    """A per-sample mask reaches the op as one [N,N] slice per sample, read for each of its heads."""
    torch.manual_seed(0)
    layer = ConvNNAttention(16, 4, 3, num_kv_heads=2, causal=True).eval()

    def padding(lengths, n=8):
        return torch.arange(n)[None, :] >= torch.tensor(lengths)[:, None]

    module = _MaskedBy("key_padding_mask", layer).eval()
    program, session = _export(module, (torch.randn(2, 8, 16), padding([8, 5])))
    _only_standard_operators(program)
    _assert_runs_as_pytorch(module, session, torch.randn(2, 8, 16), padding([4, 6]))


@pytest.mark.parametrize("build", [lambda: ConvNN2d(4, 6, 5, padding=1, similarity="l1", slot_order="index"),
                                   lambda: ConvNN2d(4, 4, 9, coordinates=True, alpha=0.5, heads=2,
                                                    aggregation="depthwise", bias=True),
                                   lambda: BranchingConv2d(4, 8, lambda_=0.5, k=3, stride=2, projection="linear")])
def test_spatial_layers_export(build):
    torch.manual_seed(0)
    layer = build().eval()
    program, session = _export(layer, (torch.randn(2, 4, 7, 7),))
    _only_standard_operators(program)
    _assert_runs_as_pytorch(layer, session, torch.randn(3, 4, 7, 7))


def _assert_the_graph_computes_the_model(build, shape):
    """A whole network: exported in float64, ONNX's reference evaluator runs its graph equal to PyTorch
    in float64; exported in float32, onnxruntime runs it at another batch size. Their float32 outputs
    are not compared: a deep network with ReLU features has candidates within float32 rounding of a
    tie in most layers, where onnxruntime's and PyTorch's roundings pick differently (measured: one
    8 x 8 image in 15 changes a neighbour's slot in a branching ResNet; PyTorch's float32 against
    its float64 does the same). The layer and op tests compare float32 onnxruntime where no tie is
    near."""
    from onnx.reference import ReferenceEvaluator

    torch.manual_seed(0)
    model = build().eval()
    program, session = _export(model, (torch.randn(2, *shape[1:]),))
    _only_standard_operators(program)
    x = torch.randn(*shape)
    got = _run(session, x)[0]
    assert got.shape == tuple(model(x).shape) and np.isfinite(got).all()

    model = model.double()
    program = _onnx_program(model, (torch.randn(2, *shape[1:], dtype=torch.float64),))
    x = x.double()
    got = ReferenceEvaluator(program.model_proto).run(None, {program.model_proto.graph.input[0].name: x.numpy()})[0]
    with torch.no_grad():  # ONNX's LayerNormalization keeps its statistics in float32 (stash_type)
        torch.testing.assert_close(torch.from_numpy(got), model(x), rtol=1e-5, atol=1e-6)


def test_a_convnn_resnet18_with_branching_layers_exports():
    _assert_the_graph_computes_the_model(
        lambda: convnn.models.create_model("resnet18", num_classes=10, layer="branching", small_stem=True, width=16),
        (3, 3, 16, 16))


def test_a_convnn_vit_exports():
    _assert_the_graph_computes_the_model(
        lambda: convnn.models.create_model("vit_tiny", num_classes=10, attention="convnn", image_size=32,
                                           patch_size=8, depth=2), (3, 3, 32, 32))


def test_a_timm_vit_with_convnn_attention_exports():
    from timm.models.vision_transformer import VisionTransformer

    _assert_the_graph_computes_the_model(
        lambda: VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=10,
                                  attn_layer=ConvNNAttention.with_options(k=5)), (3, 3, 32, 32))


class _Attention(torch.nn.Module):
    """knn_attention with fixed options; the mask, if any, is the last input."""

    def __init__(self, k, similarity, rho, index_order):
        super().__init__()
        self.arguments = (k, similarity, index_order, rho)

    def forward(self, queries, keys, values, kernel, bias, mask=None):
        k, similarity, index_order, rho = self.arguments
        return _ops.knn_attention(queries, keys, values, kernel, bias, k, similarity, mask, index_order, rho, 0.5)


@pytest.mark.parametrize("similarity", list(_ops.similarity_names()))
@pytest.mark.parametrize("rho, index_order, mask_kind", [("softmax", False, "bool"), ("uniform", True, "additive"),
                                                         ("mean", False, "none")])
def test_every_similarity_rho_slot_order_and_mask_kind_gives_the_ops_four_outputs(similarity, rho, index_order,
                                                                                  mask_kind):
    """Gaussian features (no ties); rows 0 and 1 of the mask leave fewer than K and no valid candidate."""
    generator = torch.Generator().manual_seed(0)
    g, n, m, d, k = 4, 6, 9, 5, 4
    queries, keys = torch.randn(g, n, d, generator=generator), torch.randn(g, m, d, generator=generator)
    values, kernel = torch.randn(g, m, 3, generator=generator), torch.randn(2, 3, k, generator=generator)
    bias = torch.randn(2, generator=generator)
    allowed = torch.rand(g, n, m, generator=generator) > 0.3
    allowed[:, 0, 2:] = False
    allowed[:, 1] = False
    mask = {"bool": allowed[0], "additive": torch.zeros(g, n, m).masked_fill(~allowed, float("-inf")),
            "none": None}[mask_kind]
    module = _Attention(k, similarity, rho, index_order)
    inputs = (queries, keys, values, kernel, bias) + ((mask,) if mask is not None else ())
    program, session = _export(module, inputs)
    _only_standard_operators(program)
    expected = module(*inputs)
    got = _run(session, *inputs)
    assert np.array_equal(got[2], expected[2].numpy()), "indices differ"
    for name, position in (("output", 0), ("scores", 1), ("weights", 3)):
        torch.testing.assert_close(torch.from_numpy(got[position]), expected[position], rtol=1e-5, atol=1e-6,
                                   msg=lambda text: f"{name}: {text}")


@pytest.mark.parametrize("similarity", ["dot", "gaussian", "chebyshev"])
def test_exact_ties_go_to_the_lower_index_as_in_the_op(similarity):
    """Integer-valued features in {-1, 0, 1}: dozens of candidates tie at the K-th key, and a block of
    all-zero keys ties everywhere."""
    generator = torch.Generator().manual_seed(1)
    queries = torch.randint(-1, 2, (3, 12, 4), generator=generator).float()
    keys = torch.randint(-1, 2, (3, 40, 4), generator=generator).float()
    keys[:, 10:25] = 0

    class Select(torch.nn.Module):
        def forward(self, queries, keys):
            return _ops.knn_select(queries, keys, 7, similarity, None, False)

    program, session = _export(Select(), (queries, keys))
    _only_standard_operators(program)
    scores, indices = _run(session, queries, keys)
    expected_scores, expected_indices = Select()(queries, keys)
    assert np.array_equal(indices, expected_indices.numpy())
    assert np.array_equal(scores, expected_scores.numpy())


def test_a_standard_aggregation_with_bias_exports():
    generator = torch.Generator().manual_seed(2)
    values, weights = torch.randn(2, 8, 3, generator=generator), torch.rand(2, 5, 4, generator=generator)
    indices = torch.randint(0, 8, (2, 5, 4), generator=generator)
    kernel, bias = torch.randn(6, 3, 4, generator=generator), torch.randn(6, generator=generator)

    class Aggregate(torch.nn.Module):
        def forward(self, values, weights, indices, kernel, bias):
            return _ops.knn_aggregate(values, weights, indices, kernel, bias)

    inputs = (values, weights, indices, kernel, bias)
    program, session = _export(Aggregate(), inputs)
    _only_standard_operators(program)
    torch.testing.assert_close(torch.from_numpy(_run(session, *inputs)[0]), Aggregate()(*inputs),
                               rtol=1e-5, atol=1e-6)


def test_random_candidates_are_refused_at_onnx_export_with_the_reason():
    layer = ConvNN2d(4, 4, 5, num_candidates=9).eval()
    reason = r"random candidates \(num_candidates = 9\) drawn from a generator cannot be traced"
    with pytest.raises(Exception, match=reason):
        torch.onnx.export(layer, (torch.randn(2, 4, 6, 6),), dynamo=True, verbose=False)
    program = torch.export.export(layer, (torch.randn(2, 4, 6, 6),))  # keeps the layer op, draw and all
    with pytest.raises(RuntimeError, match=reason):
        program.run_decompositions()


def test_eager_and_torch_export_keep_the_convnn_op():
    """The decompositions serve exporters that ask for them: torch.export's graph keeps knn_attention."""
    layer = ConvNN2d(4, 4, 5).eval()
    program = torch.export.export(layer, (torch.randn(2, 4, 6, 6),)).run_decompositions()
    targets = {str(node.target) for node in program.graph.nodes if node.op == "call_function"}
    assert "convnn.knn_attention.default" in targets
