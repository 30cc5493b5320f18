"""Compiles convnn's Triton kernels (python/convnn/_triton: the aggregation, knn_select and its
backward, the fused knn_attention) ahead of time and writes them as a C++ source for libconvnn_triton_kernels (issue 25 §3): the CUDA
build embeds the images and launches them through the CUDA runtime (src/ops/cuda/triton/), so a
LibTorch program on a GPU runs the same kernels as the Python package with no Python and no Triton
at run time.

    .venv/bin/python scripts/triton_aot.py --arch 80 --arch 90 --output build/.../aot_kernels.cpp
    .venv/bin/python scripts/triton_aot.py --constants build/.../triton_blocks.cpp

For every specialisation that scripts/triton_compile_check.py lists (the same list: one place says
what is compiled), and every architecture, compiled in parallel (one process per core):
- the cubin (sm_80 runs on every 8.x GPU; Triton's 90 is sm_90a, which runs on 9.0 only);
- the kernel's parameter kinds, read from the PTX entry itself (the ABI the launcher must match:
  every non-constexpr argument, then Triton's two scratch pointers), one letter each: p pointer,
  i 32-bit integer, l 64-bit integer, f float32;
- the element type of each pointer parameter, from the specialisation's signature, one letter each
  (POINTEE_LETTERS: kernel_arguments.h's pointee_letter reads a tensor's dtype the same way), so that a
  launch can check that each tensor it passes is of the type the kernel was compiled to read;
- its warps and dynamic shared memory, from Triton's metadata.
The lowest architecture's PTX is kept as well, for GPUs of a newer major version than any cubin
(the driver compiles it on first load).
The block sizes and limits the launchers need come from the kernels' modules, so that they are
written once: --constants writes them alone (no compiling), for every build with the Triton route,
embedded images or not (src/ops/cuda/triton/routes.h).
"""
import argparse
import pathlib
import re
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import triton_compile_check as check  # noqa: E402

PARAMETER_KINDS = {".u64 .ptr": "p", ".u32": "i", ".u64": "l", ".f32": "f", ".s32": "i", ".s64": "l"}
# A pointer parameter's element type -> its letter (as KernelArguments::pointees writes a tensor's).
POINTEE_LETTERS = {"*fp32": "f", "*fp16": "h", "*bf16": "b", "*i64": "l", "*i32": "i", "*i1": "?"}


# An output written in the op's dtype through a pointer compiled as float32 (specialisations.
# OUTPUTS_IN_THE_OPS_DTYPE: float32, float16 or bfloat16, by the kernel's dtype_code).
IN_THE_OPS_DTYPE = "*"


def pointee_letters(kernel, signature, name):
    """The element types of the signature's pointer parameters, in order, one letter each."""
    specialisations = check.load_kernels("specialisations")
    in_the_ops_dtype = specialisations.OUTPUTS_IN_THE_OPS_DTYPE.get(kernel.__name__, ())
    pointers = [(parameter, kind) for parameter, kind in signature.items() if kind.startswith("*")]
    unknown = [kind for _, kind in pointers if kind not in POINTEE_LETTERS]
    if unknown:
        raise RuntimeError(f"{name}: no letter for the pointer types {unknown}")
    return "".join(IN_THE_OPS_DTYPE if parameter in in_the_ops_dtype else POINTEE_LETTERS[kind]
                   for parameter, kind in pointers)


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
    if metadata.profile_scratch_size:
        raise RuntimeError(f"{name} sm_{arch}: needs profile scratch memory, which the launcher does not allocate")
    # Global scratch (on-device TMA descriptors): the launcher allocates it per program (launch.cpp).
    scratch = (metadata.global_scratch_size, metadata.global_scratch_align if metadata.global_scratch_size else 0)
    return (name, arch, metadata.name, metadata.num_warps, metadata.shared, scratch,
            parameter_kinds(compiled.asm["ptx"], metadata.name), pointee_letters(kernel, signature, name),
            compiled.asm["cubin"], compiled.asm["ptx"])


def seeded(bounded, select):
    """The (similarity, mask kind) pairs whose rows the tensor-core select seeds (bounded_select._tile_bound:
    _seed_thresholds_kernel runs before it), as bits: bit 3 * code + mask kind."""
    masks = (select.NO_MASK, select.BOOL_MASK, select.ADDITIVE_MASK)
    assert max(masks) < 3 and 3 * max(bounded.SIMILARITIES) + 2 < 32
    return sum(1 << (3 * code + mask) for code in bounded.SIMILARITIES for mask in masks
               if bounded._tile_bound(code, mask))


def constants_source():
    """The block sizes, limits and codes of src/ops/cuda/triton/blocks.h, from the kernels' modules."""
    aggregate, select, pairs, attention, attention_backward, bounded = (
        check.load_kernels(name) for name in ("aggregate", "select", "pair_gradients", "attention", "attention_backward",
                                              "bounded_select"))
    rho, dtype = attention.RHO_CODES, attention.DTYPE_CODES

    def reads(name):  # whether the running-top-K kernels are compiled to read this input dtype
        return "true" if name in select.INPUT_DTYPES else "false"

    return f"""// Generated by scripts/triton_aot.py --constants from python/convnn/_triton; do not edit.
#include "ops/cuda/triton/blocks.h"

namespace convnn::ops::cuda::triton {{

const AggregateBlocks kAggregateBlocks = {{{aggregate.ROWS}, {aggregate.CHANNELS}, {aggregate.KERNEL_GRADIENT_CHUNKS}}};
const SelectBlocks kSelectBlocks = {{{select.ROWS}, {select.THREAD_ROWS}, {select.THREAD_SLOTS}, {select.MIN_SLOTS},
                                    {select.MAX_SLOTS}, {select.NO_MASK}, {select.BOOL_MASK}, {select.ADDITIVE_MASK},
                                    {reads("bfloat16")}, {reads("float16")}}};
const BoundedSelectBlocks kBoundedSelectBlocks = {{{bounded.ROWS}, {bounded.MAX_FEATURES}, {bounded.FEATURES},
                                                  {bounded.MAX_SLOTS}, {bounded.QUEUE}, {bounded.KEY_NORM_ROWS},
                                                  {bounded.PROGRAMS},
                                                  {bounded.FLOAT32_MASK_SLOTS},
                                                  {sum(1 << code for code in bounded.SIMILARITIES)}u,
                                                  {bounded.CANDIDATES}, {bounded.MASK_BITS_ROWS},
                                                  {bounded.NORM_SECTIONS}, {seeded(bounded, select)}u,
                                                  {bounded.TILE_OFFSET_ROWS}}};
const PairGradientBlocks kPairGradientBlocks = {{{pairs.ROWS}, {pairs.FEATURES}, {pairs.COEFFICIENTS}}};
const AttentionCodes kAttentionCodes = {{{attention.CHANNELS}, {rho["uniform"]}, {rho["mean"]}, {rho["softmax"]},
                                        {dtype[torch.float32]}, {dtype[torch.bfloat16]}, {dtype[torch.float16]},
                                        {attention.RHO_AGGREGATE_ROWS}}};
const AttentionBackwardBlocks kAttentionBackwardBlocks = {{{attention_backward.ROW_ROWS}, {attention_backward.COLUMN_ROWS},
                                                          {attention_backward.COLUMN_WIDTH}}};

}}  // namespace convnn::ops::cuda::triton
"""


def images_source(architectures):
    """The compiled images and their table (compiled_kernels.h)."""
    jobs = [(index, arch) for index in range(len(check.all_specialisations())) for arch in architectures]
    results = check.map_in_parallel(compile_one, jobs)
    images, entries = [], []

    def add(key, arch, kind, name, num_warps, shared, scratch, parameters, pointees, data):
        symbol = f"kImage{len(images)}"
        images.append(f"// {key}, sm_{arch} {kind}\nconst char {symbol}[] =\n{c_string(data)};")
        entries.append(f'    {{"{key}", "{name}", {arch}, ImageKind::k{kind.capitalize()}, {num_warps}, {shared}, '
                       f'{scratch[0]}, {scratch[1]}, "{parameters}", "{pointees}", {symbol}, sizeof({symbol}) - 1}},')

    for key, arch, name, num_warps, shared, scratch, parameters, pointees, cubin, ptx in results:
        add(key, arch, "cubin", name, num_warps, shared, scratch, parameters, pointees, cubin)
        if arch == architectures[0]:
            add(key, arch, "ptx", name, num_warps, shared, scratch, parameters, pointees, ptx.encode() + b"\0")
    return f"""// Generated by scripts/triton_aot.py from python/convnn/_triton (Triton {check.triton.__version__});
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

}}  // namespace convnn::ops::cuda::triton
"""


def write_whole(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(text)
    temporary.replace(path)  # whole or not at all: an interrupted run leaves no half file


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", type=int, action="append", default=[],
                        help="a CUDA architecture, e.g. 80 or 90 (repeatable; with --output)")
    parser.add_argument("--output", type=pathlib.Path, help="the images' source (compiled_kernels.h's table)")
    parser.add_argument("--constants", type=pathlib.Path, help="the block sizes' source (blocks.h), no compiling")
    args = parser.parse_args()
    if args.output is None and args.constants is None:
        sys.exit("triton_aot: give --output, --constants or both")
    if args.output is not None and not args.arch:
        sys.exit("triton_aot: --output needs at least one --arch")
    unknown = sorted(set(args.arch) - set(check.ARCHITECTURES))
    if unknown:
        sys.exit(f"triton_aot: --arch {unknown[0]} is not one of {sorted(check.ARCHITECTURES)}")
    if args.constants is not None:
        write_whole(args.constants, constants_source())
    if args.output is not None:
        write_whole(args.output, images_source(sorted(set(args.arch))))


if __name__ == "__main__":
    main()
