"""convnn.nn.ConvNNAttention as the attention layer of timm's VisionTransformer: timm's Block
builds it with its own arguments (checked against the pinned timm), each honoured or refused with
a clear error, and calls it with attn_mask / is_causal."""
import copy
import inspect

import pytest
import torch

timm = pytest.importorskip("timm")
from timm.models.vision_transformer import Block, VisionTransformer  # noqa: E402

from convnn.nn import ConvNNAttention  # noqa: E402


def small_vit(**kwargs):
    return VisionTransformer(img_size=16, patch_size=4, embed_dim=24, depth=2, num_heads=3, num_classes=5,
                             attn_layer=ConvNNAttention.with_options(k=5), **kwargs)


def test_timm_block_passes_the_arguments_we_handle():
    """If a timm upgrade changes what Block passes to attn_layer, this names the difference."""
    source = inspect.getsource(timm.models.vision_transformer)
    for argument in ("qkv_bias=", "qk_norm=", "scale_norm=", "proj_bias=", "attn_drop=", "proj_drop=",
                     "norm_layer="):
        assert argument in source, argument
    assert "attn_mask" in inspect.signature(Block.forward).parameters
    assert "is_causal" in inspect.signature(Block.forward).parameters


def test_a_timm_vit_trains_with_convnn_attention():
    torch.manual_seed(0)
    vit = small_vit()
    attn = vit.blocks[0].attn
    assert isinstance(attn, ConvNNAttention)
    assert attn.options["k"] == 5 and attn.options["num_heads"] == 3
    # timm's defaults: qkv_bias=True and proj_bias=True, honoured as qkv_bias and out_bias.
    assert attn.options["qkv_bias"] and attn.options["out_bias"]
    assert attn.query_projection.bias is not None and attn.output_projection.bias is not None
    out = vit(torch.randn(2, 3, 16, 16))
    assert out.shape == (2, 5)
    out.sum().backward()
    assert attn.kernel.grad is not None and attn.query_projection.weight.grad is not None


def test_timm_arguments_without_a_convnn_counterpart_are_refused_clearly():
    with pytest.raises(ValueError, match="qk_norm=True is not supported"):
        small_vit(qk_norm=True)
    with pytest.raises(ValueError, match="attn_drop=0.1 is not supported"):
        small_vit(attn_drop_rate=0.1)
    vit = small_vit(proj_drop_rate=0.1)
    assert isinstance(vit.blocks[0].attn.proj_drop, torch.nn.Dropout)


def test_attn_mask_and_is_causal_map_onto_convnn_masks():
    torch.manual_seed(0)
    attn = ConvNNAttention(24, 3, 5).eval()
    x = torch.randn(2, 7, 24)
    causal = torch.ones(7, 7, dtype=torch.bool).tril()
    assert torch.equal(attn(x, attn_mask=causal), attn(x, is_causal=True))
    additive = torch.zeros(7, 7).masked_fill(~causal, float("-inf"))
    assert torch.equal(attn(x, attn_mask=additive), attn(x, is_causal=True))
    # A mask and is_causal together: both apply (C++ combines them).
    band = (torch.arange(7)[:, None] - torch.arange(7)[None, :]).abs() <= 2
    assert torch.equal(attn(x, attn_mask=band, is_causal=True), attn(x, attn_mask=band & causal))
    with pytest.raises(ValueError, match=r"attn_mask must be \[N, N\]"):
        attn(x, attn_mask=causal.expand(2, 1, 7, 7))


def test_the_convnn_models_are_in_timms_registry():
    import convnn.models

    names = timm.list_models("convnn_*")
    assert "convnn_vit_tiny_patch4" in names and "convnn_resnet50" in names
    torch.manual_seed(0)
    vit = timm.create_model("convnn_vit_tiny_patch4", num_classes=10, depth=2)
    assert isinstance(vit.blocks[0].attn, ConvNNAttention) and vit.blocks[0].attn.options["k"] == 9
    assert vit(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    assert timm.data.resolve_data_config(model=vit)["input_size"] == (3, 32, 32)
    # timm's arguments become the registry's options; the model is the registry's.
    torch.manual_seed(1)
    resnet = timm.create_model("convnn_resnet18", num_classes=10, in_chans=1, img_size=16, small_stem=True,
                               width=8)
    torch.manual_seed(1)
    same = convnn.models.create_model("resnet18", layer="branching", num_classes=10, in_channels=1,
                                      image_size=16, small_stem=True, width=8)
    for (name, a), (_, b) in zip(resnet.state_dict().items(), same.state_dict().items()):
        assert torch.equal(a, b), name
    with pytest.raises(ValueError, match="no pretrained weights"):
        timm.create_model("convnn_resnet18", pretrained=True)


def test_a_timm_model_built_with_with_options_is_saved_and_loaded_whole(tmp_path):
    """torch.save(model) of the README's timm recipe: with_options' subclass exists only in this
    process, so its layers pickle as ConvNNAttention, with their options (before: PicklingError)."""
    torch.manual_seed(4)
    vit = timm.models.VisionTransformer(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=4,
                                        num_classes=3, attn_layer=ConvNNAttention.with_options(k=9, similarity="cosine"))
    torch.save(vit, tmp_path / "model.pt")
    loaded = torch.load(tmp_path / "model.pt", weights_only=False)
    x = torch.randn(2, 3, 16, 16)
    assert torch.equal(loaded.eval()(x), vit.eval()(x))
    attn = loaded.blocks[0].attn
    assert type(attn) is ConvNNAttention and attn.options["k"] == 9 and attn.options["similarity"] == "cosine"
    copied = copy.deepcopy(vit)
    assert torch.equal(copied(x), vit(x))
