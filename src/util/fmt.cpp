// fmt's compiled part, once, in libconvnn_ops, which every convnn library and the command link.
// LibTorch puts fmt's headers on the include path but exports none of fmt's compiled functions, so
// either every file that formats compiles them (header-only mode: vformat, the float formatting,
// ... in each such file, 2-4 s of compile time per file, issue 44) or one file does, here. fmt's
// headers declare these functions, and `extern` the templates instantiated below, when
// FMT_HEADER_ONLY is not defined (the top-level CMakeLists.txt, fmt::fmt).
#include <fmt/format-inl.h>

FMT_BEGIN_NAMESPACE
namespace detail {
// The function templates that format.h declares and only format-inl.h defines, for `char` (convnn
// formats no wide strings): fmt 12.1's list, the fmt of the pinned torch. Another fmt whose list
// differs fails at link time, naming the template missing here.
template FMT_API auto dragonbox::to_decimal(float x) noexcept -> dragonbox::decimal_fp<float>;
template FMT_API auto dragonbox::to_decimal(double x) noexcept -> dragonbox::decimal_fp<double>;
template FMT_API auto thousands_sep_impl(locale_ref) -> thousands_sep_result<char>;
template FMT_API auto decimal_point_impl(locale_ref) -> char;
}  // namespace detail
FMT_END_NAMESPACE
