"""Compiles every shipped specialisation of convnn's Triton kernels (python/convnn/_triton) for
sm_80 and sm_90 without a GPU, in parallel (one process per core), and fails on a compile error,
a register spill, a shared-memory overflow, or a tensor-core kernel without HMMA/HGMMA in its SASS
(bounded_select.py). Registers and the stack frame come from the cubin that
Triton's own ptxas run produced (the cuobjdump that ships inside the triton wheel), so a warm Triton
cache (the build's scripts/triton_aot.py fills it) makes this a few seconds; only a kernel with a
stack frame is put through `ptxas -v` again, to tell its spills from local arrays. Shared memory
comes from Triton's metadata. Prints a Markdown table (BENCHMARKS.md lists it).

    .venv/bin/python scripts/triton_compile_check.py
"""
import concurrent.futures
import functools
import importlib.util
import multiprocessing
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


def nvidia_tool(name):
    """A CUDA binary tool (ptxas, cuobjdump, nvdisasm) from the triton wheel: the version Triton
    compiles with, with no CUDA toolkit needed."""
    return pathlib.Path(triton.__file__).parent / "backends/nvidia/bin" / name


def cubin_usage(cubin):
    """(registers, stack-frame bytes) of the cubin's one kernel, from `cuobjdump -res-usage`."""
    with tempfile.TemporaryDirectory() as folder:
        path = pathlib.Path(folder) / "kernel.cubin"
        path.write_bytes(cubin)
        result = subprocess.run([str(nvidia_tool("cuobjdump")), "-res-usage", str(path)], capture_output=True,
                                text=True)
    usage = re.search(r"REG:(\d+) STACK:(\d+)", result.stdout)
    if result.returncode != 0 or usage is None:
        raise RuntimeError(f"cuobjdump -res-usage failed:\n{result.stdout}{result.stderr}")
    return int(usage.group(1)), int(usage.group(2))


def tensor_core_instructions(cubin):
    """How many tensor-core instructions the cubin's SASS holds (`cuobjdump -sass`): HMMA (sm_80's
    mma.sync, and sm_90's where Triton keeps it) or HGMMA (sm_90's warpgroup wgmma)."""
    with tempfile.TemporaryDirectory() as folder:
        path = pathlib.Path(folder) / "kernel.cubin"
        path.write_bytes(cubin)
        result = subprocess.run([str(nvidia_tool("cuobjdump")), "-sass", str(path)], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"cuobjdump -sass failed:\n{result.stdout}{result.stderr}")
    return len(re.findall(r"\bHG?MMA\.", result.stdout))


# The kernels whose scores are tensor-core products (bounded_select.py, issue 41): the check fails
# where their SASS holds no HMMA or HGMMA (a dot that fell back to FMAs would be exact and slow, silently).
TENSOR_CORE_KERNELS = ("bounded select ",)


def ptxas_usage(ptx, gpu_name):
    """(registers, spill bytes) from `ptxas -v`."""
    ptxas = nvidia_tool("ptxas")
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
    constexprs = specialisations().for_architecture(constexprs, arch)
    full_signature = {**signature, **{key: "constexpr" for key in constexprs}}
    return triton.compile(triton.compiler.ASTSource(fn=kernel, constexprs=constexprs, signature=full_signature),
                          target=target, options=options.__dict__)


@functools.cache
def specialisations():
    """This tree's python/convnn/_triton/specialisations.py (its list, and its for_architecture)."""
    return load_file(pathlib.Path(__file__).resolve().parents[1] / "python/convnn/_triton/specialisations.py")


def all_specialisations():
    """(key, kernel, signature, constexprs, launch options) of every kernel the C++ launchers ask
    for: python/convnn/_triton/specialisations.py's list, of the kernels under REPO (another
    revision's for triton_cost_report.py --revision; that list is this tree's, which takes any
    revision's modules)."""
    table = specialisations()
    names = ("aggregate", "select", "pair_gradients", "attention", "attention_backward")
    modules = {name: load_kernels(name) for name in names}
    # The tensor-core select (issue 41): not in the kernels of an earlier revision.
    if (REPO / "python/convnn/_triton/bounded_select.py").exists():
        modules["bounded_select"] = load_kernels("bounded_select")
    return table.all_specialisations(modules)


def map_in_parallel(function, jobs):
    """[function(job) for job in jobs], one process per core (Triton compiles on one thread). Forked,
    so that the workers inherit the loaded kernel modules."""
    with concurrent.futures.ProcessPoolExecutor(max_workers=os.cpu_count() or 1,
                                                mp_context=multiprocessing.get_context("fork")) as pool:
        return list(pool.map(function, jobs))


def check_one(job):
    """(index, arch) -> (table row, failures) of that specialisation (in a worker process)."""
    index, arch = job
    name, kernel, signature, constexprs, launch_options = all_specialisations()[index]
    gpu_name, shared_limit = ARCHITECTURES[arch]
    try:
        compiled = compile_for(kernel, signature, constexprs, launch_options, arch)
        registers, stack = cubin_usage(compiled.asm["cubin"])
        spills = ptxas_usage(compiled.asm["ptx"], gpu_name)[1] if stack else 0  # no stack frame: no spills
    except Exception as error:  # report every kernel, then fail
        return None, [f"{name} sm_{arch}: {type(error).__name__}: {error}"]
    shared = compiled.metadata.shared
    failures = []
    if spills:
        failures.append(f"{name} sm_{arch}: {spills} bytes of register spills")
    if name.startswith(TENSOR_CORE_KERNELS) and tensor_core_instructions(compiled.asm["cubin"]) == 0:
        failures.append(f"{name} sm_{arch}: no HMMA or HGMMA in its SASS (its scores are meant for tensor cores)")
    if shared > shared_limit:
        failures.append(f"{name} sm_{arch}: {shared} bytes of shared memory, over {shared_limit}")
    return f"| {name} | sm_{arch} | {registers} | {spills} | {shared} |", failures


def main():
    only = sys.argv[1] if len(sys.argv) > 1 else ""  # a name prefix, to check some kernels while editing them
    jobs = [(index, arch) for index, (name, *_) in enumerate(all_specialisations()) if name.startswith(only)
            for arch in ARCHITECTURES]
    rows, failures = [], []
    for row, failed in map_in_parallel(check_one, jobs):
        rows += [row] if row else []
        failures += failed
    print(f"| kernel | arch | registers | spill bytes | shared bytes |\n|---|---|---|---|---|\n" + "\n".join(rows))
    if failures:
        sys.exit("triton_compile_check failed:\n  " + "\n  ".join(failures))


if __name__ == "__main__":
    main()
