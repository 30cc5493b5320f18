// `convnn viz`: pictures of the neighbours a trained model's ConvNN layers select, for one image
// (a file, or a sample of the run's data set) and a few query positions: one PNG per layer
// (neighbour_plots.h), the model input it ran on (input.pt, for Python's convnn.viz) and
// neighbours.json, which says what each picture draws and where.
#include <fmt/format.h>
#include <torch/serialize.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "convnn/checkpoint/checkpoint.h"
#include "convnn/data/image_codec.h"
#include "convnn/data/transforms.h"
#include "convnn/models/registry.h"
#include "convnn/nn/neighbours.h"
#include "convnn/train/data_setup.h"
#include "convnn/train/trainer.h"
#include "convnn/util/device.h"
#include "neighbour_plots.h"
#include "plots.h"
#include "train_options.h"

namespace convnn::cli {
namespace {

namespace fs = std::filesystem;

struct VizArgs {
  std::string checkpoint;
  std::string image;
  int64_t sample = 0;
  std::string split = data::to_string(data::Split::Test);
  std::string data_dir;
  std::vector<std::string> queries;
  int64_t grid = 3;
  std::vector<std::string> layers;
  std::string output;
  std::string device = "auto";
  bool allow_non_finite = false;
};

// "Y,X" -> {Y, X}
std::vector<int64_t> parse_query(const std::string& text) {
  const auto comma = text.find(',');
  const auto number = [&](const std::string& part) -> int64_t {
    size_t used = 0;
    int64_t value = -1;
    try {
      value = std::stoll(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    TORCH_CHECK(used == part.size() && !part.empty(), "--query '", text,
                "' must be a pixel Y,X of the model's input image (two integers)");
    return value;
  };
  TORCH_CHECK(comma != std::string::npos, "--query '", text, "' must be a pixel Y,X of the model's input image");
  return {number(text.substr(0, comma)), number(text.substr(comma + 1))};
}

// One sample of the split, as the evaluation loader gives it (normalised, without augmentation).
data::SplitData one_sample(const train::TrainConfig& config, const VizArgs& a) {
  auto data = train::load_split(config, data::parse_split(a.split));
  TORCH_CHECK(a.sample >= 0 && a.sample < data.size(), "--sample ", a.sample, " is not a sample of the ", a.split,
              " split of ", config.data.dataset, " (", data.size(), " samples: 0 to ", data.size() - 1, ")");
  if (data.image_folder) {
    data.files.paths = {data.files.paths[a.sample]};
    data.files.labels = {data.files.labels[a.sample]};
  } else {
    data.set.images = data.set.images.narrow(0, a.sample, 1).contiguous();
    data.set.labels = data.set.labels.narrow(0, a.sample, 1).contiguous();
  }
  return data;
}

// An image file as the model's input: an image folder's evaluation transform (resize, centre
// crop), or, for the in-memory data sets, the image in the set's channels resized to its size.
data::SplitData image_file(const train::TrainConfig& config, const std::string& path) {
  data::SplitData data;
  const auto& m = config.model_config;
  if (data::is_image_folder(config.data)) {
    data.image_folder = true;
    data.files.paths = {path};
    data.files.labels = {0};
    data.files.class_names = {"image"};
    return data;
  }
  auto image = data::resize(data::read_image(path), m.image_size, m.image_size, data::Interpolation::Bilinear);
  auto pixels = at::from_blob(image.pixels.data(), {image.height, image.width, image.channels}, at::kByte)
                    .permute({2, 0, 1})
                    .to(at::kFloat);
  if (pixels.size(0) != m.in_channels) {  // grey from RGB (the channels' mean), RGB from grey
    pixels = m.in_channels == 1 ? pixels.mean(0, true) : pixels.mean(0, true).expand({m.in_channels, -1, -1});
  }
  data.set.images = pixels.round().clamp(0, 255).to(at::kByte).unsqueeze(0).contiguous();
  data.set.labels = at::zeros({1}, at::kLong);
  data.set.class_names = {"image"};
  return data;
}

// The model input [C, H, W] on the CPU.
at::Tensor model_input(const train::TrainConfig& config, const VizArgs& a) {
  auto data = a.image.empty() ? one_sample(config, a) : image_file(config, a.image);
  auto loader = train::make_loader(std::move(data), config, /*training=*/false);
  loader.start_epoch(0);
  auto batch = loader.next();
  TORCH_CHECK(batch && batch->inputs.size(0) == 1, "convnn viz: '", a.image.empty() ? a.split : a.image,
              "' gave no image (unreadable?)");
  return batch->inputs[0].cpu();
}

// An attention layer's tokens on the ViT's patch grid (the class token first); a spatial layer's
// neighbours as they are. Undefined positions: a layer a picture cannot place.
nn::Neighbours on_grid(const nn::Neighbours& n, const train::TrainConfig& config) {
  if (n.positions.defined()) return n;
  if (models::model_entry(config.model).family != models::ModelFamily::ViT) return n;
  const auto& m = config.model_config;
  const int64_t side = m.image_size / m.vit.patch_size;
  return nn::on_token_grid(n, {side, side}, /*prefix_tokens=*/1);
}

nn::Neighbours to_cpu(nn::Neighbours n) {
  for (auto* t : {&n.indices, &n.scores, &n.weights, &n.positions, &n.query_positions}) {
    if (t->defined()) *t = t->cpu();
  }
  return n;
}

std::string file_name(size_t index, const std::string& layer) {
  std::string safe;
  for (const char c : layer) safe += std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' ? c : '-';
  return fmt::format("{:02}-{}.png", index + 1, safe);
}

// A 1-D or 2-D tensor as nested arrays: integers for int64, numbers otherwise.
nlohmann::json to_json(const at::Tensor& t) {
  nlohmann::json values = nlohmann::json::array();
  for (int64_t i = 0; i < t.size(0); ++i) {
    if (t.dim() > 1) {
      values.push_back(to_json(t[i]));
    } else if (t.scalar_type() == at::kLong) {
      values.push_back(t[i].item<int64_t>());
    } else {
      values.push_back(t[i].item<double>());
    }
  }
  return values;
}

nlohmann::json layer_json(const std::string& name, const std::string& file, const nn::Neighbours& n,
                          const std::vector<nn::NeighbourView>& views, const std::vector<std::vector<double>>& points,
                          const PictureLayout& layout, int64_t query_rows) {
  nlohmann::json panels = nlohmann::json::array();
  for (const auto& panel : layout.panels) {
    const auto& view = views[panel.row];
    nlohmann::json p = {{"query", view.query}, {"point", points[panel.row]},
                        {"box", {panel.left, panel.top, panel.right, panel.bottom}}};
    if (panel.column == layout.heads) {
      p["window"] = to_json(view.window);
    } else {
      // The query's row of what the layer returned, as it returned it (indices, weights) and as drawn.
      p["head"] = panel.column;
      p["indices"] = to_json(n.indices[0][panel.column][view.row]);
      p["weights"] = to_json(view.weights[panel.column]);
      p["neighbours"] = to_json(view.neighbours[panel.column]);
    }
    panels.push_back(p);
  }
  return {{"name", name},
          {"file", file},
          {"input_sizes", n.input_sizes},
          {"padding", n.padding},
          {"stride", n.stride},
          {"dilation", n.dilation},
          {"k", n.k},
          {"heads", layout.heads},
          {"token_grid", !n.has_window},
          {"window_side", n.has_window ? nn::window_side(n.k, 2) : 0},
          {"size", {layout.width, layout.height}},
          {"cell_px", layout.cell_px},
          {"frame", layout.frame},
          {"queries", query_rows},
          {"panels", panels}};
}

// The files an earlier `convnn viz` wrote into `output` (those its neighbours.json lists), so that
// the folder holds this run's pictures only.
void remove_earlier_pictures(const std::string& output) {
  const auto report = fs::path(output) / "neighbours.json";
  if (!fs::exists(report)) return;
  nlohmann::json earlier;
  try {
    std::ifstream(report) >> earlier;
  } catch (const nlohmann::json::exception&) {
    return;  // not ours to interpret: leave the folder as it is
  }
  if (!earlier.is_object() || !earlier.contains("layers") || !earlier["layers"].is_array()) return;
  for (const auto& layer : earlier["layers"]) {
    if (!layer.is_object() || !layer.contains("file") || !layer["file"].is_string()) continue;
    const auto file = fs::path(layer["file"].get<std::string>());
    if (file.has_parent_path()) continue;  // only names inside the folder
    for (const char* extension : {".png", ".dat", ".gp", ".log"}) {
      auto stale = fs::path(output) / file;
      stale.replace_extension(extension);
      fs::remove(stale);
    }
  }
}

int run_viz(const VizArgs& a) {
  TORCH_CHECK(gnuplot_available(), "convnn viz draws with gnuplot, which is not installed (apt install gnuplot-nox)");
  const auto device = resolve_device(a.device, "--device");
  const auto path = resume_checkpoint_path(a.checkpoint);
  TORCH_CHECK(checkpoint::holds_run(path), "checkpoint '", path, "' holds weights alone; convnn viz needs a run's ",
              "checkpoint, whose config names the model and its data set (convnn train writes them)");
  auto config = checkpoint::read_checkpoint_header(path).config;
  if (!a.data_dir.empty()) config.data.data_dir = a.data_dir;
  config.data.workers = 0;
  config.data.train_subset = config.data.val_subset = 0;
  std::vector<std::vector<int64_t>> pixels;
  for (const auto& q : a.queries) pixels.push_back(parse_query(q));
  const auto& m = config.model_config;
  const auto points = nn::picture_points({m.image_size, m.image_size}, pixels, a.grid);

  auto model = train::make_model(config, device);
  checkpoint::load_checkpoint(path, *model.module(), nullptr, a.allow_non_finite);
  model.module()->eval();
  const auto input = model_input(config, a);
  const auto recorded = nn::record_neighbours(*model.module(), [&] {
    torch::NoGradGuard no_grad;
    model.forward(input.unsqueeze(0).to(device));
  });
  std::string names;
  for (const auto& [name, n] : recorded) names += (names.empty() ? "" : ", ") + name;
  for (const auto& layer : a.layers) {
    const bool ran = std::any_of(recorded.begin(), recorded.end(), [&](const auto& r) { return r.first == layer; });
    TORCH_CHECK(ran, "--layers: no ConvNN layer named '", layer, "' in ", config.model, "; its ConvNN layers are ",
                names.empty() ? "none" : names);
  }
  TORCH_CHECK(!recorded.empty(), "checkpoint '", path, "' (", config.model, ") has no ConvNN layer: nothing to draw");

  const auto output = a.output.empty() ? (fs::path(path).parent_path() / "viz").string() : a.output;
  fs::create_directories(output);
  remove_earlier_pictures(output);
  {
    const auto bytes = torch::pickle_save(input);
    std::ofstream(fs::path(output) / "input.pt", std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  nlohmann::json layers = nlohmann::json::array();
  size_t drawn = 0;
  for (const auto& [name, recorded_neighbours] : recorded) {
    if (!a.layers.empty() && std::find(a.layers.begin(), a.layers.end(), name) == a.layers.end()) continue;
    const auto n = to_cpu(on_grid(recorded_neighbours, config));
    if (!n.positions.defined() || n.input_sizes.size() != 2) continue;
    std::vector<nn::NeighbourView> views;
    for (const auto& point : points) views.push_back(nn::neighbour_view(n, point));
    const auto layout = picture_layout(n, static_cast<int64_t>(views.size()));
    const auto file = file_name(drawn++, name);
    const auto title = fmt::format("{} of {} ({}x{}, K = {})", name, config.model, n.input_sizes[0], n.input_sizes[1], n.k);
    plot_neighbour_picture((fs::path(output) / file).string(), title, n, nn::picture_background(input, n.input_sizes),
                           views, layout);
    layers.push_back(layer_json(name, file, n, views, points, layout, static_cast<int64_t>(views.size())));
    fmt::print("{}: {}\n", name, (fs::path(output) / file).string());
  }
  const nlohmann::json report = {{"checkpoint", path},
                                 {"model", config.model},
                                 {"image", a.image.empty() ? fmt::format("{} sample {}", a.split, a.sample) : a.image},
                                 {"input", "input.pt"},
                                 {"colours", {{"neighbour", nn::PictureColours::neighbour},
                                              {"query", nn::PictureColours::query},
                                              {"window", nn::PictureColours::window},
                                              {"padding", nn::PictureColours::padding}}},
                                 {"layers", layers}};
  std::ofstream(fs::path(output) / "neighbours.json") << report.dump(1) << "\n";
  fmt::print("{} pictures of {} in {} (what each draws: neighbours.json)\n", drawn, config.model, output);
  return 0;
}

}  // namespace

Command add_viz_command(CLI::App& app) {
  auto* sub = app.add_subcommand("viz", "Draw the neighbours each ConvNN layer of a trained model selects (PNGs)");
  auto args = std::make_shared<VizArgs>();
  sub->add_option("--checkpoint", args->checkpoint, "Checkpoint of a run (or the run directory: its latest)")
      ->required();
  sub->add_option("--image", args->image,
                  "Image file (JPEG or PNG) to run the model on, converted as its data set's images are "
                  "(unset: --sample of --split)");
  sub->add_option("--sample", args->sample, "Sample of the data set to run the model on");
  sub->add_option("--split", args->split, "Split of the data set for --sample")->check(CLI::IsMember(data::split_names()));
  sub->add_option("--data-dir", args->data_dir, "Folder of the data set (unset: the run's)");
  sub->add_option("-q,--query", args->queries,
                  "Query pixel Y,X of the model's input image (repeatable; unset: the centres of a --grid)");
  sub->add_option("--grid", args->grid, "Without --query: queries at the centres of a grid x grid lattice")
      ->check(CLI::Range(int64_t{1}, int64_t{16}));
  sub->add_option("--layers", args->layers, "Only these layers (module paths, e.g. layer1.0.conv1)")->delimiter(',');
  sub->add_option("--output", args->output, "Folder for the PNGs (unset: <run>/viz)");
  add_device_option(sub, args->device, "Device to run the model on");
  sub->add_flag("--allow-non-finite", args->allow_non_finite, "Draw for a checkpoint whose weights hold NaN or Inf");
  sub->footer(
      "Examples:\n"
      "  convnn viz --checkpoint runs/fashion-mnist-branching/checkpoint-best.pt --grid 2\n"
      "  convnn viz --checkpoint runs/<run> --image shoe.png --query 14,14 --layers layer1.0.conv1\n");
  return {sub, [args] { return run_viz(*args); }};
}

}  // namespace convnn::cli
