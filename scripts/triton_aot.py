"""Compiles convnn's Triton kernels (python/convnn/_triton: the aggregation, knn_select and its
backward, the fused knn_attention) ahead of time and writes them as a C++ source for libconvnn_ops (issue 25 §3): the CUDA
build embeds the images and launches them through the CUDA runtime (src/ops/cuda/triton/), so a
LibTorch program on a GPU runs the same kernels as the Python package with no Python and no Triton
at run time.

    .venv/bin/python scripts/triton_aot.py --arch 80 --arch 90 --output build/.../aot_kernels.cpp

For every specialisation that scripts/triton_compile_check.py lists (the same list: one place says
what is compiled), and every architecture, compiled in parallel (one process per core):
- the cubin (sm_80 runs on every 8.x GPU; Triton's 90 is sm_90a, which runs on 9.0 only);
- the kernel's parameter kinds, read from the PTX entry itself (the ABI the launcher must match:
  every non-constexpr argument, then Triton's two scratch pointers), one letter each: p pointer,
  i 32-bit integer, l 64-bit integer, f float32;
- its warps and dynamic shared memory, from Triton's metadata.
The lowest architecture's PTX is kept as well, for GPUs of a newer major version than any cubin
(the driver compiles it on first load).
The block sizes and limits the launchers need come from the kernels' modules, so that they are
written once.
"""
import argparse
import concurrent.futures
import multiprocessing
import os
import pathlib
import re
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import triton_compile_check as check  # noqa: E402

PARAMETER_KINDS = {".u64 .ptr": "p", ".u32": "i", ".u64": "l", ".f32": "f", ".s32": "i", ".s64": "l"}


def parameter_kinds(ptx, name):
    """The entry's parameter kinds, in order, from its PTX declaration."""
    entry = re.search(r"\.entry\s+" + re.escape(name) + r"\s*\((.*?)\)", ptx, re.S)
    if entry is None:
        raise RuntimeError(f"{name}: no .entry in its PTX")
    kinds = []
    for parameter in entry.group(1).split(","):
        declared = re.match(r"\s*\.param\s+(\.\w+(?:\s+\.ptr)?)", parameter)
        kind = PARAMETER_KINDS.get(re.sub(r"\s+", " ", declared.group(1)) if declared else "")
        if kind is None:
            raise RuntimeError(f"{name}: unknown parameter declaration '{parameter.strip()}'")
        kinds.append(kind)
    return "".join(kinds)


def c_string(data, indent="    "):
    """`data` as adjacent C string literals of octal escapes (an escape of at most three digits
    cannot run into the next one, as hexadecimal escapes can)."""
    lines = []
    for start in range(0, len(data), 48):
        lines.append(indent + '"' + "".join(f"\\{byte:03o}" for byte in data[start:start + 48]) + '"')
    return "\n".join(lines) if lines else indent + '""'


def compile_one(job):
    """(index, arch) -> what the table needs of that compiled kernel (in a worker process)."""
    index, arch = job
    name, kernel, signature, constexprs, options = check.all_specialisations()[index]
    compiled = check.compile_for(kernel, signature, constexprs, options, arch)
    metadata = compiled.metadata
    if getattr(metadata, "global_scratch_size", 0) or metadata.profile_scratch_size:
        raise RuntimeError(f"{name} sm_{arch}: needs global or profile scratch memory, which the launcher "
                           "does not allocate")
    return (name, arch, metadata.name, metadata.num_warps, metadata.shared,
            parameter_kinds(compiled.asm["ptx"], metadata.name), compiled.asm["cubin"], compiled.asm["ptx"])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", type=int, action="append", required=True,
                        help="a CUDA architecture, e.g. 80 or 90 (repeatable)")
    parser.add_argument("--output", type=pathlib.Path, required=True)
    args = parser.parse_args()
    unknown = sorted(set(args.arch) - set(check.ARCHITECTURES))
    if unknown:
        sys.exit(f"triton_aot: --arch {unknown[0]} is not one of {sorted(check.ARCHITECTURES)}")
    architectures = sorted(set(args.arch))
    jobs = [(index, arch) for index in range(len(check.all_specialisations())) for arch in architectures]
    with concurrent.futures.ProcessPoolExecutor(max_workers=os.cpu_count() or 1,
                                                mp_context=multiprocessing.get_context("fork")) as pool:
        results = list(pool.map(compile_one, jobs))
    images, entries = [], []

    def add(key, arch, kind, name, num_warps, shared, parameters, data):
        symbol = f"kImage{len(images)}"
        images.append(f"// {key}, sm_{arch} {kind}\nconst char {symbol}[] =\n{c_string(data)};")
        entries.append(f'    {{"{key}", "{name}", {arch}, ImageKind::k{kind.capitalize()}, {num_warps}, {shared}, '
                       f'"{parameters}", {symbol}, sizeof({symbol}) - 1}},')

    for key, arch, name, num_warps, shared, parameters, cubin, ptx in results:
        add(key, arch, "cubin", name, num_warps, shared, parameters, cubin)
        if arch == architectures[0]:
            add(key, arch, "ptx", name, num_warps, shared, parameters, ptx.encode() + b"\0")
    aggregate, select, pairs, attention, attention_backward = (
        check.load_kernels(name) for name in ("aggregate", "select", "pair_gradients", "attention", "attention_backward"))
    rho, dtype = attention.RHO_CODES, attention.DTYPE_CODES
    source = f"""// Generated by scripts/triton_aot.py from python/convnn/_triton (Triton {check.triton.__version__});
// do not edit.
#include "ops/cuda/triton/compiled_kernels.h"

namespace convnn::ops::cuda::triton {{
namespace {{

{chr(10).join(images)}

}}  // namespace

const CompiledKernel kCompiledKernels[] = {{
{chr(10).join(entries)}
}};
const std::size_t kCompiledKernelCount = sizeof(kCompiledKernels) / sizeof(kCompiledKernels[0]);
const AggregateBlocks kAggregateBlocks = {{{aggregate.ROWS}, {aggregate.CHANNELS}, {aggregate.KERNEL_GRADIENT_CHUNKS}}};
const SelectBlocks kSelectBlocks = {{{select.ROWS}, {select.MIN_SLOTS}, {select.MAX_SLOTS}, {select.NO_MASK}, {select.BOOL_MASK},
                                    {select.ADDITIVE_MASK}}};
const PairGradientBlocks kPairGradientBlocks = {{{pairs.ROWS}, {pairs.FEATURES}, {pairs.COEFFICIENTS}}};
const AttentionCodes kAttentionCodes = {{{attention.CHANNELS}, {rho["uniform"]}, {rho["mean"]}, {rho["softmax"]},
                                        {dtype[torch.float32]}, {dtype[torch.bfloat16]}, {dtype[torch.float16]}}};
const AttentionBackwardBlocks kAttentionBackwardBlocks = {{{attention_backward.COLUMN_ROWS}, {attention_backward.COLUMN_WIDTH}}};

}}  // namespace convnn::ops::cuda::triton
"""
    args.output.parent.mkdir(parents=True, exist_ok=True)
    temporary = args.output.with_suffix(".tmp")
    temporary.write_text(source)
    temporary.replace(args.output)  # whole or not at all: an interrupted run leaves no half file


if __name__ == "__main__":
    main()
