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
