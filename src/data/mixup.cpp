// timm's Mixup in batch mode (timm/data/mixup.py: Mixup._params_per_batch, _mix_batch,
// cutmix_bbox_and_lam with correct_lam, rand_bbox, mixup_target), on a float32 batch in place.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>

#include "convnn/data/transforms.h"

namespace convnn::data {
namespace {

void check_options(const MixupOptions& o) {
  TORCH_CHECK(std::isfinite(o.mixup_alpha) && o.mixup_alpha >= 0.0,
              "mixup_cutmix: mixup_alpha must be finite and >= 0 (0: off), got ", o.mixup_alpha);
  TORCH_CHECK(std::isfinite(o.cutmix_alpha) && o.cutmix_alpha >= 0.0,
              "mixup_cutmix: cutmix_alpha must be finite and >= 0 (0: off), got ", o.cutmix_alpha);
  TORCH_CHECK(o.mixup_alpha > 0.0 || o.cutmix_alpha > 0.0,
              "mixup_cutmix: mixup_alpha or cutmix_alpha must be > 0, got both 0");
  TORCH_CHECK(o.switch_probability >= 0.0 && o.switch_probability <= 1.0,
              "mixup_cutmix: switch_probability must be in [0, 1], got ", o.switch_probability);
  TORCH_CHECK(o.probability >= 0.0 && o.probability <= 1.0,
              "mixup_cutmix: probability must be in [0, 1], got ", o.probability);
  TORCH_CHECK(o.label_smoothing >= 0.0 && o.label_smoothing <= 1.0,
              "mixup_cutmix: label_smoothing must be in [0, 1], got ", o.label_smoothing);
}

void check_batch(const at::Tensor& images, const at::Tensor& labels, int64_t num_classes) {
  TORCH_CHECK(images.defined() && images.dim() == 4 && images.scalar_type() == at::kFloat &&
                  images.is_contiguous() && images.device().is_cpu(),
              "mixup_cutmix: images must be a contiguous CPU float32 [B, C, H, W] tensor, got ",
              images.defined() ? images.toString() : "undefined", " of shape ",
              images.defined() ? images.sizes() : at::IntArrayRef{});
  TORCH_CHECK(images.size(0) > 0 && images.numel() > 0,
              "mixup_cutmix: images must be non-empty, got shape ", images.sizes());
  TORCH_CHECK(num_classes > 0, "mixup_cutmix: num_classes must be positive, got ", num_classes);
  TORCH_CHECK(labels.defined() && labels.dim() == 1 && labels.scalar_type() == at::kLong &&
                  labels.size(0) == images.size(0),
              "mixup_cutmix: labels must be an int64 [B] tensor with B = ", images.size(0),
              ", got ", labels.defined() ? labels.toString() : "undefined", " of shape ",
              labels.defined() ? labels.sizes() : at::IntArrayRef{});
  const auto low = labels.min().item<int64_t>(), high = labels.max().item<int64_t>();
  TORCH_CHECK(low >= 0 && high < num_classes,
              "mixup_cutmix: labels must be in [0, num_classes = ", num_classes,
              "), got values in [", low, ", ", high, "]");
}

// timm's _params_per_batch: whether to mix, CutMix or MixUp, and the Beta draw.
MixResult draw_params(const MixupOptions& o, Rng& rng) {
  MixResult r;
  if (rng.uniform() >= o.probability) return r;
  if (o.mixup_alpha > 0.0 && o.cutmix_alpha > 0.0) {
    r.cutmix = rng.uniform() < o.switch_probability;
  } else {
    r.cutmix = o.cutmix_alpha > 0.0;
  }
  const double alpha = r.cutmix ? o.cutmix_alpha : o.mixup_alpha;
  r.lambda = rng.beta(alpha, alpha);
  return r;
}

// timm's rand_bbox (cut sides sqrt(1 - lambda) of the image's, uniform centre, clipped) and the
// corrected lambda, one minus the box's share of the image.
void cutmix_box(MixResult& r, int64_t height, int64_t width, Rng& rng) {
  const double cut = std::sqrt(1.0 - r.lambda);
  const auto cut_h = static_cast<int64_t>(static_cast<double>(height) * cut);
  const auto cut_w = static_cast<int64_t>(static_cast<double>(width) * cut);
  const int64_t cy = rng.below(height), cx = rng.below(width);
  const int64_t y0 = std::clamp<int64_t>(cy - cut_h / 2, 0, height);
  const int64_t y1 = std::clamp<int64_t>(cy + cut_h / 2, 0, height);
  const int64_t x0 = std::clamp<int64_t>(cx - cut_w / 2, 0, width);
  const int64_t x1 = std::clamp<int64_t>(cx + cut_w / 2, 0, width);
  r.box = {y0, x0, y1 - y0, x1 - x0};
  r.lambda =
      1.0 - static_cast<double>(r.box.height * r.box.width) / static_cast<double>(height * width);
}

// Image i takes the box from image B-1-i: swapping the pair's boxes does both at once.
void paste_box(float* x, int64_t batch, int64_t channels, int64_t height, int64_t width,
               const CropBox& box) {
  const int64_t image = channels * height * width;
  for (int64_t i = 0; i < batch / 2; ++i) {
    float* a = x + i * image;
    float* b = x + (batch - 1 - i) * image;
    for (int64_t c = 0; c < channels; ++c) {
      for (int64_t y = box.top; y < box.top + box.height; ++y) {
        const int64_t offset = (c * height + y) * width + box.left;
        std::swap_ranges(a + offset, a + offset + box.width, b + offset);
      }
    }
  }
}

// x_i = lambda x_i + (1 - lambda) x_{B-1-i}, in float32 as timm's mul_/add_.
void blend_pairs(float* x, int64_t batch, int64_t image, double lambda) {
  const auto keep = static_cast<float>(lambda), take = static_cast<float>(1.0 - lambda);
  for (int64_t i = 0; i < batch / 2; ++i) {
    float* a = x + i * image;
    float* b = x + (batch - 1 - i) * image;
    for (int64_t j = 0; j < image; ++j) {
      const float va = a[j], vb = b[j];
      a[j] = va * keep + vb * take;
      b[j] = vb * keep + va * take;
    }
  }
}

// timm's mixup_target: smoothed one-hot rows of y and of flip(y), mixed with lambda.
at::Tensor mixed_targets(const at::Tensor& labels, int64_t num_classes, double lambda,
                         double smoothing) {
  const int64_t batch = labels.size(0);
  const double off = smoothing / static_cast<double>(num_classes), on = 1.0 - smoothing + off;
  const auto keep = static_cast<float>(lambda), take = static_cast<float>(1.0 - lambda);
  at::Tensor targets = at::empty({batch, num_classes}, at::kFloat);
  const auto labels_c = labels.contiguous();
  const int64_t* y = labels_c.data_ptr<int64_t>();
  float* t = targets.data_ptr<float>();
  for (int64_t i = 0; i < batch; ++i, t += num_classes) {
    const int64_t own = y[i], other = y[batch - 1 - i];
    for (int64_t k = 0; k < num_classes; ++k) {
      const auto a = static_cast<float>(k == own ? on : off);
      const auto b = static_cast<float>(k == other ? on : off);
      t[k] = a * keep + b * take;
    }
  }
  return targets;
}

}  // namespace

MixResult mixup_cutmix(at::Tensor& images, const at::Tensor& labels, int64_t num_classes, Rng& rng,
                       const MixupOptions& options, at::Tensor& targets) {
  check_options(options);
  check_batch(images, labels, num_classes);
  const int64_t batch = images.size(0), channels = images.size(1);
  const int64_t height = images.size(2), width = images.size(3);
  MixResult r = draw_params(options, rng);
  if (r.lambda != 1.0) {
    float* x = images.data_ptr<float>();
    if (r.cutmix) {
      cutmix_box(r, height, width, rng);
      paste_box(x, batch, channels, height, width, r.box);
    } else {
      blend_pairs(x, batch, channels * height * width, r.lambda);
    }
  }
  targets = mixed_targets(labels, num_classes, r.lambda, options.label_smoothing);
  return r;
}

}  // namespace convnn::data
