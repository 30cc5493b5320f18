"""Times convnn's Triton knn_aggregate kernels (python/convnn/_triton) against the device-generic
path on a CUDA device, at the paper's configuration (G = 384 slices, N = M = 197, d = 64, K = 8,
depthwise) and at N = 197, 1024, 4096, 16384 (G = 12, K = 9), in float32 and bfloat16. The C++
`convnn bench --device cuda` times the generic attention paths; the Triton kernels are registered
from Python, so they are timed here. Medians of triton.testing.do_bench (CUDA events), peak
memory from the caching allocator, bytes moved by the forward's minimum (every gathered row read
once per slot, weights and indices read, the output written) over the measured time.

    python scripts/gpu_bench.py [--json FILE]
"""
import argparse
import json

import torch
import triton.testing

import convnn  # noqa: F401  (registers the ops and the Triton CUDA kernels)
from convnn._triton import aggregate

GENERIC = torch._C.DispatchKey.CompositeExplicitAutograd
ops = torch.ops.convnn


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


def one(g, n, c, k, dtype, device):
    values, weights, indices, kernel, dy = inputs(g, n, c, k, dtype, device)
    mask = [True, True, True, False]
    paths = {
        "triton": (lambda: aggregate.aggregate_forward(values, weights, indices, kernel, None),
                   lambda: aggregate.aggregate_backward(dy, values, weights, indices, kernel, mask)),
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


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the rows to this file")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gpu_bench: no CUDA device")
    device = torch.device("cuda", torch.cuda.current_device())
    shapes = [(384, 197, 64, 8)] + [(12, n, 64, 9) for n in (197, 1024, 4096, 16384)]
    rows = [one(*shape, dtype, device) for dtype in (torch.float32, torch.bfloat16) for shape in shapes]
    print(f"device: {torch.cuda.get_device_name(device)}; torch {torch.__version__}; triton {triton.__version__}")
    print("| dtype | G | N | K | rel. error | Triton fwd ms (GB/s) / bwd ms | generic fwd ms / bwd ms | "
          "peak MiB Triton fwd/bwd | generic fwd/bwd |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['dtype']} | {r['G']} | {r['N']} | {r['K']} | {r['relative_error']:.1e} | "
              f"{r['triton_forward_ms']:.3f} ({r['triton_forward_gbps']:.0f}) / {r['triton_backward_ms']:.3f} | "
              f"{r['generic_forward_ms']:.3f} / {r['generic_backward_ms']:.3f} | "
              f"{r['triton_forward_mib']:.1f} / {r['triton_backward_mib']:.1f} | "
              f"{r['generic_forward_mib']:.1f} / {r['generic_backward_mib']:.1f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(device), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
