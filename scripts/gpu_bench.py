"""Times convnn's Triton kernels (python/convnn/_triton) on a CUDA device, at the paper's
configuration (G = 384 slices, N = M = 197, d = 64, K = 8, depthwise, scaled_dot) and at N = 197,
1024, 4096, 16384 (G = 12, K = 9), in float32 and bfloat16:
- each kernel against the device-generic path: knn_aggregate forward and backward, knn_select;
- the op-level paths, forward and forward+backward: the reference (Algorithm 1 in PyTorch: full
  QK^T, topk, softmax, gather), the knn_attention op on the generic path (CONVNN_CUDA_KERNELS=generic),
  the composed Triton path (knn_select, softmax, knn_aggregate through the dispatcher, whose CUDA
  kernels are the Triton ones, with autograd), the knn_attention op with the Triton kernels (its
  forward the fused kernel of attention.py, its backward the two kernels of attention_backward.py), and
  scaled_dot_product_attention on the same [G,N,d] tensors for scale;
- the paper's Table 1 module (ConvNNAttention against timm's Attention), eager, and its
  forward+backward step replayed from a CUDA graph (issue 38 §3);
- the two designs of the running top-K (select.design) on the same inputs: the set held a query row
  per thread (one warp of 32 rows per program, what the launchers take at K <= 16) and the set
  shared by a row's threads (16 rows, 8 warps), the select kernel and the fused attention forward
  launched directly, at Table 1 and at 12 x 4096 (K 8, float32), with --designs (a step of its own
  in scripts/gpu-check.sh): the static cost report counts instructions, not occupancy, and this
  decides between them.
- knn_select with its scores on tensor cores (bounded_select.py, issue 41) against the IEEE kernel,
  with --tensor-cores (a step of its own in scripts/gpu-check.sh): at 12 x N, N = 4096, 16384 and
  65536 (D 64, K 8, scaled_dot), float32 and bfloat16, on Gaussian, clustered (64 centres, noise 1%
  of their scale) and duplicated (every key four times) features: the rows the tensor-core kernel
  leaves to its rerun and the candidates it re-scores exactly per row, whether the indices and scores
  equal the IEEE kernel's (not timed at 65536, where it takes seconds), the time of each and of
  scaled_dot_product_attention's forward and forward+backward on [1, 12, N, 64];
- knn_attention's forward and forward+backward with that select (CONVNN_SELECT_SCORES=tensor_cores:
  the forward composes it, rho and the aggregation; the two-kernel backward), with --training (a step
  of its own): [1, 12, N, 64] heads, N = 16384 and 65536, causal (a bool [N, N] mask) or not,
  bfloat16 (and float32 at 16384), against scaled_dot_product_attention (is_causal) on the same
  tensors, and at 16384 the indices and scores against the IEEE kernel's (issue 41's targets).
The C++ `convnn bench --device cuda` times the generic paths; the Triton kernels are registered
from Python, so they are timed here. Medians of triton.testing.do_bench (CUDA events); peak memory
from the caching allocator over one call of its own; GB/s of the aggregation forward counts its
minimum bytes (every gathered row read once per slot, weights and indices read, output written).

With --compile-jobs J, --training and --tensor-cores first compile their kernels in J processes at
once (each runs its share of the cases untimed; Triton's cache on disk then serves the timed run),
and each prints its table a row at a time, so that a step cut short keeps the rows it finished.
--profile-select runs one tensor-core select (bfloat16, 12 x 4096) for a profiler (gpu-check.sh's
ncu step).

    python scripts/gpu_bench.py [--json FILE] [--designs | --tensor-cores | --training | --profile-select]
                                [--sizes N ...] [--compile-jobs J]
"""
import argparse
import contextlib
import json
import os

import torch
import triton.testing

import convnn  # registers the ops and the Triton launcher
from convnn._triton import attention, bounded_select, register, select

GENERIC = torch._C.DispatchKey.CompositeExplicitAutograd
CUDA = torch._C.DispatchKey.CUDA  # each op's CUDA kernel: the Triton kernels where they apply
ops = torch.ops.convnn


def write_json(json_path, device, **sections):
    """The sections' rows as JSON at json_path, with the device's name (nothing without a path)."""
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(device), **sections}, f, indent=1)


def equal_cell(row):
    """A table's cell of whether a row's indices and scores equal the IEEE kernel's."""
    return f"{row['indices_equal']} / {row['scores_equal']}" if "indices_equal" in row else "not compared"


def on_triton(call):
    """call() once, each convnn op in it having taken the Triton kernels (convnn.cuda_paths), or
    composed ops that did (knn_attention with its select on tensor cores): a figure labelled Triton
    but measured on the generic path (after a failed first-call check, say) would be wrong, so this
    raises instead, with the reason the path log gives."""
    with convnn.cuda_paths() as paths:
        result = call()
    generic = [entry for entry in paths if ": ATen path" in entry and not entry.endswith(" compose")]
    if generic or not any("Triton kernels" in entry for entry in paths):
        raise RuntimeError(f"gpu_bench: a call timed as the Triton kernels' took the generic path: {generic or paths}")
    return result


def inputs(g, n, c, k, dtype, device):
    generator = torch.Generator(device=device).manual_seed(0)
    values = torch.randn(g, n, c, device=device, generator=generator).to(dtype)
    weights = torch.randn(g, n, k, device=device, generator=generator).softmax(-1).to(dtype)
    indices = torch.randint(0, n, (g, n, k), device=device, generator=generator)
    kernel = torch.randn(c, k, device=device, generator=generator).to(dtype)
    grad_output = torch.randn(g, n, c, device=device, generator=generator).to(dtype)
    return values, weights, indices, kernel, grad_output


def timed(fn):
    """(median ms, peak MiB above what was allocated before). The peak is read over one call of its
    own: do_bench allocates a 256 MB buffer to flush the L2 cache between calls."""
    fn()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"), peak


def graphed(step):
    """`step` captured in a CUDA graph after warm-up on a side stream (as torch.cuda.graphs asks): the
    graph's replay, or the capture's error as a string (a step that reads a value back to the host
    cannot be captured)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            step()
    except RuntimeError as error:
        return f"{type(error).__name__}: {error}".splitlines()[0]
    return graph.replay


def one(g, n, c, k, dtype, device):
    values, weights, indices, kernel, dy = inputs(g, n, c, k, dtype, device)
    mask = [True, True, True, False]
    paths = {
        "triton": (lambda: ops.knn_aggregate.default._op_dk(CUDA, values, weights, indices, kernel, None),
                   lambda: ops.knn_aggregate_backward.default._op_dk(CUDA, dy, values, weights, indices, kernel, mask)),
        "generic": (lambda: ops.knn_aggregate.default._op_dk(GENERIC, values, weights, indices, kernel, None),
                    lambda: ops.knn_aggregate_backward.default._op_dk(GENERIC, dy, values, weights, indices,
                                                                      kernel, mask)),
    }
    fused_out, generic_out = paths["triton"][0](), paths["generic"][0]()
    error = ((fused_out.double() - generic_out.double()).norm() / generic_out.double().norm()).item()
    row = {"G": g, "N": n, "d": c, "K": k, "dtype": str(dtype).replace("torch.", ""), "relative_error": error}
    size = values.element_size()
    forward_bytes = g * n * k * (c * size + size + 8) + g * n * c * size + c * k * size
    for name, (forward, backward) in paths.items():
        row[f"{name}_forward_ms"], row[f"{name}_forward_mib"] = timed(forward)
        row[f"{name}_backward_ms"], row[f"{name}_backward_mib"] = timed(backward)
        row[f"{name}_forward_gbps"] = forward_bytes / row[f"{name}_forward_ms"] / 1e6
    return row


def reference_attention(q, k, v, kernel, neighbours):
    """Algorithm 1 in PyTorch: the full score matrix, topk, softmax, gather, depthwise taps."""
    scores = q @ k.transpose(1, 2) / q.shape[-1] ** 0.5
    top, indices = scores.topk(neighbours, dim=-1)
    weights = top.softmax(-1)
    gathered = v.gather(1, indices.flatten(1).unsqueeze(-1).expand(-1, -1, v.shape[-1])).view(
        *indices.shape, v.shape[-1])
    return (weights.unsqueeze(-1) * gathered * kernel.t()).sum(2)


def composed_attention(q, k, v, kernel, neighbours):
    scores, indices = ops.knn_select(q, k, neighbours, "scaled_dot", None, False)
    return ops.knn_aggregate(v, scores.softmax(-1), indices, kernel, None)


def attention_op(q, k, v, kernel, neighbours):
    """The knn_attention op: on CUDA its fused Triton kernel, or the generic path under
    CONVNN_CUDA_KERNELS=generic (op_paths sets it around the whole forward and backward)."""
    return ops.knn_attention(q, k, v, kernel, None, neighbours, "scaled_dot", None, False, "softmax", 1.0)[0]


def sdpa(q, k, v, kernel, neighbours):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v)


def module_paths(dtype, device, batch=32, tokens=197, channels=768, heads=12, neighbours=8):
    """The paper's Table 1 module: ConvNNAttention (scaled_dot, softmax, depthwise) with the Triton
    kernels and with CONVNN_CUDA_KERNELS=generic, against timm's Attention (bias-free projections
    around scaled_dot_product_attention), forward and forward+backward."""

    import timm.layers
    from convnn.nn import ConvNNAttention

    torch.manual_seed(2)
    convnn_layer = ConvNNAttention(channels, heads, neighbours, similarity="scaled_dot", aggregation="depthwise",
                                   rho="softmax").to(device, dtype)
    mhsa = timm.layers.Attention(channels, heads, qkv_bias=False).to(device, dtype)
    x = torch.randn(batch, tokens, channels, device=device).to(dtype).requires_grad_()
    grad = torch.randn(batch, tokens, channels, device=device).to(dtype)
    row = {"B": batch, "N": tokens, "C": channels, "H": heads, "K": neighbours, "dtype": str(dtype).replace("torch.", "")}
    for name, layer, kernels in (("convnn_triton", convnn_layer, "fused"), ("convnn_generic", convnn_layer, "generic"),
                                 ("mhsa_sdpa", mhsa, "fused")):
        os.environ["CONVNN_CUDA_KERNELS"] = kernels

        def forward(layer=layer):
            with torch.no_grad():
                return layer(x)

        def forward_backward(layer=layer):
            torch.autograd.grad(layer(x), [x, *layer.parameters()], grad)

        row[f"{name}_forward_ms"], row[f"{name}_forward_mib"] = timed(forward)
        row[f"{name}_fb_ms"], row[f"{name}_fb_mib"] = timed(forward_backward)
        if kernels == "fused":  # the training step replayed from a CUDA graph, beside eager
            replay = graphed(forward_backward)
            if isinstance(replay, str):
                row[f"{name}_graph_fb_ms"], row[f"{name}_graph_error"] = None, replay
            else:
                row[f"{name}_graph_fb_ms"] = triton.testing.do_bench(replay, warmup=25, rep=100,
                                                                     return_mode="median")
    os.environ["CONVNN_CUDA_KERNELS"] = "fused"
    with torch.no_grad():
        fused = convnn_layer(x)
        os.environ["CONVNN_CUDA_KERNELS"] = "generic"
        generic_out = convnn_layer(x)
        os.environ["CONVNN_CUDA_KERNELS"] = "fused"
    row["triton_vs_generic_max_abs"] = (fused.float() - generic_out.float()).abs().max().item()
    return row


PATHS = {"reference": reference_attention, "generic": attention_op, "composed": composed_attention, "fused": attention_op,
         "sdpa": sdpa}


def op_paths(g, n, d, neighbours, dtype, device):
    generator = torch.Generator(device=device).manual_seed(1)
    leaves = [torch.randn(g, n, d, device=device, generator=generator).to(dtype).requires_grad_() for _ in range(3)]
    kernel = torch.randn(d, neighbours, device=device, generator=generator).to(dtype).requires_grad_()
    grad = torch.randn(g, n, d, device=device, generator=generator).to(dtype)
    row = {"G": g, "N": n, "d": d, "K": neighbours, "dtype": str(dtype).replace("torch.", "")}
    select_fused = ops.knn_select.default._op_dk(CUDA, leaves[0].detach(), leaves[1].detach(), neighbours, "scaled_dot",
                                                 None, False)
    select_generic = ops.knn_select.default._op_dk(GENERIC, leaves[0].detach(), leaves[1].detach(), neighbours,
                                                   "scaled_dot", None, False)
    row["select_indices_differing"] = int((select_fused[1] != select_generic[1]).any(-1).sum())
    row["select_triton_ms"], row["select_triton_mib"] = timed(
        lambda: ops.knn_select.default._op_dk(CUDA, leaves[0].detach(), leaves[1].detach(), neighbours, "scaled_dot",
                                              None, False))
    row["select_generic_ms"], row["select_generic_mib"] = timed(
        lambda: ops.knn_select.default._op_dk(GENERIC, leaves[0].detach(), leaves[1].detach(), neighbours,
                                              "scaled_dot", None, False))
    # knn_select's backward: Triton (the aggregation kernels for scaled_dot, the pair-gradient kernels
    # for cosine) against the generic path, on the same selection.
    q, k = leaves[0].detach(), leaves[1].detach()
    for similarity in ("scaled_dot", "cosine"):
        scores, indices = ops.knn_select.default._op_dk(GENERIC, q, k, neighbours, similarity, None, False)
        grad_scores = torch.randn_like(scores)
        row[f"select_backward_{similarity}_triton_ms"], row[f"select_backward_{similarity}_triton_mib"] = timed(
            lambda: ops.knn_select_backward.default._op_dk(CUDA, grad_scores, q, k, indices, scores, similarity))
        row[f"select_backward_{similarity}_generic_ms"], row[f"select_backward_{similarity}_generic_mib"] = timed(
            lambda: ops.knn_select_backward.default._op_dk(GENERIC, grad_scores, q, k, indices, scores, similarity))
    for name, path in PATHS.items():
        if name == "reference" and g * n * n * 4 > 8 * 2**30:
            continue  # the [G,N,N] scores alone above 8 GiB
        os.environ["CONVNN_CUDA_KERNELS"] = "generic" if name == "generic" else "fused"

        def forward(path=path):
            with torch.no_grad():
                return path(*leaves, kernel, neighbours)

        def forward_backward(path=path):
            out = path(*leaves, kernel, neighbours)
            torch.autograd.grad(out, leaves + [kernel] if name != "sdpa" else leaves, grad)

        row[f"{name}_forward_ms"], row[f"{name}_forward_mib"] = timed(forward)
        row[f"{name}_fb_ms"], row[f"{name}_fb_mib"] = timed(forward_backward)
    os.environ["CONVNN_CUDA_KERNELS"] = "fused"
    return row


def selection_designs(g, n, d, neighbours, device):
    """The select kernel and the fused attention forward (scaled_dot, no mask, softmax, float32) in both
    designs of select.design, launched directly on the same inputs: ms of each, and the query rows
    whose indices, scores or outputs differ between them (none on a GPU, whose IEEE tl.dot sums each
    score in feature order whatever the tile; the interpreter tests prove the designs equal on
    integer-valued inputs)."""
    generator = torch.Generator(device=device).manual_seed(2)
    q, k, v = (torch.randn(g, n, d, device=device, generator=generator) for _ in range(3))
    taps = torch.randn(d, neighbours, device=device, generator=generator)
    slots, root = select.slots_for(neighbours), float(torch.tensor(float(d)).sqrt())
    row = {"G": g, "N": n, "d": d, "K": neighbours}
    results = {}
    for label, shared_set in (("per_thread", False), ("shared", True)):
        blocks, options = select.design(slots, select.NO_MASK, shared_set)
        grid = (triton.cdiv(n, blocks["ROWS"]), g)
        constexprs = {"SIMILARITY": 1, "MASK": select.NO_MASK, "SLOTS": slots, "FEATURES": 16, **blocks, **options}
        scores, indices = torch.empty(g, n, neighbours, device=device), torch.empty(g, n, neighbours, dtype=torch.int64,
                                                                                  device=device)
        output, weights = torch.empty(g, n, d, device=device), torch.empty(g, n, neighbours, device=device)
        chosen, chosen_scores = torch.empty_like(indices), torch.empty_like(scores)

        # Contiguous [G, N, d] operands: the kernels' row layouts (heads 1, then batch, head and row
        # strides of each, as src/ops/cuda/triton/kernel_arguments.h's RowLayout).
        rows = (n * d, 0, d)

        def run_select(grid=grid, constexprs=constexprs, scores=scores, indices=indices):
            select._select_kernel[grid](q, k, q, scores, indices, n, n, d, neighbours, 0, 1, root, 0, 1, *rows, *rows,
                                        **constexprs)

        def run_attention(grid=grid, constexprs=constexprs, output=output, chosen_scores=chosen_scores, chosen=chosen,
                          weights=weights, shared_set=shared_set):
            attention._attention_kernel[grid](q, k, v, taps, v, q, output, chosen_scores, chosen, weights, n, n, d, d,
                                              neighbours, 0, 1, root, attention.RHO_CODES["softmax"], 1.0, 0, 0, 0, 1,
                                              *rows, *rows, *rows, *rows,
                                              CHANNELS=attention.forward_channels(slots, shared_set), **constexprs)

        row[f"select_{label}_ms"], _ = timed(run_select)
        row[f"attention_{label}_ms"], _ = timed(run_attention)
        results[label] = (indices, scores, chosen, output)
    apart = torch.zeros(g, n, dtype=torch.bool, device=device)
    for a, b in zip(results["per_thread"], results["shared"]):
        apart |= (a != b).any(-1)
    row["rows_apart"] = int(apart.sum())
    row["index_rows_apart"] = int(((results["per_thread"][0] != results["shared"][0]).any(-1)
                                   | (results["per_thread"][2] != results["shared"][2]).any(-1)).sum())
    return row


def select_features(kind, g, n, d, dtype, device):
    """Queries and keys [g, n, d] of one kind: Gaussian; clustered round 64 centres (noise 1% of their
    scale); duplicated (each of n / 4 Gaussian keys four times, the queries Gaussian)."""
    generator = torch.Generator(device=device).manual_seed(3)

    def gaussian(rows):
        return torch.randn(g, rows, d, device=device, generator=generator)

    if kind == "clustered":
        centres = gaussian(64)
        def near(rows):
            chosen = torch.randint(0, 64, (g, rows), device=device, generator=generator)
            return centres.gather(1, chosen[..., None].expand(g, rows, d)) + 0.01 * gaussian(rows)
        queries, keys = near(n), near(n)
    elif kind == "duplicated":
        queries, keys = gaussian(n), gaussian(max(1, n // 4)).repeat_interleave(4, dim=1)[:, :n]
    else:
        queries, keys = gaussian(n), gaussian(n)
    return queries.to(dtype).contiguous(), keys.to(dtype).contiguous()


def similarity_constant(similarity, d):
    """The select kernels' similarity_constant, as the C++ launcher passes it."""
    if similarity == "scaled_dot":
        return float(torch.tensor(float(d)).sqrt())
    return float(torch.tensor(ops.cosine_eps(), dtype=torch.float32)) if similarity == "cosine" else 1.0


def rerun_and_rescored(queries, keys, neighbours, similarity="scaled_dot"):
    """(query rows the tensor-core kernel leaves to its rerun, candidates it re-scores exactly per row
    on average), without a mask: launched directly as the C++ launcher launches it (the keys' norms,
    the rows' seeds, then the persistent grid), with the kernel's STATS."""
    g, n, d = queries.shape
    m = keys.shape[1]
    slots = select.slots_for(neighbours)
    dtype = str(queries.dtype).replace("torch.", "")
    scores = torch.empty(g, n, neighbours, device=queries.device, dtype=queries.dtype)
    indices = torch.empty(g, n, neighbours, device=queries.device, dtype=torch.int64)
    redo = torch.empty(g * n, device=queries.device, dtype=torch.int32)
    rescored = torch.empty(3, g * n, device=queries.device, dtype=torch.int32)  # and the tiles scored, taken
    norms = torch.zeros(g, bounded_select.NORM_SECTIONS, m + 1, device=queries.device, dtype=torch.float32)
    rows = (n * d, 0, d)
    bounded_select._key_norms_kernel[(triton.cdiv(m, bounded_select.KEY_NORM_ROWS), g)](
        keys, norms, m, d, similarity_constant("cosine", d), 1, *rows, BLOCK=bounded_select.KEY_NORM_ROWS,
        FEATURES=bounded_select.FEATURES, CANDIDATES=bounded_select.CANDIDATES)
    code = select.SIMILARITY_CODES[similarity]
    seeds = norms  # unread where the kernel takes no seeds
    register.with_scratch_memory()  # the seeds kernel's and the two-tile step's TMA descriptors (sm_90)
    if bounded_select._tile_bound(code, select.NO_MASK):
        seeds = torch.empty(g * n, device=queries.device, dtype=torch.float32)
        bounded_select._seed_thresholds_kernel[(triton.cdiv(n, bounded_select.ROWS), g)](
            queries, keys, queries, redo, norms, seeds, n, m, d, neighbours, 0, 1, similarity_constant(similarity, d),
            1.0, 1, *rows, *rows, SIMILARITY=code, MASK=select.NO_MASK, ROWS=bounded_select.ROWS,
            CANDIDATES=bounded_select.CANDIDATES, FEATURES=bounded_select.FEATURES,
            PRECISION=bounded_select.FLOAT32_PRECISION, PRODUCT_FEATURES=bounded_select.SEED_PRODUCT_FEATURES,
            num_warps=bounded_select.seed_warps(dtype))
    programs = min(triton.cdiv(n, bounded_select.ROWS) * g, bounded_select.PROGRAMS)
    queue = torch.empty(programs * bounded_select.ROWS, bounded_select.QUEUE, device=queries.device, dtype=torch.int32)
    bounded_select._bounded_select_kernel[(programs,)](
        queries, keys, queries, redo, scores, indices, redo, rescored, norms, seeds, queue, g, n, m, d, neighbours,
        0, 1, similarity_constant(similarity, d), 1.0, select.DTYPE_CODES[queries.dtype], 1, *rows, *rows,
        SIMILARITY=code, MASK=select.NO_MASK, ROWS=bounded_select.ROWS,
        CANDIDATES=bounded_select.CANDIDATES, SLOTS=slots, QUEUE=bounded_select.QUEUE, FLUSH=bounded_select.FLUSH,
        FEATURES=bounded_select.FEATURES, PRECISION=bounded_select.FLOAT32_PRECISION, STATS=True,
        STEP_TILES=bounded_select.tiles_per_step(code, select.NO_MASK, dtype,
                                                 register.architecture([queries])), PART=0,
        **bounded_select.compile_options(slots, select.NO_MASK, dtype))
    return int(redo.sum()), float(rescored[0].float().mean())


@contextlib.contextmanager
def select_scores(scores_by):
    """CONVNN_SELECT_SCORES=scores_by inside the block (the C++ launchers read it on each call)."""
    os.environ["CONVNN_SELECT_SCORES"] = scores_by
    try:
        yield
    finally:
        os.environ.pop("CONVNN_SELECT_SCORES")


def select_scores_row(kind, g, n, d, neighbours, dtype, device, time_ieee=True, timer=None, similarity="scaled_dot"):
    """One row of compare_select_scores."""
    timer = timer or timed
    queries, keys = select_features(kind, g, n, d, dtype, device)
    row = {"similarity": similarity, "features": kind, "G": g, "N": n, "d": d, "K": neighbours,
           "dtype": str(dtype).replace("torch.", "")}
    row["rows_left_to_the_rerun"], row["rescored_per_row"] = rerun_and_rescored(queries, keys, neighbours,
                                                                                similarity)

    def select_by(scores_by):
        with select_scores(scores_by):
            return ops.knn_select.default._op_dk(CUDA, queries, keys, neighbours, similarity, None, False)

    bounded = on_triton(lambda: select_by("tensor_cores"))
    row["tensor_cores_ms"], _ = timer(lambda: select_by("tensor_cores"))
    if time_ieee:
        ieee = on_triton(lambda: select_by("ieee"))
        row["indices_equal"] = bool(torch.equal(bounded[1], ieee[1]))
        row["scores_equal"] = bool(torch.equal(bounded[0], ieee[0]))
        row["scores_max_difference"] = float((bounded[0].float() - ieee[0].float()).abs().max())
        row["ieee_ms"], _ = timer(lambda: select_by("ieee"))
    q, k, v = (t.view(1, g, n, d) for t in (queries, keys, queries))
    row["sdpa_forward_ms"], _ = timer(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v))
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    row["sdpa_fb_ms"], _ = timer(lambda: torch.autograd.grad(
        torch.nn.functional.scaled_dot_product_attention(*leaves), leaves, torch.ones_like(q)))
    return row


SELECT_SIZES = (4096, 16384, 65536)  # --tensor-cores' N
TRAINING_SIZES = (16384, 65536)  # --training's N


def select_cases(sizes):
    """compare_select_scores's (similarity, features, N, dtype), bfloat16 first."""
    cases = [("scaled_dot", kind, n, dtype) for n in sizes for dtype in (torch.bfloat16, torch.float32)
             for kind in ("gaussian", "clustered", "duplicated")]
    return cases + [(similarity, "gaussian", n, dtype) for similarity in ("cosine", "gaussian") for n in sizes
                    if n <= 16384 for dtype in (torch.bfloat16, torch.float32)]


def select_case_row(case, device, timer=None):
    """select_scores_row of one of select_cases (12 slices, D 64, K 8; the IEEE kernel up to 16384)."""
    similarity, kind, n, dtype = case
    return select_scores_row(kind, 12, n, 64, 8, dtype, device, time_ieee=n <= 16384, timer=timer,
                             similarity=similarity)


def compare_select_scores(device, json_path, sizes=SELECT_SIZES):
    """select_scores_row for each size, dtype and kind of features (scaled_dot), and for cosine and
    gaussian on Gaussian features up to N = 16384, printed as a table a row at a time (a step cut
    short by its time limit keeps the rows it finished)."""
    print(f"device: {torch.cuda.get_device_name(device)}; knn_select (D 64, K 8) on tensor cores "
          "against the IEEE kernel, ms, and SDPA on the same [1, 12, N, 64]:")
    print("| similarity | dtype | N | features | rows left to the rerun (of 12 N) | candidates re-scored per row | "
          "indices / scores equal | tensor cores | IEEE | SDPA forward | SDPA forward+backward |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|", flush=True)
    rows = []
    for case in select_cases(sizes):
        r = select_case_row(case, device)
        rows.append(r)
        ieee = f"{r['ieee_ms']:.3f}" if "ieee_ms" in r else "not timed"
        print(f"| {r['similarity']} | {r['dtype']} | {r['N']} | {r['features']} | {r['rows_left_to_the_rerun']} | "
              f"{r['rescored_per_row']:.1f} | {equal_cell(r)} | "
              f"{r['tensor_cores_ms']:.3f} | {ieee} | {r['sdpa_forward_ms']:.3f} | {r['sdpa_fb_ms']:.3f} |", flush=True)
        write_json(json_path, device, select_scores=rows)


def training_row(n, causal, dtype, device, heads=12, d=64, neighbours=8, compare_ieee=True, timer=None):
    """One row of compare_training: knn_attention (scaled_dot, softmax, a depthwise kernel) on [1, H, N,
    D] heads of Gaussian features with its select on tensor cores, forward and forward+backward, causal
    through a bool [N, N] mask (as ConvNNAttention's causal option builds it), against
    scaled_dot_product_attention on the same tensors (is_causal); with compare_ieee, the IEEE kernel's
    forward too (the fused kernel), and whether the indices and scores are the same."""
    timer = timer or timed
    generator = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(1, heads, n, d, device=device, generator=generator).to(dtype) for _ in range(3))
    kernel = torch.randn(d, neighbours, device=device, generator=generator).to(dtype)
    mask = torch.ones(n, n, dtype=torch.bool, device=device).tril() if causal else None
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    grad = torch.ones_like(q)

    def forward(*tensors):
        return ops.knn_attention(*tensors, kernel, None, neighbours, "scaled_dot", mask, False, "softmax", 1.0)

    row = {"N": n, "H": heads, "d": d, "K": neighbours, "causal": causal, "dtype": str(dtype).replace("torch.", "")}
    def forward_backward():
        return torch.autograd.grad(forward(*leaves)[0], leaves, grad)

    with select_scores("tensor_cores"):
        bounded = on_triton(lambda: forward(q, k, v))
        on_triton(forward_backward)
        row["forward_ms"], _ = timer(lambda: forward(q, k, v))
        row["fb_ms"], row["fb_mib"] = timer(forward_backward)
    if compare_ieee:
        with select_scores("ieee"):
            ieee = on_triton(lambda: forward(q, k, v))
            row["ieee_forward_ms"], _ = timer(lambda: forward(q, k, v))
        row["indices_equal"] = bool(torch.equal(bounded[2], ieee[2]))
        row["scores_equal"] = bool(torch.equal(bounded[1], ieee[1]))
        apart = torch.where(bounded[1] == ieee[1], 0.0, bounded[1].float() - ieee[1].float())  # -inf slots alike
        row["scores_max_difference"] = float(apart.abs().max())
    sdpa_leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    row["sdpa_forward_ms"], _ = timer(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v,
                                                                                               is_causal=causal))
    row["sdpa_fb_ms"], row["sdpa_fb_mib"] = timer(lambda: torch.autograd.grad(
        torch.nn.functional.scaled_dot_product_attention(*sdpa_leaves, is_causal=causal), sdpa_leaves, grad))
    return row


def training_cases(sizes):
    """compare_training's (N, causal, dtype): bfloat16 at each size, float32 at the first, bfloat16 first."""
    return [(n, causal, dtype) for n in sizes for dtype in ((torch.bfloat16, torch.float32) if n == sizes[0]
                                                          else (torch.bfloat16,))
            for causal in (False, True)]


def training_case_row(case, device, timer=None):
    """training_row of one of training_cases (compared with the IEEE kernel up to 16384)."""
    n, causal, dtype = case
    return training_row(n, causal, dtype, device, compare_ieee=n <= 16384, timer=timer)


def compile_in_shards(mode, sizes, jobs):
    """Each kernel that `mode` (--training or --tensor-cores) launches at these sizes compiled ahead of
    the timed run, by `jobs` processes at once, each running its share of the cases once untimed:
    Triton compiles a kernel on its first launch, single-threaded, seconds each, and writes it to its
    cache on disk, which the timed run then reads (on a lent GPU machine with 16 cores, the
    difference between a few minutes of compiling and a few seconds)."""
    import subprocess
    import sys
    command = [sys.executable, os.path.abspath(__file__), mode, *(["--sizes", *map(str, sizes)] if sizes else [])]
    shards = [subprocess.Popen(command + ["--compile-shard", f"{i}/{jobs}"]) for i in range(jobs)]
    failed = [i for i, shard in enumerate(shards) if shard.wait() != 0]
    if failed:
        raise SystemExit(f"gpu_bench: compiling shards {failed} of {jobs} failed")


def run_shard(mode, device, sizes, shard):
    """One process of compile_in_shards: cases shard, shard + count, ... of `mode`, each run once."""
    index, count = map(int, shard.split("/"))
    once = lambda fn: (fn(), 0.0)  # noqa: E731
    if mode == "--training":
        for case in training_cases(sizes or TRAINING_SIZES)[index::count]:
            training_case_row(case, device, timer=once)
    else:
        for case in select_cases(sizes or SELECT_SIZES)[index::count]:
            select_case_row(case, device, timer=once)


def profiled_select(device, n=4096):
    """One knn_select on tensor cores (scaled_dot, bfloat16, Gaussian 12 x n, D 64, K 8) after one
    untimed call, for a profiler (scripts/gpu-check.sh runs ncu on its last launch)."""
    queries, keys = select_features("gaussian", 12, n, 64, torch.bfloat16, device)
    with select_scores("tensor_cores"):
        for _ in range(2):
            on_triton(lambda: ops.knn_select.default._op_dk(CUDA, queries, keys, 8, "scaled_dot", None, False))
    torch.cuda.synchronize()


def compare_training(device, json_path, sizes=TRAINING_SIZES):
    """training_row at each size, causal or not, bfloat16 (and float32 at the first size), printed as a
    table a row at a time: the issue's target is forward+backward at least 2x faster than SDPA in
    bfloat16."""
    print(f"device: {torch.cuda.get_device_name(device)}; knn_attention (scaled_dot, softmax, depthwise, D 64, "
          "K 8) on [1, 12, N, 64] with its select on tensor cores, against SDPA on the same tensors, ms:")
    print("| dtype | N | causal | indices / scores equal to the IEEE kernel's | forward (IEEE forward) | "
          "forward+backward (peak MiB) | SDPA forward | SDPA forward+backward (peak MiB) | "
          "SDPA / convnn, forward+backward |\n|---|---|---|---|---|---|---|---|---|", flush=True)
    rows = []
    for case in training_cases(sizes):
        r = training_case_row(case, device)
        rows.append(r)
        ieee = f" ({r['ieee_forward_ms']:.3f})" if "ieee_forward_ms" in r else ""
        print(f"| {r['dtype']} | {r['N']} | {r['causal']} | {equal_cell(r)} | {r['forward_ms']:.3f}{ieee} | "
              f"{r['fb_ms']:.3f} ({r['fb_mib']:.0f}) | {r['sdpa_forward_ms']:.3f} | {r['sdpa_fb_ms']:.3f} "
              f"({r['sdpa_fb_mib']:.0f}) | {r['sdpa_fb_ms'] / r['fb_ms']:.2f} |", flush=True)
        write_json(json_path, device, training=rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the rows to this file")
    parser.add_argument("--designs", action="store_true", help="only the running top-K's two designs")
    parser.add_argument("--tensor-cores", action="store_true", help="only knn_select on tensor cores against IEEE")
    parser.add_argument("--training", action="store_true",
                        help="only knn_attention's forward+backward with the select on tensor cores against SDPA")
    parser.add_argument("--sizes", type=int, nargs="+",
                        help="sequence lengths N of --tensor-cores (default 4096 16384 65536) or --training "
                             "(default 16384 65536)")
    parser.add_argument("--compile-jobs", type=int, default=0,
                        help="with --training or --tensor-cores: first compile their kernels in this many "
                             "processes at once (compile_in_shards)")
    parser.add_argument("--compile-only", action="store_true", help="with --compile-jobs: compile, time nothing")
    parser.add_argument("--compile-shard", help=argparse.SUPPRESS)
    parser.add_argument("--profile-select", action="store_true",
                        help="only one knn_select on tensor cores at 12 x 4096, bfloat16, for a profiler")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gpu_bench: no CUDA device")
    device = torch.device("cuda", torch.cuda.current_device())
    if args.designs:
        compare_designs(device, args.json)
        return
    mode = "--training" if args.training else "--tensor-cores" if args.tensor_cores else None
    if args.compile_shard:
        run_shard(mode, device, args.sizes, args.compile_shard)
        return
    if mode and args.compile_jobs > 0:
        compile_in_shards(mode, args.sizes, args.compile_jobs)
        if args.compile_only:
            return
    if args.profile_select:
        profiled_select(device)
        return
    if args.tensor_cores:
        compare_select_scores(device, args.json, *([tuple(args.sizes)] if args.sizes else []))
        return
    if args.training:
        compare_training(device, args.json, *([tuple(args.sizes)] if args.sizes else []))
        return
    shapes = [(384, 197, 64, 8)] + [(12, n, 64, 9) for n in (197, 1024, 4096, 16384)]
    rows = [one(*shape, dtype, device) for dtype in (torch.float32, torch.bfloat16) for shape in shapes]
    print(f"device: {torch.cuda.get_device_name(device)}; torch {torch.__version__}; triton {triton.__version__}")
    print("knn_aggregate, depthwise:")
    print("| dtype | G | N | K | rel. error | Triton fwd ms (GB/s) / bwd ms | generic fwd ms / bwd ms | "
          "peak MiB Triton fwd/bwd | generic fwd/bwd |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['dtype']} | {r['G']} | {r['N']} | {r['K']} | {r['relative_error']:.1e} | "
              f"{r['triton_forward_ms']:.3f} ({r['triton_forward_gbps']:.0f}) / {r['triton_backward_ms']:.3f} | "
              f"{r['generic_forward_ms']:.3f} / {r['generic_backward_ms']:.3f} | "
              f"{r['triton_forward_mib']:.1f} / {r['triton_backward_mib']:.1f} | "
              f"{r['generic_forward_mib']:.1f} / {r['generic_backward_mib']:.1f} |")
    paths = [op_paths(*shape, dtype, device) for dtype in (torch.float32, torch.bfloat16) for shape in shapes]
    print("\nop level (scaled_dot, softmax, depthwise), ms forward / forward+backward, peak MiB of forward+backward:")
    print("| dtype | G | N | K | select Triton / generic ms (rows picked apart) | " + " | ".join(PATHS) + " |")
    print("|---|---|---|---|---|" + "---|" * len(PATHS))
    for r in paths:
        cells = [f"{r[f'{p}_forward_ms']:.3f} / {r[f'{p}_fb_ms']:.3f} ({r[f'{p}_fb_mib']:.0f})"
                 if f"{p}_fb_ms" in r else "skipped" for p in PATHS]
        print(f"| {r['dtype']} | {r['G']} | {r['N']} | {r['K']} | {r['select_triton_ms']:.3f} / "
              f"{r['select_generic_ms']:.3f} ({r['select_indices_differing']}) | " + " | ".join(cells) + " |")
    modules = [module_paths(dtype, device) for dtype in (torch.float32, torch.bfloat16)]
    print("\nmodule level (the paper's Table 1: B 32, N 197, C 768, 12 heads, K 8), ms forward / "
          "forward+backward (peak MiB of forward+backward):")
    print("| dtype | ConvNNAttention, Triton | ConvNNAttention, generic | timm Attention (SDPA) | "
          "forward+backward from a CUDA graph: Triton / SDPA | max abs Triton - generic |")
    print("|---|---|---|---|---|---|")
    for r in modules:
        cells = [f"{r[f'{p}_forward_ms']:.3f} / {r[f'{p}_fb_ms']:.3f} ({r[f'{p}_fb_mib']:.0f})"
                 for p in ("convnn_triton", "convnn_generic", "mhsa_sdpa")]
        graphs = " / ".join(f"{r[f'{p}_graph_fb_ms']:.3f}" if r[f"{p}_graph_fb_ms"] is not None
                            else f"not captured ({r[f'{p}_graph_error']})" for p in ("convnn_triton", "mhsa_sdpa"))
        print(f"| {r['dtype']} | " + " | ".join(cells) + f" | {graphs} | {r['triton_vs_generic_max_abs']:.2e} |")
    write_json(args.json, device, aggregate=rows, op_paths=paths, modules=modules)


def compare_designs(device, json_path):
    """selection_designs at Table 1 and 12 x 4096, printed as a table (and written as JSON)."""
    designs = [selection_designs(*shape, device) for shape in ((384, 197, 64, 8), (12, 4096, 64, 8))]
    print(f"device: {torch.cuda.get_device_name(device)}; the running top-K's two designs (scaled_dot, no mask, "
          "float32), ms: per thread (1 warp, 32 rows) / shared (8 warps, 16 rows):")
    print("| G | N | K | knn_select | fused attention forward | rows apart (indices) |\n|---|---|---|---|---|---|")
    for r in designs:
        print(f"| {r['G']} | {r['N']} | {r['K']} | {r['select_per_thread_ms']:.3f} / {r['select_shared_ms']:.3f} | "
              f"{r['attention_per_thread_ms']:.3f} / {r['attention_shared_ms']:.3f} | {r['rows_apart']} "
              f"({r['index_rows_apart']}) |")
    write_json(json_path, device, selection_designs=designs)


if __name__ == "__main__":
    main()
