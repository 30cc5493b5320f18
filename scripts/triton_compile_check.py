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
NUM_WARPS = 4  # aggregate.py's and pair_gradients.py's kernels launch with Triton's default; select.py names its own
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


def select_specialisations(module):
    """knn_select: each similarity at each width of the running top-K (2 to 64 slots) and each
    tile width of the dot products (16 to 64 features, and the loop), with an additive mask and
    index order (the most code); the bool mask, no mask and score order at the widest; the
    half-precision inputs at the widest, for a dot product and a distance. The other combinations
    differ from these in a load's type or a branch taken, not in what is live."""
    def signature(pointer, mask_pointer):
        return {"q_ptr": pointer, "k_ptr": pointer, "mask_ptr": mask_pointer, "scores_ptr": pointer,
                "indices_ptr": "*i64", "n": "i32", "m": "i32", "d": "i32", "k": "i32", "mask_slice_stride": "i32",
                "root": "fp32"}

    def constexprs(similarity, mask, index_order, slots, features):
        return {"SIMILARITY": similarity, "MASK": mask, "INDEX_ORDER": index_order, "ROWS": module.ROWS,
                "CANDIDATES": module.CANDIDATES, "SLOTS": slots, "FEATURES": features}

    widest = module.slots_for(module.MAX_SLOTS)
    for name, code in module.SIMILARITY_CODES.items():
        for features in sorted({module.features_for(d) for d in (1, 64)}):
            slots = 2
            while slots <= widest:
                yield (f"select {name} K<={slots} {features}-feature chunks float32", module._select_kernel,
                       signature("*fp32", "*fp32"), constexprs(code, module.ADDITIVE_MASK, True, slots, features))
                slots *= 2
    for mask, mask_name, mask_pointer in ((module.NO_MASK, "no mask", "*fp32"), (module.BOOL_MASK, "bool mask", "*i1")):
        yield (f"select dot K<={widest} float32 {mask_name}, score order", module._select_kernel,
               signature("*fp32", mask_pointer), constexprs(0, mask, False, widest, module.features_for(64)))
    for dtype in ("bfloat16", "float16"):
        for name in ("dot", "gaussian"):
            yield (f"select {name} K<={widest} {dtype}", module._select_kernel, signature(POINTER[dtype], "*fp32"),
                   constexprs(module.SIMILARITY_CODES[name], module.ADDITIVE_MASK, True, widest, module.features_for(64)))


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
    similarities in float32, and in bfloat16 and float16 for one dot-product form and one
    sign form."""
    accumulation = {"ACC": tl.float32, "FEATURES": module.FEATURES}
    for dtype, pointer in POINTER.items():
        names = module.SIMILARITY_CODES if dtype == "float32" else ("cosine", "chebyshev")
        for name in names:
            code = module.SIMILARITY_CODES[name]
            yield (f"select backward coefficients {name} {dtype}", module._pair_coefficients_kernel,
                   {"q_ptr": pointer, "k_ptr": pointer, "indices_ptr": "*i64", "live_ptr": "*fp32",
                    "coefficients_ptr": "*fp32", "arg_ptr": "*i32", "rows_total": "i32", "n": "i32", "m": "i32",
                    "d": "i32", "k": "i32", "eps": "fp32"},
                   {"SIMILARITY": code, "ROWS": module.ROWS, **accumulation})
            yield (f"select backward d queries {name} {dtype}", module._query_gradient_kernel,
                   {"q_ptr": pointer, "k_ptr": pointer, "indices_ptr": "*i64", "coefficients_ptr": "*fp32",
                    "arg_ptr": "*i32", "grad_q_ptr": pointer, "rows_total": "i32", "n": "i32", "m": "i32", "d": "i32",
                    "k": "i32"},
                   {"SIMILARITY": code, "ROWS": module.ROWS, **accumulation})
            yield (f"select backward d keys {name} {dtype}", module._key_gradient_kernel,
                   {"q_ptr": pointer, "k_ptr": pointer, "coefficients_ptr": "*fp32", "arg_ptr": "*i32",
                    "order_ptr": "*i64", "run_start_ptr": "*i64", "grad_k_ptr": pointer, "d": "i32", "k": "i32"},
                   {"SIMILARITY": code, **accumulation})


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


def compile_for(kernel, signature, constexprs, num_warps, arch):
    """The kernel compiled for sm_<arch> (90 is sm_90a) with exactly this signature: every
    non-constexpr argument a kernel parameter, no value specialisation (what an ahead-of-time
    launcher relies on; scripts/triton_aot.py)."""
    target = GPUTarget("cuda", arch, 32)
    options = triton.compiler.make_backend(target).parse_options({"num_warps": num_warps})
    full_signature = {**signature, **{key: "constexpr" for key in constexprs}}
    return triton.compile(triton.compiler.ASTSource(fn=kernel, constexprs=constexprs, signature=full_signature),
                          target=target, options=options.__dict__)


def main():
    module = load_kernels()
    failures, rows = [], []
    select = load_kernels("select")
    every = [(*spec, NUM_WARPS) for spec in specialisations(module)]
    every += [(*spec, select.NUM_WARPS) for spec in select_specialisations(select)]
    every += [(*spec, NUM_WARPS) for spec in pair_gradient_specialisations(load_kernels("pair_gradients"))]
    for name, kernel, signature, constexprs, num_warps in every:
        for arch, (gpu_name, shared_limit) in ARCHITECTURES.items():
            try:
                compiled = compile_for(kernel, signature, constexprs, num_warps, arch)
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
