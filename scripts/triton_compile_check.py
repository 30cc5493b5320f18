"""Compiles every shipped specialisation of convnn's Triton kernels (python/convnn/_triton) for
sm_80 and sm_90 without a GPU, and fails on a compile error, a register spill or a shared-memory
overflow. Registers and spills come from the ptxas that ships inside the triton wheel (`ptxas -v`
on the kernel's PTX), shared memory from Triton's metadata. Prints a Markdown table
(BENCHMARKS.md lists it).

    .venv/bin/python scripts/triton_compile_check.py
"""
import importlib.util
import os
import pathlib
import re
import subprocess
import sys
import tempfile

if os.environ.get("TRITON_INTERPRET") == "1":
    sys.exit("triton_compile_check: TRITON_INTERPRET=1 is set; unset it to compile for a GPU")

import triton  # noqa: E402
import triton.compiler  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
ARCHITECTURES = {80: ("sm_80", 163 * 1024), 90: ("sm_90a", 227 * 1024)}  # name for ptxas, shared-memory limit
# aggregate.py's and pair_gradients.py's kernels launch with Triton's defaults; select.py names its own.
DEFAULT_OPTIONS = {"num_warps": 4}
POINTER = {"float32": "*fp32", "bfloat16": "*bf16", "float16": "*fp16"}


def load_kernels(name="aggregate"):
    """python/convnn/_triton/<name>.py as a module of a package of its own (so that its relative
    imports work), without importing convnn, which would load the C++ libraries."""
    package = "convnn_triton_sources"
    if package not in sys.modules:
        folder = REPO / "python/convnn/_triton"
        spec = importlib.util.spec_from_file_location(package, folder / "__init__.py",
                                                      submodule_search_locations=[str(folder)])
        sys.modules[package] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[package])
    return importlib.import_module(f"{package}.{name}")


def top_k_variants(select):
    """(key suffix, mask pointer type, constexprs) of every kernel built on the running top-K of
    select.py: every similarity at every width (8 to 64 slots) with every mask kind."""
    masks = {select.NO_MASK: ("no mask", "*fp32"), select.BOOL_MASK: ("bool mask", "*i1"),
             select.ADDITIVE_MASK: ("additive mask", "*fp32")}
    for name, code in select.SIMILARITY_CODES.items():
        for mask, (mask_name, mask_pointer) in masks.items():
            slots = select.MIN_SLOTS
            while slots <= select.slots_for(select.MAX_SLOTS):
                yield (f"{name} K<={slots} {mask_name}", mask_pointer,
                       {"SIMILARITY": code, "MASK": mask, "ROWS": select.ROWS,
                        "CANDIDATES": select.candidates_for(slots, mask),
                        "SLOTS": slots, "FEATURES": select.features_for(64)})
                slots *= 2


def select_specialisations(module):
    """knn_select: every kernel a call can launch (the kernel takes float32 inputs whatever the op's
    dtype, and select_forward puts the slots in index order after it)."""
    for suffix, mask_pointer, constexprs in top_k_variants(module):
        yield (f"select {suffix}", module._select_kernel,
               {"q_ptr": "*fp32", "k_ptr": "*fp32", "mask_ptr": mask_pointer, "scores_ptr": "*fp32",
                "indices_ptr": "*i64", "n": "i32", "m": "i32", "d": "i32", "k": "i32",
                "mask_slice_stride": "i32", "root": "fp32"},
               constexprs)


def attention_specialisations(module, select):
    """knn_attention's fused forward: the same variants as the select kernel (rho, slot order, bias
    and the op's dtype are runtime arguments); its backward's softmax scores gradient at every width."""
    for suffix, mask_pointer, constexprs in top_k_variants(select):
        yield (f"attention {suffix}", module._attention_kernel,
               {"q_ptr": "*fp32", "k_ptr": "*fp32", "v_ptr": "*fp32", "kernel_ptr": "*fp32",
                "bias_ptr": "*fp32", "mask_ptr": mask_pointer, "output_ptr": "*fp32", "scores_ptr": "*fp32",
                "indices_ptr": "*i64", "weights_ptr": "*fp32", "n": "i32", "m": "i32", "d": "i32",
                "c": "i32", "k": "i32", "mask_slice_stride": "i32", "root": "fp32", "rho": "i32",
                "temperature": "fp32", "index_order": "i32", "has_bias": "i32", "dtype_code": "i32"},
               {**constexprs, "CHANNELS": module.CHANNELS})
    slots = select.MIN_SLOTS
    while slots <= select.slots_for(select.MAX_SLOTS):
        yield (f"attention softmax scores gradient K<={slots}", module._softmax_scores_gradient_kernel,
               {"grad_output_ptr": "*fp32", "values_ptr": "*fp32", "kernel_ptr": "*fp32", "indices_ptr": "*i64",
                "weights_ptr": "*fp32", "grad_scores_ptr": "*fp32", "rows_total": "i32", "n": "i32", "m": "i32",
                "c": "i32", "k": "i32", "temperature": "fp32", "dtype_code": "i32"},
               {"ROWS": select.ROWS, "SLOTS": slots, "CHANNELS": module.CHANNELS})
        slots *= 2


def attention_backward_specialisations(module, select):
    """knn_attention's two-kernel backward: the row kernel for each dot-product similarity at every
    width, and the column kernel (float32 inputs: the launcher converts half precision)."""
    for similarity, scaled in module.SIMILARITY_SCALED.items():
        slots = select.MIN_SLOTS
        while slots <= select.slots_for(select.MAX_SLOTS):
            yield (f"attention backward rows {similarity} K<={slots}", module._rows_kernel,
                   {"grad_output_ptr": "*fp32", "values_ptr": "*fp32", "kernel_ptr": "*fp32", "indices_ptr": "*i64",
                    "weights_ptr": "*fp32", "scores_ptr": "*fp32", "keys_ptr": "*fp32", "live_ptr": "*fp32",
                    "grad_queries_ptr": "*fp32", "partial_ptr": "*fp32", "rows_total": "i32", "n": "i32",
                    "m": "i32", "c": "i32", "d": "i32", "k": "i32", "temperature": "fp32", "root": "fp32",
                    "dtype_code": "i32"},
                   {"SCALED": scaled, "ROWS": select.ROWS, "SLOTS": slots, "CHANNELS": module.attention.CHANNELS})
            slots *= 2
    # The rows busiest first (row_order_ptr) since the column kernel's balance; a report of an
    # earlier revision (triton_cost_report.py --revision) compiles its kernel without it.
    row_order = {"row_order_ptr": "*i64"} if hasattr(module, "busiest_first") else {}
    yield ("attention backward columns", module._columns_kernel,
           {"grad_output_ptr": "*fp32", "queries_ptr": "*fp32", "weights_ptr": "*fp32", "kernel_ptr": "*fp32",
            "live_ptr": "*fp32", "order_ptr": "*i64", "run_start_ptr": "*i64", **row_order,
            "grad_values_ptr": "*fp32", "grad_keys_ptr": "*fp32", "rows_total": "i32", "c": "i32", "d": "i32",
            "k": "i32", "value_parts": "i32"},
           {"ROWS": module.COLUMN_ROWS, "WIDTH": module.COLUMN_WIDTH})


def specialisations(module):
    """(kernel name, kernel, signature, constexprs) of every launch the package makes."""
    blocks = {"ROWS": module.ROWS, "CHANNELS": module.CHANNELS, "ACC": tl.float32}
    for dtype, pointer in POINTER.items():
        sizes = {"rows_total": "i32", "n": "i32", "m": "i32", "c": "i32", "k": "i32"}
        for has_bias in (False, True):
            yield (f"forward {dtype}{' bias' if has_bias else ''}", module._forward_kernel,
                   {"values_ptr": pointer, "weights_ptr": pointer, "indices_ptr": "*i64", "kernel_ptr": pointer,
                    "bias_ptr": pointer, "output_ptr": pointer, **sizes},
                   {"HAS_BIAS": has_bias, **blocks})
        yield (f"d weights {dtype}", module._weights_gradient_kernel,
               {"grad_output_ptr": pointer, "values_ptr": pointer, "indices_ptr": "*i64", "kernel_ptr": pointer,
                "grad_weights_ptr": pointer, **sizes}, blocks)
        yield (f"d kernel {dtype}", module._kernel_gradient_kernel,
               {"grad_output_ptr": pointer, "values_ptr": pointer, "weights_ptr": pointer, "indices_ptr": "*i64",
                "partial_ptr": "*fp32", **sizes, "rows_per_chunk": "i32"}, blocks)
        yield (f"d values {dtype}", module._values_gradient_kernel,
               {"grad_output_ptr": pointer, "weights_ptr": pointer, "kernel_ptr": pointer, "order_ptr": "*i64",
                "run_start_ptr": "*i64", "grad_values_ptr": pointer, "c": "i32", "k": "i32"},
               {"CHANNELS": module.CHANNELS, "ACC": tl.float32})
        standard_sizes = {"rows_total": "i32", "n": "i32", "m": "i32", "c": "i32", "c_out": "i32", "k": "i32"}
        for has_bias in (False, True):
            yield (f"standard forward {dtype}{' bias' if has_bias else ''}", module._standard_forward_kernel,
                   {"values_ptr": pointer, "weights_ptr": pointer, "indices_ptr": "*i64", "kernel_ptr": pointer,
                    "bias_ptr": pointer, "output_ptr": pointer, **standard_sizes},
                   {"HAS_BIAS": has_bias, **blocks})
        yield (f"standard d weights {dtype}", module._standard_weights_gradient_kernel,
               {"grad_output_ptr": pointer, "values_ptr": pointer, "indices_ptr": "*i64", "kernel_ptr": pointer,
                "grad_weights_ptr": pointer, **standard_sizes}, blocks)
        yield (f"standard d kernel {dtype}", module._standard_kernel_gradient_kernel,
               {"grad_output_ptr": pointer, "values_ptr": pointer, "weights_ptr": pointer, "indices_ptr": "*i64",
                "partial_ptr": "*fp32", **standard_sizes, "rows_per_chunk": "i32"}, blocks)
        yield (f"standard d values {dtype}", module._standard_values_gradient_kernel,
               {"grad_output_ptr": pointer, "weights_ptr": pointer, "kernel_ptr": pointer, "order_ptr": "*i64",
                "run_start_ptr": "*i64", "grad_values_ptr": pointer, "c": "i32", "c_out": "i32", "k": "i32"},
               {"CHANNELS": module.CHANNELS, "ACC": tl.float32})


def pair_gradient_specialisations(module):
    """knn_select's backward for cosine and the distances: each kernel for each of the four
    similarities, on float32 inputs (pair_gradients.select_backward converts half precision)."""
    common = {"ACC": tl.float32, "FEATURES": module.FEATURES}
    for name, code in module.SIMILARITY_CODES.items():
        yield (f"select backward coefficients {name}", module._pair_coefficients_kernel,
               {"q_ptr": "*fp32", "k_ptr": "*fp32", "indices_ptr": "*i64", "live_ptr": "*fp32",
                "coefficients_ptr": "*fp32", "arg_ptr": "*i32", "rows_total": "i32", "n": "i32", "m": "i32",
                "d": "i32", "k": "i32", "eps": "fp32"},
               {"SIMILARITY": code, "ROWS": module.ROWS, **common})
        yield (f"select backward d queries {name}", module._query_gradient_kernel,
               {"q_ptr": "*fp32", "k_ptr": "*fp32", "indices_ptr": "*i64", "coefficients_ptr": "*fp32",
                "arg_ptr": "*i32", "grad_q_ptr": "*fp32", "rows_total": "i32", "n": "i32", "m": "i32", "d": "i32",
                "k": "i32"},
               {"SIMILARITY": code, "ROWS": module.ROWS, **common})
        yield (f"select backward d keys {name}", module._key_gradient_kernel,
               {"q_ptr": "*fp32", "k_ptr": "*fp32", "coefficients_ptr": "*fp32", "arg_ptr": "*i32",
                "order_ptr": "*i64", "run_start_ptr": "*i64", "grad_k_ptr": "*fp32", "d": "i32", "k": "i32"},
               {"SIMILARITY": code, **common})


def ptxas_usage(ptx, gpu_name):
    """(registers, spill bytes) from `ptxas -v`."""
    ptxas = pathlib.Path(triton.__file__).parent / "backends/nvidia/bin/ptxas"
    with tempfile.TemporaryDirectory() as folder:
        source = pathlib.Path(folder) / "kernel.ptx"
        source.write_text(ptx)
        result = subprocess.run([str(ptxas), "-v", f"--gpu-name={gpu_name}", str(source), "-o",
                                 str(pathlib.Path(folder) / "kernel.cubin")], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"ptxas failed:\n{result.stderr}")
    registers = int(re.search(r"Used (\d+) registers", result.stderr).group(1))
    spills = sum(int(b) for b in re.findall(r"(\d+) bytes spill (?:stores|loads)", result.stderr))
    return registers, spills


def compile_for(kernel, signature, constexprs, launch_options, arch):
    """The kernel compiled for sm_<arch> (90 is sm_90a) with exactly this signature: every
    non-constexpr argument a kernel parameter, no value specialisation (what an ahead-of-time
    launcher relies on; scripts/triton_aot.py)."""
    target = GPUTarget("cuda", arch, 32)
    options = triton.compiler.make_backend(target).parse_options(dict(launch_options))
    full_signature = {**signature, **{key: "constexpr" for key in constexprs}}
    return triton.compile(triton.compiler.ASTSource(fn=kernel, constexprs=constexprs, signature=full_signature),
                          target=target, options=options.__dict__)


def all_specialisations():
    """(name, kernel, signature, constexprs, launch options) of every kernel the package and the
    C++ library launch (scripts/triton_aot.py embeds the same list)."""
    select = load_kernels("select")
    every = [(*spec, DEFAULT_OPTIONS) for spec in specialisations(load_kernels("aggregate"))]
    every += [(*spec, select.COMPILE_OPTIONS) for spec in select_specialisations(select)]
    every += [(*spec, DEFAULT_OPTIONS) for spec in pair_gradient_specialisations(load_kernels("pair_gradients"))]
    every += [(*spec, select.COMPILE_OPTIONS if "gradient" not in spec[0] else DEFAULT_OPTIONS)
              for spec in attention_specialisations(load_kernels("attention"), select)]
    backward = load_kernels("attention_backward")
    every += [(*spec, backward.COMPILE_OPTIONS) for spec in attention_backward_specialisations(backward, select)]
    return every


def main():
    failures, rows = [], []
    only = sys.argv[1] if len(sys.argv) > 1 else ""  # a name prefix, to check some kernels while editing them
    for name, kernel, signature, constexprs, launch_options in all_specialisations():
        if not name.startswith(only):
            continue
        for arch, (gpu_name, shared_limit) in ARCHITECTURES.items():
            try:
                compiled = compile_for(kernel, signature, constexprs, launch_options, arch)
                registers, spills = ptxas_usage(compiled.asm["ptx"], gpu_name)
            except Exception as error:  # report every kernel, then fail
                failures.append(f"{name} sm_{arch}: {type(error).__name__}: {error}")
                continue
            shared = compiled.metadata.shared
            rows.append(f"| {name} | sm_{arch} | {registers} | {spills} | {shared} |")
            if spills:
                failures.append(f"{name} sm_{arch}: {spills} bytes of register spills")
            if shared > shared_limit:
                failures.append(f"{name} sm_{arch}: {shared} bytes of shared memory, over {shared_limit}")
    print(f"| kernel | arch | registers | spill bytes | shared bytes |\n|---|---|---|---|---|\n" + "\n".join(rows))
    if failures:
        sys.exit("triton_compile_check failed:\n  " + "\n  ".join(failures))


if __name__ == "__main__":
    main()
