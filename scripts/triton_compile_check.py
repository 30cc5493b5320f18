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
from triton.backends.compiler import GPUTarget  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
ARCHITECTURES = {80: ("sm_80", 163 * 1024), 90: ("sm_90a", 227 * 1024)}  # name for ptxas, shared-memory limit


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


def load_file(path):
    """A Python file as a module of its own, by path."""
    spec = importlib.util.spec_from_file_location(path.stem + "_of_this_tree", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
    """(key, kernel, signature, constexprs, launch options) of every kernel the C++ launchers ask
    for: python/convnn/_triton/specialisations.py's list, of the kernels under REPO (another
    revision's for triton_cost_report.py --revision; that list is this tree's, which takes any
    revision's modules)."""
    table = load_file(pathlib.Path(__file__).resolve().parents[1] / "python/convnn/_triton/specialisations.py")
    names = ("aggregate", "select", "pair_gradients", "attention", "attention_backward")
    return table.all_specialisations({name: load_kernels(name) for name in names})


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
