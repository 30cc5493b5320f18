"""The PyTorch 2 stack on a model with ConvNN layers: torch.compile(fullgraph=True) traces it with
no graph break and gives eager's outputs and gradients, and torch.export exports it to a program
that runs and gives eager's outputs. Inductor fuses the surrounding ops (mean, linear) in its own
order, so float32 agrees to rounding, not bit for bit; the ConvNN ops themselves are the same."""
import pytest
import torch

import convnn  # noqa: F401
from convnn.nn import BranchingConv2d, ConvNN2d, ConvNNAttention


class SmallNet(torch.nn.Module):
    """A ConvNN2d and a branching layer on the image, ConvNN attention on its tokens."""

    def __init__(self):
        super().__init__()
        self.conv = ConvNN2d(3, 8, 9, padding=1)
        self.branch = BranchingConv2d(8, 8, k=9)
        self.attn = ConvNNAttention(8, 2, 5, causal=True)
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x):
        y = self.branch(self.conv(x))
        tokens = y.flatten(2).transpose(1, 2)
        return self.head(self.attn(tokens).mean(1))


@pytest.fixture(scope="module")
def net():
    torch.manual_seed(0)
    return SmallNet()


def test_compile_fullgraph_equals_eager_forward_and_backward(net):
    x = torch.randn(2, 3, 6, 6)
    compiled = torch.compile(net, fullgraph=True)
    x_eager, x_compiled = x.clone().requires_grad_(), x.clone().requires_grad_()
    eager = net(x_eager)
    eager.sum().backward()
    eager_grads = {n: p.grad.clone() for n, p in net.named_parameters() if p.grad is not None}
    net.zero_grad()
    out = compiled(x_compiled)
    out.sum().backward()
    torch.testing.assert_close(out, eager)
    torch.testing.assert_close(x_compiled.grad, x_eager.grad)
    for n, g in eager_grads.items():
        torch.testing.assert_close(dict(net.named_parameters())[n].grad, g, msg=n)
    net.zero_grad()


def test_compile_lowers_the_ops_where_the_environment_sets_ci(monkeypatch):
    """Inductor refuses the implicit fallback of a custom op that has a decomposition in
    torch._decomp's table (convnn's, for ONNX export) when CI is set, as GitHub Actions sets it:
    convnn registers the fallback itself. Inductor's caches are off, so the graph is lowered here."""
    import torch._functorch.config
    import torch._inductor.config

    monkeypatch.setenv("CI", "true")
    ops = torch.ops.convnn
    torch.manual_seed(1)
    q, k, v = (torch.randn(2, 7, 4, requires_grad=True) for _ in range(3))
    kernel = torch.randn(4, 3)

    def the_three_ops(q, k, v):
        fused = ops.knn_attention(q, k, v, kernel, None, 3, "cosine", None, False, "softmax", 1.0)[0]
        scores, indices = ops.knn_select(q, k, 3, "l1", None, False)
        return fused + ops.knn_aggregate(v, scores.softmax(-1), indices, kernel, None)

    torch._dynamo.reset()
    with torch._inductor.config.patch(fx_graph_cache=False), \
            torch._functorch.config.patch(enable_autograd_cache=False):
        out = torch.compile(the_three_ops, fullgraph=True)(q, k, v)
        grads = torch.autograd.grad(out.sum(), (q, k, v))
    torch.testing.assert_close(out, the_three_ops(q, k, v))
    for got, expected in zip(grads, torch.autograd.grad(the_three_ops(q, k, v).sum(), (q, k, v))):
        torch.testing.assert_close(got, expected)


def test_export_runs_and_equals_eager(net):
    net.eval()
    x = torch.randn(2, 3, 6, 6)
    program = torch.export.export(net, (x,))
    assert any("convnn.layer_forward" in str(node.target) for node in program.graph.nodes)
    torch.testing.assert_close(program.module()(x), net(x), rtol=0, atol=0)
    net.train()


def test_the_constant_result_mark_is_torchs_own():
    """convnn.nn.functional marks its option-text function as torch.compiler.assume_constant_result
    does, without importing Dynamo at convnn's import: the same attributes on a fresh function."""
    from convnn.nn import functional

    def with_torchs(): return None

    def with_convnns(): return None

    torch.compiler.assume_constant_result(with_torchs)
    functional._assume_constant_result(with_convnns)
    assert vars(with_torchs) == vars(with_convnns) != {}
    assert all(getattr(functional._option_texts, name) == value for name, value in vars(with_torchs).items())


def test_torchscript_is_refused_with_one_message_naming_convnn_and_what_to_use():
    """TorchScript cannot carry the layers' option texts (it failed with "unsupported input list
    type: str"); script and trace, of a layer or of a model holding one, say so and point to
    torch.compile / torch.export."""
    layer = ConvNN2d(3, 4, 9, padding=1)
    with pytest.raises(RuntimeError, match=r"ConvNN2d: convnn layers do not support TorchScript \(torch.jit.script\); "
                                           r"use torch.compile or torch.export"):
        torch.jit.script(layer)
    with pytest.raises(RuntimeError, match=r"ConvNNAttention: convnn layers do not support TorchScript \(torch.jit.trace\)"):
        torch.jit.trace(torch.nn.Sequential(ConvNNAttention(8, 2, 3)), torch.randn(1, 5, 8))
