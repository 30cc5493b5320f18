"""What a PyTorch/timm user expects of the layers' interface (issue 27 §5): projections that are
real nn.Linear modules which timm's init, fix_init and module replacement (LoRA, quantisation)
reach, the names PyTorch/timm/NATTEN use, errors that name the layer, the memory format kept,
type hints."""
import inspect
import math
import typing
from importlib import resources

import pytest
import torch
from torch import nn

import convnn
from convnn.nn import BranchingConv2d, BranchingConv3d, ConvNN1d, ConvNN2d, ConvNN3d, ConvNNAttention

timm = pytest.importorskip("timm")
from timm.models.vision_transformer import VisionTransformer  # noqa: E402

PROJECTIONS = ("query_projection", "key_projection", "value_projection", "output_projection")


def test_attention_projections_are_linear_modules_with_the_cpp_state_dict_keys():
    attention = ConvNNAttention(8, 2, 3, qkv_bias=True)
    for name in PROJECTIONS:
        assert type(getattr(attention, name)) is nn.Linear
    keys = set(attention.state_dict())
    names, _, _ = torch.ops.convnn.layer_parameters("ConvNNAttention", attention._texts)
    assert keys == set(names)
    assert {"query_projection.weight", "query_projection.bias", "output_projection.weight"} <= keys
    assert attention.proj is attention.output_projection


SPATIAL_LAYERS = (lambda: ConvNN1d(4, 4, 3, projection="linear", projection_bias=True),
                  lambda: ConvNN2d(4, 6, 3, projection="linear", qk_channels=2),
                  lambda: ConvNN3d(4, 4, 3, projection="linear"))
BRANCHING_LAYERS = (lambda: BranchingConv2d(4, 8, lambda_=0.5, k=3, projection="linear"),
                    lambda: BranchingConv2d(4, 6, lambda_=0.0, kernel_size=5, stride=2, dilation=(1, 2)),
                    lambda: BranchingConv3d(4, 4, lambda_=0.5, k=3, stride=(1, 2, 1)))


@pytest.mark.parametrize("build", SPATIAL_LAYERS + BRANCHING_LAYERS)
def test_every_cpp_linear_and_convolution_is_a_torch_nn_module_under_the_cpp_state_dict_keys(build):
    layer = build()
    names, tensors, _ = torch.ops.convnn.layer_parameters(layer._layer, layer._texts)
    assert set(layer.state_dict()) == set(names)  # checkpoints of the earlier layout load as they are
    kinds = {"linear": nn.Linear, "conv1d": nn.Conv1d, "conv2d": nn.Conv2d, "conv3d": nn.Conv3d}
    sub_names, sub_kinds, _ = torch.ops.convnn.layer_submodules(layer._layer, layer._texts)
    assert sub_names, "the layer has no Linear or convolution to show"
    for name, kind in zip(sub_names, sub_kinds):
        assert type(layer.get_submodule(name)) is kinds[kind], name
    projections = [name for name, m in layer.named_modules() if name.endswith("_projection")]
    assert all(type(layer.get_submodule(name)) is nn.Linear for name in projections)
    if layer._layer.startswith("Branching"):
        assert type(layer.mix) is type(layer.conv_branch) is kinds[f"conv{layer._layer[-2:]}"]


@pytest.mark.parametrize("build", BRANCHING_LAYERS[1:])
def test_the_convolution_branch_module_computes_what_the_layer_runs(build):
    """With lambda = 0 the layer is mix(conv_branch(x)): the nn modules' stride, padding and dilation are
    the C++ sub-layers'."""
    torch.manual_seed(0)
    layer = build().double()
    if "convnn_branch" in layer._modules:
        layer = type(layer)(**{**layer.options, "lambda_": 0.0}).double()
    x = torch.randn(2, 4, *(9,) * (len(layer.conv_branch.kernel_size)), dtype=torch.float64)
    torch.testing.assert_close(layer(x), layer.mix(layer.conv_branch(x)), rtol=1e-12, atol=1e-12)


def _with_weight(build, state, name, weight):
    """A layer of `build` with the state_dict `state` but `name`'s weight replaced."""
    reference = build().double()
    reference.load_state_dict({**state, f"{name}.weight": weight})
    return reference


@pytest.mark.parametrize("build", SPATIAL_LAYERS + BRANCHING_LAYERS[:1])
def test_a_projection_parametrization_or_pruning_is_honoured_a_replaced_one_refused_a_hook_warned(build):
    from torch.nn.utils import parametrize, prune

    torch.manual_seed(0)
    layer = build().double()
    name = next(name for name, _ in layer.named_modules() if name.endswith("value_projection"))
    x = torch.randn(2, 4, *(5,) * int(layer._layer[-2]), dtype=torch.float64)  # [B, C, spatial...] of a ...Nd layer
    projection = layer.get_submodule(name)
    state = {key: tensor.clone() for key, tensor in layer.state_dict().items()}
    weight = state[f"{name}.weight"]

    class Doubled(nn.Module):
        def forward(self, weight):
            return weight * 2

    parametrize.register_parametrization(projection, "weight", Doubled())
    torch.testing.assert_close(layer(x), _with_weight(build, state, name, weight * 2)(x), rtol=0, atol=0)
    parametrize.remove_parametrizations(projection, "weight", leave_parametrized=False)

    # Pruning's mask, applied in a pre-hook the C++ forward does not run, is applied, and follows a
    # change of the unpruned weight (an optimizer step) rather than keeping the mask's first product.
    prune.l1_unstructured(projection, "weight", amount=0.5)
    with torch.no_grad():
        projection.weight_orig.mul_(3)
    masked = projection.weight_orig.detach() * projection.weight_mask
    torch.testing.assert_close(layer(x), _with_weight(build, state, name, masked)(x), rtol=0, atol=0)
    prune.remove(projection, "weight")

    handle = projection.register_forward_hook(lambda module, args, output: output * 0)
    with pytest.warns(UserWarning, match=rf"forward hooks of its sub-layer {name} are not called"):
        layer(x)
    handle.remove()
    owner, _, leaf = name.rpartition(".")
    setattr(layer.get_submodule(owner), leaf, _LowRankDelta(projection))
    with pytest.raises(ValueError, match=rf"sub-layer {name} is a _LowRankDelta;.*must be a plain Linear module"):
        layer(x)


def test_init_and_type_based_weight_decay_rules_reach_the_branching_layers_convolutions():
    layer = BranchingConv2d(4, 8, lambda_=0.5, k=3, projection="linear")
    before = layer.conv_branch.weight.detach().clone()
    for module in layer.modules():  # timm's ResNet init: kaiming on every nn.Conv2d
        if isinstance(module, nn.Conv2d):
            nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
    assert not torch.equal(before, layer.conv_branch.weight)
    # A rule that decays the weights of Linear and Conv2d modules only sees all five.
    decayed = {id(m.weight) for m in layer.modules() if isinstance(m, (nn.Linear, nn.Conv2d))}
    assert decayed == {id(p) for n, p in layer.named_parameters() if n.endswith("weight")}


class _LowRankDelta(nn.Module):
    """A LoRA-style wrapper: the base projection plus a low-rank update (what PEFT substitutes)."""

    def __init__(self, base, rank=2):
        super().__init__()
        self.base = base
        self.down = nn.Linear(base.in_features, rank, bias=False, dtype=base.weight.dtype)
        self.up = nn.Linear(rank, base.out_features, bias=False, dtype=base.weight.dtype)
        nn.init.normal_(self.up.weight)

    def forward(self, x):
        return self.base(x) + self.up(self.down(x))


def test_a_wrapped_projection_takes_effect_and_equals_its_merged_weight():
    torch.manual_seed(0)
    attention = ConvNNAttention(8, 2, 3).double()
    x = torch.randn(2, 6, 8, dtype=torch.float64)
    before = attention(x)
    attention.value_projection = _LowRankDelta(attention.value_projection)
    wrapped = attention(x)
    assert not torch.allclose(before, wrapped)
    # Merging the update into the weight (as PEFT's merge does) gives the same layer.
    delta = attention.value_projection.up.weight @ attention.value_projection.down.weight
    merged = ConvNNAttention(8, 2, 3).double()
    merged.load_state_dict({**{k: v for k, v in attention.state_dict().items() if not k.startswith("value_")},
                            "value_projection.weight": attention.value_projection.base.weight + delta})
    torch.testing.assert_close(merged(x), wrapped, rtol=1e-12, atol=1e-12)
    wrapped.sum().backward()
    assert attention.value_projection.down.weight.grad.abs().sum() > 0


def test_plain_projections_are_one_matrix_product_and_a_hooked_one_runs_its_module():
    """As timm's qkv: plain nn.Linear projections run as one [3C, C] product (the C++ layer's rule,
    convnn::attention_project_qkv); a forward hook, a parametrization or a subclass makes the layer
    call the modules, so what they add takes effect."""
    torch.manual_seed(1)
    attention = ConvNNAttention(8, 2, 3, qkv_bias=True).double()
    x = torch.randn(2, 6, 8, dtype=torch.float64)
    queries, keys, values = attention._project_qkv(x)
    assert queries._base is not None and queries._base is keys._base is values._base, "thirds of one product"
    for got, linear in zip((queries, keys, values), (attention.query_projection, attention.key_projection,
                                                     attention.value_projection)):
        torch.testing.assert_close(got, linear(x), rtol=1e-12, atol=1e-12)
    before = attention(x)
    calls = []
    handle = attention.key_projection.register_forward_hook(lambda module, args, out: calls.append(1) or out * 2)
    hooked = attention(x)
    assert calls == [1] and not torch.allclose(before, hooked)
    handle.remove()
    for name in ("weight", "bias"):  # doubled keys again, the other way
        torch.nn.utils.parametrize.register_parametrization(attention.key_projection, name, _Doubled())
    torch.testing.assert_close(attention(x), hooked, rtol=1e-12, atol=1e-12)


class _Doubled(nn.Module):
    def forward(self, weight):
        return 2 * weight


def _timm_vit(**kwargs):
    return VisionTransformer(img_size=16, patch_size=4, embed_dim=32, depth=3, num_heads=2, num_classes=5,
                             attn_layer=ConvNNAttention.with_options(k=4), **kwargs)


def test_timm_weight_init_reaches_the_projections():
    torch.manual_seed(0)
    vit = _timm_vit()
    weights = torch.cat([getattr(block.attn, name).weight.flatten() for block in vit.blocks for name in PROJECTIONS])
    # timm's init: trunc_normal_(std=0.02) on every nn.Linear (the C++ default is PyTorch's
    # kaiming-uniform, std 1/sqrt(3 * 32) = 0.10 here).
    assert abs(weights.std().item() - 0.02) < 0.002


def test_timm_fix_init_rescales_the_output_projection():
    torch.manual_seed(0)
    plain = _timm_vit()
    torch.manual_seed(0)
    fixed = _timm_vit(fix_init=True)
    for layer_id, (a, b) in enumerate(zip(plain.blocks, fixed.blocks)):
        torch.testing.assert_close(b.attn.proj.weight, a.attn.proj.weight / math.sqrt(2.0 * (layer_id + 1)))
        torch.testing.assert_close(b.attn.query_projection.weight, a.attn.query_projection.weight)


def test_type_based_weight_decay_rules_see_the_projections():
    """timm's param_groups_weight_decay and the usual `isinstance(m, nn.Linear)` rules."""
    vit = _timm_vit()
    linear = {name for name, module in vit.named_modules() if isinstance(module, nn.Linear)}
    assert {f"blocks.0.attn.{name}" for name in PROJECTIONS} <= linear


@pytest.mark.parametrize("layer, alias, option, value", [
    (lambda **kw: ConvNN2d(8, 8, 3, **kw), "num_heads", "heads", 2),
    (lambda **kw: ConvNN1d(8, 8, 3, **kw), "num_heads", "heads", 4),
    (lambda **kw: ConvNNAttention(8, 2, 3, **kw), "is_causal", "causal", True),
])
def test_pytorch_names_are_accepted_for_the_same_options(layer, alias, option, value):
    assert layer(**{alias: value}).options[option] == value
    with pytest.raises(TypeError, match=f"{alias} and {option} are the same option; give one"):
        layer(**{alias: value, option: value})


def test_is_causal_option_equals_the_causal_mask_at_forward():
    torch.manual_seed(0)
    built_causal = ConvNNAttention(8, 2, 3, is_causal=True).double()
    plain = ConvNNAttention(8, 2, 3).double()
    plain.load_state_dict(built_causal.state_dict())
    x = torch.randn(2, 7, 8, dtype=torch.float64)
    assert torch.equal(built_causal(x), plain(x, is_causal=True))


@pytest.mark.parametrize("build, shape", [
    (lambda: ConvNN1d(4, 6, 3), (2, 4, 9)),
    (lambda: ConvNN2d(4, 6, 3), (2, 4, 5, 5)),
    (lambda: ConvNN3d(4, 6, 3), (2, 4, 3, 4, 5)),
    (lambda: ConvNNAttention(8, 2, 3), (2, 5, 8)),
    (lambda: BranchingConv2d(4, 6), (2, 4, 5, 5)),
    (lambda: BranchingConv3d(4, 6), (2, 4, 3, 3, 3)),
])
def test_a_dtype_mismatch_names_the_layer(build, shape):
    layer = build()
    with pytest.raises(RuntimeError, match=rf"{type(layer).__name__}: input is Double but the layer's parameters "
                                           r"are Float"):
        layer(torch.randn(*shape, dtype=torch.float64))
    with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast casts; no mismatch to report there
        layer(torch.randn(*shape, dtype=torch.float64).float())


@pytest.mark.parametrize("build", [lambda: ConvNN2d(4, 6, 3, padding=1), lambda: BranchingConv2d(4, 6)])
def test_a_channels_last_input_gives_a_channels_last_output_as_conv2d_does(build):
    torch.manual_seed(0)
    layer = build().double()
    x = torch.randn(2, 4, 5, 6, dtype=torch.float64)
    out = layer(x.to(memory_format=torch.channels_last))
    assert out.is_contiguous(memory_format=torch.channels_last)
    assert nn.Conv2d(4, 6, 3)(x.float().to(memory_format=torch.channels_last)).is_contiguous(
        memory_format=torch.channels_last)
    # The same values (the convolutions of the branching layer sum in another order in channels_last).
    torch.testing.assert_close(out, layer(x), rtol=1e-12, atol=1e-12)


def test_the_branching_layer_builds_as_its_docstring_shows():
    signature = inspect.signature(BranchingConv2d)
    assert list(signature.parameters)[:2] == ["in_channels", "out_channels"]
    layer = BranchingConv2d(8, 16, lambda_=0.5, k=9, similarity="cosine")
    assert layer(torch.randn(1, 8, 6, 6)).shape == (1, 16, 6, 6)
    for word in ("lambda_", "k=9"):
        assert word in BranchingConv2d.__doc__


def test_the_package_ships_type_hints():
    assert resources.files("convnn").joinpath("py.typed").is_file()
    for layer in (ConvNN1d, ConvNN2d, ConvNN3d, ConvNNAttention, BranchingConv2d, BranchingConv3d):
        hints = typing.get_type_hints(layer.forward)
        assert hints["return"] is torch.Tensor
        assert layer.forward.__doc__, f"{layer.__name__}.forward has no docstring"
    assert typing.get_type_hints(convnn.models.create_model)["return"] is nn.Module


def _tiny_vit(attn_layer=None, **kwargs):
    extra = {} if attn_layer is None else {"attn_layer": attn_layer}
    return VisionTransformer(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2, num_classes=5,
                             **extra, **kwargs)


def test_an_mhsa_vit_converted_at_k_equal_n_computes_what_the_mhsa_vit_does():
    """The converter maps timm's qkv/proj onto the four projections; with K = the token count and
    the layer's defaults (scaled_dot, softmax, kernel of ones) ConvNN attention is attention."""
    torch.manual_seed(0)
    mhsa = _tiny_vit().double().eval()
    tokens = (16 // 4) ** 2 + 1
    converted = _tiny_vit(ConvNNAttention.with_options(k=tokens)).double().eval()
    converted.load_state_dict(convnn.pretrained.mhsa_to_convnn_state_dict(mhsa.state_dict(), converted))
    images = torch.randn(2, 3, 16, 16, dtype=torch.float64)
    torch.testing.assert_close(converted(images), mhsa(images), rtol=1e-10, atol=1e-10)
    for block, source in zip(converted.blocks, mhsa.blocks):
        assert torch.equal(block.attn.proj.weight, source.attn.proj.weight)
        assert torch.equal(torch.cat([block.attn.query_projection.bias, block.attn.key_projection.bias,
                                      block.attn.value_projection.bias]), source.attn.qkv.bias)


def test_the_converter_names_what_does_not_fit():
    mhsa = _tiny_vit(qkv_bias=False)
    with_bias = _tiny_vit(ConvNNAttention.with_options(k=4))
    with pytest.raises(ValueError, match=r"no blocks\.0\.attn\.qkv\.bias for blocks\.0\.attn"):
        convnn.pretrained.mhsa_to_convnn_state_dict(mhsa.state_dict(), with_bias)
    state = _tiny_vit().state_dict()
    state["blocks.1.attn.qkv.weight"] = state["blocks.1.attn.qkv.weight"][:48]
    with pytest.raises(ValueError, match=r"blocks\.1\.attn\.qkv\.weight has shape \(48, 32\), but blocks\.1\.attn "
                                         r"has embed_dim 32"):
        convnn.pretrained.mhsa_to_convnn_state_dict(state, with_bias)
    with pytest.raises(ValueError, match="no ConvNNAttention layer"):
        convnn.pretrained.mhsa_to_convnn_state_dict(state, _tiny_vit())


@pytest.mark.parametrize("aggregation", ["standard", "depthwise"])
def test_conv_nn3d_in_the_convolution_setting_is_conv3d(aggregation):
    """Coordinates only, chebyshev, K = 27, index order, uniform rho, padding 1: the 3x3x3 window in
    raster order, so the convolution's weights as kernel give conv3d with same padding."""
    torch.manual_seed(3)
    standard = aggregation == "standard"
    weight = torch.randn(5 if standard else 4, 4 if standard else 1, 3, 3, 3, dtype=torch.float64)
    bias = torch.randn(weight.shape[0], dtype=torch.float64)
    x = torch.randn(2, 4, 3, 4, 5, dtype=torch.float64)
    kernel = weight.flatten(2) if standard else weight.flatten(1)
    got = convnn.nn.functional.conv_nn3d(x, kernel, bias, k=27, similarity="chebyshev", coordinates=True,
                                         alpha=0.0, padding=1, slot_order="index", rho="uniform")
    want = nn.functional.conv3d(x, weight, bias, padding=1, groups=1 if standard else 4)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_stride_and_dilation_take_one_value_or_one_per_axis_as_torch_convolutions_do():
    """The C++ field list gives their type (int[]) and defaults; an integer or a tuple is accepted,
    anything else refused naming the option; the output has ceil(size / stride) positions."""
    layer = ConvNN2d(4, 6, 9, padding=1)
    assert layer.options["stride"] == (1, 1) and layer.options["dilation"] == (1, 1)
    assert ConvNN2d(4, 6, 9, padding=1, stride=2)(torch.randn(2, 4, 7, 8)).shape == (2, 6, 4, 4)
    assert ConvNN3d(4, 6, 8, stride=(1, 2, 3))(torch.randn(1, 4, 3, 4, 5)).shape == (1, 6, 3, 2, 2)
    with pytest.raises(TypeError, match="option stride must be an integer or a tuple of integers"):
        ConvNN2d(4, 6, 9, stride="2")
    with pytest.raises(RuntimeError, match=r"option stride must be one integer or 2 \(one per axis\), got '1,2,3'"):
        ConvNN2d(4, 6, 9, stride=(1, 2, 3))
    with pytest.raises(RuntimeError, match=r"ConvNN2d: dilation must be at least 1 on every axis, got \[0, 1\]"):
        ConvNN2d(4, 6, 9, dilation=(0, 1))
    # The functional form takes them too: every third of 9 positions, candidates on the dilation-2 grid.
    out = convnn.nn.functional.conv_nn1d(torch.randn(1, 4, 9), torch.randn(4, 3), None, k=3, stride=3, dilation=2)
    assert out.shape == (1, 4, 3)


@pytest.mark.parametrize("dilation", [1, 2])
def test_a_strided_layer_compiles(dilation):
    """torch.compile traces the strided (and dilated) layer: the same output as eager."""
    torch.manual_seed(4)
    layer = ConvNN2d(3, 5, 9, padding=dilation, stride=2, dilation=dilation, similarity="chebyshev",
                     coordinates=True, alpha=0.0, slot_order="index").double().eval()
    x = torch.randn(2, 3, 7, 8, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(layer, backend="aot_eager", fullgraph=True)(x), layer(x))
