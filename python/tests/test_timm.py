"""convnn.nn.ConvNNAttention as the attention layer of timm's VisionTransformer: timm's Block
builds it with its own arguments (checked against the pinned timm), each honoured or refused with
a clear error, and calls it with attn_mask / is_causal."""
import copy
import inspect
import subprocess
import sys

import pytest
import torch

timm = pytest.importorskip("timm")
from timm.models.vision_transformer import Block, VisionTransformer  # noqa: E402

import convnn.models  # noqa: E402
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
    # timm's broadcastable [B, 1, N, N] form is the same mask (tests/test_sequences.py has the rest).
    assert torch.equal(attn(x, attn_mask=causal.expand(2, 1, 7, 7)), attn(x, is_causal=True))
    with pytest.raises(RuntimeError, match=r"attn_mask must be \[N,N\], \[B,N,N\] or \[B,H,N,N\]"):
        attn(x, attn_mask=causal.expand(2, 2, 7, 7))


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


@pytest.mark.parametrize("first, then", [("convnn", "timm"), ("timm", "convnn")])
def test_the_models_reach_timm_whichever_is_imported_first_and_convnn_alone_imports_no_timm(first, then):
    """`import convnn` leaves timm (and the Dynamo it imports) unimported; the models are registered
    at timm's first import, or at once where timm was imported before convnn."""
    script = "\n".join([
        "import sys",
        f"import {first}",
        f"assert ('timm' in sys.modules) == {first == 'timm'}, sorted(sys.modules)",
        f"import {then}",
        "import timm",
        "print(sorted(timm.list_models('convnn_*')))",
    ])
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert eval(result.stdout) == sorted(convnn.timm_models.timm_models()), result.stdout


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


# ------------------------------------------------------------------------ the registry's table

def test_timms_convnn_names_come_from_the_cpp_table():
    import convnn.models

    expected = []
    for row in convnn.models.model_table():
        if row["family"] == "vit":
            expected += [f"convnn_{row['name']}_patch4", f"convnn_{row['name']}_patch16"]
        elif row["family"] == "resnet":
            expected.append(f"convnn_{row['name']}")
    # The language models are not image classifiers: timm does not list them.
    assert any(row["family"] == "lm" for row in convnn.models.model_table())
    assert sorted(timm.list_models("convnn_*")) == sorted(expected)
    assert "convnn_vit_large_patch16" in expected
    cfg = timm.models.get_pretrained_cfg("convnn_vit_large_patch16")
    assert cfg.input_size == (3, 224, 224) and cfg.classifier == "head"
    with pytest.raises(RuntimeError, match="Unknown model"):
        timm.create_model("convnn_vit_huge_patch16")


def test_convnn_vit_large_patch16_has_timms_parameter_count():
    """ConvNN attention's depthwise kernel adds 24 blocks x 64 x K to timm's vit_large_patch16_224
    (304,326,632 parameters); its plain-attention build is exactly timm's count."""
    with torch.device("meta"):
        reference = sum(p.numel() for p in timm.create_model("vit_large_patch16_224").parameters())
    assert reference == 304_326_632
    model = timm.create_model("convnn_vit_large_patch16", attention="mhsa")
    assert sum(p.numel() for p in model.parameters()) == reference
    assert model.blocks[0].attn.num_heads == 16 and len(model.blocks) == 24


# ------------------------------------------------------------------- timm's model interface

def _interface_pair(family):
    """(convnn's timm model, timm's own) of the same shape, small enough for a CPU test."""
    torch.manual_seed(0)
    if family == "resnet":
        ours = timm.create_model("convnn_resnet18", layer="conv", num_classes=10, img_size=64)
        theirs = timm.create_model("resnet18", num_classes=10)
        return ours, theirs, torch.randn(2, 3, 64, 64)
    ours = timm.create_model("convnn_vit_tiny_patch4", depth=3, num_classes=10)
    theirs = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=4, depth=3, num_classes=10)
    return ours, theirs, torch.randn(2, 3, 32, 32)


@pytest.mark.parametrize("family", ["resnet", "vit"])
def test_forward_features_head_and_classifier_behave_as_timms(family):
    ours, theirs, x = _interface_pair(family)
    ours.eval(), theirs.eval()
    with torch.no_grad():
        for model in (ours, theirs):
            features = model.forward_features(x)
            assert torch.equal(model.forward_head(features), model(x))
        assert ours.forward_features(x).shape == theirs.forward_features(x).shape
        features = ours.forward_features(x)
        assert ours.forward_head(features, pre_logits=True).shape == (2, theirs.num_features)
        assert ours.num_features == ours.head_hidden_size == theirs.num_features
        assert ours.num_classes == theirs.num_classes == 10
        assert ours.global_pool == ("avg" if family == "resnet" else "token")
        head = ours.get_classifier()
        assert isinstance(head, torch.nn.Linear) and head.in_features == theirs.get_classifier().in_features
        head_name = ours.pretrained_cfg["classifier"]
        assert ours.get_submodule(head_name) is head
        # A new classifier: another size; 0 returns the pooled features, as timm's does.
        for model in (ours, theirs):
            model.reset_classifier(5)
            assert model.get_classifier().out_features == 5 and model.num_classes == 5
            assert model(x).shape == (2, 5)
            model.reset_classifier(0)
            assert isinstance(model.get_classifier(), torch.nn.Identity)
            assert model(x).shape == (2, model.num_features)
        assert torch.equal(ours(x), ours.forward_head(features, pre_logits=True))
        # Another pooling: the head's input changes with it.
        ours.reset_classifier(3, "max")
        theirs.reset_classifier(3, "max")
        assert ours.global_pool == "max" and ours(x).shape == theirs(x).shape == (2, 3)
        pooled = features.amax((2, 3)) if family == "resnet" else features[:, 1:].amax(1)
        assert torch.equal(ours.forward_head(features, pre_logits=True), pooled)
        with pytest.raises(ValueError, match="global_pool must be one of"):
            ours.reset_classifier(3, "bogus")


def test_a_new_classifier_trains_and_keeps_the_device_and_dtype():
    ours, _, x = _interface_pair("vit")
    ours = ours.double()
    ours.reset_classifier(7, "avg")
    assert ours.head.weight.dtype == torch.float64
    out = ours(x.double())
    assert out.shape == (2, 7)
    out.sum().backward()
    assert ours.head.weight.grad is not None
    features = ours.forward_features(x.double())
    assert torch.equal(ours.forward_head(features, pre_logits=True), features[:, 1:].mean(1))
    # timm's global_pool argument sets the pooling at creation.
    pooled = timm.create_model("convnn_vit_tiny_patch4", depth=1, num_classes=4, global_pool="avg")
    assert pooled.global_pool == "avg" and pooled(x).shape == (2, 4)
    with pytest.raises(ValueError, match="global_pool must be one of"):
        timm.create_model("convnn_resnet18", global_pool="map")


@pytest.mark.parametrize("family", ["resnet", "vit"])
def test_forward_intermediates_behave_as_timms(family):
    ours, theirs, x = _interface_pair(family)
    ours.eval(), theirs.eval()
    count = 5 if family == "resnet" else 3
    with torch.no_grad():
        for kwargs in (dict(), dict(indices=2), dict(indices=[0, -1]), dict(indices=1, stop_early=True)):
            final, maps = ours.forward_intermediates(x, **kwargs)
            their_final, their_maps = theirs.forward_intermediates(x, **kwargs)
            assert final.shape == their_final.shape, kwargs
            assert [m.shape for m in maps] == [m.shape for m in their_maps], kwargs
        # The intermediates alone; the last is the final map (ResNet) / tokens before the norm (ViT).
        maps = ours.forward_intermediates(x, intermediates_only=True)
        assert len(maps) == count
        if family == "resnet":
            assert torch.equal(maps[-1], ours.forward_features(x))
            with pytest.raises(ValueError, match="output_fmt"):
                ours.forward_intermediates(x, output_fmt="NLC")
        else:
            tokens = ours.forward_intermediates(x, indices=1, norm=True, output_fmt="NLC", intermediates_only=True)[0]
            assert torch.equal(tokens, ours.forward_features(x)[:, 1:])
            assert torch.equal(maps[-1], ours.forward_intermediates(x, indices=1, output_fmt="NLC",
                                                                     intermediates_only=True)[0]
                               .reshape(2, 8, 8, -1).permute(0, 3, 1, 2))
            pairs = ours.forward_intermediates(x, indices=2, return_prefix_tokens=True, intermediates_only=True)
            their_pairs = theirs.forward_intermediates(x, indices=2, return_prefix_tokens=True, intermediates_only=True)
            assert [(a.shape, b.shape) for a, b in pairs] == [(a.shape, b.shape) for a, b in their_pairs]
            result = ours.forward_intermediates(x, output_dict=True)
            assert set(result) == set(theirs.forward_intermediates(x, output_dict=True))
        with pytest.raises(ValueError, match="out of range"):
            ours.forward_intermediates(x, indices=[count])


@pytest.mark.parametrize("family", ["resnet", "vit"])
def test_features_only_gives_timms_feature_maps(family):
    ours, theirs, x = _interface_pair(family)
    name = "convnn_resnet18" if family == "resnet" else "convnn_vit_tiny_patch4"
    options = dict(layer="conv", img_size=64) if family == "resnet" else dict(depth=3)
    their_name, their_options = (("resnet18", {}) if family == "resnet" else
                                 ("vit_tiny_patch16_224", dict(img_size=32, patch_size=4, depth=3)))
    for out_indices in (None, (1, 2)):
        extra = {} if out_indices is None else dict(out_indices=out_indices)
        backbone = timm.create_model(name, features_only=True, **options, **extra)
        reference = timm.create_model(their_name, features_only=True, **their_options, **extra)
        assert backbone.feature_info.channels() == reference.feature_info.channels()
        assert backbone.feature_info.reduction() == reference.feature_info.reduction()
        if family == "vit":
            assert backbone.feature_info.module_name() == reference.feature_info.module_name()
        backbone.eval()
        with torch.no_grad():
            maps = backbone(x)
            assert [m.shape for m in maps] == [m.shape for m in reference.eval()(x)]
            # The maps are the model's own intermediates (the backbone has the same weights).
            ours.load_state_dict(backbone.model.state_dict(), strict=False)
            expected = ours.eval().forward_intermediates(x, indices=backbone.out_indices, intermediates_only=True)
            for got, want in zip(maps, expected):
                assert torch.equal(got, want)
        assert "classifier" not in backbone.pretrained_cfg
        # The backbone holds no head (timm prunes it, and what follows the last tap).
        assert isinstance(backbone.model.get_classifier(), torch.nn.Identity)
    with pytest.raises(ValueError, match="feature_cls"):
        timm.create_model(name, features_only=True, feature_cls="dict", **options)


@pytest.mark.parametrize("family", ["resnet", "vit"])
@pytest.mark.parametrize("feature_cls", ["hook", "fx"])
def test_features_only_with_hooks_and_fx_gives_timms_outputs(family, feature_cls):
    """timm's FeatureHookNet (forward hooks on the feature_info modules) and FeatureGraphNet (torch.fx)
    over the models: timm's shapes for the same model family (a ViT's are its blocks' tokens, class
    token included, as timm's), and the maps of forward_intermediates."""
    _, _, x = _interface_pair(family)
    name = "convnn_resnet18" if family == "resnet" else "convnn_vit_tiny_patch4"
    options = dict(layer="conv", img_size=64) if family == "resnet" else dict(depth=3)
    their_name, their_options = (("resnet18", {}) if family == "resnet" else
                                 ("vit_tiny_patch16_224", dict(img_size=32, patch_size=4, depth=3)))
    torch.manual_seed(5)  # the backbone's model and `ours` get the same weights
    backbone = timm.create_model(name, features_only=True, feature_cls=feature_cls, out_indices=(1, 2), **options)
    torch.manual_seed(5)
    ours = timm.create_model(name, **options)
    reference = timm.create_model(their_name, features_only=True, feature_cls=feature_cls, out_indices=(1, 2),
                                  **their_options)
    with torch.no_grad():
        maps = backbone.eval()(x)
        assert [m.shape for m in maps] == [m.shape for m in reference.eval()(x)]
        expected = ours.eval().forward_intermediates(x, indices=(1, 2), intermediates_only=True)
        for got, want in zip(maps, expected):
            if family == "vit":  # tokens [B, 1 + patches, C] -> the patches as a [B, C, H, W] map
                got = got[:, 1:].transpose(1, 2).reshape(want.shape)
            assert torch.equal(got, want)


@pytest.mark.parametrize("name,options,size", [("convnn_resnet18", dict(img_size=32), 32),
                                               ("convnn_resnet18", dict(layer="conv", img_size=64), 64),
                                               ("convnn_vit_tiny_patch4", dict(depth=2), 32)])
def test_torch_fx_traces_the_models_and_the_traced_module_computes_the_same(name, options, size):
    """timm's FX feature extraction and torch.fx.symbolic_trace see through the models (the ViT's
    input check is one recorded call, and still refuses a wrong image size when the graph runs)."""
    from timm.models._features_fx import get_graph_node_names

    torch.manual_seed(0)
    model = timm.create_model(name, num_classes=10, **options).eval()
    _, eval_nodes = get_graph_node_names(model)
    assert len(eval_nodes) > 10
    traced = torch.fx.symbolic_trace(model)
    x = torch.randn(2, 3, size, size)
    with torch.no_grad():
        assert torch.equal(traced(x), model(x))
    if "vit" in name:
        with pytest.raises(ValueError, match="images must be"):
            traced(torch.randn(2, 3, size + 4, size + 4))


@pytest.mark.parametrize("size", [32, 40, 65])
def test_pool_size_is_forward_features_spatial_size_at_input_size(size):
    """timm's pretrained_cfg contract: pool_size is what forward_features gives at input_size (a
    CNN); None for the ViTs, as timm's ViT configs."""
    model = timm.create_model("convnn_resnet18", layer="conv", img_size=size, num_classes=10).eval()
    assert model.pretrained_cfg["input_size"] == (3, size, size)
    with torch.no_grad():
        features = model.forward_features(torch.randn(1, *model.pretrained_cfg["input_size"]))
    assert model.pretrained_cfg["pool_size"] == tuple(features.shape[2:])
    assert timm.create_model("convnn_vit_tiny_patch4", depth=1).pretrained_cfg["pool_size"] is None
    assert timm.create_model("vit_tiny_patch16_224", pretrained=False).pretrained_cfg.get("pool_size") is None


def test_a_vit_with_dynamic_img_size_takes_other_sizes_as_timms_does():
    """dynamic_img_size=True: any size whose sides are multiples of the patch size, the position
    embedding resampled as timm's resample_abs_pos_embed; at the built size the same model as without."""
    from timm.layers import resample_abs_pos_embed

    torch.manual_seed(0)
    fixed = timm.create_model("convnn_vit_tiny_patch4", depth=2, num_classes=10).eval()
    dynamic = timm.create_model("convnn_vit_tiny_patch4", depth=2, num_classes=10, dynamic_img_size=True).eval()
    dynamic.load_state_dict(fixed.state_dict())
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(dynamic(x), fixed(x))
        wide = torch.randn(2, 3, 48, 64)
        tokens = dynamic.forward_features(wide)
        assert tokens.shape == (2, 1 + 12 * 16, dynamic.embed_dim)
        # The embedding it adds is timm's resampling of its own.
        assert torch.equal(convnn.models.resample_position_embedding(dynamic.pos_embed, (12, 16)),
                           resample_abs_pos_embed(dynamic.pos_embed, (12, 16), num_prefix_tokens=1))
        patches = dynamic.patch_embed(wide).flatten(2).transpose(1, 2)
        embedded = torch.cat([dynamic.cls_token.expand(2, -1, -1), patches], 1) + resample_abs_pos_embed(
            dynamic.pos_embed, (12, 16), num_prefix_tokens=1)
        torch.testing.assert_close(dynamic._embed(wide), embedded, rtol=0, atol=0)
        maps = dynamic.forward_intermediates(wide, intermediates_only=True)
        assert [m.shape for m in maps] == [(2, dynamic.embed_dim, 12, 16)] * 2
    with pytest.raises(ValueError, match="multiples of the patch size 4"):
        dynamic(torch.randn(1, 3, 30, 32))
    with pytest.raises(ValueError, match=r"images must be \[B, 3, 32, 32\]"):
        timm.create_model("convnn_vit_tiny_patch4", depth=1)(torch.randn(1, 3, 48, 48))
    with pytest.raises(ValueError, match="dynamic_img_size is a ViT option"):
        timm.create_model("convnn_resnet18", dynamic_img_size=True)


def test_a_vit_loads_the_weights_of_another_image_size_with_its_position_embedding_resampled():
    from timm.layers import resample_abs_pos_embed

    torch.manual_seed(0)
    small = timm.create_model("convnn_vit_tiny_patch4", depth=1, num_classes=10)
    large = timm.create_model("convnn_vit_tiny_patch4", depth=1, num_classes=10, img_size=48)
    large.load_state_dict(small.state_dict())
    assert torch.equal(large.pos_embed, resample_abs_pos_embed(small.pos_embed, (12, 12), num_prefix_tokens=1))
    assert large(torch.randn(1, 3, 48, 48)).shape == (1, 10)
    traced = torch.fx.symbolic_trace(timm.create_model("convnn_vit_tiny_patch4", depth=1, dynamic_img_size=True))
    assert traced(torch.randn(1, 3, 40, 24)).shape == (1, 1000)


def test_no_weight_decay_and_group_matcher_drive_timms_optimizer():
    from timm.optim import create_optimizer_v2

    ours, theirs, _ = _interface_pair("vit")
    assert ours.no_weight_decay() == {"pos_embed", "cls_token"} <= theirs.no_weight_decay()
    paper = timm.create_model("convnn_vit_tiny_patch4", depth=2, paper=True)
    assert paper.no_weight_decay() == {"cls_token"}  # its sinusoidal position encoding is a buffer
    optimizer = create_optimizer_v2(ours, "adamw", weight_decay=0.05)
    no_decay = {id(p) for group in optimizer.param_groups if group["weight_decay"] == 0.0 for p in group["params"]}
    assert id(ours.pos_embed) in no_decay and id(ours.cls_token) in no_decay
    assert id(ours.blocks[0].fc1.weight) not in no_decay
    # Layer-wise decay reads group_matcher: one scale per block, the stem below them.
    layered = create_optimizer_v2(ours, "adamw", weight_decay=0.05, layer_decay=0.5)
    assert len({group["lr_scale"] for group in layered.param_groups}) == len(ours.blocks) + 2
    resnet, _, _ = _interface_pair("resnet")
    assert resnet.no_weight_decay() == set()
    create_optimizer_v2(resnet, "sgd", weight_decay=1e-4, layer_decay=0.5)


def test_set_grad_checkpointing_keeps_forward_intermediates():
    ours, _, x = _interface_pair("vit")
    expected = ours.forward_intermediates(x, intermediates_only=True)
    ours.set_grad_checkpointing(True)
    got = ours.forward_intermediates(x.requires_grad_(), intermediates_only=True)
    for a, b in zip(got, expected):
        assert torch.equal(a, b)
    sum(m.sum() for m in got).backward()
    assert x.grad is not None


def _small(name, depth=1):
    """The registered model at its own widths and heads, `depth` blocks deep (a ResNet's stage count
    is its depth, so it stays whole), on small images: four patches a side, or 64 px."""
    if "vit" not in name:
        return dict(img_size=64)
    return dict(depth=depth, img_size=4 * int(name.rsplit("patch", 1)[1]))


@pytest.mark.parametrize("name", sorted(timm.list_models("convnn_*")))
def test_every_registered_model_keeps_timms_model_contract(name):
    """pretrained_cfg complete and true (timm's load_pretrained finds first_conv's and classifier's
    weights by these names; pool_size is forward_features's grid at input_size), torch.fx traces
    it, and reset_classifier(0) / forward_head(pre_logits=True) give timm's shapes."""
    torch.manual_seed(0)
    model = timm.create_model(name, num_classes=7, **_small(name)).eval()
    cfg = model.pretrained_cfg
    for key in ("input_size", "crop_pct", "interpolation", "mean", "std", "first_conv", "classifier", "pool_size",
                "num_classes"):
        assert key in cfg, key
    state = model.state_dict()
    first = state[cfg["first_conv"] + ".weight"]
    assert first.dim() == 4 and first.shape[1] == cfg["input_size"][0]
    assert state[cfg["classifier"] + ".weight"].shape == (7, model.num_features) and cfg["num_classes"] == 7
    x = torch.randn(1, *cfg["input_size"])
    with torch.no_grad():
        features = model.forward_features(x)
        if cfg["pool_size"] is not None:
            assert tuple(features.shape[2:]) == cfg["pool_size"]
        traced = torch.fx.symbolic_trace(model)
        assert torch.equal(traced(x), model(x))
        assert model.forward_head(features, pre_logits=True).shape == (1, model.num_features)
        model.reset_classifier(0)
        assert model(x).shape == (1, model.num_features)


@pytest.mark.parametrize("name", sorted(timm.list_models("convnn_*")))
@pytest.mark.parametrize("feature_cls", ["getter", "hook", "fx"])
def test_every_registered_model_gives_its_feature_maps_with_every_feature_class(name, feature_cls):
    """features_only=True through each of timm's feature wrappers: one map per feature_info entry,
    with the channels feature_info states."""
    torch.manual_seed(0)
    # depth 3: a ViT's default out_indices are its last 3 blocks
    backbone = timm.create_model(name, features_only=True, feature_cls=feature_cls, **_small(name, 3)).eval()
    size = backbone.pretrained_cfg["input_size"]
    with torch.no_grad():
        maps = backbone(torch.randn(1, *size))
    channels = backbone.feature_info.channels()
    assert len(maps) == len(channels) > 0
    for got, expected in zip(maps, channels):
        assert got.shape[1 if got.dim() == 4 else -1] == expected
