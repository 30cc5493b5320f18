"""Every specialisation of convnn's Triton kernels that a launch may ask for, by key: the one list
that the ahead-of-time build (scripts/triton_aot.py), the compile check
(scripts/triton_compile_check.py) and the Python package's launcher (register.py) read, so that a
key names the same kernel, signature and constexprs on both routes (issue 38 §4). The C++
launchers (src/ops/cuda/triton/*_launches.cpp) build the keys and the arguments.

Each entry is (key, kernel, signature, constexprs, launch options). The functions take the kernel
modules as arguments, so that the compile check can list the kernels of another revision
(scripts/triton_cost_report.py --revision). A constexpr may depend on the architecture the kernel is
compiled for (ByArchitecture): the builds take it per architecture (for_architecture).
"""
import functools

import triton.language as tl

# The outputs that the select and fused attention kernels write in the op's dtype through a pointer
# compiled as float32 (select.store_as, by their runtime dtype_code): a launch passes tensors of
# that dtype there (register.py checks every other pointer against its compiled type).
OUTPUTS_IN_THE_OPS_DTYPE = {"_select_kernel": ("scores_ptr",), "_bounded_select_kernel": ("scores_ptr",),
                            "_rerun_kernel": ("scores_ptr",),
                            "_attention_kernel": ("output_ptr", "scores_ptr", "weights_ptr"),
                            "_rho_aggregate_kernel": ("output_ptr", "weights_ptr")}

# aggregate.py's and pair_gradients.py's kernels launch with Triton's defaults; select.py names its own.
DEFAULT_OPTIONS = {"num_warps": 4}
POINTER = {"float32": "*fp32", "bfloat16": "*bf16", "float16": "*fp16"}


class ByArchitecture:
    """A constexpr whose value depends on the architecture a kernel is compiled for: value(arch), arch
    as in sm_<arch> (90 for an H100)."""

    def __init__(self, value):
        self.value = value

    def __repr__(self):
        return f"ByArchitecture({self.value!r})"


def for_architecture(constexprs, arch):
    """The constexprs of a kernel compiled for sm_<arch>: ByArchitecture values taken at arch (the
    compile check, the ahead-of-time build and register.py call this, each with its own arch)."""
    return {key: value.value(arch) if isinstance(value, ByArchitecture) else value
            for key, value in constexprs.items()}


def dtype_codes(kernel):
    """The kernel's runtime dtype code, where it takes one: the select and fused attention kernels'
    output pointers are compiled as float32 and write half precision through pointers of its type
    (select.store_as). Kernels compiled per dtype take none (their pointers' type is the dtype), nor
    did the select kernel of an earlier revision (scripts/triton_cost_report.py --revision)."""
    return {"dtype_code": "i32"} if "dtype_code" in kernel.arg_names else {}


def mask_slices(kernel):
    """Where the kernel finds a query slice's mask: the mask slices' stride, then how many query slices
    each serves (select.mask_slice_start; not in the kernels of an earlier revision, which read a
    mask slice per query slice)."""
    return {"mask_slice_stride": "i32",
            **({"slices_per_mask_slice": "i32"} if "slices_per_mask_slice" in kernel.arg_names else {})}


def row_layouts(kernel, *tensors):
    """The strides a kernel takes for each of `tensors` (their rows read in place: the C++ RowLayout,
    row_chunks.slice_starts), after the heads of the call; none for a kernel of an earlier revision
    that takes no strides (scripts/triton_cost_report.py --revision)."""
    if "heads" not in kernel.arg_names:
        return {}
    strides = {f"{tensor}_{stride}_stride": "i32" for tensor in tensors for stride in ("batch", "head", "row")}
    return {"heads": "i32", **strides}


def input_pointers(select):
    """(key suffix, pointer type) of each dtype the running-top-K kernels are compiled to read
    (select.INPUT_DTYPES: the float32 kernels' keys name none; the launchers convert any other dtype
    to float32). A report of an earlier revision without the list gets its float32 kernels."""
    dtypes = getattr(select, "INPUT_DTYPES", ("float32",))
    return [("" if dtype == "float32" else f" {dtype} inputs", POINTER[dtype]) for dtype in dtypes]


def top_k_variants(select):
    """(key suffix, input pointer type, mask pointer type, constexprs) of every kernel built on the
    running top-K of select.py: every input dtype it reads, similarity and width (8 to 64 slots) with
    every mask kind (without a mask, the pointer the launcher passes for the unread mask is the
    queries')."""
    for dtype_suffix, pointer in input_pointers(select):
        masks = {select.NO_MASK: ("no mask", pointer), select.BOOL_MASK: ("bool mask", "*i1"),
                 select.ADDITIVE_MASK: ("additive mask", "*fp32")}
        for name, code in select.SIMILARITY_CODES.items():
            for mask, (mask_name, mask_pointer) in masks.items():
                slots = select.MIN_SLOTS
                while slots <= select.slots_for(select.MAX_SLOTS):
                    blocks = (select.design(slots, mask)[0] if hasattr(select, "design")
                              else {"ROWS": select.ROWS, "CANDIDATES": select.candidates_for(slots, mask)})
                    yield (f"{name} K<={slots} {mask_name}{dtype_suffix}", pointer, mask_pointer,
                           {"SIMILARITY": code, "MASK": mask, **blocks, "SLOTS": slots,
                            "FEATURES": select.features_for(64)})
                    slots *= 2


def select_specialisations(module):
    """knn_select: every kernel a call can launch (queries and keys of an input dtype, the scores
    written in the op's dtype; the launcher puts the slots in index order after it)."""
    for suffix, pointer, mask_pointer, constexprs in top_k_variants(module):
        yield (f"select {suffix}", module._select_kernel,
               {"q_ptr": pointer, "k_ptr": pointer, "mask_ptr": mask_pointer, "scores_ptr": "*fp32",
                "indices_ptr": "*i64", "n": "i32", "m": "i32", "d": "i32", "k": "i32",
                **mask_slices(module._select_kernel), "similarity_constant": "fp32",
                **dtype_codes(module._select_kernel),
                **row_layouts(module._select_kernel, "q", "k")},
               constexprs)


def bounded_select_specialisations(module, select):
    """knn_select on tensor cores (bounded_select.py, issue 41): the keys' norms per input dtype, a bool
    mask's words; for
    each similarity it serves (module.SIMILARITIES), each width, mask kind and input dtype the tensor-core kernel serves
    (module.compile_options), that kernel and its rerun of the rows it leaves (the select kernel's
    constexprs and launch options)."""
    for dtype_suffix, pointer in input_pointers(select):
        yield (f"key norms{dtype_suffix}", module._key_norms_kernel,
               {"k_ptr": pointer, "norms_ptr": "*fp32", "m": "i32", "d": "i32", "cosine_eps": "fp32",
                **row_layouts(module._key_norms_kernel, "k")},
               {"BLOCK": module.KEY_NORM_ROWS, "FEATURES": module.FEATURES,
                **({"CANDIDATES": module.CANDIDATES} if hasattr(module, "NORM_SECTIONS") else {})}, {"num_warps": 4})
    # (hasattr: the static cost report lists these for the kernels of earlier revisions too.)
    words_kernel = hasattr(module, "_mask_bits_kernel")
    if words_kernel:
        wholes = hasattr(module, "_tiles_whole")  # (not in the kernels of an earlier revision)
        yield ("mask bits", module._mask_bits_kernel,
               {"mask_ptr": "*i1", "bits_ptr": "*i64", **({"wholes_ptr": "*i32"} if wholes else {}), "rows": "i32",
                **({"n": "i32"} if wholes else {}), "m": "i32", "words": "i32"},
               {"ROWS": module.MASK_BITS_ROWS, "CANDIDATES": module.CANDIDATES,
                **({"BLOCK_ROWS": module.ROWS} if wholes else {})}, {"num_warps": 4})
    for suffix, pointer, mask_pointer, constexprs in top_k_variants(select):
        slots, dtype = constexprs["SLOTS"], next((d for d in select.INPUT_DTYPES if f"{d} inputs" in suffix), "float32")
        options = module.compile_options(slots, constexprs["MASK"], dtype)
        if constexprs["SIMILARITY"] not in module.SIMILARITIES or options is None:
            continue
        outputs = {"scores_ptr": "*fp32", "indices_ptr": "*i64", "redo_ptr": "*i32"}
        operands = {"q_ptr": pointer, "k_ptr": pointer, "mask_ptr": mask_pointer, **outputs}
        # A bool mask as _mask_bits_kernel's words; the rerun reads the mask itself.
        words = {"mask_ptr": "*i64"} if constexprs["MASK"] == select.BOOL_MASK and words_kernel else {}
        # The tensor-core kernel's: after the mask, a bool mask's blocks' whole words (bounded_select.
        # _tiles_whole; not in the kernels of an earlier revision).
        bounded_operands = {**operands, **words}
        if hasattr(module, "_tiles_whole"):
            bounded_operands = {"q_ptr": pointer, "k_ptr": pointer, "mask_ptr": bounded_operands["mask_ptr"],
                                "wholes_ptr": "*i32", **outputs}
        sizes = {"n": "i32", "m": "i32", "d": "i32", "k": "i32", **mask_slices(module._rerun_kernel),
                 "similarity_constant": "fp32"}
        strides = {"dtype_code": "i32", **row_layouts(module._rerun_kernel, "q", "k")}
        seeded = hasattr(module, "_seed_thresholds_kernel")  # (not in the kernels of an earlier revision)
        if seeded and slots == select.MIN_SLOTS and module._tile_bound(constexprs["SIMILARITY"], constexprs["MASK"]):
            # The rows' seeds: one kernel for every width (K is an argument).
            yield (f"bounded seeds {suffix.replace(f'K<={slots} ', '')}", module._seed_thresholds_kernel,
                   {"q_ptr": pointer, "k_ptr": pointer, "mask_ptr": mask_pointer, **words,
                    **({"wholes_ptr": "*i32"} if "wholes_ptr" in module._seed_thresholds_kernel.arg_names else {}),
                    "norms_ptr": "*fp32", "seeds_ptr": "*fp32",
                    "n": "i32", "m": "i32", "d": "i32", "k": "i32", **mask_slices(module._seed_thresholds_kernel),
                    "similarity_constant": "fp32", "bound_scale": "fp32",
                    **row_layouts(module._seed_thresholds_kernel, "q", "k")},
                   {"SIMILARITY": constexprs["SIMILARITY"], "MASK": constexprs["MASK"], "ROWS": module.ROWS,
                    "CANDIDATES": module.CANDIDATES, "FEATURES": module.FEATURES,
                    "PRECISION": module.FLOAT32_PRECISION, "PRODUCT_FEATURES": module.SEED_PRODUCT_FEATURES,
                    "INJECT": 0},
                   {"num_warps": module.seed_warps(dtype) if hasattr(module, "seed_warps") else module.SEED_WARPS})
        for name, part in select_parts(module, constexprs["MASK"], select):
            yield (f"bounded select {name}{suffix}", module._bounded_select_kernel,
                   {**bounded_operands, "rescored_ptr": "*i32", "norms_ptr": "*fp32",
                    **({"seeds_ptr": "*fp32"} if seeded else {}), "queue_ptr": "*i32", "slices": "i32", **sizes,
                    "bound_scale": "fp32", **strides},
                   {"SIMILARITY": constexprs["SIMILARITY"], "MASK": constexprs["MASK"], "ROWS": module.ROWS,
                    "CANDIDATES": module.CANDIDATES, "SLOTS": slots, "QUEUE": module.QUEUE, "FLUSH": module.FLUSH,
                    "FEATURES": module.FEATURES, "PRECISION": module.FLOAT32_PRECISION, "INJECT": 0, "STATS": False,
                    **step_tiles(module, constexprs["SIMILARITY"], constexprs["MASK"], dtype), **part},
                   options)
        yield (f"rerun select {suffix}", module._rerun_kernel, {**operands, **sizes, **strides}, constexprs,
               select.design(slots, constexprs["MASK"])[1])


def select_parts(module, mask_kind, select):
    """(the name's prefix, the PART constexpr) of each launch of the tensor-core select: a bool mask's
    whole tiles ("whole tiles ", part 1), then its others (part 2); one launch otherwise (none in the
    kernels of an earlier revision, which had no parts)."""
    if not hasattr(module, "_tiles_whole"):
        return [("", {})]
    if mask_kind != select.BOOL_MASK:
        return [("", {"PART": 0})]
    return [("whole tiles ", {"PART": 1}), ("", {"PART": 2})]


def step_tiles(module, similarity, mask_kind, dtype):
    """The tensor-core select's STEP_TILES (bounded_select.tiles_per_step), by architecture; none in
    the kernels of an earlier revision (scripts/triton_cost_report.py --revision)."""
    if not hasattr(module, "tiles_per_step"):
        return {}
    return {"STEP_TILES": ByArchitecture(functools.partial(module.tiles_per_step, similarity, mask_kind, dtype))}


def attention_specialisations(module, select):
    """knn_attention's fused forward: the same variants as the select kernel (rho, slot order, bias
    and the op's dtype are runtime arguments); the composed forward's rho and aggregation; its
    backward's softmax scores gradient at every width."""
    for suffix, pointer, mask_pointer, constexprs in top_k_variants(select):
        yield (f"attention {suffix}", module._attention_kernel,
               {"q_ptr": pointer, "k_ptr": pointer, "v_ptr": pointer, "kernel_ptr": pointer,
                "bias_ptr": pointer, "mask_ptr": mask_pointer, "output_ptr": "*fp32", "scores_ptr": "*fp32",
                "indices_ptr": "*i64", "weights_ptr": "*fp32", "n": "i32", "m": "i32", "d": "i32",
                "c": "i32", "k": "i32", **mask_slices(module._attention_kernel), "similarity_constant": "fp32",
                "rho": "i32",
                "temperature": "fp32", "index_order": "i32", "has_bias": "i32", "dtype_code": "i32",
                **row_layouts(module._attention_kernel, "q", "k", "v", "out")},
               {**constexprs, "CHANNELS": module.forward_channels(constexprs["SLOTS"])
                if hasattr(module, "forward_channels") else module.CHANNELS})
    if hasattr(module, "_rho_aggregate_kernel"):  # (not in the kernels of an earlier revision)
        yield from rho_aggregate_specialisations(module, select)
    for dtype, pointer in backward_pointers(module):
        slots = select.MIN_SLOTS
        while slots <= select.slots_for(select.MAX_SLOTS):
            yield (f"attention softmax scores gradient K<={slots}{dtype}", module._softmax_scores_gradient_kernel,
                   {"grad_output_ptr": pointer, "values_ptr": pointer, "kernel_ptr": pointer, "indices_ptr": "*i64",
                    "weights_ptr": pointer, "grad_scores_ptr": pointer, "rows_total": "i32", "n": "i32", "m": "i32",
                    "c": "i32", "k": "i32", "temperature": "fp32",
                    **dtype_codes(module._softmax_scores_gradient_kernel),
                    **row_layouts(module._softmax_scores_gradient_kernel, "dy", "v")},
                   {"ROWS": select.ROWS, "SLOTS": slots, "CHANNELS": module.CHANNELS})
            slots *= 2


def rho_aggregate_specialisations(module, select):
    """The composed forward's rho and aggregation in one kernel (attention._rho_aggregate_kernel), at
    every width, per input dtype of the running-top-K kernels (the scores, values, kernel and bias in
    it; the weights and output written in the op's dtype; rho, bias and the op's dtype at run time)."""
    for dtype_suffix, pointer in input_pointers(select):
        slots = select.MIN_SLOTS
        while slots <= select.slots_for(select.MAX_SLOTS):
            yield (f"attention rho aggregate K<={slots}{dtype_suffix}", module._rho_aggregate_kernel,
                   {"scores_ptr": pointer, "indices_ptr": "*i64", "v_ptr": pointer, "kernel_ptr": pointer,
                    "bias_ptr": pointer, "output_ptr": "*fp32", "weights_ptr": "*fp32", "n": "i32", "m": "i32",
                    "c": "i32", "k": "i32", "rho": "i32", "temperature": "fp32", "has_bias": "i32",
                    "dtype_code": "i32"},
                   {"ROWS": module.RHO_AGGREGATE_ROWS, "SLOTS": slots, "CHANNELS": module.THREAD_CHANNELS})
            slots *= 2


def attention_options(module, select, spec):
    """The launch options of one of attention_specialisations' kernels."""
    kernel = spec[1]
    if kernel is getattr(module, "_rho_aggregate_kernel", None):
        return module.rho_aggregate_options(spec[3]["SLOTS"])
    if kernel is module._softmax_scores_gradient_kernel:
        return getattr(module, "SCORES_GRADIENT_OPTIONS", DEFAULT_OPTIONS)
    return top_k_options(select, spec)


def backward_pointers(attention):
    """(key suffix, pointer type) of each dtype the backward's kernels are compiled for: they read
    their inputs and write their gradients in the op's dtype (attention.BACKWARD_IN_OPS_DTYPE). A
    report of an earlier revision (scripts/triton_cost_report.py --revision), whose kernels took
    float32 whatever the dtype and whose keys named none, gets its one float32 kernel per key."""
    if getattr(attention, "BACKWARD_IN_OPS_DTYPE", False):
        return [(f" {dtype}", pointer) for dtype, pointer in POINTER.items()]
    return [("", POINTER["float32"])]


def attention_backward_specialisations(module, select):
    """knn_attention's two-kernel backward, per dtype (its inputs and gradients in the op's dtype; the
    score gradient g, live_ptr, and the kernel's partials float32): the row kernel for each
    dot-product similarity at every width, and the column kernel."""
    for dtype, pointer in backward_pointers(module.attention):
        for similarity, scaled in module.SIMILARITY_SCALED.items():
            slots = select.MIN_SLOTS
            while slots <= select.slots_for(select.MAX_SLOTS):
                yield (f"attention backward rows {similarity} K<={slots}{dtype}", module._rows_kernel,
                       {"grad_output_ptr": pointer, "values_ptr": pointer, "kernel_ptr": pointer, "indices_ptr": "*i64",
                        "weights_ptr": pointer, "scores_ptr": pointer, "keys_ptr": pointer, "live_ptr": "*fp32",
                        "grad_queries_ptr": pointer, "partial_ptr": "*fp32", "rows_total": "i32", "n": "i32",
                        "m": "i32", "c": "i32", "d": "i32", "k": "i32", "temperature": "fp32", "root": "fp32",
                        **dtype_codes(module._rows_kernel), **row_layouts(module._rows_kernel, "dy", "k", "v", "dq")},
                       {"SCALED": scaled, "ROWS": getattr(module, "ROW_ROWS", select.ROWS), "SLOTS": slots,
                        "CHANNELS": getattr(module, "ROW_CHANNELS", module.attention.CHANNELS)})
                slots *= 2
        # The rows busiest first (row_order_ptr) since the column kernel's balance; a report of an
        # earlier revision (triton_cost_report.py --revision) compiles its kernel without it.
        row_order = {"row_order_ptr": "*i32"} if "row_order_ptr" in module._columns_kernel.arg_names else {}
        # (taps_ptr: the kernel transposed; an earlier revision's kernel_ptr, [C, K].)
        taps = "taps_ptr" if "taps_ptr" in module._columns_kernel.arg_names else "kernel_ptr"
        yield (f"attention backward columns{dtype}", module._columns_kernel,
               {"grad_output_ptr": pointer, "queries_ptr": pointer, "weights_ptr": pointer, taps: pointer,
                "live_ptr": "*fp32", "order_ptr": "*i32", "run_start_ptr": "*i32", **row_order,
                "grad_values_ptr": pointer, "grad_keys_ptr": pointer, "rows_total": "i32", "c": "i32", "d": "i32",
                "k": "i32", "value_parts": "i32",
                **({"n": "i32", "m": "i32"} if "heads" in module._columns_kernel.arg_names else {}),
                **row_layouts(module._columns_kernel, "dy", "q", "dv", "dk")},
               {"ROWS": module.COLUMN_ROWS, "WIDTH": module.COLUMN_WIDTH})


def aggregate_specialisations(module):
    """The aggregation: (key, kernel, signature, constexprs) of every launch, per dtype."""
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
               {"grad_output_ptr": pointer, "weights_ptr": pointer, "kernel_ptr": pointer, "order_ptr": "*i32",
                "run_start_ptr": "*i32", "grad_values_ptr": pointer, "c": "i32", "k": "i32"},
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
               {"grad_output_ptr": pointer, "weights_ptr": pointer, "kernel_ptr": pointer, "order_ptr": "*i32",
                "run_start_ptr": "*i32", "grad_values_ptr": pointer, "c": "i32", "c_out": "i32", "k": "i32"},
               {"CHANNELS": module.CHANNELS, "ACC": tl.float32})


def pair_gradient_specialisations(module):
    """knn_select's backward for cosine and the distances: each kernel for each of the four
    similarities, on float32 inputs (the launcher converts half precision)."""
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
                "order_ptr": "*i32", "run_start_ptr": "*i32", "grad_k_ptr": "*fp32", "d": "i32", "k": "i32"},
               {"SIMILARITY": code, **common})


def top_k_options(select, spec):
    """The launch options of a kernel built on the running top-K: its width's (select.py), or one set
    for every width in a revision before the per-thread set (scripts/triton_cost_report.py --revision)."""
    if hasattr(select, "design"):
        return select.design(spec[3]["SLOTS"], spec[3]["MASK"])[1]
    return select.COMPILE_OPTIONS


def all_specialisations(modules=None):
    """(key, kernel, signature, constexprs, launch options) of every kernel the C++ launchers ask
    for. `modules`: {name: module} of aggregate, select, pair_gradients, attention, attention_backward
    and, from issue 41 on, bounded_select (default: this package's)."""
    if modules is None:
        from . import aggregate, attention, attention_backward, bounded_select, pair_gradients, select
        modules = {"aggregate": aggregate, "select": select, "pair_gradients": pair_gradients,
                   "attention": attention, "attention_backward": attention_backward,
                   "bounded_select": bounded_select}
    select, backward = modules["select"], modules["attention_backward"]
    every = [(*spec, DEFAULT_OPTIONS) for spec in aggregate_specialisations(modules["aggregate"])]
    every += [(*spec, top_k_options(select, spec)) for spec in select_specialisations(select)]
    # Not in a revision before issue 41, nor in one of its first design (the held set, 2026-11-29, whose
    # kernel took other arguments): scripts/triton_cost_report.py --revision reports those without it.
    if hasattr(modules.get("bounded_select"), "_key_norms_kernel"):
        every += list(bounded_select_specialisations(modules["bounded_select"], select))
    every += [(*spec, DEFAULT_OPTIONS) for spec in pair_gradient_specialisations(modules["pair_gradients"])]
    every += [(*spec, attention_options(modules["attention"], select, spec))
              for spec in attention_specialisations(modules["attention"], select)]
    every += [(*spec, backward.compile_options(spec[3].get("SLOTS")) if hasattr(backward, "compile_options")
               else backward.COMPILE_OPTIONS) for spec in attention_backward_specialisations(backward, select)]
    return every
