"""The similarities as the Triton kernels know them (issue 38 §4): one table of names, in the order
of the C++ Similarity enum (torch.ops.convnn.similarity_names(); python/tests/test_triton_kernels.py
holds the two equal, and the C++ launchers name their kernels by the same enum order), the codes
the kernels are compiled for, and the groups the kernels branch on. Every branch on a code names its
similarity; a code no branch knows fails the kernel's compilation (tl.static_assert), so a seventh
similarity cannot silently take another one's arithmetic.

The kernels' modules import only this file, not convnn (scripts/triton_aot.py and
scripts/triton_compile_check.py compile them before the C++ library exists), which is why the names
are written here and checked against the library instead of read from it.
"""
import triton
import triton.language as tl

NAMES = ("dot", "scaled_dot", "cosine", "gaussian", "chebyshev", "l1")
CODES = {name: code for code, name in enumerate(NAMES)}

DOT = tl.constexpr(CODES["dot"])
SCALED_DOT = tl.constexpr(CODES["scaled_dot"])
COSINE = tl.constexpr(CODES["cosine"])
GAUSSIAN = tl.constexpr(CODES["gaussian"])
CHEBYSHEV = tl.constexpr(CODES["chebyshev"])
L1 = tl.constexpr(CODES["l1"])

# Scores from dot products (cosine's scaled by the rows' inverse norms afterwards), and the
# distances, ranked by minus the distance and reported as exp(-distance). (Globals that a
# constexpr_function reads must be constexpr, and what it calls a constexpr_function: Triton hashes
# them into the kernel's cache key.)
_DOT_PRODUCTS = tl.constexpr((CODES["dot"], CODES["scaled_dot"], CODES["cosine"]))
_DISTANCES = tl.constexpr((CODES["gaussian"], CODES["chebyshev"], CODES["l1"]))


@triton.constexpr_function
def known(code):
    """The code, or a compile-time error for one no similarity has."""
    if code not in _DOT_PRODUCTS.value + _DISTANCES.value:
        raise ValueError(f"unknown similarity code {code}: similarities.py names codes 0 to 5")
    return code


@triton.constexpr_function
def is_dot_product(code):
    return known(code) in _DOT_PRODUCTS.value


@triton.constexpr_function
def is_distance(code):
    return known(code) in _DISTANCES.value
