"""Dynamic shapes through the convnn layers, the functional forms and the models (issue 26).

torch.export with torch.export.Dim batch (and token, height, width) dimensions gives a program that
runs at other sizes and equals eager; torch.compile builds one graph for many batch sizes, counted
with Dynamo's CompileCounter backend (which runs the captured graph eagerly, so the outputs are
eager's bit for bit). The layer ops stay whole in the exported graph (convnn.layer_forward), so the
exported programs equal eager exactly too.

Sizes start at 2: PyTorch specialises dimensions of size 0 and 1. The first inputs torch.compile
sees have no dynamic size equal to another size (H = W, or the batch equal to the kernel's K):
Dynamo's duck sizing would give both one symbol, and specialising the static one (K) would
specialise the other.
"""
import pytest
import torch
import torch._dynamo.testing
from torch.export import Dim

import convnn  # noqa: F401
from convnn import models
from convnn.nn import BranchingConv2d, ConvNN1d, ConvNN2d, ConvNNAttention
from convnn.nn import functional as F

EXACT = dict(rtol=0, atol=0)


def export_runs_at_other_sizes(module, example, dynamic_shapes, other_inputs, strict=False):
    """Exports module at `example` with these dynamic dimensions and checks the program against
    eager at each of `other_inputs` (tuples of arguments)."""
    program = torch.export.export(module, example, dynamic_shapes=dynamic_shapes, strict=strict)
    for inputs in other_inputs:
        torch.testing.assert_close(program.module()(*inputs), module(*inputs), **EXACT)
    return program


def graphs_compiled(module, inputs, **compile_options):
    """The number of graphs torch.compile(fullgraph=True) captures over these calls, each of which
    must equal eager."""
    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounter()
    compiled = torch.compile(module, backend=counter, fullgraph=True, **compile_options)
    for args in inputs:
        torch.testing.assert_close(compiled(*args), module(*args), **EXACT)
    return counter.frame_count


def randn(*shape):
    return (torch.randn(*shape),)


@pytest.fixture(autouse=True)
def seeded():
    torch.manual_seed(0)


# ----------------------------------------------------------------------------------------- layers

def test_convnn1d_exports_with_dynamic_batch_and_length():
    layer = ConvNN1d(3, 4, 3, padding=1).eval()
    shapes = {"input": {0: Dim("batch", min=2, max=64), 2: Dim("length", min=2, max=128)}}
    export_runs_at_other_sizes(layer, randn(3, 3, 12), shapes, [randn(5, 3, 20), randn(2, 3, 7)])


@pytest.mark.parametrize("options", [dict(), dict(coordinates=True, alpha=0.5)], ids=["features", "coordinates"])
def test_convnn2d_exports_with_dynamic_batch_height_and_width(options):
    layer = ConvNN2d(3, 4, 9, padding=1, **options).eval()
    shapes = {"input": {0: Dim("batch", min=2, max=64), 2: Dim("height", min=2, max=32),
                        3: Dim("width", min=2, max=32)}}
    export_runs_at_other_sizes(layer, randn(3, 3, 6, 7), shapes, [randn(5, 3, 8, 5), randn(2, 3, 4, 4)])


def test_convnn2d_with_random_candidates_exports_with_dynamic_batch():
    """Height and width stay static here: PyTorch's randperm with a generator (the fixed draw of
    evaluation, or a layer's own seed) reads its length concretely while tracing, which pins the
    token count M = H*W. The draw itself must not change (it decides which candidates a trained
    model sees), so convnn keeps randperm."""
    layer = ConvNN2d(3, 4, 9, padding=1, num_candidates=20).eval()
    shapes = {"input": {0: Dim("batch", min=2, max=64)}}
    export_runs_at_other_sizes(layer, randn(3, 3, 6, 7), shapes, [randn(5, 3, 6, 7), randn(2, 3, 6, 7)])


def test_branching_conv2d_exports_with_dynamic_batch_height_and_width():
    layer = BranchingConv2d(4, 6, k=9).eval()
    shapes = {"input": {0: Dim("batch", min=2, max=64), 2: Dim("height", min=2, max=32),
                        3: Dim("width", min=2, max=32)}}
    export_runs_at_other_sizes(layer, randn(3, 4, 6, 7), shapes, [randn(5, 4, 8, 5), randn(2, 4, 3, 9)])


@pytest.mark.parametrize("options", [dict(stride=2), dict(dilation=(2, 1), padding=2)], ids=["stride", "dilation"])
def test_strided_and_dilated_layers_export_with_a_dynamic_batch(options):
    """Height and width specialise here (the query lattice is built from the concrete sizes); the
    batch stays dynamic."""
    layer = BranchingConv2d(4, 6, k=4, **options).eval()
    shapes = {"input": {0: Dim("batch", min=2, max=64)}}
    export_runs_at_other_sizes(layer, randn(3, 4, 7, 6), shapes, [randn(5, 4, 7, 6), randn(2, 4, 7, 6)])


@pytest.mark.parametrize("options", [dict(), dict(causal=True), dict(kernel_per_head=True, fused=False),
                                     dict(slot_order="index", rho="mean", fused=False)],
                         ids=["fused", "causal", "kernel-per-head", "unfused-index-order"])
def test_attention_exports_with_dynamic_batch_and_tokens(options):
    layer = ConvNNAttention(8, 2, 5, **options).eval()
    shapes = {"x": {0: Dim("batch", min=2, max=64), 1: Dim("tokens", min=5, max=256)}}
    export_runs_at_other_sizes(layer, randn(3, 12, 8), shapes, [randn(5, 20, 8), randn(2, 5, 8)])


def test_attention_with_a_mask_input_exports_with_dynamic_tokens():
    layer = ConvNNAttention(8, 2, 5).eval()
    tokens = Dim("tokens", min=5, max=256)
    shapes = {"x": {0: Dim("batch", min=2, max=64), 1: tokens}, "attn_mask": {0: tokens, 1: tokens},
              "is_causal": None}

    def inputs(b, n):
        return torch.randn(b, n, 8), torch.rand(n, n) < 0.7, False

    export_runs_at_other_sizes(layer, inputs(3, 12), shapes, [inputs(5, 20), inputs(2, 7)])


def test_attention_with_key_padding_and_a_per_sample_mask_exports_with_dynamic_batch_and_tokens():
    """The masks of docs/sequences.md keep the batch and the token count dynamic."""
    layer = ConvNNAttention(8, 2, 5).eval()
    batch, tokens = Dim("batch", min=2, max=64), Dim("tokens", min=5, max=256)
    shapes = {"x": {0: batch, 1: tokens}, "attn_mask": {0: batch, 2: tokens, 3: tokens}, "is_causal": None,
              "key_padding_mask": {0: batch, 1: tokens}}

    def inputs(b, n):
        padding = torch.arange(n)[None, :] >= torch.randint(1, n + 1, (b,))[:, None]
        return torch.randn(b, n, 8), torch.rand(b, 1, n, n) < 0.7, False, padding

    export_runs_at_other_sizes(layer, inputs(3, 12), shapes, [inputs(5, 20), inputs(2, 7)])


@pytest.mark.parametrize("make_layer,first,others", [
    (lambda: ConvNN1d(3, 4, 3, padding=1), (2, 3, 12), [(3, 3, 12), (5, 3, 20), (4, 3, 9)]),
    (lambda: ConvNN2d(3, 4, 9, padding=1), (2, 3, 6, 7), [(3, 3, 6, 7), (5, 3, 8, 5), (4, 3, 5, 9)]),
    (lambda: BranchingConv2d(3, 6, k=9), (2, 3, 6, 7), [(3, 3, 6, 7), (5, 3, 8, 5), (4, 3, 5, 9)]),
    (lambda: ConvNNAttention(8, 2, 5, causal=True), (2, 7, 8), [(3, 7, 8), (5, 11, 8), (4, 9, 8)]),
], ids=["ConvNN1d", "ConvNN2d", "BranchingConv2d", "ConvNNAttention"])
def test_a_layer_compiles_once_for_every_size_with_dynamic_true(make_layer, first, others):
    layer = make_layer().eval()
    inputs = [randn(*shape) for shape in [first] + others]
    assert graphs_compiled(layer, inputs, dynamic=True) == 1


def test_a_compiled_attention_layer_takes_sequences_shorter_than_k_as_eager_does():
    """Eager pads the keys of a sequence shorter than k (docs/sequences.md); compiled with dynamic=True
    the choice is a guard on the length: one graph for the lengths of at least k, one for those below,
    each equal to eager (before, the traced op refused the shorter ones)."""
    layer = ConvNNAttention(8, 2, 5, causal=True).eval()
    at_least_k = [randn(3, n, 8) for n in (7, 11, 9, 5)]
    below_k = [randn(3, n, 8) for n in (4, 2, 3)]
    assert graphs_compiled(layer, at_least_k + below_k, dynamic=True) == 2


def test_training_step_compiles_once_with_dynamic_true_and_equals_eager():
    """Forward and backward in training mode, batch and tokens varying (dropout draws from the
    default generator, reseeded alike for both runs)."""
    layer = ConvNNAttention(8, 2, 5, dropout=0.25)
    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounter()
    compiled = torch.compile(layer, backend=counter, fullgraph=True, dynamic=True)
    for shape in [(2, 7, 8), (3, 7, 8), (5, 9, 8)]:
        x_eager = torch.randn(*shape, requires_grad=True)
        x_compiled = x_eager.detach().clone().requires_grad_()
        torch.manual_seed(1)
        eager = layer(x_eager)
        torch.manual_seed(1)
        out = compiled(x_compiled)
        torch.testing.assert_close(out, eager, **EXACT)
        eager.sum().backward()
        out.sum().backward()
        torch.testing.assert_close(x_compiled.grad, x_eager.grad, **EXACT)
    assert counter.frame_count == 1


# ------------------------------------------------------------------------------ functional forms

class Functional(torch.nn.Module):
    """A functional form with fixed options, as a module for torch.export."""

    def __init__(self, function):
        super().__init__()
        self.function = function

    def forward(self, *args):
        return self.function(*args)


def conv_nn_tokens(queries, keys, values, kernel):
    return F.conv_nn(queries, keys, values, kernel, None, k=5, heads=2, similarity="scaled_dot", rho="softmax")


def conv_nn1d(input, kernel, bias):
    return F.conv_nn1d(input, kernel, bias, k=3, padding=1)


def conv_nn2d(input, kernel, bias):
    return F.conv_nn2d(input, kernel, bias, k=9, padding=1, similarity="cosine", coordinates=True, alpha=0.5)


def token_args(b, n, m):
    return torch.randn(b, n, 8), torch.randn(b, m, 8), torch.randn(b, m, 8), torch.randn(4, 5)


def conv1d_args(b, length):
    return torch.randn(b, 4, length), torch.randn(5, 4, 3), torch.randn(5)


def conv2d_args(b, h, w):
    return torch.randn(b, 4, h, w), torch.randn(5, 4, 9), torch.randn(5)


BATCH = Dim("batch", min=2, max=64)
FUNCTIONAL_CASES = {
    # name: (function, example, other inputs, dynamic shapes of the positional arguments)
    "conv_nn": (conv_nn_tokens, token_args(3, 10, 12), [token_args(5, 6, 20), token_args(2, 17, 5)],
                ({0: BATCH, 1: Dim("queries", min=2, max=256)}, {0: BATCH, 1: Dim("candidates", min=5, max=256)},
                 {0: BATCH, 1: Dim("candidates", min=5, max=256)}, None)),
    "conv_nn1d": (conv_nn1d, conv1d_args(2, 12), [conv1d_args(5, 20), conv1d_args(3, 7)],
                  ({0: BATCH, 2: Dim("length", min=2, max=128)}, None, None)),
    "conv_nn2d": (conv_nn2d, conv2d_args(3, 6, 7), [conv2d_args(5, 8, 5), conv2d_args(2, 4, 9)],
                  ({0: BATCH, 2: Dim("height", min=2, max=32), 3: Dim("width", min=2, max=32)}, None, None)),
}


@pytest.mark.parametrize("strict", [False, True], ids=["non-strict", "strict"])
@pytest.mark.parametrize("case", FUNCTIONAL_CASES)
def test_functional_form_exports_with_dynamic_sizes_and_equals_eager(case, strict):
    function, example, others, shapes = FUNCTIONAL_CASES[case]
    program = export_runs_at_other_sizes(Functional(function), example, (shapes,), [tuple(o) for o in others],
                                         strict=strict)
    # The op is one node of the graph, its option texts a constant argument built at trace time.
    [node] = [node for node in program.graph.nodes if f"convnn.{case}" in str(node.target)]
    texts = [arg for arg in node.args if isinstance(arg, (list, tuple)) and all(isinstance(t, str) for t in arg)]
    assert len(texts) == 1 and any(text.startswith("k=") for text in texts[0])


@pytest.mark.parametrize("case", FUNCTIONAL_CASES)
def test_functional_form_compiles_fullgraph_once_for_every_size(case):
    function, example, others, _ = FUNCTIONAL_CASES[case]
    assert graphs_compiled(function, [example] + others, dynamic=True) == 1


def test_functional_form_options_may_be_arguments_of_the_compiled_function():
    """Options passed in (here k and temperature) are constants of the graph: each new value gives
    eager's result, through a graph of its own."""
    def attend(tokens, kernel, k, temperature):
        return F.conv_nn(tokens, tokens, tokens, kernel, None, k=k, rho="softmax", temperature=temperature)

    calls = [(torch.randn(2, 12, 4), torch.ones(4, k), k, t) for k, t in [(3, 0.5), (5, 2.0), (7, 1.0)]]
    assert graphs_compiled(attend, calls) == 3


def test_functional_form_options_are_still_checked_by_cpp_under_compile():
    """The option rules stay C++'s: a bad value or an unknown name gives eager's message."""
    x, kernel = torch.randn(2, 4, 8), torch.randn(4, 4, 3)
    bad_value = torch.compile(lambda x, w: F.conv_nn1d(x, w, None, k=3, rho="nope"), fullgraph=True, backend="eager")
    with pytest.raises(Exception, match="rho must be one of uniform, mean, softmax; got 'nope'"):
        bad_value(x, kernel)
    bad_name = torch.compile(lambda x, w: F.conv_nn1d(x, w, None, k=3, kk=2), fullgraph=True, backend="eager")
    with pytest.raises(Exception, match="conv_nn1d: kk is not an option; its options are k, similarity"):
        bad_name(x, kernel)


# ------------------------------------------------------------------------------------------ models

SMALL_RESNET = dict(small_stem=True, width=8, num_classes=10, image_size=16, in_channels=1, layer="branching", k=9)


def test_resnet_with_branching_layers_exports_with_dynamic_batch_height_and_width():
    """Height and width from 16: the last stage (stride 8) must not be 1 pixel wide, which PyTorch
    would specialise."""
    model = models.create_model("resnet18", **SMALL_RESNET).eval()
    shapes = {"images": {0: Dim("batch", min=2, max=64), 2: Dim("height", min=16, max=64),
                         3: Dim("width", min=16, max=64)}}
    export_runs_at_other_sizes(model, randn(3, 1, 16, 24), shapes, [randn(5, 1, 24, 16), randn(2, 1, 32, 40)])


def test_resnet_compiles_once_for_many_batch_sizes():
    model = models.create_model("resnet18", **SMALL_RESNET).eval()
    inputs = [randn(b, 1, 16, 16) for b in (2, 3, 5, 7)]
    assert graphs_compiled(model, inputs, dynamic=True) == 1


def test_automatic_dynamic_shapes_compile_twice_for_ten_batch_sizes():
    """Without dynamic=True, Dynamo compiles the first size statically and the second one
    dynamically; a ragged last batch and evaluation at other batch sizes no longer reach the
    recompile limit (8), which fullgraph=True turns into a failure."""
    model = models.create_model("resnet18", **SMALL_RESNET).eval()
    inputs = [randn(b, 1, 16, 16) for b in range(2, 12)]
    assert graphs_compiled(model, inputs) == 2


VIT = dict(image_size=16, patch_size=4, embed_dim=24, depth=2, num_heads=3, num_classes=5, attention="convnn", k=5)


def test_vit_with_convnn_attention_exports_with_dynamic_batch():
    """The batch only: this ViT's learned position embedding fixes the image size (its forward
    refuses any other), hence the token count."""
    model = models.create_model("vit_tiny", **VIT).eval()
    shapes = {"images": {0: Dim("batch", min=2, max=64)}}
    export_runs_at_other_sizes(model, randn(3, 3, 16, 16), shapes, [randn(5, 3, 16, 16), randn(2, 3, 16, 16)])
    assert graphs_compiled(model, [randn(b, 3, 16, 16) for b in (2, 3, 5)], dynamic=True) == 1


def small_timm_vit(**kwargs):
    from timm.models.vision_transformer import VisionTransformer
    return VisionTransformer(img_size=16, patch_size=4, embed_dim=24, depth=2, num_heads=3, num_classes=5,
                             attn_layer=ConvNNAttention.with_options(k=5), **kwargs).eval()


def test_timm_vit_with_convnn_attention_exports_with_dynamic_batch_and_tokens():
    """timm's dynamic_img_size=True resamples the position embedding, so the image size, hence the
    token count, may vary too; timm needs it to be a multiple of the patch size (4)."""
    pytest.importorskip("timm")
    patches_high, patches_wide = Dim("patches_high", min=3, max=16), Dim("patches_wide", min=3, max=16)
    shapes = {"x": {0: Dim("batch", min=2, max=64), 2: 4 * patches_high, 3: 4 * patches_wide}}
    export_runs_at_other_sizes(small_timm_vit(dynamic_img_size=True), randn(3, 3, 16, 20), shapes,
                               [randn(5, 3, 24, 16), randn(2, 3, 12, 32)])


def test_timm_vit_with_convnn_attention_compiles_once_for_many_batch_sizes():
    pytest.importorskip("timm")
    model = small_timm_vit()
    assert graphs_compiled(model, [randn(b, 3, 16, 16) for b in (2, 3, 5, 6)], dynamic=True) == 1
