// A seeded fuzz of the six core ops through the dispatcher: knn_select, knn_aggregate,
// knn_attention and their _backward ops. Each case runs in a forked child with a time limit, so a
// crash or a hang is reported as that case's failure instead of ending the test binary.
//   - An illegal call (wrong ranks and shapes, zero-size dimensions, k out of range, integer and
//     mixed dtypes, NaN/Inf, masks of a wrong shape or dtype, indices out of range, unknown names,
//     bad temperatures, a tensor on another device, an undefined tensor) must raise a c10::Error
//     whose first line starts with the op's name and names the argument.
//   - A legal edge (fewer than k valid candidates, fully masked rows, exact ties, zero-size
//     dimensions, non-contiguous and stride-0 inputs, float32/bfloat16/float16) must equal the
//     float64 reference, gradients included.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <functional>
#include <random>
#include <sstream>

#include "convnn/ops/knn_ops.h"
#include "ops/reference/reference.h"
#include "support/assert_close.h"

namespace fuzz_test {  // apart from the files of its unity batch (tests/CMakeLists.txt)

namespace {

namespace ops = convnn::ops;
namespace reference = convnn::reference;
using convnn::testing::AllClose;
using convnn::testing::epsilon_of;

constexpr int kCases = 600;
constexpr unsigned kSecondsPerCase = 30;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
const std::vector<std::string>& kSimilarities = convnn::similarity_names();
const std::vector<std::string>& kRhos = convnn::rho_names();

// ------------------------------------------------------------------------------ isolation

// Runs `body` in a forked child, which reports "" (passed) or what went wrong through a pipe.
// A signal, a time-out or a non-zero exit becomes the case's failure message.
std::string run_isolated(const std::function<std::string()>& body, unsigned seconds = kSecondsPerCase) {
  int fds[2];
  if (pipe(fds) != 0) return std::string("pipe failed: ") + std::strerror(errno);
  const pid_t pid = fork();
  if (pid < 0) return std::string("fork failed: ") + std::strerror(errno);
  if (pid == 0) {
    close(fds[0]);
    alarm(seconds);
    at::set_num_threads(1);  // the child has no OpenMP pool of its own
    std::string failure;
    try {
      failure = body();
    } catch (const c10::Error& e) {
      failure = std::string("unexpected exception: ") + e.what_without_backtrace();
    } catch (const std::exception& e) {
      failure = std::string("unexpected exception: ") + e.what();
    }
    for (size_t sent = 0; sent < failure.size();) {
      const ssize_t n = write(fds[1], failure.data() + sent, failure.size() - sent);
      if (n <= 0 && errno != EINTR) break;
      if (n > 0) sent += static_cast<size_t>(n);
    }
    _exit(0);
  }
  close(fds[1]);
  std::string failure;
  char buffer[4096];
  for (;;) {
    const ssize_t n = read(fds[0], buffer, sizeof buffer);
    if (n > 0) failure.append(buffer, static_cast<size_t>(n));
    if (n == 0 || (n < 0 && errno != EINTR)) break;
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFSIGNALED(status)) {
    return WTERMSIG(status) == SIGALRM
               ? "hung: no result within " + std::to_string(seconds) + " s"
               : std::string("crashed: ") + strsignal(WTERMSIG(status));
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return "the case's process exited with status " + std::to_string(WEXITSTATUS(status));
  }
  return failure;
}

// ------------------------------------------------------------------------------ problems

enum class Op { Select, Aggregate, Attention, SelectBackward, AggregateBackward, AttentionBackward };
const char* op_name(Op op) {
  switch (op) {
    case Op::Select: return "knn_select";
    case Op::Aggregate: return "knn_aggregate";
    case Op::Attention: return "knn_attention";
    case Op::SelectBackward: return "knn_select_backward";
    case Op::AggregateBackward: return "knn_aggregate_backward";
    case Op::AttentionBackward: return "knn_attention_backward";
  }
  return "?";
}
bool selects(Op op) { return op == Op::Select || op == Op::Attention || op == Op::SelectBackward || op == Op::AttentionBackward; }
bool aggregates(Op op) { return op != Op::Select && op != Op::SelectBackward; }
bool has_rho(Op op) { return op == Op::Attention || op == Op::AttentionBackward; }
bool takes_mask(Op op) { return op == Op::Select || op == Op::Attention; }
bool takes_weights(Op op) { return op == Op::Aggregate || op == Op::AggregateBackward || op == Op::AttentionBackward; }
bool backward(Op op) { return op == Op::SelectBackward || op == Op::AggregateBackward || op == Op::AttentionBackward; }

// Every argument of every op; each op reads the ones it takes.
struct Problem {
  int64_t g = 1, n = 1, m = 1, d = 1, c = 1, k = 1;
  at::Tensor queries, keys, values, kernel, weights, indices, scores, grad;
  c10::optional<at::Tensor> bias, mask;
  std::string similarity = "dot", rho = "softmax";
  double temperature = 1.0;
  bool index_order = false;
};

class Random {
 public:
  explicit Random(uint64_t seed) : engine_(seed) {}
  int64_t integer(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(engine_); }
  bool coin(double p = 0.5) { return std::bernoulli_distribution(p)(engine_); }
  template <typename T>
  const T& pick(const std::vector<T>& v) { return v[static_cast<size_t>(integer(0, static_cast<int64_t>(v.size()) - 1))]; }
  at::Generator generator() { return at::make_generator<at::CPUGeneratorImpl>(engine_()); }

 private:
  std::mt19937_64 engine_;
};

at::Tensor normal(c10::IntArrayRef shape, Random& random, at::ScalarType dtype = at::kDouble) {
  return at::normal(0.0, 1.0, shape, random.generator(), at::TensorOptions().dtype(at::kDouble)).to(dtype);
}

// A legal float64 problem of small random shape; the saved forward tensors come from the op.
Problem legal_problem(Op op, Random& random) {
  Problem p;
  p.g = random.integer(1, 3);
  p.n = random.integer(1, 6);
  p.m = random.integer(1, 8);
  p.d = random.integer(1, 4);
  p.c = random.integer(1, 3);
  p.k = random.integer(1, p.m);
  p.similarity = random.pick(kSimilarities);
  p.rho = has_rho(op) ? random.pick(kRhos) : "softmax";
  p.index_order = random.coin();
  p.queries = normal({p.g, p.n, p.d}, random);
  p.keys = normal({p.g, p.m, p.d}, random);
  p.values = normal({p.g, p.m, p.c}, random);
  p.kernel = random.coin() ? normal({p.c, p.k}, random) : normal({random.integer(1, 3), p.c, p.k}, random);
  if (random.coin()) p.bias = normal({p.kernel.dim() == 2 ? p.c : p.kernel.size(0)}, random);
  p.indices = at::randint(p.m, {p.g, p.n, p.k}, random.generator(), at::TensorOptions().dtype(at::kLong));
  p.weights = normal({p.g, p.n, p.k}, random);
  p.scores = normal({p.g, p.n, p.k}, random);
  return p;
}

int64_t output_channels(const Problem& p) { return p.kernel.dim() == 2 ? p.c : p.kernel.size(0); }

// The gradient a backward op receives, and the forward tensors it needs, made from the problem.
void prepare_backward(Op op, Problem& p, Random& random) {
  if (op == Op::SelectBackward) {
    std::tie(p.scores, p.indices) = ops::knn_select(p.queries, p.keys, p.k, p.similarity, c10::nullopt, p.index_order);
    p.grad = normal({p.g, p.n, p.k}, random);
  } else if (op == Op::AttentionBackward) {
    at::Tensor output;
    std::tie(output, p.scores, p.indices, p.weights) =
        ops::knn_attention(p.queries, p.keys, p.values, p.kernel, p.bias, p.k, p.similarity, c10::nullopt,
                           p.index_order, p.rho, p.temperature);
    p.grad = normal(output.sizes(), random);
  } else if (op == Op::AggregateBackward) {
    p.grad = normal({p.g, p.n, output_channels(p)}, random);
  }
}

std::vector<at::Tensor> call(Op op, const Problem& p) {
  switch (op) {
    case Op::Select: {
      auto [s, i] = ops::knn_select(p.queries, p.keys, p.k, p.similarity, p.mask, p.index_order);
      return {s, i};
    }
    case Op::Aggregate: return {ops::knn_aggregate(p.values, p.weights, p.indices, p.kernel, p.bias)};
    case Op::Attention: {
      auto [o, s, i, w] = ops::knn_attention(p.queries, p.keys, p.values, p.kernel, p.bias, p.k, p.similarity,
                                             p.mask, p.index_order, p.rho, p.temperature);
      return {o, s, i, w};
    }
    case Op::SelectBackward: {
      auto [gq, gk] = ops::knn_select_backward(p.grad, p.queries, p.keys, p.indices, p.scores, p.similarity);
      return {gq, gk};
    }
    case Op::AggregateBackward: {
      auto [gv, gw, gker, gb] =
          ops::knn_aggregate_backward(p.grad, p.values, p.weights, p.indices, p.kernel, {true, true, true, true});
      return {gv, gw, gker, gb};
    }
    case Op::AttentionBackward: {
      auto [gq, gk, gv, gker, gb] =
          ops::knn_attention_backward(p.grad, p.queries, p.keys, p.values, p.kernel, p.scores, p.indices,
                                      p.weights, p.similarity, p.rho, p.temperature,
                                      {true, true, true, true, p.bias.has_value()});
      return {gq, gk, gv, gker, gb};
    }
  }
  return {};
}

// ------------------------------------------------------------------------------ illegal calls

// One way to break a call: the argument the error must name, and the change.
struct Mutation {
  std::string name;
  std::string argument;
  std::function<bool(Op)> applies;
  std::function<void(Problem&, Random&)> apply;
};

at::Tensor with_value_at_random(const at::Tensor& t, double value, Random& random) {
  auto out = t.clone();
  out.view({-1})[random.integer(0, t.numel() - 1)] = value;
  return out;
}

at::Tensor on_meta(const at::Tensor& t) { return at::empty(t.sizes(), t.options().device(at::kMeta)); }

std::vector<Mutation> mutations() {
  std::vector<Mutation> list{
      {"queries of rank 2", "queries", selects, [](Problem& p, Random&) { p.queries = p.queries[0]; }},
      {"keys of rank 4", "keys", selects, [](Problem& p, Random&) { p.keys = p.keys.unsqueeze(0); }},
      {"keys with another D", "keys", selects,
       [](Problem& p, Random& r) { p.keys = normal({p.g, p.m, p.d + 1}, r); }},
      {"keys with another G", "keys", selects,
       [](Problem& p, Random& r) { p.keys = normal({p.g + 1, p.m, p.d}, r); }},
      {"D = 0", "queries", selects, [](Problem& p, Random&) {
         p.queries = p.queries.narrow(2, 0, 0);
         p.keys = p.keys.narrow(2, 0, 0);
       }},
      {"integer queries", "queries", selects, [](Problem& p, Random&) { p.queries = p.queries.to(at::kLong); }},
      {"float32 keys beside float64 queries", "keys", selects,
       [](Problem& p, Random&) { p.keys = p.keys.to(at::kFloat); }},
      {"NaN in the queries", "queries", selects,
       [](Problem& p, Random& r) { p.queries = with_value_at_random(p.queries, kNaN, r); }},
      {"+inf in the keys", "keys", selects, [](Problem& p, Random& r) { p.keys = with_value_at_random(p.keys, kInf, r); }},
      {"-inf in the queries", "queries", selects,
       [](Problem& p, Random& r) { p.queries = with_value_at_random(p.queries, -kInf, r); }},
      {"keys on another device", "keys", selects, [](Problem& p, Random&) { p.keys = on_meta(p.keys); }},
      {"unknown similarity", "similarity", selects, [](Problem& p, Random&) { p.similarity = "euclidean"; }},
      {"values of rank 2", "values", aggregates, [](Problem& p, Random&) { p.values = p.values[0]; }},
      {"integer values", "values", aggregates, [](Problem& p, Random&) { p.values = p.values.to(at::kInt); }},
      {"values on another device", "values", aggregates, [](Problem& p, Random&) { p.values = on_meta(p.values); }},
      {"kernel with another K", "kernel", aggregates, [](Problem& p, Random& r) {
         auto sizes = p.kernel.sizes().vec();
         sizes.back() += 1;
         p.kernel = normal(sizes, r);
       }},
      {"kernel of rank 1", "kernel", aggregates, [](Problem& p, Random&) { p.kernel = p.kernel.flatten(); }},
      {"float32 kernel", "kernel", aggregates, [](Problem& p, Random&) { p.kernel = p.kernel.to(at::kFloat); }},
      {"undefined kernel", "kernel", aggregates, [](Problem& p, Random&) { p.kernel = at::Tensor(); }},
      {"bias of another length", "bias", [](Op op) { return op == Op::Aggregate || op == Op::Attention; },
       [](Problem& p, Random& r) { p.bias = normal({output_channels(p) + 1}, r); }},
      {"float32 bias", "bias", [](Op op) { return op == Op::Aggregate || op == Op::Attention; },
       [](Problem& p, Random& r) { p.bias = normal({output_channels(p)}, r, at::kFloat); }},
      {"weights of another K", "weights", takes_weights,
       [](Problem& p, Random& r) { p.weights = normal({p.g, p.n, p.k + 1}, r); }},
      {"int32 indices", "indices", [](Op op) { return op != Op::Select && op != Op::Attention; },
       [](Problem& p, Random&) { p.indices = p.indices.to(at::kInt); }},
      {"indices of rank 2", "indices", [](Op op) { return op != Op::Select && op != Op::Attention; },
       [](Problem& p, Random&) { p.indices = p.indices[0]; }},
      {"an index of M", "indices", [](Op op) { return op != Op::Select && op != Op::Attention; },
       [](Problem& p, Random& r) { p.indices = with_value_at_random(p.indices, static_cast<double>(p.m), r); }},
      {"an index of -1", "indices", [](Op op) { return op != Op::Select && op != Op::Attention; },
       [](Problem& p, Random& r) { p.indices = with_value_at_random(p.indices, -1.0, r); }},
      {"undefined indices", "indices", [](Op op) { return op != Op::Select && op != Op::Attention; },
       [](Problem& p, Random&) { p.indices = at::Tensor(); }},
      {"k = 0", "k", [](Op op) { return op == Op::Select || op == Op::Attention; },
       [](Problem& p, Random&) { p.k = 0; }},
      {"k = M + 1", "k", [](Op op) { return op == Op::Select || op == Op::Attention; },
       [](Problem& p, Random&) { p.k = p.m + 1; }},
      {"k = -3", "k", [](Op op) { return op == Op::Select || op == Op::Attention; },
       [](Problem& p, Random&) { p.k = -3; }},
      {"M = 0", "k", [](Op op) { return op == Op::Select || op == Op::Attention; }, [](Problem& p, Random&) {
         p.keys = p.keys.narrow(1, 0, 0);
         p.values = p.values.narrow(1, 0, 0);
       }},
      {"mask of the wrong shape", "mask", takes_mask,
       [](Problem& p, Random&) { p.mask = at::ones({p.n, p.m + 1}, at::kBool); }},
      {"mask of rank 1", "mask", takes_mask, [](Problem& p, Random&) { p.mask = at::ones({p.m}, at::kBool); }},
      {"integer mask", "mask", takes_mask, [](Problem& p, Random&) { p.mask = at::ones({p.n, p.m}, at::kInt); }},
      {"mask on another device", "mask", takes_mask,
       [](Problem& p, Random&) { p.mask = at::empty({p.n, p.m}, at::TensorOptions().dtype(at::kBool).device(at::kMeta)); }},
      {"additive mask of 0.5 with a distance similarity", "mask", takes_mask, [](Problem& p, Random&) {
         p.similarity = "gaussian";
         p.mask = at::full({p.n, p.m}, 0.5, at::kDouble);
       }},
      {"unknown rho", "rho", has_rho, [](Problem& p, Random&) { p.rho = "max"; }},
      {"temperature 0", "temperature", has_rho, [](Problem& p, Random&) { p.temperature = 0.0; }},
      {"temperature -1", "temperature", has_rho, [](Problem& p, Random&) { p.temperature = -1.0; }},
      {"temperature NaN", "temperature", has_rho, [](Problem& p, Random&) { p.temperature = kNaN; }},
      {"temperature inf", "temperature", has_rho, [](Problem& p, Random&) { p.temperature = kInf; }},
      {"temperature 1e-40 (a float32 denormal)", "temperature", has_rho,
       [](Problem& p, Random&) { p.temperature = 1e-40; }},
      {"gradient of the wrong shape", "", backward,
       [](Problem& p, Random& r) { p.grad = normal({p.g, p.n + 1, p.grad.size(2)}, r); }},
      {"float32 gradient", "", backward, [](Problem& p, Random&) { p.grad = p.grad.to(at::kFloat); }},
      {"undefined gradient", "", backward, [](Problem& p, Random&) { p.grad = at::Tensor(); }},
      {"scores of the wrong shape", "scores", [](Op op) { return op == Op::SelectBackward || op == Op::AttentionBackward; },
       [](Problem& p, Random&) { p.scores = p.scores.narrow(1, 0, p.n - 1); }},
  };
  return list;
}

// The argument that carries the incoming gradient of a backward op.
std::string gradient_argument(Op op) { return op == Op::SelectBackward ? "grad_scores" : "grad_output"; }

// Whether `word` stands in `text` as a whole word (so "k" is not found inside "knn_select").
bool has_word(const std::string& text, const std::string& word) {
  const auto is_word_char = [](char ch) { return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_'; };
  for (size_t at = text.find(word); at != std::string::npos; at = text.find(word, at + 1)) {
    const bool starts = at == 0 || !is_word_char(text[at - 1]);
    const bool ends = at + word.size() == text.size() || !is_word_char(text[at + word.size()]);
    if (starts && ends) return true;
  }
  return false;
}

std::string expect_named_error(Op op, const Problem& p, const std::string& argument) {
  try {
    call(op, p);
  } catch (const c10::Error& e) {
    const std::string message = e.what_without_backtrace();
    const std::string first_line = message.substr(0, message.find('\n'));
    const std::string prefix = std::string(op_name(op)) + ": ";
    if (first_line.rfind(prefix, 0) != 0) return "the error does not start with '" + prefix + "': " + first_line;
    if (!has_word(first_line, argument)) return "the error does not name '" + argument + "': " + first_line;
    return "";
  }
  return "no error was raised";
}

// ------------------------------------------------------------------------------ legal edges

constexpr double kFloat64Tolerance = 1e-9;

std::string compare(const std::string& what, const at::Tensor& actual, const at::Tensor& expected, double tol) {
  if (!actual.defined() && !expected.defined()) return "";
  if (!actual.defined() || !expected.defined()) {
    // An undefined gradient means zero.
    const auto& defined = actual.defined() ? actual : expected;
    return defined.numel() == 0 || defined.abs().max().item<double>() == 0 ? "" : what + ": one side undefined";
  }
  if (actual.sizes() != expected.sizes()) {
    std::ostringstream s;
    s << what << ": shape " << actual.sizes() << " against " << expected.sizes();
    return s.str();
  }
  const auto result = AllClose(actual.to(at::kDouble), expected.to(at::kDouble), tol, tol);
  return result ? "" : what + ": " + result.message();
}

std::string compare_indices(const at::Tensor& actual, const at::Tensor& expected) {
  return at::equal(actual, expected) ? "" : "indices differ from the reference";
}

// Gradients of sum(f(inputs) * grad) through ATen autograd: the reference's backward.
std::vector<at::Tensor> reference_gradients(const std::function<at::Tensor(const std::vector<at::Tensor>&)>& f,
                                            std::vector<at::Tensor> inputs, const at::Tensor& grad) {
  std::vector<at::Tensor> leaves;
  for (auto& t : inputs) {
    if (t.defined()) t = t.detach().requires_grad_(true);
    leaves.push_back(t);
  }
  at::AutoGradMode enable(true);
  const auto out = f(inputs);
  if (!out.requires_grad()) {
    // The reference returns an empty output unconnected to its inputs: every gradient is zero.
    std::vector<at::Tensor> zeros;
    for (const auto& t : leaves) zeros.push_back(t.defined() ? at::zeros_like(t) : at::Tensor());
    return zeros;
  }
  std::vector<at::Tensor> defined;
  for (const auto& t : leaves) {
    if (t.defined()) defined.push_back(t);
  }
  auto grads = torch::autograd::grad({out}, defined, {grad}, /*retain_graph=*/false, /*create_graph=*/false,
                                     /*allow_unused=*/true);
  std::vector<at::Tensor> result;
  size_t next = 0;
  for (const auto& t : leaves) result.push_back(t.defined() ? grads[next++] : at::Tensor());
  return result;
}

std::string check_legal(Op op, const Problem& p) {
  const auto similarity = convnn::parse_similarity(p.similarity);
  const auto rho = convnn::parse_rho(p.rho);
  const auto outputs = call(op, p);
  const double tol = kFloat64Tolerance;
  std::string failure;
  const auto note = [&](const std::string& f) {
    if (failure.empty()) failure = f;
  };
  switch (op) {
    case Op::Select: {
      auto [s, i] = reference::knn_select(p.queries, p.keys, p.k, similarity, p.mask, p.index_order);
      note(compare_indices(outputs[1], i));
      note(compare("scores", outputs[0], s, tol));
      break;
    }
    case Op::Aggregate:
      note(compare("output", outputs[0], reference::knn_aggregate(p.values, p.weights, p.indices, p.kernel, p.bias), tol));
      break;
    case Op::Attention: {
      auto [o, s, i, w] = reference::knn_attention(p.queries, p.keys, p.values, p.kernel, p.bias, p.k, similarity,
                                                   p.mask, p.index_order, rho, p.temperature);
      note(compare_indices(outputs[2], i));
      note(compare("output", outputs[0], o, tol));
      note(compare("scores", outputs[1], s, tol));
      note(compare("weights", outputs[3], w, tol));
      break;
    }
    case Op::SelectBackward: {
      // The reference's backward: the written convention at non-differentiable points (the first
      // coordinate of a chebyshev tie), which autograd through amax would split instead.
      auto [gq, gk] = reference::knn_select_backward(p.grad, p.queries, p.keys, p.indices, p.scores, similarity);
      note(compare("grad_queries", outputs[0], gq, tol));
      note(compare("grad_keys", outputs[1], gk, tol));
      break;
    }
    case Op::AggregateBackward: {
      const auto grads = reference_gradients(
          [&](const std::vector<at::Tensor>& x) { return reference::knn_aggregate(x[0], x[1], p.indices, x[2], c10::nullopt); },
          {p.values, p.weights, p.kernel}, p.grad);
      note(compare("grad_values", outputs[0], grads[0], tol));
      note(compare("grad_weights", outputs[1], grads[1], tol));
      note(compare("grad_kernel", outputs[2], grads[2], tol));
      note(compare("grad_bias", outputs[3], p.grad.sum(at::IntArrayRef{0, 1}), tol));
      break;
    }
    case Op::AttentionBackward: {
      // rho and the aggregation through ATen autograd from the op's own scores and indices, then
      // the reference select backward for the queries and keys.
      const auto grads = reference_gradients(
          [&](const std::vector<at::Tensor>& x) {
            const auto weights = reference::rho_weights(x[0], rho, p.temperature);
            return reference::knn_aggregate(x[1], weights, p.indices, x[2], c10::nullopt);
          },
          {p.scores, p.values, p.kernel}, p.grad);
      at::Tensor gq, gk;
      if (grads[0].defined() && convnn::rho_has_score_gradient(rho)) {
        std::tie(gq, gk) = reference::knn_select_backward(grads[0], p.queries, p.keys, p.indices, p.scores, similarity);
      }
      note(compare("grad_queries", outputs[0], gq, tol));
      note(compare("grad_keys", outputs[1], gk, tol));
      note(compare("grad_values", outputs[2], grads[1], tol));
      note(compare("grad_kernel", outputs[3], grads[2], tol));
      if (p.bias.has_value()) note(compare("grad_bias", outputs[4], p.grad.sum(at::IntArrayRef{0, 1}), tol));
      break;
    }
  }
  return failure;
}

// Reduced precision: the op in `dtype` against the float64 reference on the same (rounded)
// inputs, given the op's own selection, within a tolerance scaled by the dtype's epsilon.
std::string check_precision(Op op, const Problem& p64, at::ScalarType dtype) {
  Problem p = p64;
  for (auto* t : {&p.queries, &p.keys, &p.values, &p.kernel, &p.weights, &p.scores, &p.grad}) {
    if (t->defined()) *t = t->to(dtype);
  }
  if (p.bias) p.bias = p.bias->to(dtype);
  Problem rounded = p;  // the rounded inputs, back in float64
  for (auto* t : {&rounded.queries, &rounded.keys, &rounded.values, &rounded.kernel, &rounded.weights}) {
    *t = t->to(at::kDouble);
  }
  if (rounded.bias) rounded.bias = rounded.bias->to(at::kDouble);
  const auto similarity = convnn::parse_similarity(p.similarity);
  const auto outputs = call(op, p);
  const double eps = epsilon_of(dtype);
  if (op == Op::Aggregate) {
    const auto expected = reference::knn_aggregate(rounded.values, rounded.weights, p.indices, rounded.kernel, rounded.bias);
    return compare("output", outputs[0], expected, 16 * eps * (1 + expected.abs().max().item<double>()));
  }
  // Select and attention: the chosen candidates score, in float64, within rounding of the best.
  const auto indices = outputs[op == Op::Select ? 1 : 2];
  const auto exact = reference::ranking_keys(rounded.queries, rounded.keys, similarity, c10::nullopt);
  const auto kth = std::get<0>(exact.topk(p.k, -1)).select(-1, p.k - 1).unsqueeze(-1);
  const auto chosen = exact.gather(-1, indices);
  const double slack = 64 * eps * (1 + exact.abs().max().item<double>());
  if (!(chosen >= kth - slack).all().item<bool>()) return "a chosen candidate is not among the top k within rounding";
  if (op == Op::Select) return "";
  const auto weights = reference::rho_weights(reference::selected_scores(rounded.queries, rounded.keys, indices, similarity),
                                              convnn::parse_rho(p.rho), p.temperature);
  const auto expected = reference::knn_aggregate(rounded.values, weights, indices, rounded.kernel, rounded.bias);
  return compare("output", outputs[0], expected, 64 * eps * (1 + expected.abs().max().item<double>()));
}

// A legal edge applied to a float64 problem of `op`, described by its name.
struct Edge {
  std::string name;
  std::function<bool(Op)> applies;
  std::function<void(Problem&, Random&)> apply;
};

std::vector<Edge> edges() {
  const auto any = [](Op) { return true; };
  return {
      {"plain", any, [](Problem&, Random&) {}},
      {"fewer than k valid candidates", takes_mask, [](Problem& p, Random& r) {
         p.mask = at::rand({p.n, p.m}, r.generator(), at::kDouble) < 0.3;
       }},
      {"a fully masked row", takes_mask, [](Problem& p, Random& r) {
         auto allowed = at::rand({p.g, p.n, p.m}, r.generator(), at::kDouble) < 0.7;
         allowed.select(1, r.integer(0, p.n - 1)).fill_(false);
         p.mask = allowed;
       }},
      {"an additive -inf mask", takes_mask, [](Problem& p, Random& r) {
         p.mask = at::zeros({p.n, p.m}, at::kDouble).masked_fill(at::rand({p.n, p.m}, r.generator(), at::kDouble) < 0.4, -kInf);
       }},
      {"exact ties (integer features)", selects, [](Problem& p, Random& r) {
         const auto opts = at::TensorOptions().dtype(at::kDouble);
         p.queries = at::randint(-2, 3, p.queries.sizes(), r.generator(), opts);
         p.keys = at::randint(-2, 3, p.keys.sizes(), r.generator(), opts);
       }},
      {"G = 0", any, [](Problem& p, Random&) {
         p.g = 0;
         for (auto* t : {&p.queries, &p.keys, &p.values, &p.weights, &p.indices, &p.scores}) *t = t->narrow(0, 0, 0);
       }},
      {"N = 0", any, [](Problem& p, Random&) {
         p.n = 0;
         for (auto* t : {&p.queries, &p.weights, &p.indices, &p.scores}) *t = t->narrow(1, 0, 0);
       }},
      {"C = 0 (depthwise)", aggregates, [](Problem& p, Random&) {
         p.c = 0;
         p.values = p.values.narrow(2, 0, 0);
         p.kernel = at::zeros({0, p.k}, at::kDouble);
         p.bias = c10::nullopt;
       }},
      {"non-contiguous inputs", any, [](Problem& p, Random&) {
         for (auto* t : {&p.queries, &p.keys, &p.values, &p.weights}) *t = t->transpose(1, 2).contiguous().transpose(1, 2);
       }},
      {"stride-0 (expanded) inputs", any, [](Problem& p, Random&) {
         p.queries = p.queries.narrow(1, 0, 1).expand({p.g, p.n, p.d});
         p.values = p.values.narrow(2, 0, 1).expand({p.g, p.m, p.c});
         p.weights = p.weights.narrow(2, 0, 1).expand({p.g, p.n, p.k});
       }},
  };
}

// ------------------------------------------------------------------------------ the fuzz

struct Case {
  std::string description;
  std::function<std::string()> run;
};

Case make_case(int index, Random& random) {
  static const auto all_mutations = mutations();
  static const auto all_edges = edges();
  const Op op = static_cast<Op>(random.integer(0, 5));
  const uint64_t seed = static_cast<uint64_t>(random.integer(0, 1 << 30));
  std::ostringstream d;
  d << "case " << index << ", " << op_name(op) << ": ";
  const int64_t kind = random.integer(0, 9);
  if (kind < 6) {
    std::vector<const Mutation*> fitting;
    for (const auto& m : all_mutations) {
      if (m.applies(op)) fitting.push_back(&m);
    }
    const Mutation& m = *random.pick(fitting);
    d << "illegal: " << m.name;
    return {d.str(), [op, seed, &m] {
              Random r(seed);
              auto p = legal_problem(op, r);
              prepare_backward(op, p, r);
              m.apply(p, r);
              return expect_named_error(op, p, m.argument.empty() ? gradient_argument(op) : m.argument);
            }};
  }
  if (kind < 8) {
    std::vector<const Edge*> fitting;
    for (const auto& e : all_edges) {
      if (e.applies(op)) fitting.push_back(&e);
    }
    const Edge& e = *random.pick(fitting);
    d << "legal: " << e.name;
    return {d.str(), [op, seed, &e] {
              Random r(seed);
              auto p = legal_problem(op, r);
              e.apply(p, r);
              prepare_backward(op, p, r);
              const auto failure = check_legal(op, p);
              return failure.empty() ? failure : failure + " [similarity " + p.similarity + ", rho " + p.rho + "]";
            }};
  }
  const bool forward_op = op == Op::Select || op == Op::Aggregate || op == Op::Attention;
  const Op precision_op = forward_op ? op : Op::Aggregate;
  const at::ScalarType dtype = random.pick(std::vector<at::ScalarType>{at::kFloat, at::kBFloat16, at::kHalf});
  d.str("");
  d << "case " << index << ", " << op_name(precision_op) << ": legal: " << c10::toString(dtype) << " inputs";
  return {d.str(), [precision_op, seed, dtype] {
            Random r(seed);
            auto p = legal_problem(precision_op, r);
            if (p.similarity == "chebyshev" || p.similarity == "cosine" || p.similarity == "l1") {
              p.similarity = "dot";
            }
            return check_precision(precision_op, p, dtype);
          }};
}

TEST(OpsFuzz, IllegalCallsNameOpAndArgumentAndLegalEdgesEqualTheFloat64Reference) {
  Random random(20261123);
  int failures = 0;
  for (int i = 0; i < kCases; ++i) {
    const auto c = make_case(i, random);
    const auto failure = run_isolated(c.run);
    if (!failure.empty()) {
      ++failures;
      ADD_FAILURE() << c.description << "\n  " << failure;
    }
  }
  EXPECT_EQ(failures, 0) << "of " << kCases << " cases";
}

// The isolation itself: a crash and a hang in a case are reported, not lost. The crash is a
// SIGKILL, which no sanitizer intercepts, so the test means the same in the sanitizer build.
TEST(OpsFuzz, IsolationReportsACrashAndAHang) {
  EXPECT_NE(run_isolated([] {
              raise(SIGKILL);
              return std::string();
            }).find("crashed"),
            std::string::npos);
  EXPECT_NE(run_isolated(
                [] {
                  for (;;) pause();
                  return std::string();
                },
                1)
                .find("hung"),
            std::string::npos);
  EXPECT_EQ(run_isolated([] { return std::string("told"); }), "told");
}

}  // namespace

}  // namespace fuzz_test
