"""`import convnn` registers the ops, from any working directory, and they have autograd."""

import re

import pytest
import torch

import convnn  # registers torch.ops.convnn
ops = torch.ops.convnn


def test_the_ops_are_registered():
    assert hasattr(ops, "knn_select")
    assert hasattr(ops, "knn_aggregate")
    assert hasattr(ops, "knn_attention")


def test_fused_attention_equals_sdpa_and_has_gradients():
    torch.manual_seed(3)
    q, k, v = (torch.randn(2, 9, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    kernel = torch.ones(4, 9, dtype=torch.float64)
    out, scores, indices, weights = ops.knn_attention(
        q, k, v, kernel, None, 9, "scaled_dot", None, False, "softmax", 1.0)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    assert (out - expected).abs().max().item() < 1e-12
    assert torch.autograd.gradcheck(
        lambda q, k, v: ops.knn_attention(q, k, v, kernel[:, :3], None, 3, "scaled_dot", None,
                                          False, "softmax", 0.5)[0], (q, k, v))


def test_attention_identity_matches_sdpa():
    torch.manual_seed(0)
    q, k, v = (torch.randn(4, 12, 8, dtype=torch.float64) for _ in range(3))
    scores, indices = ops.knn_select(q, k, 12, "scaled_dot", None, False)
    out = ops.knn_aggregate(v, torch.softmax(scores, -1), indices,
                            torch.ones(8, 12, dtype=torch.float64), None)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    assert (out - expected).abs().max().item() < 1e-12


def test_gradcheck_select_every_similarity():
    torch.manual_seed(1)
    for similarity in ops.similarity_names():
        q = torch.randn(2, 5, 3, dtype=torch.float64, requires_grad=True)
        k = torch.randn(2, 6, 3, dtype=torch.float64, requires_grad=True)
        assert torch.autograd.gradcheck(
            lambda q, k: ops.knn_select(q, k, 3, similarity, None, False)[0], (q, k)), similarity


def test_gradcheck_aggregate_depthwise_and_standard():
    torch.manual_seed(2)
    values = torch.randn(2, 7, 3, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(2, 5, 4, dtype=torch.float64, requires_grad=True)
    indices = torch.randint(0, 7, (2, 5, 4))
    bias = torch.randn(3, dtype=torch.float64, requires_grad=True)
    depthwise = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    standard = torch.randn(3, 3, 4, dtype=torch.float64, requires_grad=True)
    for kernel in (depthwise, standard):
        assert torch.autograd.gradcheck(
            lambda v, w, ker, b: ops.knn_aggregate(v, w, indices, ker, b),
            (values, weights, kernel, bias))


def test_bad_input_raises_a_clear_error():
    q = torch.randn(2, 5, 3)
    with pytest.raises(RuntimeError, match=r"k must be in \[1, M\] where M = 5"):
        ops.knn_select(q, q, 6, "dot", None, False)
    with pytest.raises(RuntimeError, match="similarity must be one of"):
        ops.knn_select(q, q, 2, "euclid", None, False)


def test_meta_tensors_give_shapes_and_a_device_mix_is_named():
    q = torch.empty(2, 5, 3, device="meta")
    keys = torch.empty(2, 7, 3, device="meta")
    values = torch.empty(2, 7, 4, device="meta")
    scores, indices = ops.knn_select(q, keys, 4, "cosine", None, False)
    assert scores.shape == (2, 5, 4) and indices.dtype == torch.int64 and scores.is_meta
    out, *_ = ops.knn_attention(q, keys, values, torch.empty(6, 4, 4, device="meta"), None, 4,
                                "dot", None, False, "softmax", 1.0)
    assert out.shape == (2, 5, 6)
    with pytest.raises(RuntimeError, match="queries and keys must be on the same device"):
        ops.knn_select(torch.randn(2, 5, 3), keys, 4, "dot", None, False)


def test_non_finite_queries_name_the_position():
    q = torch.randn(1, 4, 3)
    q[0, 2, 1] = float("inf")
    with pytest.raises(RuntimeError, match=r"queries must be finite .* at position \[0, 2, 1\]"):
        ops.knn_select(q, torch.randn(1, 5, 3), 2, "gaussian", None, False)


def test_a_torch_other_than_the_one_convnn_was_built_against_is_refused(monkeypatch):
    from convnn import _build_info, _library

    monkeypatch.setattr(torch, "__version__", "2.12.1+cu130")
    with pytest.raises(ImportError, match=rf"built against torch {re.escape(_build_info.TORCH_VERSION)}.*has torch 2\.12\.1"):
        _library.load()
    # The local suffix names the wheel's CUDA build, not the C++ ABI: the same release loads.
    monkeypatch.setattr(torch, "__version__", _build_info.TORCH_VERSION.split("+")[0] + "+cpu")
    _library.load()


def test_import_works_from_any_directory(tmp_path):
    import subprocess
    import sys

    code = "import convnn, torch; print(torch.ops.convnn.knn_select.default.name())"
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "convnn::knn_select"


def test_the_package_version_is_the_cmake_projects():
    """pyproject.toml reads the version from project(VERSION) in CMakeLists.txt; the compiled
    library reports the same (convnn.__version__ comes from CMake at build time)."""
    import importlib.metadata
    import pathlib

    cmake = (pathlib.Path(__file__).resolve().parents[2] / "CMakeLists.txt").read_text()
    declared = re.search(r"project\(convnn VERSION ([0-9.]+)", cmake).group(1)
    assert importlib.metadata.version("convnn") == convnn.__version__ == declared


def test_cuda_paths_says_which_path_each_op_on_cuda_tensors_took_and_why():
    """convnn.cuda_paths() keeps each choice of the CUDA kernels (src/ops/cuda/triton/path_choice.h)
    made inside the block; here through knn_select's CUDA kernel on CPU tensors (no GPU), in float64,
    which the Triton kernels do not take. Nothing is kept outside a block."""
    queries, keys = torch.randn(2, 9, 5, dtype=torch.float64), torch.randn(2, 20, 5, dtype=torch.float64)
    cuda_select = ops.knn_select.default._op_dk
    with convnn.cuda_paths() as paths:
        scores, indices = cuda_select(torch._C.DispatchKey.CUDA, queries, keys, 4, "l1", None, False)
    assert paths == ["knn_select: ATen path: dtype Double (the Triton kernels take float32, bfloat16 and float16)"]
    assert torch.equal(indices, ops.knn_select(queries, keys, 4, "l1", None, False)[1])
    cuda_select(torch._C.DispatchKey.CUDA, queries, keys, 4, "l1", None, False)
    with convnn.cuda_paths() as paths:
        pass
    assert paths == []
