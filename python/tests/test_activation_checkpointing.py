"""torch.utils.checkpoint around the convnn layers (issue 26): the recompute in backward must draw
the same random candidates as the forward did, so the gradients equal the un-checkpointed run's,
bitwise, with the default generator (which checkpoint restores itself) and with a layer's own
generator (seed=...), which it does not know about: before the fix the input gradient differed by
up to ~1e3 here, silently."""
import pytest
import torch
from torch.utils.checkpoint import checkpoint

import convnn


def layers():
    return {
        "ConvNN2d": (lambda seed: convnn.nn.ConvNN2d(4, 4, 3, num_candidates=6, padding=1, seed=seed),
                     (2, 4, 5, 5)),
        "BranchingConv2d": (lambda seed: convnn.nn.BranchingConv2d(4, 4, k=3, num_candidates=6, seed=seed),
                            (2, 4, 5, 5)),
        "ConvNNAttention": (lambda seed: convnn.nn.ConvNNAttention(8, 2, 3, num_candidates=5, dropout=0.1,
                                                                   seed=seed),
                            (2, 9, 8)),
    }


def input_gradient(layer, x, use_reentrant):
    """The input's gradient of a weighted sum of the output, the generators at fixed states."""
    x = x.detach().clone().requires_grad_(True)
    torch.manual_seed(0)
    if layer._generator is not None:
        layer._generator.manual_seed(11)
    y = layer(x) if use_reentrant is None else checkpoint(layer, x, use_reentrant=use_reentrant)
    (y * torch.arange(y.numel(), dtype=y.dtype).reshape(y.shape)).sum().backward()
    return x.grad


@pytest.mark.parametrize("name", sorted(layers()))
@pytest.mark.parametrize("seed", [None, 3], ids=["default-generator", "own-generator"])
@pytest.mark.parametrize("use_reentrant", [True, False])
def test_checkpointed_gradients_equal_the_plain_run_bitwise(name, seed, use_reentrant):
    make, shape = layers()[name]
    layer = make(seed).double().train()
    x = torch.randn(*shape, dtype=torch.double, generator=torch.Generator().manual_seed(1))
    plain = input_gradient(layer, x, None)
    checkpointed = input_gradient(layer, x, use_reentrant)
    assert torch.equal(plain, checkpointed), (plain - checkpointed).abs().max()


def test_the_own_generator_goes_on_as_without_checkpointing():
    """The recompute replays the forward's draw and then leaves the generator where the forward
    left it: the next step draws what it would have drawn without checkpointing."""
    layer = convnn.nn.ConvNN2d(4, 4, 3, num_candidates=6, padding=1, seed=3).double().train()
    x = torch.randn(2, 4, 5, 5, dtype=torch.double, requires_grad=True)
    layer._generator.manual_seed(11)
    layer(x).sum().backward()
    expected = layer._generator.get_state()
    layer._generator.manual_seed(11)
    checkpoint(layer, x, use_reentrant=False).sum().backward()
    assert torch.equal(layer._generator.get_state(), expected)


def test_conv_nn1d_checkpointed_gradients_equal_the_plain_run_bitwise():
    for seed in (None, 3):
        layer = convnn.nn.ConvNN1d(4, 4, 3, num_candidates=5, seed=seed).double().train()
        x = torch.randn(2, 4, 9, dtype=torch.double, generator=torch.Generator().manual_seed(1))
        for use_reentrant in (True, False):
            assert torch.equal(input_gradient(layer, x, None), input_gradient(layer, x, use_reentrant))


def parameter_gradients(model, x, checkpointing):
    """Every parameter's gradient of a weighted sum of the logits, the generators at fixed states."""
    model.set_grad_checkpointing(checkpointing)
    model.zero_grad()
    torch.manual_seed(0)
    for layer in model.modules():
        if getattr(layer, "_generator", None) is not None:
            layer._generator.manual_seed(11)
    y = model(x)
    (y * torch.arange(y.numel(), dtype=y.dtype).reshape(y.shape)).sum().backward()
    return {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("seed", [None, 3], ids=["default-generator", "own-generator"])
def test_timm_set_grad_checkpointing_gives_the_plain_runs_gradients_bitwise(seed):
    """A timm ViT whose attention is ConvNN attention with random candidates and dropout, and
    convnn's own ViT and ResNet with random candidates, through timm's set_grad_checkpointing."""
    timm = pytest.importorskip("timm")
    torch.manual_seed(2)
    vit = timm.create_model("vit_tiny_patch16_224", img_size=16, patch_size=4, embed_dim=16, depth=2,
                            num_heads=2, num_classes=3, drop_path_rate=0.1)
    for block in vit.blocks:
        block.attn = convnn.nn.ConvNNAttention(16, 2, 3, num_candidates=6, dropout=0.1, seed=seed)
    models = {
        "timm vit": vit,
        "convnn vit": convnn.models.create_model("vit_tiny", attention="convnn", image_size=16, patch_size=4,
                                                 depth=2, k=3, num_candidates=6, num_classes=3, drop_path=0.1),
        "convnn resnet": convnn.models.create_model("resnet18", layer="branching", k=3, num_candidates=6,
                                                    small_stem=True, width=4, image_size=16, num_classes=3),
    }
    x = torch.randn(2, 3, 16, 16, dtype=torch.double, generator=torch.Generator().manual_seed(1))
    for name, model in models.items():
        model = model.double().train()
        plain = parameter_gradients(model, x, False)
        checkpointed = parameter_gradients(model, x, True)
        for key in plain:
            assert torch.equal(plain[key], checkpointed[key]), (name, key)
