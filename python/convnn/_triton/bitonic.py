"""A bitonic network over the rows of a tile (the running top-K of select.py shared by a row's
threads): the K largest keys of each row, sorted. Keys are distinct int64 (select.py's packed
ranking keys), so the networks' results are exact whatever the order of their steps.

Written here rather than taken from tl.sort / tl.topk / tl.flip: those exchange a pair through an
xor reduction, which Triton's CPU interpreter (where these kernels are proven: no GPU here) runs
element by element in Python, about 100 times slower than a sum (measured: a select call 3.5 s
against 0.6 s before the network). Here the partner of a key is the pair's sum less the key, exact
in wrapping int64 arithmetic, and sums run as numpy sums in the interpreter and as one shuffle per
step on a GPU, as the xor does.

A row of W = 2^B keys is viewed as a hypercube [rows, 2, ..., 2] (B axes of 2): the axis of bit b
of a key's position in its row is axis B - b.
"""
import triton
import triton.language as tl


@triton.constexpr_function
def _log2(n):
    if n <= 0 or n & (n - 1):
        raise ValueError(f"bitonic networks take powers of two, not {n}")
    return n.bit_length() - 1


@triton.constexpr_function
def _hypercube(rows, bits):
    return [rows] + [2] * bits


@triton.constexpr_function
def _axis_shape(bits, bit):
    """The shape, over a hypercube of `bits` position bits, of a tensor that varies along bit `bit`."""
    return [1] + [2 if axis == bits - bit else 1 for axis in range(1, bits + 1)]


@triton.jit
def _position_bit(BITS: tl.constexpr, BIT: tl.constexpr):
    """Bit BIT of every position (0 or 1), broadcastable over the hypercube view."""
    return tl.reshape(tl.arange(0, 2), _axis_shape(BITS, BIT))


@triton.jit
def _exchange(h, BITS: tl.constexpr, BIT: tl.constexpr, larger_here):
    """Compare-exchange of the pairs that differ in bit BIT: each position keeps the larger key of
    its pair where larger_here is 1 and the smaller where it is 0."""
    partner = tl.sum(h, BITS - BIT, keep_dims=True) - h
    return tl.where((h > partner) == (larger_here != 0), h, partner)


@triton.jit
def _merge(h, BITS: tl.constexpr, BLOCK_BITS: tl.constexpr, DESCENDING: tl.constexpr):
    """Sorts each block of 2^BLOCK_BITS positions that holds a bitonic sequence. Blocks alternate
    direction (ascending where bit BLOCK_BITS of the position is 0) while there are several; a block
    that is the whole row is sorted descending if DESCENDING, else ascending."""
    if BLOCK_BITS < BITS:
        direction = _position_bit(BITS, BLOCK_BITS)
    else:
        direction = tl.full(_axis_shape(BITS, 0), DESCENDING, tl.int32)
    for step in tl.static_range(BLOCK_BITS):  # bits BLOCK_BITS - 1 down to 0
        h = _exchange(h, BITS, BLOCK_BITS - 1 - step, _position_bit(BITS, BLOCK_BITS - 1 - step) ^ direction)
    return h


@triton.jit
def largest(x, K: tl.constexpr, DESCENDING: tl.constexpr):
    """The K largest keys of each row of x [R, W] (K and W powers of two, K <= W), sorted descending
    if DESCENDING, else ascending: blocks of K sorted by the network, then halved L - log2(K)
    times (the larger of two opposite sorted blocks, position by position, is a bitonic block that
    holds the pair's K largest) and merged again."""
    R: tl.constexpr = x.shape[0]
    BITS: tl.constexpr = _log2(x.shape[1])
    KEEP: tl.constexpr = _log2(K)
    h = tl.reshape(x, _hypercube(R, BITS))
    for block_bits in tl.static_range(1, KEEP + 1):
        h = _merge(h, BITS, block_bits, DESCENDING)
    for halving in tl.static_range(BITS - KEEP):
        h = tl.max(h, BITS - halving - KEEP)  # the axis of bit KEEP
        h = _merge(h, BITS - halving - 1, KEEP, DESCENDING)
    return tl.reshape(h, [R, K])


@triton.jit
def sorted_bitonic(x, DESCENDING: tl.constexpr):
    """Each row of x [R, W] (W a power of two) sorted, where every row holds a bitonic sequence: e.g.
    the larger of a descending and an ascending sorted row, position by position, which also holds
    the pair's W largest keys."""
    R: tl.constexpr = x.shape[0]
    BITS: tl.constexpr = _log2(x.shape[1])
    return tl.reshape(_merge(tl.reshape(x, _hypercube(R, BITS)), BITS, BITS, DESCENDING), [R, x.shape[1]])
