"""The static cost report of the selection kernels and of knn_attention's backward (issue 38 §5):
what the running top-K of python/convnn/_triton/select.py and the two backward kernels of
attention_backward.py cost on an H100, estimated without a GPU from the code ptxas emits.

    .venv/bin/python scripts/triton_cost_report.py [--revision REV] [--json FILE]

For the knn_select kernel and the fused knn_attention forward (the same running top-K), scaled_dot
without a mask, at the paper's Table 1 shape (K = 8) and at 12 x 4096 (K = 8 and 9):
1. compiles the kernel for sm_90 (as scripts/triton_compile_check.py does) and disassembles the
   cubin with the nvdisasm that ships in Triton's wheel, with line information;
2. splits the candidate-tile loop into its parts, counted in SASS instructions per warp: the dot
   product per FEATURES features (the loop holding the FFMAs), the per-tile work every tile does,
   one selection round (the other loop inside the tile loop) and, where the kernel has one, the
   bitonic merge of a tile (the block of the tile loop that a branch skips and that holds the
   network of bitonic.py; the end's sort of the K slots is outside the loop); what D = 64 on
   16-byte aligned tensors skips is counted apart, not in the tile: the IEEE division by sqrt(D)
   that a power-of-two sqrt(D) saves, and the masked dot-product loop beside the vector-load one
   (select._dot_keys; the report assumes the aligned rows that PyTorch's allocator gives);
3. counts, on seeded random Gaussian features, how often each part runs: per block of query rows
   and per tile, the selection rounds and whether the tile is merged by the bitonic network (the
   kernel's own rule, read from its module: a set held a row per thread, select.held_per_thread,
   does the same work on every tile, no rounds; a kernel with ROUNDS and BITONIC_SLOTS merges by
   the network past ROUNDS entries, the design of 2026-11-27; a kernel without either runs K
   merge rounds on every tile that some row of the block enters, the design before issue 38);
4. estimates the kernel's time from the warp instructions it issues: every instruction at the
   H100 SXM's issue rate (132 SMs x 4 schedulers x 1 warp instruction per cycle x 1.755 GHz), no
   stall, no latency, no occupancy limit: a lower bound on the instruction-issue time, not a
   prediction; and beside it the DRAM bound of its compulsory bytes (inputs and outputs once, at
   3.35 TB/s). The larger of the two is the estimate's bound.

Then the same model for knn_attention's two-kernel backward (attention_backward.py; scaled_dot,
softmax, depthwise, C = D = 64): the row kernel's loop nests (channel blocks x slots, feature blocks
x slots) and the column kernel's two loops (one step per slot of the block's most-read key row,
from the inverse index of the top-K on seeded Gaussian features), each nest sized in SASS and
multiplied by its trip counts, with the straight-line code on the paths a program takes through
them (straight_line_run: not a body that aligned tensors skip, nor the column kernel's other part);
and its launches per backward, and the fused forward's in float32 and bfloat16 (the Triton launches
and the ATen ops the launchers call, conversions included, counted on CPU tensors with the kernels
recorded instead of run). The backward's two sorts (the
inverse index, the rows busiest first) are bounded apart by their DRAM traffic (a radix sort of 8-bit
digits: over the keys' bits alone with int32 positions where the revision has sorted_keys.h, else
ATen's sort of every bit of the key width read from the launch count with int64 positions) and
added to the op's forward + backward total. Then issue 41's training targets: knn_attention's forward+backward at
12 x 16384 and 12 x 65536 in bfloat16 with the select on tensor cores (no mask, or a causal bool
mask: the tiles it skips simulated with the kernel's rule; dot and scaled_dot with the seeds kernel
that starts their rows, its tile loop and K-th rounds counted per program), the composition's other
steps and the backward, against a lower bound of SDPA's flash attention (its products at the tensor cores' peak,
its exponentials at the MUFU rate): a ratio of two bounds. Last, the SASS per step of every kernel
that walks the inverse index.

With --revision REV the kernels come from that commit (git archive), so that one script reports
before and after a change. The instruction counts are exact for the compiled code; the round counts
are measured on random data (clustered or adversarial data runs more rounds; at most K per tile);
the time is an estimate with the assumptions above written beside it.
"""
import argparse
import functools
import inspect
import io
import json
import math
import os
import pathlib
import re
import subprocess
import sys
import tarfile
import tempfile

import torch

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
import triton_compile_check as check  # noqa: E402

# The H100 SXM (assumptions of the estimate; see the module's text).
SMS, SCHEDULERS, CLOCK_HZ, DRAM_BYTES_PER_S = 132, 4, 1.755e9, 3.35e12
# The value channels of a head (C = D = 64, the paper's), for the fused forward's aggregation and the
# two-kernel backward (attention_backward.py: softmax rho, scaled_dot, depthwise kernel).
CHANNELS = 64
SHAPES = {"Table 1 (G 384, N 197, D 64, K 8)": (384, 197, 64, 8),
          "12 x 4096 (G 12, N 4096, D 64, K 8)": (12, 4096, 64, 8),
          "12 x 4096 (G 12, N 4096, D 64, K 9)": (12, 4096, 64, 9)}
FAMILIES = ("select", "attention")  # the knn_select kernel, the fused knn_attention forward


# What the model reads of a revision besides its kernels: the C++ that decides the backward's sorts
# (backward_sorts_us) and the composed forward's passes (composition_bound_us), where the revision has it.
REVISION_SOURCES = ("src/ops/cuda/triton", "src/ops/composite/knn_attention_composed.cpp")


def sources_at(revision, folder):
    """python/convnn/_triton of `revision`, and REVISION_SOURCES where it has them, unpacked under
    `folder` (a repository root for check)."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", revision, "python/convnn/_triton"],
                             capture_output=True, check=True).stdout
    tarfile.open(fileobj=io.BytesIO(archive)).extractall(folder)
    for path in REVISION_SOURCES:
        found = subprocess.run(["git", "-C", str(REPO), "archive", revision, path], capture_output=True)
        if found.returncode == 0:
            tarfile.open(fileobj=io.BytesIO(found.stdout)).extractall(folder)
    return pathlib.Path(folder)


class Source(str):
    """An instruction's source file, and its line there (.line)."""

    def __new__(cls, path, line):
        source = super().__new__(cls, path)
        source.line = line
        return source


def sass(kernel_name):
    """(instructions [(text, source file: a Source)], labels {name: position}) of the kernel for sm_90."""
    for name, kernel, signature, constexprs, options in check.all_specialisations():
        if name == kernel_name:
            compiled = check.compile_for(kernel, signature, constexprs, options, 90)
            break
    else:
        raise SystemExit(f"triton_cost_report: no specialisation named '{kernel_name}'")
    nvdisasm = check.nvidia_tool("nvdisasm")
    with tempfile.TemporaryDirectory() as folder:
        cubin = pathlib.Path(folder) / "kernel.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        text = subprocess.run([str(nvdisasm), "-c", "-g", str(cubin)], capture_output=True, text=True,
                              check=True).stdout
    instructions, labels, source = [], {}, ""
    for line in text.splitlines():
        if (match := re.match(r'\s*//## File "([^"]*)", line (\d+)', line)):
            source = Source(match.group(1), int(match.group(2)))
        elif (match := re.match(r"^(\.L_x_\d+|\$\S+):", line)):  # a branch target or a subroutine
            labels[match.group(1)] = len(instructions)
        elif (match := re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;", line)):
            instructions.append((match.group(1), source))
    return instructions, labels, compiled.metadata.num_warps


def branch_target(text, labels):
    """The position a branch instruction jumps to, or None (not a branch to a label)."""
    match = re.search(r"\bBRA\b.*`\((\.L_x_\d+)\)", text)
    return labels.get(match.group(1)) if match else None


def loops(instructions, labels):
    """[(first, last)] instruction ranges closed by a backward branch, but the way back from an
    out-of-line retry: ptxas puts a wait's retry loop (a TMA copy's barrier: SYNCS.PHASECHK.TRYWAIT)
    after the kernel's end, entered by a forward branch from the instruction before the way back's
    target, and left by an unconditional branch back, a few instructions after the retry's start: no
    loop of the kernel's."""
    found = []
    for position, (text, _) in enumerate(instructions):
        target = branch_target(text, labels)
        if target is None or target > position:
            continue
        retry = branch_target(instructions[target - 1][0], labels) if target > 0 else None
        if not text.startswith("@") and retry is not None and target < retry <= position <= retry + 4:
            continue
        found.append((target, position))
    return found


def opcode(text):
    words = text.split()
    word = words[1] if words[0].startswith("@") else words[0]
    return word.split(".")[0]


def bitonic_region(instructions, labels, tiles, inner_loops):
    """The instructions of the tile loop that a conditional forward branch skips and that hold the
    bitonic network (python/convnn/_triton/bitonic.py): the tiles that take the rounds skip them."""
    best = (0, -1)
    for position in range(tiles[0], tiles[1] + 1):
        match = re.search(r"^@!?U?P\d.*\bBRA\b.*`\((\.L_x_\d+)\)", instructions[position][0])
        target = labels.get(match.group(1), -1) if match else -1
        region = (position + 1, target - 1)
        if not (position < target <= tiles[1]) or any(
                loop and region[0] <= loop[0] and loop[1] <= region[1] for loop in inner_loops):
            continue
        network = sum(source.endswith("_triton/bitonic.py") for _, source in instructions[region[0]:region[1] + 1])
        if network > 32 and region[1] - region[0] > best[1] - best[0]:
            best = region
    return best


def division_lines(module):
    """The lines of select.py that divide a score tile by sqrt(D) in IEEE arithmetic: a branch that a
    power-of-two sqrt(D) (D = 64 in every shape here) skips for one multiply."""
    lines = pathlib.Path(module.__file__).read_text().splitlines()
    return {number for number, text in enumerate(lines, 1) if "tl.math.div_rn(keys," in text}


def parts(kernel_name, bitonic_merges, skipped_lines=frozenset()):
    """The kernel's instruction counts per part (see the module's text), per warp. Instructions of the
    tile loop from select.py's skipped_lines, and a dot-product loop not taken on aligned rows, are
    counted apart ("skipped"), not in the tile's base."""
    instructions, labels, warps = sass(kernel_name)
    ranges = loops(instructions, labels)

    def size(r):
        return r[1] - r[0] + 1

    def ffma(r):  # the score tile's FFMAs (the fused attention's aggregation has FFMAs of its own)
        return sum(opcode(text) == "FFMA" and source.endswith("select.py")
                   for text, source in instructions[r[0]:r[1] + 1])

    dots = [r for r in ranges if ffma(r) >= 16]
    # The innermost loop of score FFMAs; where a kernel has two (select._dot_keys: vector loads when
    # the rows are 16-byte aligned whole chunks, masked scalar loads otherwise), the vector one,
    # which D = 64 on aligned tensors takes: the other is counted as skipped.
    dot = min(dots, key=size)
    tiles = min((r for r in ranges if r[0] < dot[0] and dot[1] <= r[1]), key=size)
    untaken = [r for r in dots if r != dot and tiles[0] < r[0] and r[1] < tiles[1]]
    rounds = [r for r in ranges if tiles[0] < r[0] and r[1] < tiles[1] and r != dot and r not in untaken]
    round_loop = max(rounds, key=size) if rounds else None
    inner = size(dot) + (size(round_loop) if round_loop else 0)
    bitonic = size(bitonic_region(instructions, labels, tiles, [dot, round_loop])) if bitonic_merges else 0
    inside = [r for r in (dot, round_loop) if r]
    skipped = sum(source.endswith("select.py") and getattr(source, "line", 0) in skipped_lines
                  and not any(r[0] <= position <= r[1] for r in inside + untaken)
                  for position, (_, source) in enumerate(instructions[tiles[0]:tiles[1] + 1], tiles[0]))
    skipped += sum(size(r) for r in untaken)
    # Loops after the tile loop (the fused attention's): the aggregation, which loads the values, a
    # loop over blocks of channels (around a loop over the K slots, or with the slots unrolled),
    # taken (its vector-load body where it has two: vector_load_nests); and the slots' index order,
    # a loop over K that loads nothing and that a score-ordered call (the layers' default) skips.
    after = [nest for nest in loop_nests(instructions, labels) if (nest[0] or nest[1])[0] > tiles[1]]
    def loads(nest):
        first, last = nest[0] or nest[1]
        return any(opcode(text) == "LDG" for text, _ in instructions[first:last + 1])

    loading = [nest for nest in after if loads(nest)]
    aggregation, _ = vector_load_nests(instructions, labels, loading)
    aggregation = [(nest_size(nest) if nest[0] else None, nest_size((None, nest[1]))) for nest in aggregation]
    return {"warps": warps, "total": len(instructions), "dot_per_chunk": size(dot),
            "tile": size(tiles) - inner - bitonic - skipped, "round": size(round_loop) if round_loop else 0,
            "bitonic": bitonic, "skipped": skipped, "aggregation": aggregation,
            "once": len(instructions) - size(tiles) - sum(nest_size(nest) for nest in after)}


def tile_width(module, k):
    """Candidates per score tile of an unmasked call."""
    return module.candidates_for(k, module.NO_MASK)


def rows_per_block(module, k):
    """Query rows per program at K (one ROWS for every width before the set held per thread)."""
    return module.rows_for(module.slots_for(k)) if hasattr(module, "rows_for") else module.ROWS


def round_counts(module, g, n, d, k, seed=0, blocks_wanted=96):
    """Per tile of CANDIDATES candidates, summed over a sample of blocks of ROWS query rows on seeded
    Gaussian features (scaled_dot): (rounds, bitonic tiles, tiles, blocks sampled, blocks in all).
    A set held a row per thread (select.held_per_thread) does the same work on every tile: no
    rounds, no merges."""
    rows, tile = rows_per_block(module, k), tile_width(module, k)
    blocks_per_slice = math.ceil(n / rows)
    generator = torch.Generator().manual_seed(seed)
    per_thread = hasattr(module, "held_per_thread") and module.held_per_thread(module.slots_for(k))
    limit = getattr(module, "ROUNDS", None)  # None: the design before issue 38 (K merge rounds)
    merges = limit is not None and module.slots_for(k) <= module.BITONIC_SLOTS
    if hasattr(module, "held_per_thread"):  # from the set held per thread on: rounds only, no merges
        limit, merges = k, False
    rounds = bitonic = tiles = sampled = 0
    slices = max(1, min(g, blocks_wanted // blocks_per_slice))
    for _ in range(slices):
        queries = torch.randn(n, d, generator=generator, dtype=torch.float64)
        keys = torch.randn(n, d, generator=generator, dtype=torch.float64)
        blocks = range(0, blocks_per_slice, max(1, blocks_per_slice // blocks_wanted))
        for block in blocks:
            scores = queries[block * rows:(block + 1) * rows] @ keys.T / math.sqrt(d)
            sampled += 1
            for first in range(0, n, tile):
                tiles += 1
                if per_thread:
                    continue
                seen = scores[:, :first]
                kth = seen.topk(k, dim=1).values[:, -1:] if first >= k else torch.full((len(scores), 1), -math.inf)
                entries = int((scores[:, first:first + tile] > kth).sum(dim=1).max())
                if limit is None:
                    rounds += k if entries > 0 else 0
                elif entries > limit and merges:
                    bitonic += 1
                else:
                    rounds += min(entries, k)
    return rounds, bitonic, tiles, sampled, g * blocks_per_slice


def estimate(counts, module, shape, runs):
    """The bound of a kernel of instruction counts `counts` at `shape`, from `runs`: what
    round_counts gave for that shape (the select and attention kernels share it)."""
    g, n, d, k = shape
    rounds, bitonic_tiles, tiles, sampled, blocks = runs
    scale = blocks / sampled
    chunks = math.ceil(d / module.features_for(d))
    blocks_of_channels = math.ceil(CHANNELS / forward_channels(module.slots_for(k)))
    aggregation = sum(inner * blocks_of_channels if outer is None  # the slots unrolled in the loop
                      else (outer - inner) * blocks_of_channels + inner * blocks_of_channels * k
                      for outer, inner in counts["aggregation"])
    per_warp = (sampled * (counts["once"] + aggregation) + tiles * (counts["tile"] + chunks * counts["dot_per_chunk"])
                + rounds * counts["round"] + bitonic_tiles * counts["bitonic"]) * scale
    warp_instructions = per_warp * counts["warps"]
    issue_s = warp_instructions / (SMS * SCHEDULERS * CLOCK_HZ)
    dram_bytes = 4 * (2 * g * n * d) + g * n * k * (4 + 8)  # q and k once; scores and indices
    dram_s = dram_bytes / DRAM_BYTES_PER_S
    return {"rounds_per_tile": rounds / tiles, "bitonic_tiles_share": bitonic_tiles / tiles,
            "warp_instructions_per_score": warp_instructions / (blocks * rows_per_block(module, k) * tile_width(module, k)
                                                                * (tiles / sampled)),
            "issue_bound_us": issue_s * 1e6, "dram_bound_us": dram_s * 1e6,
            "bound_us": max(issue_s, dram_s) * 1e6, "set_by": "instruction issue" if issue_s > dram_s else "DRAM"}


def forward_channels(slots):
    """Value channels per step of the fused forward's aggregation at this width (one for every width
    before the set held per thread)."""
    attention = check.load_kernels("attention")
    return attention.forward_channels(slots) if hasattr(attention, "forward_channels") else attention.CHANNELS


def loop_nests(instructions, labels):
    """[(outer or None, inner)]: each innermost loop with the loop around it, if any."""
    found = [r for r in loops(instructions, labels) if r[1] > r[0]]

    def inside(a, b):
        return a != b and b[0] <= a[0] and a[1] <= b[1]

    inner = [r for r in found if not any(inside(other, r) for other in found)]
    return [(min((r for r in found if inside(i, r)), key=lambda r: r[1] - r[0], default=None), i) for i in inner]


def vector_load_nests(instructions, labels, nests=None):
    """(the loop nests taken, the loop nests not taken) of a kernel at D = C = 64 on aligned tensors,
    of all its nests or of `nests`: where some nests load 128-bit vectors (row_chunks.py: the body that
    a kernel runs on rows of whole chunks on 16-byte boundaries, beside the same body with scalar
    loads), those; otherwise every nest."""
    nests = loop_nests(instructions, labels) if nests is None else nests

    def vector(nest):
        first, last = nest[0] or nest[1]
        return any(re.search(r"\bLDG\.E\.128\b", text) for text, _ in instructions[first:last + 1])

    taken = [nest for nest in nests if vector(nest)] or nests
    return taken, [nest for nest in nests if nest not in taken]


def nest_size(nest):
    first, last = nest[0] or nest[1]
    return last - first + 1


def straight_line_run(instructions, labels, taken, nests):
    """Instructions outside every loop nest (of `nests`) that one program runs, once: those on the paths
    from the kernel's entry through the `taken` nests, in code order, to an EXIT (a branch goes to its
    target, and on, where predicated; EXIT and RET end a path, but predicated; a call returns). A body
    that aligned tensors do not take (row_chunks.py's scalar-load body beside the vector one), the
    other branch of a runtime choice between nests (the column kernel's values or keys), and the
    subroutines (a division's slow path) are not on them; the two sides of a branch inside a path
    both are (an overcount of a few instructions)."""
    count = len(instructions)

    def successors(position):
        text = instructions[position][0]
        onward = [position + 1] if position + 1 < count else []
        if opcode(text) in ("EXIT", "RET"):
            return onward if text.startswith("@") else []
        if opcode(text) == "BRA":
            target = branch_target(text, labels)
            return ([target] if target is not None else []) + (onward if text.startswith("@") else [])
        return onward

    forward = [successors(position) for position in range(count)]
    backward = [[] for _ in range(count)]
    for position, targets in enumerate(forward):
        for target in targets:
            backward[target].append(position)

    def reached(starts, edges):
        seen, pending = set(starts), list(starts)
        while pending:
            for following in edges[pending.pop()]:
                if following not in seen:
                    seen.add(following)
                    pending.append(following)
        return seen

    spans = sorted(nest[0] or nest[1] for nest in taken)
    exits = [position for position in range(count) if opcode(instructions[position][0]) == "EXIT"]
    sources = [[0]] + [list(range(first, last + 1)) for first, last in spans]
    ends = [[first] for first, _ in spans] + [exits]
    on_paths = set()
    for starts, finishes in zip(sources, ends):
        on_paths |= reached(starts, forward) & reached(finishes, backward)
    in_nests = {position for nest in nests for first, last in [nest[0] or nest[1]]
                for position in range(first, last + 1)}
    return len(on_paths - in_nests)


def instructions_per_program(kernel_name, trips, taken=None):
    """Warp instructions one program issues, and its warps: its straight-line code (straight_line_run)
    once, each loop nest by `trips`, one (outer trips, inner trips) per nest in code order (outer None
    for a single loop), or a function of the nest ((outer, inner) ranges) giving them. The nests of a
    body not taken on aligned tensors (vector_load_nests) are not counted; with `taken` (indices into
    the taken nests), only those nests run (a program that takes one branch of several)."""
    instructions, labels, warps = sass(kernel_name)
    nests, untaken = vector_load_nests(instructions, labels)
    if callable(trips):
        trips = [trips(nest) for nest in nests]
    if len(nests) != len(trips):
        raise SystemExit(f"triton_cost_report: {kernel_name} has {len(nests)} loop nests, the report expects "
                         f"{len(trips)}: update the report with the kernel")
    running = [(nest, nest_trips) for index, (nest, nest_trips) in enumerate(zip(nests, trips))
               if taken is None or index in taken]
    total = straight_line_run(instructions, labels, [nest for nest, _ in running], nests + untaken)
    for (outer, inner), (outer_trips, inner_trips) in running:
        inner_size = inner[1] - inner[0] + 1
        if outer is None:
            total += inner_size * inner_trips
        else:
            outer_size = outer[1] - outer[0] + 1
            total += (outer_size - inner_size) * outer_trips + inner_size * outer_trips * inner_trips
    return total, warps


@functools.cache
def longest_runs(backward, g, n, d, k, seed=0, slices_wanted=16, causal=False):
    """Sum over the column kernel's blocks of key/value rows of their longest run in the inverse index
    (the steps each block takes), for the top-K of seeded Gaussian features (scaled_dot; causal: of the
    keys up to the query's position), sampled on some slices (fewer at long N: about 2^28 scores in
    all, one slice at least) and scaled to all G. The blocks are of the order the kernel takes:
    neighbouring rows, or the rows busiest first where the revision's kernel takes row_order (sorted
    over the sampled slices together, as the kernel sorts all G*M rows)."""
    generator = torch.Generator().manual_seed(seed)
    slices = min(g, slices_wanted, max(1, 2 ** 28 // (n * n)))
    readers = []
    for _ in range(slices):
        queries = torch.randn(n, d, generator=generator)
        keys = torch.randn(n, d, generator=generator)
        chosen = []
        for first in range(0, n, 4096):  # [4096, N] scores at a time
            scores = queries[first:first + 4096] @ keys.T
            if causal:
                rows = torch.arange(first, first + len(scores))[:, None]
                scores.masked_fill_(torch.arange(n)[None, :] > rows, float("-inf"))
            chosen.append(scores.topk(k, dim=1).indices)
        readers.append(torch.bincount(torch.cat(chosen).reshape(-1), minlength=n))
    runs = torch.cat(readers)
    if "row_order_ptr" in backward._columns_kernel.arg_names:  # rows by run length, longest first (issue 38 §2)
        runs = runs.sort(descending=True, stable=True).values
    blocks = torch.nn.functional.pad(runs, (0, -len(runs) % backward.COLUMN_ROWS)).view(-1, backward.COLUMN_ROWS)
    return float(blocks.max(1).values.sum()) * g / slices, len(blocks) * g / slices


def float32_key(name):
    """The key of the float32 kernel that `name` names: name + " float32" where the revision compiles it
    per dtype (the backward's kernels since they read the op's dtype, issue 38 §1), else name."""
    return f"{name} float32" if f"{name} float32" in specialisation_keys() else name


@functools.cache
def specialisation_keys():
    """Every key of the reported revision's specialisations (listed once)."""
    return frozenset(spec[0] for spec in check.all_specialisations())


# Bytes per element of the op's dtype, for the DRAM bounds.
ELEMENT_BYTES = {"float32": 4, "bfloat16": 2}


def dtype_key(name, dtype):
    """The key of the backward's kernel `name` compiled for `dtype` (float32: float32_key)."""
    return float32_key(name) if dtype == "float32" else f"{name} {dtype}"


def backward_estimates(backward, select, shape, dtype="float32", causal=False):
    """{kernel: figures} for the row and column kernels at `shape` (N = M) in the op's `dtype`, as
    estimate() does for the selection: issue bound, DRAM bound of compulsory bytes (every tensor
    once, gathers from L2; the op's tensors in its dtype, the score gradient and the kernel's
    partials in float32, indices int64, the inverse index's as the revision builds it); causal: the
    column kernel's steps of a causal top-K."""
    g, n, d, k = shape
    c, rows, e = CHANNELS, g * n, ELEMENT_BYTES[dtype]
    chunks = math.ceil(c / getattr(backward, "ROW_CHANNELS", backward.attention.CHANNELS))
    rows_kernel = dtype_key(f"attention backward rows scaled_dot K<={select.slots_for(k)}", dtype)
    columns_kernel = dtype_key("attention backward columns", dtype)
    # Each loop over blocks of channels (features) around a loop over the K slots, or a single loop
    # with the slots unrolled (attention.COLUMN_SLOTS).
    per_program, warps = instructions_per_program(rows_kernel, lambda nest: (chunks, k) if nest[0] else (None, chunks))
    row_programs = math.ceil(rows / getattr(backward, "ROW_ROWS", select.ROWS))
    row_bytes = (e * rows * c + e * g * n * (c + d) + rows * k * (8 + e + e + 4) + e * rows * d
                 + 4 * row_programs * c * k)
    steps, blocks = longest_runs(backward, g, n, d, k, causal=causal)
    parts = math.ceil(c / backward.COLUMN_WIDTH), math.ceil(d / backward.COLUMN_WIDTH)
    # The inverse index's run starts and positions: int32 where the revision sorts by bits (sorts_by_bits).
    index = 4 if sorts_by_bits() else 8
    column_bytes = index * g * n + rows * k * (index + e + 4) + e * rows * (c + d) + e * g * n * (c + d)
    kernels = [(rows_kernel, per_program * warps * row_programs, row_bytes, f"{row_programs} programs")]
    try:
        # A program takes the values' loop or the keys': each its own straight-line run, its loop a step
        # of its block's longest run.
        values_program, column_warps = instructions_per_program(columns_kernel, [(None, 0), (None, 0)], taken=[0])
        keys_program, _ = instructions_per_program(columns_kernel, [(None, 0), (None, 0)], taken=[1])
        instructions, labels, _ = sass(columns_kernel)
        nests, _ = vector_load_nests(instructions, labels)
        values_loop, keys_loop = (inner[1] - inner[0] + 1 for _, inner in nests)
        column_instructions = column_warps * (blocks * (parts[0] * values_program + parts[1] * keys_program)
                                              + steps * (parts[0] * values_loop + parts[1] * keys_loop))
        kernels.append((columns_kernel, column_instructions, column_bytes,
                        f"{steps / blocks:.1f} steps per block of {backward.COLUMN_ROWS} rows (longest run; mean K)"))
    except SystemExit:
        # ptxas laid the bfloat16 column kernel's loops out rotated and overlapping (its stores'
        # conversions), which this report's loop finder does not read: its DRAM bound alone.
        if dtype == "float32":
            raise
        kernels.append((columns_kernel, None, column_bytes, "DRAM bound only: its SASS loops not read by the report"))
    figures = {}
    for name, warp_instructions, dram_bytes, note in kernels:
        issue_s = (warp_instructions or 0) / (SMS * SCHEDULERS * CLOCK_HZ)
        dram_s = dram_bytes / DRAM_BYTES_PER_S
        figures[name] = {"warp_instructions_per_row": (warp_instructions or float("nan")) / rows,
                         "issue_bound_us": issue_s * 1e6 if warp_instructions else float("nan"),
                         "dram_bound_us": dram_s * 1e6, "bound_us": max(issue_s, dram_s) * 1e6,
                         "set_by": "instruction issue" if issue_s > dram_s else "DRAM", "note": note}
    return figures


# The kernels that walk the inverse index (which slots read each key/value row) one slot per step,
# and the loop of each that takes the steps: their cost grows with the slots a row is read by.
WALKERS = ("d values float32", "standard d values float32", "select backward d keys cosine",
           "select backward d keys gaussian", "attention backward columns")


def subroutine_size(instructions, labels, name):
    """Instructions from a called subroutine's label to its first return."""
    start = labels[name]
    end = next(i for i in range(start, len(instructions)) if opcode(instructions[i][0]) == "RET")
    return end - start + 1


def walker_steps(kernel_name):
    """[(own instructions, subroutine instructions it may call)] per trip of each loop of a kernel, outermost
    first, per warp: a loop's own instructions exclude the loops inside it (each listed on its own), and a
    call (the int64 division, which the compiler emits as a subroutine behind a 32-bit fast path) costs its
    subroutine's instructions when taken."""
    instructions, labels, _ = sass(kernel_name)
    found = sorted({r for r in loops(instructions, labels) if r[1] > r[0]}, key=lambda r: (r[0], -r[1]))
    steps = []
    for first, last in found:
        nested = [r for r in found if r != (first, last) and first <= r[0] and r[1] <= last]
        own = [i for i in range(first, last + 1) if not any(r[0] <= i <= r[1] for r in nested)]
        called = [re.search(r"`\((\S+)\)", instructions[i][0]).group(1) for i in own
                  if opcode(instructions[i][0]) == "CALL"]
        steps.append((len(own), sum(subroutine_size(instructions, labels, name) for name in called)))
    return steps


def report_walkers(report):
    """The inverse-index walkers' section: SASS per slot step."""
    print("\nInverse-index walkers (float32): SASS instructions per warp per trip of each loop, outermost first "
          "(a loop's own, without the loops inside it), + those of a subroutine a trip may call. The step over a "
          "slot is the outer loop; the standard kernel's inner loop is over blocks of output channels; the column "
          f"kernel's loops step {check.load_kernels('attention_backward').COLUMN_ROWS} rows at once (values, "
          "then keys; where it has four, values and keys on rows of whole chunks, vector loads, then on others)\n")
    print("| kernel | per trip of each loop |\n|---|---|")
    report["walkers"] = {}
    for kernel in map(float32_key, WALKERS):
        steps = walker_steps(kernel)
        report["walkers"][kernel] = steps
        print(f"| {kernel} | {', '.join(f'{size}' + (f' + {called}' if called else '') for size, called in steps)} |")


LAUNCH_COUNT = """
import json, sys
import torch
from torch.utils._python_dispatch import TorchDispatchMode
import convnn
from convnn._triton import register

sys.path.insert(0, {tests!r})
import triton_interpreter  # the interpreter's bfloat16 products and rounding made a GPU's, as the tests make them

triton_interpreter.round_bfloat16_to_nearest_even()
triton_interpreter.multiply_bfloat16_as_numbers()

g, n, d, k = {shape}
NO_KERNEL = (torch.ops.aten.empty, torch.ops.aten.empty_like, torch.ops.aten.view, torch.ops.aten._unsafe_view,
             torch.ops.aten.detach, torch.ops.aten.alias, torch.ops.aten.slice, torch.ops.aten.as_strided,
             torch.ops.aten.lift_fresh)
aten = []
sorts = []  # (elements, key bytes) of each sort
launching = []  # the interpreter's own copies while a kernel runs are no launch of the op's

class Count(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket not in NO_KERNEL and not launching:
            aten.append(func.overloadpacket.__name__)
            if func.overloadpacket is torch.ops.aten.sort:
                sorts.append((args[0].numel(), args[0].element_size()))
        return func(*args, **(kwargs or {{}}))

def run(*args, launch=register.run):
    launching.append(1)
    try:
        launch(*args)
    finally:
        launching.pop()

register.run = run

generator = torch.Generator().manual_seed(0)
q, keys = torch.randn(g, n, d, generator=generator), torch.randn(g, n, d, generator=generator)
values, kernel = torch.randn(g, n, d, generator=generator), torch.randn(d, k, generator=generator)
grad_output = torch.randn(g, n, d, generator=generator)
q, keys, values, kernel, grad_output = (t.to({dtype}) for t in (q, keys, values, kernel, grad_output))
if {forward}:
    op, outputs = torch.ops.convnn.knn_attention_device_fused.default, 4
    args = (q, keys, values, kernel, None, k, "scaled_dot", None, False, "softmax", 1.0)
else:
    _, scores, indices, weights = torch.ops.convnn.knn_attention(q, keys, values, kernel, None, k, "scaled_dot", None,
                                                                 False, "softmax", 1.0)
    op, outputs = torch.ops.convnn.knn_attention_backward_device_fused.default, 5
    args = (grad_output, q, keys, values, kernel, scores, indices, weights, "scaled_dot", "softmax", 1.0)
op._op_dk(torch._C.DispatchKey.CUDA, *args)  # the first-call check, once
register.recording = []
with Count():
    results = op._op_dk(torch._C.DispatchKey.CUDA, *args)
assert len(results) == outputs, "the Triton kernels did not run"
print(json.dumps({{"triton": len(register.recording), "aten": aten, "sorts": sorts}}))
"""


# Assumed for the sorts' bound: ATen's sort of a CUDA tensor is a radix sort (CUB's) of 8-bit digits.
SORT_DIGIT_BITS = 8
LAUNCH_SHAPE = (4, 9, 8, 3)  # (G, N = M, D, K) of the launch count


def sort_bound_us(elements, key_bytes, key_bits=None, position_bytes=8):
    """A DRAM lower bound of a stable radix sort of `elements` keys that returns their positions: the
    positions written once, a histogram pass reading the keys, then a pass per digit of the key's
    bits, reading and writing keys and positions. ATen's sort: every bit of the key, int64 positions;
    sorted_keys.h's on a GPU: key_bits, int32 positions. No launch latency (each pass is a launch)."""
    passes = math.ceil((key_bits if key_bits is not None else 8 * key_bytes) / SORT_DIGIT_BITS)
    return elements * (position_bytes + key_bytes + passes * 2 * (key_bytes + position_bytes)) / DRAM_BYTES_PER_S * 1e6


def bits_for(largest):
    """The bits that hold every value from 0 to `largest` (sorted_keys.h's bits_for)."""
    return max(1, int(largest).bit_length())


def sorts_by_bits():
    """Whether the revision's launchers sort over their keys' bits alone with int32 positions on a GPU
    (src/ops/cuda/triton/sorted_keys.h), where before they called ATen's sort."""
    return (check.REPO / "src/ops/cuda/triton/sorted_keys.h").exists()


def backward_sorts_us(g, n, k, key_bytes):
    """(inverse index, rows busiest first): the two sorts of knn_attention's backward at G x N (M = N),
    K, µs, of G N K slots' targets and G M run lengths, as the revision's launchers sort them: over the
    bits of G M - 1 and of N K with int32 positions (sorts_by_bits), or ATen's sort of every bit of
    key_bytes (the launch count's) with int64 positions."""
    if sorts_by_bits():
        return (sort_bound_us(g * n * k, key_bytes["inverse_index"], bits_for(g * n - 1), 4),
                sort_bound_us(g * n, key_bytes["rows"], bits_for(n * k), 4))
    return sort_bound_us(g * n * k, key_bytes["inverse_index"]), sort_bound_us(g * n, key_bytes["rows"])


def launches(forward=False, dtype="torch.float32", shape=LAUNCH_SHAPE):
    """Kernel launches of one fused forward (knn_attention_device_fused) or one two-kernel backward
    (knn_attention_backward_device_fused), as a CUDA tensor runs their C++ launchers: the Triton
    launches and the ATen ops they call (each one launch or more: ATen's sort is several), counted on
    CPU tensors in a process of its own under Triton's interpreter (the installed convnn: the working
    tree's after scripts/setup.sh)."""
    # As on a GPU: no value read back by the op's checks (CONVNN_DEVICE_VALUE_CHECKS=0).
    environment = {**os.environ, "TRITON_INTERPRET": "1", "CONVNN_DEVICE_VALUE_CHECKS": "0"}
    script = LAUNCH_COUNT.format(shape=tuple(shape), forward=forward, dtype=dtype,
                                 tests=str(REPO / "python" / "tests"))
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=environment)
    if result.returncode != 0:
        raise RuntimeError(f"counting the launches failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def report_sorts(report, sorts):
    """The backward's two sorts at each shape (their key widths as the launchers sort them, counted on the
    launch count's shape), and the op's forward+backward bound with them."""
    g, n, _, k = LAUNCH_SHAPE
    key_bytes = {elements: size for elements, size in sorts}
    inverse_key, rows_key = key_bytes[g * n * k], key_bytes[g * n]
    report["sort_key_bytes"] = {"inverse_index": inverse_key, "rows": rows_key}
    how = ("CUB's radix sort of the keys' bits alone (sorted_keys.h), keys and int32 positions" if sorts_by_bits()
           else "ATen's sort taken as a radix sort of every bit of the key, keys and int64 positions")
    print(f"\nThe backward's sorts, a DRAM lower bound ({how} read and written each pass of {SORT_DIGIT_BITS}-bit "
          "digits; no launch latency), and the op's forward + backward with them (the fused forward, the row and "
          "column kernels, the sorts):\n")
    print("| shape | inverse index: keys, bytes each, µs | rows busiest first: keys, bytes each, µs | "
          "op forward + backward bound µs |\n|---|---|---|---|")
    report["sorts"] = {}
    for shape_name, (g, n, _, k) in SHAPES.items():
        inverse, rows = backward_sorts_us(g, n, k, report["sort_key_bytes"])
        kernels = report["kernels"][f"attention scaled_dot K<={check.load_kernels('select').slots_for(k)} no mask"]
        backward = report["backward"][shape_name]
        parts = {"fused knn_attention forward": kernels["shapes"][shape_name]["bound_us"],
                 **{kernel: f["bound_us"] for kernel, f in backward.items()}, "the two sorts": inverse + rows}
        total = sum(parts.values())
        report["sorts"][shape_name] = {"inverse_index_us": inverse, "rows_us": rows, "op_forward_backward_us": total,
                                       "parts_us": parts}
        print(f"| {shape_name} | {g * n * k:,}, {inverse_key}, {inverse:.1f} | {g * n:,}, {rows_key}, {rows:.1f} | "
              f"{total:.0f} |")
    if "backward bfloat16" in report:  # the bfloat16 kernels at Table 1, the same sorts
        table1, (g, n, _, k) = next(iter(SHAPES.items()))
        forward = report["kernels"][f"attention scaled_dot K<={check.load_kernels('select').slots_for(k)} no mask "
                                    "bfloat16 inputs"]["shapes"][table1]["bound_us"]
        sorts_us = report["sorts"][table1]["inverse_index_us"] + report["sorts"][table1]["rows_us"]
        parts = {"fused knn_attention forward": forward,
                 **{kernel: f["bound_us"] for kernel, f in report["backward bfloat16"][table1].items()},
                 "the two sorts": sorts_us}
        report["sorts bfloat16"] = {table1: {"op_forward_backward_us": sum(parts.values()), "parts_us": parts}}
        dram_only = [kernel for kernel, f in report["backward bfloat16"][table1].items()
                     if math.isnan(f["issue_bound_us"])]
        print(f"\nIn bfloat16 at {table1}: op forward + backward bound {sum(parts.values()):.0f} µs ("
              + ", ".join(f"{name} {us:.0f}" for name, us in parts.items()) + ")"
              + (f"; {', '.join(dram_only)} at its DRAM bound only (looser: its instruction issue not counted)"
                 if dram_only else "") + ".")


# The issue's targets that a static bound can speak to (issue 38, "Targets"): the op's forward +
# backward at Table 1 and knn_select at 12 x 4096 (K 8), in µs on an H100. The module's targets
# (against SDPA, in bfloat16 and float32) and peak memory need the GPU: the model has no GEMM,
# SDPA or allocator.
TARGETS_US = {"op forward + backward, Table 1": 250.0, "knn_select, 12 x 4096 (K 8)": 1000.0}


def report_targets(report):
    """Each static target's bound against it, and the kernel that sets it (the largest part)."""
    table1, long = "Table 1 (G 384, N 197, D 64, K 8)", "12 x 4096 (G 12, N 4096, D 64, K 8)"
    op = report["sorts"][table1]
    select = report["kernels"][f"select scaled_dot K<={check.load_kernels('select').slots_for(8)} no mask"]
    largest = max(op["parts_us"].items(), key=lambda part: part[1])
    rows = {"op forward + backward, Table 1": (op["op_forward_backward_us"], largest),
            "knn_select, 12 x 4096 (K 8)": (select["shapes"][long]["bound_us"],
                                          ("knn_select", select["shapes"][long]["bound_us"]))}
    print("\nThe issue's static targets (H100 bounds; the module's targets and peak memory need a GPU):\n")
    print("| target | bound µs | target µs | met by the bound | set by (its bound µs) |\n|---|---|---|---|---|")
    report["targets"] = {}
    for name, (bound, (kernel, part)) in rows.items():
        met = bound <= TARGETS_US[name]
        report["targets"][name] = {"bound_us": bound, "target_us": TARGETS_US[name], "met": met, "set_by": kernel}
        print(f"| {name} | {bound:.0f} | {TARGETS_US[name]:.0f} | {'yes' if met else 'no'} | {kernel} ({part:.0f}) |")


# Issue 41's training targets: knn_attention forward+backward on 12 heads of N tokens (D = C = 64,
# K = 8, scaled_dot, softmax, depthwise) in bfloat16 with the select on tensor cores (the forward
# composes it, rho and knn_aggregate; the two-kernel backward), causal (a bool [N, N] mask, as
# ConvNNAttention's causal option builds it) or not: at least twice as fast as SDPA.
TRAINING_SHAPES = {f"12 x {n} (G 12, N {n}, D 64, K 8)": (12, n, 64, 8) for n in (16384, 65536)}
TRAINING_TARGET = 2.0
# The H100 SXM's exponentials: MUFU.EX2, 16 per SM and cycle.
MUFU_PER_SM_CYCLE = 16


def sdpa_bound_us(g, n, d, causal):
    """(forward, forward + backward) lower bounds of SDPA's flash attention in bfloat16 on an H100, µs:
    its products at the tensor cores' dense peak (the forward's QK^T and PV, the backward's five: S
    again, dP, dV, dQ, dK) and an exponential per score and pass at the MUFU rate, each pass the larger
    of the two (as if perfectly overlapped); causal, half the pairs. Its DRAM traffic (q, k, v, the
    output and their gradients once) is far below both at these N. A bound, not a prediction: FlashAttention
    reaches a fraction of the peak."""
    pairs = g * n * n * (0.5 if causal else 1.0)
    multiply_adds = SMS * TENSOR_CORE_FMA_PER_SM_CYCLE["BF16"] * CLOCK_HZ
    exponentials = SMS * MUFU_PER_SM_CYCLE * CLOCK_HZ
    forward = max(2 * pairs * d / multiply_adds, pairs / exponentials)
    backward = max(5 * pairs * d / multiply_adds, pairs / exponentials)
    return forward * 1e6, (forward + backward) * 1e6


def aten_softmax_rho_bytes(element):
    """Bytes a [G, N, K] slot moves through reference::rho_weights' softmax (src/ops/reference/
    rho_forms.cpp), each ATen op reading its operands and writing its result once: isneginf (a bool
    mask), the float32 copy of half-precision scores, the mask's negation, the rows' any and amax, the
    shift, the division by the temperature, two masked fills, softmax (its input read twice: the
    row's largest, then the exponentials), the last masked fill and the copy back to the op's dtype;
    float32 scores copy nothing. (ops, bytes a slot)."""
    f, half = 4, element != 4
    moves = [element + 1, *([element + f] if half else []), 2, 1, f, 2 * f, 2 * f, 2 * f + 1, 2 * f, 3 * f,
             2 * f + 1, *([f + element] if half else [])]
    return len(moves), sum(moves)


def composition_bound_us(g, n, k, c=CHANNELS, element=2):
    """The DRAM bound of the composed forward's steps after the select with softmax rho (src/ops/
    composite/knn_attention_composed.cpp). Where the revision has the rho and aggregation kernel
    (attention._rho_aggregate_kernel: rho_aggregate in the source): the scores and indices read, the
    weights and the output written, the values read. Before it: rho's ATen ops (aten_softmax_rho_bytes),
    then the aggregation reading the values, weights and indices and writing the output, and what the
    revision does for the rows the select could not rank: a NaN-row test reading the scores and masked
    fills reading and writing the weights and, after the aggregation, the output; where softmax's own
    NaN weights are taken as they come (reference::nan_scores_give_nan_weights), nothing. µs; no launch
    latency (the ATen ops are a dozen launches)."""
    slots, rows = g * n * k, g * n
    source = check.REPO / "src/ops/composite/knn_attention_composed.cpp"
    composed = source.read_text() if source.exists() else ""
    aggregation = slots * (element + 8) + 2 * rows * c * element
    if "rho_aggregate" in composed:
        traffic = aggregation + slots * element  # the scores read, the weights written (not read back)
    else:
        nan_rows = 0 if "nan_scores_give_nan_weights" in composed else 3 * slots * element + 2 * rows * c * element
        traffic = aten_softmax_rho_bytes(element)[1] * slots + aggregation + nan_rows
    return traffic / DRAM_BYTES_PER_S * 1e6


def report_training(report):
    """The op's forward+backward bounds at TRAINING_SHAPES, bfloat16, against SDPA's (sdpa_bound_us):
    the tensor-core select (no mask, or a causal bool mask, read once into its words, of which the
    heads read G N M / 16 bytes: the words up to each block's diagonal), the composition's other
    steps, the two-kernel backward (the bfloat16 column kernel's instruction issue taken from the
    float32 kernel's SASS, whose loops the report reads) and its sorts."""
    bounded, backward, select = (check.load_kernels(name) for name in ("bounded_select", "attention_backward",
                                                                          "select"))
    key_bytes = report["sort_key_bytes"]
    print("\nknn_attention forward+backward at long N, bfloat16, the select on tensor cores, against SDPA's bound "
          "(H100 lower bounds, µs; a ratio of bounds, not a prediction)\n")
    print("| shape | causal | select (scored tiles) | rest of the forward | backward kernels | sorts | "
          "op forward / forward+backward | SDPA forward / forward+backward | SDPA / op, forward+backward | "
          f"at least {TRAINING_TARGET:.0f}x |\n|---|---|---|---|---|---|---|---|---|---|")
    report["training"] = {}
    norms_counts = norms_parts("key norms bfloat16 inputs")
    for shape_name, shape in TRAINING_SHAPES.items():
        g, n, d, k = shape
        for causal in (False, True):
            kernel = f"bounded select scaled_dot K<={max(8, 1 << (k - 1).bit_length())} " \
                     f"{'bool mask' if causal else 'no mask'} bfloat16 inputs"
            runs = bounded_runs(bounded, shape, 1.9e-5, causal=causal)
            seeds = seeds_parts(f"bounded seeds scaled_dot {'bool mask' if causal else 'no mask'} bfloat16 inputs")
            whole_counts = None
            if runs.get("parts") is not None:  # a bool mask's first launch: its whole tiles
                whole_counts = bounded_parts(kernel.replace("bounded select ", "bounded select whole tiles "))
            chosen = bounded_estimate(bounded_parts(kernel), norms_counts, bounded, shape, runs,
                                      mask_bytes=(g * n * n // 16 + n * n + n * n // 8) if causal else 0,
                                      seeds_counts=seeds, whole_counts=whole_counts)
            half = backward_estimates(backward, select, shape, "bfloat16", causal)
            full = backward_estimates(backward, select, shape, "float32", causal)
            kernels_us = 0.0
            for name, figures in half.items():
                issue = figures["issue_bound_us"]
                if math.isnan(issue):  # the bfloat16 column kernel: the float32 kernel's instruction issue
                    issue = next(f["issue_bound_us"] for other, f in full.items() if "columns" in other)
                kernels_us += max(issue, figures["dram_bound_us"])
            sorts_us = sum(backward_sorts_us(g, n, k, key_bytes))
            rest_us = composition_bound_us(g, n, k)
            forward_us = chosen["bound_us"] + rest_us
            total_us = forward_us + kernels_us + sorts_us
            sdpa_forward, sdpa_total = sdpa_bound_us(g, n, d, causal)
            ratio = sdpa_total / total_us
            report["training"][f"{shape_name}{', causal' if causal else ''}"] = {
                "select": chosen, "rest_of_forward_us": rest_us, "backward_kernels_us": kernels_us,
                "sorts_us": sorts_us, "op_forward_us": forward_us, "op_forward_backward_us": total_us,
                "sdpa_forward_us": sdpa_forward, "sdpa_forward_backward_us": sdpa_total, "sdpa_over_op": ratio,
                "met": ratio >= TRAINING_TARGET}
            print(f"| {shape_name} | {'yes' if causal else 'no'} | {chosen['bound_us']:.0f} "
                  f"({chosen['scored_tiles_share']:.0%}, set by {chosen['set_by']}) | {rest_us:.0f} | "
                  f"{kernels_us:.0f} | {sorts_us:.0f} | {forward_us:.0f} / {total_us:.0f} | "
                  f"{sdpa_forward:.0f} / {sdpa_total:.0f} | {ratio:.2f} | "
                  f"{'yes' if ratio >= TRAINING_TARGET else 'no'} |")


def print_backward_rows(figures, shape_name):
    for kernel, f in figures.items():
        print(f"| {kernel} | {shape_name} | {f['warp_instructions_per_row']:.0f} | {f['issue_bound_us']:.0f} | "
              f"{f['dram_bound_us']:.0f} | {f['bound_us']:.0f} | {f['set_by']} | {f['note']} |")


def report_backward(report):
    """The two-kernel backward's section: its bounds at each shape and its launches."""
    backward, select = check.load_kernels("attention_backward"), check.load_kernels("select")
    print("\nknn_attention backward in two kernels (softmax, scaled_dot, depthwise, C = D = 64): float32, and "
          "the bfloat16 kernels at Table 1\n")
    print("| kernel | shape | warp instr. per query row | issue bound (µs) | DRAM bound (µs) | bound (µs) | set by "
          "| note |")
    print("|---|---|---|---|---|---|---|---|")
    report["backward"] = {}
    for shape_name, shape in SHAPES.items():
        figures = backward_estimates(backward, select, shape)
        report["backward"][shape_name] = figures
        print_backward_rows(figures, shape_name)
    table1 = next(iter(SHAPES))
    if "bfloat16" in getattr(check.load_kernels("select"), "INPUT_DTYPES", ()):  # bfloat16 kernels: Table 1
        figures = backward_estimates(backward, select, SHAPES[table1], "bfloat16")
        report["backward bfloat16"] = {table1: figures}
        print_backward_rows(figures, table1)
    if check.REPO != REPO:  # another revision's kernels: its launchers are not the installed ones
        print("\nLaunches per backward: counted for the working tree only.")
        return
    counted = launches()
    report["backward_launches"] = counted
    print(f"\nLaunches per backward, torch.float32: {counted['triton']} Triton kernels and {len(counted['aten'])} "
          f"ATen ops ({', '.join(counted['aten'])}); ATen's sort may launch several kernels. The sorts (inverse "
          "index, rows busiest first) are not in the bounds above.")
    half = launches(dtype="torch.bfloat16")
    report["backward_launches torch.bfloat16"] = half
    print(f"Launches per backward, torch.bfloat16: {half['triton']} Triton kernels and {len(half['aten'])} ATen ops "
          f"({', '.join(half['aten'])}).")
    report_sorts(report, counted["sorts"])
    for dtype in ("torch.float32", "torch.bfloat16"):
        counted = launches(forward=True, dtype=dtype)
        report[f"forward_launches {dtype}"] = counted
        print(f"Launches per fused forward, {dtype}: {counted['triton']} Triton kernel and {len(counted['aten'])} "
              f"ATen ops ({', '.join(counted['aten']) or 'none'}).")


def report_top_k_kernel(report, counted, module, kernel, shape_name, shape, runs):
    """A row of the running-top-K kernels' table: the kernel's SASS (counted once) and its bound at shape."""
    if kernel not in counted:
        counted[kernel] = parts(kernel, bitonic_merges=hasattr(module, "ROUNDS"), skipped_lines=division_lines(module))
        report["kernels"][kernel] = {"sass": counted[kernel], "shapes": {}}
    counts = counted[kernel]
    figures = estimate(counts, module, shape, runs)
    report["kernels"][kernel]["shapes"][shape_name] = figures
    program = f"{rows_per_block(module, shape[3])} x {tile_width(module, shape[3])}, {counts['warps']}"
    aggregation = "–" if not counts["aggregation"] else ", ".join(
        [f"{inner} per {'slot' if outer else 'block'}" for outer, inner in counts["aggregation"]]
        + [f"{forward_channels(module.slots_for(shape[3]))} channels per block"])
    print(f"| {kernel} | {shape_name} | {program} | {counts['tile']} / {counts['dot_per_chunk']} / "
          f"{counts['round']} / {counts['bitonic']} | {counts['skipped']} | {aggregation} | "
          f"{figures['rounds_per_tile']:.2f} | {figures['bitonic_tiles_share']:.0%} | "
          f"{figures['warp_instructions_per_score']:.1f} | {figures['bound_us']:.0f} | {figures['set_by']} |")


# knn_select on tensor cores (bounded_select.py, issue 41): the shapes of its targets (12 heads of
# N = M keys, D = 64, K = 8), and the H100 SXM's dense tensor-core rate in multiply-adds per SM and
# cycle by the operands' type (989 TFLOPS bfloat16 and 495 TF32 at the boost clock, over 132 SMs):
# the peak, which mma.sync does not reach, so the bound below it is a lower bound.
BOUNDED_SHAPES = {f"12 x {n} (G 12, N {n}, D 64, K 8)": (12, n, 64, 8) for n in (4096, 16384, 65536)}
TENSOR_CORE_FMA_PER_SM_CYCLE = {"BF16": 2048, "F16": 2048, "TF32": 1024}


def tensor_core_multiply_adds(text):
    """(multiply-adds one warp's tensor-core instruction takes part in, its operands' type): an HMMA's
    m x n x k (HMMA.16816.F32.BF16), or a quarter of an HGMMA's (HGMMA.64x32x16.F32.BF16: the four
    warps of a warpgroup issue it together); None for another instruction."""
    match = re.search(r"HGMMA\.(\d+)x(\d+)x(\d+)\.F32\.(\w+)", text)
    if match:
        return int(match.group(1)) * int(match.group(2)) * int(match.group(3)) // 4, match.group(4)
    match = re.search(r"HMMA\.(\d\d)(\d)(\d+)\.F32\.(\w+)", text)
    if match:
        return int(match.group(1)) * int(match.group(2)) * int(match.group(3)), match.group(4)
    return None


def narrower_chunks(instructions, labels, span, outside=()):
    """(instructions, tensor-core multiply-adds per warp) of the chunk products in span (first, last)
    that D = 64 skips: a chunk's code (its loads, shared-memory stores, barriers and tensor-core
    instructions) lies between two branches or labels, and where _upper_keys has chunks of several
    widths (a first chunk of the widest that fits d, narrower first chunks and last chunks for other
    d), D = 64, a multiple of the widest, runs the widest alone; narrower ones are counted here, to be
    left out. The products inside `outside` (the chunk loop's) and those of another shape (the gate's
    small product) are not chunks of the tile's."""
    first, last = span
    cuts = sorted({i for i in range(first, last + 1) if opcode(instructions[i][0]) == "BRA"}
                  | {position for position in labels.values() if first <= position <= last})
    regions = {}
    for i in range(first, last + 1):
        found = tensor_core_multiply_adds(instructions[i][0])
        if not found or any(r[0] <= i <= r[1] for r in outside):
            continue
        shape = re.search(r"GMMA\.(\d+x\d+)", instructions[i][0])
        start = max([c + (opcode(instructions[c][0]) == "BRA") for c in cuts if c <= i] + [first])
        end = min([c for c in cuts if c > i] + [last + 1]) - 1
        regions.setdefault(shape.group(1) if shape else "", {}).setdefault((start, end), 0)
        regions[shape.group(1) if shape else ""][(start, end)] += found[0]
    if not regions:
        return 0, 0
    # The tile's product: the shape with the most multiply-adds; its widest regions run.
    chunks = max(regions.values(), key=lambda r: sum(r.values()))
    widest = max(chunks.values())
    skipped = [(r, adds) for r, adds in chunks.items() if adds < widest]
    return sum(r[1] - r[0] + 1 for r, _ in skipped), sum(adds for _, adds in skipped)


def bounded_parts(kernel_name):
    """The tensor-core select's SASS per warp (bounded_select.py: a persistent loop over blocks of
    rows, the tile loop inside it, a step of STEP_TILES tiles an iteration; "tile" below is a step):
    what each step runs (its first chunk of features, the gate and its small product, the flush
    test, and the unrolled remainder of chunks that ptxas puts after the loop of chunks: all taken,
    as at D = 64, where the first chunk is apart, the remainder takes three and the loop none), the
    loop of further chunks of FEATURES features (ptxas unrolls it: `unrolled` chunks an iteration),
    a round of the append loop (`scored_only`: the part of the tile that a tile skipped under a bool
    mask does not run), the flush inside the tile loop (apart from its chunk loop: its barriers, the
    K-th key, the threshold's loops taken once each) and its loop per FLUSH queued candidates (apart
    from the exact re-score: the merge, with the remainder of the re-score's unrolled loop, counted
    as taken: an over-count at D = 64, where the unrolled loop takes every feature), the exact
    re-score per 8 features (its loop over the unrolled features: `exact_unrolled` times 8 an
    iteration, from its FFMA, one per pair and feature), what a block runs outside the tile loop (the
    final flush's chunks counted as the tile loop's), the query norms per chunk, and the tensor-core
    multiply-adds per tile (first chunk and gate) and per further chunk. The step's chunk products
    narrower than the widest (the first chunks and last chunks of other d) are left out: D = 64 skips
    them (narrower_chunks; `skipped_at_64` their instructions); so is the IEEE division of keys by
    sqrt(D) (division_lines), in every part."""
    instructions, labels, warps = sass(kernel_name)
    ranges = loops(instructions, labels)

    def size(r):
        return r[1] - r[0] + 1

    def inside(inner, outer):
        return inner != outer and outer[0] <= inner[0] and inner[1] <= outer[1]

    def tensor_core(first, last):
        found = [tensor_core_multiply_adds(text) for text, _ in instructions[first:last + 1]]
        return [f for f in found if f]

    # The tile loop's chunk loop: the most deeply nested loop with tensor-core instructions (the
    # initial thresholds' product, before the tile loop, has one too).
    dot = max((r for r in ranges if tensor_core(*r)), key=lambda r: (sum(inside(r, o) for o in ranges), -size(r)))
    tiles = min((r for r in ranges if inside(dot, r)), key=size)
    work = min((r for r in ranges if inside(tiles, r)), key=size)
    inner = [r for r in ranges if inside(r, tiles) and r != dot]
    chunk_loop = max(inner, key=size)  # the flush's loop over FLUSH queued candidates
    exact = max((r for r in ranges if inside(r, chunk_loop)), key=size)
    # The flush: the largest forward-branch region of the tile loop that holds its chunk loop.
    flush = chunk_loop
    for position in range(tiles[0], chunk_loop[0]):
        match = re.search(r"^@!?U?P\d.*\bBRA\b.*`\((\.L_x_\d+)\)", instructions[position][0])
        target = labels.get(match.group(1), -1) if match else -1
        if chunk_loop[1] < target <= tiles[1] + 1 and target - position - 1 > size(flush):
            flush = (position + 1, target - 1)
    append = [r for r in inner if not inside(r, flush) and r != chunk_loop and r != flush]
    append = max(append, key=size)
    final_chunks = max((r for r in ranges if inside(r, work) and r[0] > tiles[1]), key=size)
    # Before the tile loop: the query norms' loop per chunk, and (an earlier revision's _initial_thresholds)
    # a product's chunk loop, taken as the tile's, and the threshold's steps (_dot_threshold: counted
    # once each, a step or none on these inputs).
    before = [r for r in ranges if inside(r, work) and r[1] < tiles[0]]
    bounded = check.load_kernels("bounded_select")
    stepping_source, stepping_first = inspect.getsourcelines(bounded._dot_threshold.fn)
    stepping = range(stepping_first, stepping_first + len(stepping_source))
    steps = [r for r in before if any(getattr(instructions[i][1], "line", None) in stepping
                                      for i in range(r[0], r[1] + 1))]
    initial_products = [r for r in before if tensor_core(*r)]
    norms = [r for r in before if r not in steps and r not in initial_products]
    per_chunk = tensor_core(*dot)
    per_tile = tensor_core(tiles[0], tiles[1])
    # With a bool mask, a tile that no row's bounds decide is not scored (bounded_select: the branch of
    # `if deciding`): the forward branch on that line that skips the first chunk, the chunk loop and
    # the gate's product. None in a kernel without it.
    lines = pathlib.Path(bounded.__file__).read_text().splitlines()
    deciding = {number for number, text in enumerate(lines, 1) if text.strip() == "if deciding != 0:"}
    scored = None
    for position in range(tiles[0], dot[0]):
        text, where = instructions[position]
        match = re.search(r"^@!?U?P\d.*\bBRA\b.*`\((\.L_x_\d+)\)", text)
        target = labels.get(match.group(1), -1) if match else -1
        if getattr(where, "line", None) in deciding and dot[1] < target <= tiles[1]:
            scored = (position + 1, target - 1)
    # A warp's share of a chunk's product: a step's tiles (STEP_TILES at sm_90; 1 before steps; 1 in a bool
    # mask's part 2, whose steps take one tile).
    constexprs = check.specialisations().for_architecture(
        next(c for name, _, _, c, _ in check.all_specialisations() if name == kernel_name), 90)
    step_tiles = 1 if constexprs.get("PART") == 2 else constexprs.get("STEP_TILES", 1)
    chunk_multiply_adds = bounded.ROWS * bounded.CANDIDATES * step_tiles * bounded.FEATURES // warps
    pairs_per_thread = bounded.ROWS * bounded.FLUSH // (32 * warps)
    exact_unrolled = max(1, sum(opcode(text) == "FFMA" for text, _ in instructions[exact[0]:exact[1] + 1])
                         // (8 * pairs_per_thread))
    skipped, skipped_multiply_adds = narrower_chunks(instructions, labels, tiles, outside=(dot, flush))
    # The IEEE division of keys by sqrt(D) (select.scaled_by_root: the flushes' exact keys, the thresholds'
    # steps), a branch that a power-of-two sqrt(D) skips for one multiply, as in parts().
    division = division_lines(check.load_kernels("select"))

    def divided(span, *excluded):
        return sum(source.endswith("select.py") and getattr(source, "line", 0) in division
                   and not any(r[0] <= position <= r[1] for r in excluded)
                   for position, (_, source) in enumerate(instructions[span[0]:span[1] + 1], span[0]))

    return {"warps": warps, "total": len(instructions), "step_tiles": step_tiles, "dot_loop": size(dot),
            "unrolled": sum(f for f, _ in per_chunk) // chunk_multiply_adds,
            "tile": size(tiles) - size(dot) - size(flush) - size(append) - skipped
            - divided(tiles, dot, flush, append),
            "skipped_at_64": skipped,
            "scored_only": size(scored) - size(dot) - narrower_chunks(instructions, labels, scored, (dot,))[0]
            if scored else 0,
            "append_round": size(append),
            "flush": size(flush) - size(chunk_loop) - divided(flush, chunk_loop),
            "flush_chunk": size(chunk_loop) - size(exact) - divided(chunk_loop, exact),
            "exact_unrolled": exact_unrolled, "exact_per_8_features": size(exact) / exact_unrolled,
            "block": size(work) - size(tiles) - size(final_chunks) - sum(size(r) for r in norms + initial_products)
            - divided(work, tiles, final_chunks, *norms, *initial_products),
            "initial_dot_loop": sum(size(r) for r in initial_products),
            "norms_per_chunk": sum(size(r) for r in norms),
            "tile_multiply_adds": sum(f for f, _ in per_tile) - sum(f for f, _ in per_chunk) - skipped_multiply_adds,
            "loop_multiply_adds": sum(f for f, _ in per_chunk), "operands": per_chunk[0][1]}



def bounded_runs(bounded, shape, model, similarity="scaled_dot", seed=0, blocks_wanted=16, causal=False,
                 dtype="bfloat16"):
    """The kernel's rule on seeded Gaussian features [N, D] (one slice; keys the same size), per sampled
    block of ROWS query rows, in steps of the tiles the sm_90 kernel scores a step for `dtype`
    (bounded_select.tiles_per_step): the gate (the exact key plus the bound's size: model |q||k| for
    the dot products, at the step's largest key norm, model for cosine's, model (|q|^2 + |k|^2) for
    gaussian's minus the squared distance, docs/operator.md; against the K-th exact key of the
    candidates flushed so far), the appends (a round per candidate of a step's busiest lane word), the
    flushes (after a step that leaves FLUSH_AT or more in a queue, and after the last) and their
    chunks of FLUSH. causal: a bool mask of the keys up to each query's position, as the kernel
    takes a bool mask: in a revision with parts (bounded_select._tiles_whole), first the block's whole
    tiles (those before its first row's diagonal, in whole steps) as without a mask (part 1, its own
    launch), then part 2 from there, one tile a step, from part 1's exact top; there (and in the
    whole loop of an earlier revision) a tile scored only where some row of the block has a candidate
    in it and a threshold above -inf, every valid candidate queued while the row's top has an empty
    slot, every allowed one while its threshold is -inf, and the tiles past the block's last row not
    visited once every row's top is full.
    dot and scaled_dot start from their seeds (the tiles the seeds kernel scores counted as seed tiles).
    Returns {tiles (scored), steps (scored), skipped tiles, append rounds, flushes, flush chunks, seed
    tiles, candidates re-scored per row, blocks sampled, blocks in all, and "parts": the same counts
    (tiles to flush chunks) for part 1 and part 2 apart where the kernel has parts, else None}."""
    g, n, d, k = shape
    rows, tile, queue, flush = bounded.ROWS, bounded.CANDIDATES, bounded.QUEUE, bounded.FLUSH
    # Tiles a step on sm_90 (an earlier revision's kernel: one); a bool mask's part 2: one.
    code = check.load_kernels("similarities").CODES[similarity]
    wide = getattr(bounded, "tiles_per_step", lambda *_: 1)(code, 1 if causal else 0, dtype, 90) * tile
    parts = causal and hasattr(bounded, "_tiles_whole")
    step = tile if parts else wide
    generator = torch.Generator().manual_seed(seed)
    queries = torch.randn(n, d, generator=generator, dtype=torch.float64)
    keys = torch.randn(n, d, generator=generator, dtype=torch.float64)
    key_norms = keys.norm(dim=1)
    tile_norms = key_norms.view(-1, tile).amax(1).repeat_interleave(tile)
    slots = check.load_kernels("select").slots_for(k)
    blocks_per_slice = math.ceil(n / rows)
    counted = ("tiles", "steps", "skipped_tiles", "append_rounds", "flushes", "flush_chunks")
    by_part = {part: dict.fromkeys(counted, 0) for part in ("whole", "rest")}
    runs = {"rescored": 0, "rows": 0, "seed_tiles": 0, "seed_tested_tiles": 0}
    sampled = 0
    # An odd stride, so that blocks of both parities are sampled: a causal block's whole tiles are taken in
    # steps of two, and an odd block's last one goes to part 2.
    stride = max(1, blocks_per_slice // blocks_wanted)
    for block in range(0, blocks_per_slice, stride - 1 + stride % 2):
        q = queries[block * rows:(block + 1) * rows]
        q_norms = q.norm(dim=1, keepdim=True)
        positions = torch.arange(block * rows, block * rows + len(q))[:, None]
        if similarity == "gaussian":
            exact = -torch.cdist(q, keys) ** 2
            upper = {width: exact + model * (q_norms ** 2 + key_norms ** 2) for width in (step, wide)}
        elif similarity == "cosine":
            exact = q @ keys.T / q_norms / key_norms
            upper = {width: exact + model for width in (step, wide)}
        else:  # the bound at each step's largest key norm (bounded_select._gate_thresholds)
            exact = q @ keys.T
            upper = {width: exact + model * q_norms * key_norms.view(-1, width).amax(1).repeat_interleave(width)
                     for width in (step, wide)}
        best = torch.full((len(q), k), -math.inf, dtype=torch.float64)
        threshold = best[:, -1].clone()
        fill = torch.zeros(len(q), dtype=torch.long)
        ranked = torch.zeros(len(q), dtype=torch.long)  # candidates flushed: fewer than K, an empty slot
        reach = (block * rows + len(q) - 1) // tile * tile + tile if causal else n  # past the block's diagonal
        if similarity not in ("gaussian", "cosine") and hasattr(bounded, "SEED_TILES"):
            # bounded_select._seed_thresholds_kernel: the K-th largest of the columns' largest lower bounds
            # over the first SEED_TILES tiles the block reaches; a row that has one closes its top to masked
            # candidates.
            seen = min(reach, bounded.SEED_TILES * tile)
            # This revision's rule (its kernel takes the blocks' whole words): whole tiles of M, each
            # column's largest product, the bound subtracted from the K-th at the tiles' largest norm; a
            # bool mask's bits tested on the tiles from the block's first not whole (a causal block's
            # diagonal tile). An earlier revision's: each candidate's lower bound at its tile's norm.
            largest_norm = "wholes_ptr" in bounded._seed_thresholds_kernel.arg_names
            if largest_norm:
                seen = min(seen, n // tile * tile)
                if causal:
                    runs["seed_tested_tiles"] += max(0, math.ceil(seen / tile) - min(block * rows + 1, n) // tile)
            runs["seed_tiles"] += math.ceil(seen / tile)
            lower = exact[:, :seen] if largest_norm else exact[:, :seen] - model * q_norms * tile_norms[:seen]
            if causal:
                lower = torch.where(torch.arange(seen)[None, :] <= positions, lower, -math.inf)
            lower = torch.nn.functional.pad(lower, (0, -seen % tile), value=-math.inf)
            reached = lower.view(len(q), -1, tile).amax(1).topk(k, dim=1).values[:, -1]
            if largest_norm:
                reached = reached - model * q_norms[:, 0] * tile_norms[:seen].max()
            threshold = torch.maximum(threshold, reached)
            ranked = torch.where(reached > -math.inf, k, ranked)
        elif similarity not in ("gaussian", "cosine"):
            # An earlier revision's _initial_thresholds: the least of SLOTS groups' largest lower bounds of
            # the first tile's keys.
            lower = exact[:, :tile] - model * q_norms * tile_norms[:tile]
            if causal:
                lower = torch.where(torch.arange(tile)[None, :] <= positions, lower, -math.inf)
            reached = lower.view(len(q), tile // slots, slots).amax(1).amin(1)
            threshold = torch.maximum(threshold, reached)
            ranked = torch.where(reached > -math.inf, k, ranked)
        queued = []
        sampled += 1

        def flushed(best, queued, fill, counts):
            ranked.add_(fill)
            counts["flushes"] += 1
            counts["flush_chunks"] += math.ceil(int(fill.max()) / flush)
            runs["rescored"] += int(fill.sum())
            if queued:
                best = torch.cat([best] + queued, dim=1).topk(k, dim=1).values
            return best, best[:, -1].clone()

        def stepped(first, width, allowed, counts):
            """One step of `width` candidates from `first`: (whether it decided) after its appends and flush."""
            nonlocal best, threshold, fill, queued
            passing = upper[width][:, first:first + width] >= threshold[:, None]
            keys_here = exact[:, first:first + width]
            deciding = True
            if allowed is not None:
                deciding = bool((allowed.any(dim=1) & (threshold > -math.inf)).any())
                # A masked candidate enters only while the row's top has an empty slot (bounded_select).
                passing = torch.where((ranked < k)[:, None], True,
                                      torch.where((threshold == -math.inf)[:, None], allowed,
                                                  passing & allowed & deciding))
                keys_here = torch.where(allowed, keys_here, -math.inf)
            counts["steps" if deciding else "skipped_tiles"] += 1
            counts["tiles"] += math.ceil(min(width, n - first) / tile) if deciding else 0
            count = passing.sum(dim=1)
            queued.append(torch.where(passing, keys_here, -math.inf))
            fill += count
            # A round per candidate of the step's busiest lane word (bounded_select._appended; before LANES, of its
            # busiest row).
            words = torch.nn.functional.pad(passing, (0, width - passing.shape[1]))
            counts["append_rounds"] += int(words.reshape(len(words), getattr(bounded, "LANES", 1), -1).sum(dim=2).max())
            if int(fill.max()) >= queue - 2 * tile:
                best, threshold = flushed(best, queued, fill, counts)
                fill, queued = torch.zeros_like(fill), []

        first = 0
        rest = by_part["rest"]
        if parts:
            # Part 1: the tiles before the block's first row's diagonal, in whole steps, as without a mask,
            # and its last flush; part 2 starts from its exact top (bounded_select._resumed), the threshold
            # the larger of the seed and the K-th exact key, the top closed where either closes it.
            seeded_threshold = threshold.clone()
            whole = min(block * rows + 1, n) // tile * tile // wide * wide
            for first in range(0, whole, wide):
                stepped(first, wide, None, by_part["whole"])
            first = whole
            if int(fill.max()) > 0:
                best, threshold = flushed(best, queued, fill, by_part["whole"])
            else:
                by_part["whole"]["flushes"] += 1
            fill, queued = torch.zeros_like(fill), []
            threshold = torch.maximum(best[:, -1], seeded_threshold)
        for first in range(first, n, step):
            if causal and first >= reach and bool((ranked >= k).all()):
                break
            allowed = None
            if causal:
                allowed = torch.arange(first, min(first + step, n))[None, :] <= positions
            stepped(first, step, allowed, rest)
        if int(fill.max()) > 0:
            best, threshold = flushed(best, queued, fill, rest)
        else:
            rest["flushes"] += 1  # the final flush's fixed part runs with an empty queue too
        runs["rows"] += len(q)
    runs.update({key: by_part["whole"][key] + by_part["rest"][key] for key in counted})
    runs.update(sampled=sampled, blocks=g * blocks_per_slice, rescored_per_row=runs["rescored"] / runs["rows"],
                parts=by_part if parts else None)
    return runs


def bounded_estimate(counts, norms_counts, bounded, shape, runs, mask_bytes=0, seeds_counts=None, whole_counts=None):
    """The tensor-core select's bound at `shape`: the larger of its instruction issue (and the keys'
    norms kernel's), its tensor-core multiply-adds at the tensor cores' peak and its compulsory DRAM
    bytes (the rerun's programs, none of whose rows is flagged on these inputs, only read the flags;
    mask_bytes: what a mask adds). A tile skipped under a bool mask runs the tile's part but its
    scored_only part and the chunk loop. Where the runs have parts (a bool mask's two launches), part 1
    at whole_counts (its kernel's bounded_parts), part 2 at counts."""
    g, n, d, k = shape
    scale = runs["blocks"] / runs["sampled"]
    chunks = math.ceil(d / bounded.FEATURES)
    launched = [(counts, runs)] if runs.get("parts") is None else [(whole_counts, runs["parts"]["whole"]),
                                                                    (counts, runs["parts"]["rest"])]
    warp_instructions = multiply_adds = 0
    for parts, part_runs in launched:
        per_warp = (runs["sampled"] * (parts["block"] + parts["norms_per_chunk"] * chunks
                                       + (chunks - 1) // parts["unrolled"] * parts["initial_dot_loop"])
                    + part_runs["steps"] * (parts["tile"] + (chunks - 1) // parts["unrolled"] * parts["dot_loop"])
                    + part_runs["skipped_tiles"] * (parts["tile"] - parts["scored_only"])
                    + part_runs["append_rounds"] * parts["append_round"] + part_runs["flushes"] * parts["flush"]
                    + part_runs["flush_chunks"] * (parts["flush_chunk"] + d / 8 * parts["exact_per_8_features"])
                    ) * scale
        warp_instructions += per_warp * parts["warps"]
        multiply_adds += part_runs["steps"] * scale * parts["warps"] * (
            parts["tile_multiply_adds"] + (chunks - 1) // parts["unrolled"] * parts["loop_multiply_adds"])
    norms_programs = g * math.ceil(n / bounded.KEY_NORM_ROWS)
    warp_instructions += norms_programs * norms_counts["per_program"](chunks)
    seed_multiply_adds = 0
    if seeds_counts and runs["seed_tiles"]:  # the seeds kernel: a program per block, its tiles and K rounds
        seed_tiles = runs["seed_tiles"] * scale
        # A bool mask's tiles not whole for the block, in its loop that tests their bits (a revision
        # without that loop: every tile at its one loop's count).
        tested = runs.get("seed_tested_tiles", 0) * scale if seeds_counts.get("masked_tile") else 0
        warp_instructions += seeds_counts["warps"] * (
            runs["blocks"] * (seeds_counts["rest"] + k * seeds_counts["round"])
            + (seed_tiles - tested) * seeds_counts["tile"] + tested * (seeds_counts.get("masked_tile") or 0))
        seed_multiply_adds = seed_tiles * bounded.ROWS * bounded.CANDIDATES * d
    issue_s = warp_instructions / (SMS * SCHEDULERS * CLOCK_HZ)
    multiply_adds += seed_multiply_adds
    tensor_s = multiply_adds / (SMS * TENSOR_CORE_FMA_PER_SM_CYCLE[counts["operands"]] * CLOCK_HZ)
    element = 2 if counts["operands"] in ("BF16", "F16") else 4
    dram_s = (element * 3 * g * n * d + g * n * (k * (element + 8) + 3 * 4)
              + 2 * 4 * runs["rescored_per_row"] * g * n + mask_bytes) / DRAM_BYTES_PER_S
    bound = max(issue_s, tensor_s, dram_s)
    return {"rescored_per_row": runs["rescored_per_row"],
            "scored_tiles_share": runs["tiles"] / (runs["sampled"] * math.ceil(n / bounded.CANDIDATES)),
            "append_rounds_per_step": runs["append_rounds"] / (runs["steps"] + runs["skipped_tiles"]),
            "flushes_per_block": runs["flushes"] / runs["sampled"],
            "warp_instructions_per_score": warp_instructions / (g * n * n),
            "issue_bound_us": issue_s * 1e6, "tensor_core_bound_us": tensor_s * 1e6,
            "dram_bound_us": dram_s * 1e6, "bound_us": bound * 1e6,
            "set_by": {issue_s: "instruction issue", tensor_s: "tensor cores", dram_s: "DRAM"}[bound]}


def seeds_parts(kernel_name):
    """The seeds kernel (bounded_select._seed_thresholds_kernel), SASS per warp: its tile loop (the
    outermost loop with tensor-core instructions; where it has several, the first of TMA copies, which
    D = 64 takes: a bool mask's tiles whole for the block, or every tile without a mask; its chunk loop,
    one with tensor-core instructions inside it, not taken, as at D = 64 by chunks of
    SEED_PRODUCT_FEATURES), a bool mask's loop of the tiles it tests (the second of copies; None
    without), the round of its K-th largest (the largest loop after them without tensor-core
    instructions) and the rest, once a program (straight_line_run through those loops); None where the
    revision has no such kernel."""
    try:
        instructions, labels, warps = sass(kernel_name)
    except SystemExit:
        return None
    ranges = loops(instructions, labels)

    def size(r):
        return r[1] - r[0] + 1

    def inside(inner, outer):
        return inner != outer and outer[0] <= inner[0] and inner[1] <= outer[1]

    def tensor_core(r):
        return any(tensor_core_multiply_adds(text) for text, _ in instructions[r[0]:r[1] + 1])

    def copies(r):
        return any("UTMALDG" in text for text, _ in instructions[r[0]:r[1] + 1])

    def per_tile(tile):
        chunks = sum(size(r) for r in ranges if inside(r, tile) and tensor_core(r)
                     and not any(inside(r, o) and inside(o, tile) for o in ranges))
        skipped, _ = narrower_chunks(instructions, labels, tile)
        return size(tile) - chunks - skipped

    tile_loops = [r for r in ranges if tensor_core(r) and not any(inside(r, o) for o in ranges)]
    copied = sorted(r for r in tile_loops if copies(r))
    # (A revision without the bool mask's second loop: its largest tile loop, of copies where it has one.)
    tile = copied[0] if len(copied) > 1 else max(tile_loops, key=lambda r: (copies(r), size(r)))
    masked = copied[1] if len(copied) > 1 else None
    last = max(r[1] for r in ([tile, masked] if masked else [tile]))
    rounds = max((r for r in ranges if r[0] > last and not tensor_core(r)
                  and not any(inside(r, o) for o in tile_loops)), key=size)
    # The rest: the straight-line code on the paths through the loops D = 64 takes (not the staged loops'
    # set-up of a wider D), once a program.
    outermost = [(None, r) for r in ranges if not any(inside(r, o) for o in ranges)]
    taken = [(None, r) for r in ([tile, masked, rounds] if masked else [tile, rounds])]
    return {"warps": warps, "tile": per_tile(tile), "masked_tile": per_tile(masked) if masked else None,
            "round": size(rounds), "rest": straight_line_run(instructions, labels, taken, outermost)}


def norms_parts(kernel_name):
    """The keys' norms kernel: per program, SASS outside its loop plus its loop per chunk of features."""
    instructions, labels, warps = sass(kernel_name)
    body = max(loops(instructions, labels), key=lambda r: r[1] - r[0])
    loop = body[1] - body[0] + 1
    return {"per_program": lambda chunks: warps * (len(instructions) - loop + chunks * loop)}


def report_bounded_select(report):
    """The tensor-core select's table: scaled_dot without a mask, bfloat16 and float32 inputs, at
    BOUNDED_SHAPES, and cosine and gaussian at the first of them (where the kernel serves them), beside
    the IEEE select kernel's bound at 12 x 4096 (the table above)."""
    bounded = check.load_kernels("bounded_select")
    if not hasattr(bounded, "_key_norms_kernel"):
        print("\nknn_select on tensor cores: the held-set design of this revision is not modelled here "
              "(BENCHMARKS.md, 2026-11-29 has its figures)")
        return
    print("\nknn_select on tensor cores (bounded_select.py): no mask, sm_90; the IEEE kernel's "
          "rerun launch reads only the flags here (no row flagged on Gaussian inputs)\n")
    print("| kernel | shape | SASS per warp: step (tiles) / loop of chunks (chunks) / append round / flush / "
          "per 8 queued / "
          "exact per 8 features | warps | re-scored per row | append rounds per step | flushes per block | "
          "warp instr. per score | issue (µs) | tensor cores (µs) | DRAM (µs) | bound (µs) | set by |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    report["bounded_select"] = {}
    served = [name for name in ("scaled_dot", "cosine", "gaussian")
              if check.load_kernels("similarities").CODES[name] in bounded.SIMILARITIES]
    cases = [(name, shape_name, shape) for name in served for shape_name, shape in BOUNDED_SHAPES.items()
             if name == "scaled_dot" or shape_name == next(iter(BOUNDED_SHAPES))]
    for suffix, exact_products in ((" bfloat16 inputs", True), ("", False)):
        norms_counts = norms_parts(f"key norms{suffix}")
        for similarity, shape_name, shape in cases:
            kernel = f"bounded select {similarity} K<={max(8, 1 << (shape[3] - 1).bit_length())} no mask{suffix}"
            counts = bounded_parts(kernel)
            # The bound's size at D = 64 (docs/operator.md: 1.9e-5 of |q||k| for bfloat16, 2.0e-3 for TF32;
            # gaussian's about twice that of |q|^2 + |k|^2, bounded_select.gaussian_bound).
            model = (1.9e-5 if exact_products else 2.0e-3) * (2 if similarity == "gaussian" else 1)
            runs = bounded_runs(bounded, shape, model, similarity, dtype="bfloat16" if exact_products else "float32")
            figures = bounded_estimate(counts, norms_counts, bounded, shape, runs,
                                       seeds_counts=seeds_parts(f"bounded seeds {similarity} no mask{suffix}"))
            report["bounded_select"].setdefault(kernel, {"sass": counts, "shapes": {}})["shapes"][shape_name] = figures
            print(f"| {kernel} | {shape_name} | {counts['tile']} ({counts['step_tiles']}) / "
                  f"{counts['dot_loop']} ({counts['unrolled']}) / "
                  f"{counts['append_round']} / {counts['flush']} / {counts['flush_chunk']} / "
                  f"{counts['exact_per_8_features']:.0f} | {counts['warps']} | {figures['rescored_per_row']:.0f} | "
                  f"{figures['append_rounds_per_step']:.2f} | {figures['flushes_per_block']:.1f} | "
                  f"{figures['warp_instructions_per_score']:.2f} | {figures['issue_bound_us']:.0f} | "
                  f"{figures['tensor_core_bound_us']:.0f} | {figures['dram_bound_us']:.0f} | "
                  f"{figures['bound_us']:.0f} | {figures['set_by']} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--revision", help="a git revision whose kernels to report (default: the working tree)")
    parser.add_argument("--json", type=pathlib.Path, help="also write the figures as JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        if args.revision:
            check.REPO = sources_at(args.revision, folder)
        module = check.load_kernels("select")
        if not hasattr(module, "candidates_for"):  # a revision before issue 38: one tile width
            module.candidates_for = lambda k, mask_kind: module.CANDIDATES
        report = {"revision": args.revision or "working tree", "kernels": {}}
        print(f"Static cost report ({report['revision']}), sm_90, H100 SXM issue-rate bound\n")
        print("| kernel | shape | program: rows x tile, warps | SASS per tile: base / dot per 16 features / round / "
              "bitonic merge | skipped at D = 64 | aggregation: SASS per slot (or per block of channels, slots "
              "unrolled) | rounds per tile | "
              "bitonic tiles | warp instr. per score | bound (µs) | set by |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        counted = {}
        runs = {name: round_counts(module, *shape) for name, shape in SHAPES.items()}
        for family in FAMILIES:
            for shape_name, shape in SHAPES.items():
                kernel = f"{family} scaled_dot K<={module.slots_for(shape[3])} no mask"
                report_top_k_kernel(report, counted, module, kernel, shape_name, shape, runs[shape_name])
        if "bfloat16" in getattr(module, "INPUT_DTYPES", ()):  # the kernels reading bfloat16, at Table 1
            shape_name, shape = next(iter(SHAPES.items()))
            for family in FAMILIES:
                kernel = f"{family} scaled_dot K<={module.slots_for(shape[3])} no mask bfloat16 inputs"
                report_top_k_kernel(report, counted, module, kernel, shape_name, shape, runs[shape_name])
        if (check.REPO / "python/convnn/_triton/bounded_select.py").exists():
            report_bounded_select(report)
        if args.revision is None or (check.REPO / "python/convnn/_triton/attention_backward.py").exists():
            report_backward(report)
            if "sorts" in report:
                report_targets(report)
            if "sort_key_bytes" in report and "bounded_select" in report:
                report_training(report)
            report_walkers(report)
        else:
            print("\nknn_attention backward in two kernels: not in this revision (the backward composed the core ops)")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
