#include "convnn/ops/rho.h"

#include "util/enum_names.h"

namespace convnn {
namespace {

constexpr detail::NameTable<Rho, 3> kRhoNames{
    {{"uniform", Rho::Uniform}, {"mean", Rho::Mean}, {"softmax", Rho::Softmax}}};

}  // namespace

Rho parse_rho(std::string_view name) { return parse_rho_argument(name, "rho"); }

Rho parse_rho_argument(std::string_view name, const char* argument) {
  return detail::parse_name(kRhoNames, name, argument);
}

const char* to_string(Rho rho) { return detail::name_of(kRhoNames, rho); }

}  // namespace convnn
