"""The Python layers against the C++ layers: built from the same seed they hold the same tensors
under the same state_dict keys; on the same weights and input, outputs and gradients are bitwise
equal on the CPU. The C++ side is python/tests/parity/layer_parity.cpp (built with the C++
tests), which builds the C++ module from the same option texts."""
import os
import pathlib
import subprocess

import pytest
import torch

import convnn
from convnn.nn import BranchingConv2d, BranchingConv3d, ConvNN1d, ConvNN2d, ConvNN3d, ConvNNAttention

PARITY = os.environ.get(
    "CONVNN_LAYER_PARITY", str(pathlib.Path(__file__).resolve().parents[2] / "build" / "bin" / "convnn_layer_parity"))

CASES = [
    ("conv1d", lambda: ConvNN1d(4, 6, 3, padding=1, coordinates=True, alpha=0.5, bias=True), (2, 4, 11)),
    ("conv2d", lambda: ConvNN2d(4, 8, 9, padding=1, similarity="dot", rho="softmax"), (2, 4, 6, 5)),
    ("conv2d-linear-heads", lambda: ConvNN2d(4, 4, 5, heads=2, projection="linear", qk_channels=6,
                                             aggregation="depthwise", kernel_per_head=True, bias=True),
     (2, 4, 5, 5)),
    ("conv2d-random", lambda: ConvNN2d(4, 8, 4, padding=1, num_candidates=12, include_self=True, seed=7),
     (2, 4, 5, 5)),
    ("conv2d-strided-dilated", lambda: ConvNN2d(4, 6, 9, padding=2, stride=(2, 1), dilation=2, coordinates=True,
                                                alpha=0.5, bias=True), (2, 4, 7, 8)),
    ("conv3d", lambda: ConvNN3d(3, 4, 27, padding=1, coordinates=True, alpha=0.5, bias=True), (2, 3, 3, 4, 5)),
    ("conv3d-depthwise-random", lambda: ConvNN3d(4, 4, 6, aggregation="depthwise", similarity="l1", rho="softmax",
                                                 num_candidates=20, seed=5), (2, 4, 3, 3, 4)),
    ("attention", lambda: ConvNNAttention(16, 2, 5, qkv_bias=True, causal=True), (2, 9, 16)),
    ("attention-kvt", lambda: ConvNNAttention(12, 3, 4, similarity="cosine", rho="mean", aggregation="standard",
                                              kernel_init="default", bias=True, out_bias=True), (3, 10, 12)),
    ("branching", lambda: BranchingConv2d(4, 8, lambda_=0.5, k=9, padding=1), (2, 4, 6, 6)),
    ("branching-random", lambda: BranchingConv2d(4, 6, lambda_=0.5, k=5, num_candidates=16, seed=3), (2, 4, 5, 5)),
    ("branching-strided", lambda: BranchingConv2d(4, 6, lambda_=0.5, k=9, padding=1, stride=2), (2, 4, 7, 6)),
    ("branching3d", lambda: BranchingConv3d(3, 6, lambda_=0.5, k=8, similarity="gaussian"), (2, 3, 3, 3, 4)),
]


def run_cpp(tmp_path, layer, state, x, grad_output, training):
    case, result = tmp_path / "case.pt", tmp_path / "result.pt"
    torch.save({"layer": layer._layer, "options": layer._texts, "state": state, "input": x,
                "grad_output": grad_output, "training": training}, case)
    subprocess.run([PARITY, str(case), str(result)], check=True)
    # torch::pickle_save tags typed containers (torch.jit._pickle.restore_type_tag), which
    # weights_only=True refuses; this file is our own tool's output.
    return torch.load(result, weights_only=False)


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("name,build,shape", CASES, ids=[c[0] for c in CASES])
def test_outputs_and_gradients_equal_the_cpp_layer_bitwise(tmp_path, name, build, shape, training):
    torch.manual_seed(0)
    layer = build().double().train(training)
    state = {k: v.detach().clone() for k, v in layer.state_dict().items()}
    x = torch.randn(*shape, dtype=torch.float64, requires_grad=True)
    out = layer(x)
    grad_output = torch.randn_like(out)
    out.backward(grad_output)
    cpp = run_cpp(tmp_path, layer, state, x.detach(), grad_output, training)
    assert torch.equal(cpp["output"], out.detach())
    assert torch.equal(cpp["input_grad"], x.grad)
    grads = {n: p.grad for n, p in layer.named_parameters() if p.grad is not None}
    assert set(cpp["grads"]) == set(grads)
    for n, g in grads.items():
        assert torch.equal(cpp["grads"][n], g), n


@pytest.mark.parametrize("name,build,shape", CASES, ids=[c[0] for c in CASES])
def test_the_same_seed_builds_the_cpp_layers_tensors(name, build, shape):
    """Construction is the C++ module's own: same keys, shapes and initial values (the C++ and
    Python random generators are one)."""
    torch.manual_seed(1)
    first = build()
    names, tensors, trainable = torch.ops.convnn.layer_parameters(first._layer, first._texts)
    torch.manual_seed(1)
    again = build()
    state = again.state_dict()
    assert list(state) == [n for n in state]  # a state_dict, in registration order
    assert set(state) == set(names)
    for n, t in zip(names, tensors):
        assert state[n].shape == t.shape and state[n].dtype == t.dtype, n
    torch.manual_seed(1)
    _, cpp_tensors, _ = torch.ops.convnn.layer_parameters(first._layer, first._texts)
    for n, t in zip(names, cpp_tensors):
        assert torch.equal(state[n], t), n
    params = {n for n, _ in again.named_parameters()}
    assert params == {n for n, p in zip(names, trainable) if p}


def test_parameter_counts_equal_the_cpp_ones():
    # ConvNN2d(64, 64, 9): standard kernel 64*64*9; the branching layer: half ConvNN (32*64*9),
    # half 3x3 conv with bias (32*64*9 + 32), 1x1 mix with bias (64*64 + 64).
    assert sum(p.numel() for p in ConvNN2d(64, 64, 9).parameters()) == 64 * 64 * 9
    # ConvNN3d(16, 32, 27) with bias: standard kernel 32*16*27 and 32; depthwise: 16*27.
    assert sum(p.numel() for p in ConvNN3d(16, 32, 27, bias=True).parameters()) == 32 * 16 * 27 + 32
    assert sum(p.numel() for p in ConvNN3d(16, 16, 27, aggregation="depthwise").parameters()) == 16 * 27
    # BranchingConv3d(8, 8): half ConvNN3d (4*8*27), half 3x3x3 conv with bias (4*8*27 + 4), 1x1x1 mix (8*8 + 8).
    assert sum(p.numel() for p in BranchingConv3d(8, 8).parameters()) == 4 * 8 * 27 + 4 * 8 * 27 + 4 + 8 * 8 + 8
    assert sum(p.numel() for p in BranchingConv2d(64, 64).parameters()) == 32 * 64 * 9 + 32 * 64 * 9 + 32 + 64 * 64 + 64


def test_options_are_the_cpp_ones_with_clear_errors():
    assert ConvNN2d(4, 8, 9).options["similarity"] == "cosine"
    assert ConvNNAttention(8, 2, 3).options["similarity"] == "scaled_dot"
    assert BranchingConv2d(4, 8).options["padding"] == 1  # the branching layer's own default
    with pytest.raises(TypeError, match="ConvNN2d: paddin is not an option; its options are in_channels"):
        ConvNN2d(4, 8, 9, paddin=1)
    # An unknown keyword is named before a missing option (it was "missing a required argument: 'k'").
    with pytest.raises(TypeError, match="ConvNN2d: kernel_size is not an option"):
        ConvNN2d(8, 8, kernel_size=3)
    with pytest.raises(TypeError, match="missing a required argument: 'k'"):
        ConvNN2d(4, 8)
    with pytest.raises(RuntimeError, match="similarity must be one of"):
        ConvNN2d(4, 8, 9, similarity="cos")
    # Each value has its C++ field's type: "9" was stored as k="9", True as k=1.
    with pytest.raises(TypeError, match=r"ConvNN2d: option k must be an integer, got '9' \(str\)"):
        ConvNN2d(8, 8, "9")
    with pytest.raises(TypeError, match=r"option k must be an integer, got True \(bool\)"):
        ConvNN2d(4, 8, True)
    with pytest.raises(TypeError, match=r"option include_self must be True or False, got 1 \(int\)"):
        ConvNN2d(4, 8, 9, include_self=1)
    assert ConvNN2d(4, 8, 9, alpha=1).options["alpha"] == 1  # an integer is a number
    with pytest.raises(RuntimeError, match="heads = 3 must be at least 1 and divide"):
        ConvNN2d(4, 8, 9, heads=3)
    with pytest.raises(RuntimeError, match=r"k must be in \[1, 9\]"):
        ConvNN2d(2, 2, 10, padding=1)(torch.randn(1, 2, 1, 1))


def test_functional_forms_equal_the_module():
    torch.manual_seed(0)
    layer = ConvNN2d(3, 5, 9, padding=1, similarity="chebyshev")
    x = torch.randn(2, 3, 6, 6)
    expected = layer(x)
    got = convnn.nn.functional.conv_nn2d(x, layer.kernel, None, k=9, padding=1, similarity="chebyshev")
    assert torch.equal(got, expected)


def test_an_unbatched_input_is_one_sample_as_torch_nn_convolutions_take_it():
    torch.manual_seed(13)
    cases = [(ConvNN1d(3, 4, 3, padding=1), torch.randn(3, 7)), (ConvNN2d(3, 4, 9, padding=1), torch.randn(3, 5, 6)),
             (BranchingConv2d(3, 6, k=9), torch.randn(3, 5, 6)), (ConvNNAttention(8, 2, 3), torch.randn(6, 8))]
    for layer, sample in cases:
        assert torch.equal(layer(sample), layer(sample.unsqueeze(0)).squeeze(0)), type(layer).__name__
