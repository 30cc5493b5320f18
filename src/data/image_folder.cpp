// Image data sets on disk as lists of files and labels: torchvision's ImageFolder layout and the
// ILSVRC-2012 flat validation folder with a labels file. Layouts and formats: docs/image-data.md.
#include "convnn/data/image_folder.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <system_error>
#include <unordered_map>
#include <utility>

namespace convnn::data {
namespace {

namespace fs = std::filesystem;

// Dot files are never data: .DS_Store, editor backups, .ipynb_checkpoints (a class folder
// torchvision would count).
bool is_hidden(const std::string& name) { return !name.empty() && name[0] == '.'; }

// The extensions our decoders read; the file's content decides the decoder (image_codec.h).
bool has_image_extension(const fs::path& path) {
  std::string ext = path.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return ext == ".jpg" || ext == ".jpeg" || ext == ".png";
}

void check_directory(const fs::path& dir, const char* what) {
  std::error_code ec;
  const auto status = fs::status(dir, ec);
  TORCH_CHECK(fs::exists(status), what, " ", dir.string(), ": no such directory");
  TORCH_CHECK(fs::is_directory(status), what, " ", dir.string(), ": not a directory");
}

struct Entry {
  fs::path path;
  bool directory;     // symbolic links followed
  bool regular_file;
};

// The non-hidden entries of `dir`, in no order. The types come from the directory listing
// itself (no stat per file, which matters for ImageNet's 1.28 M files) except for links.
std::vector<Entry> list_directory(const fs::path& dir) {
  std::vector<Entry> entries;
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  TORCH_CHECK(!ec, "directory ", dir.string(), ": cannot list (", ec.message(), ")");
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    TORCH_CHECK(!ec, "directory ", dir.string(), ": cannot list (", ec.message(), ")");
    const auto& path = it->path();
    if (is_hidden(path.filename().string())) continue;
    std::error_code type_ec;
    const Entry entry{path, it->is_directory(type_ec), it->is_regular_file(type_ec)};
    // A dangling link to an image would make a class silently smaller.
    TORCH_CHECK(entry.directory || entry.regular_file || !it->is_symlink(type_ec) ||
                    !has_image_extension(path),
                "image ", path.string(), ": a symbolic link to no regular file (broken?)");
    entries.push_back(entry);
  }
  return entries;
}

// Sorted names of the non-hidden subdirectories: the classes of an ImageFolder.
std::vector<std::string> class_folders(const fs::path& root) {
  std::vector<std::string> names;
  for (const auto& entry : list_directory(root)) {
    if (entry.directory) names.push_back(entry.path.filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

// Images under `dir`, recursively and through symbolic links like torchvision's
// os.walk(followlinks=True); each directory is visited once, so a link loop ends.
void collect_images(const fs::path& dir, std::set<fs::path>& visited,
                    std::vector<std::pair<std::string, std::string>>& found) {
  std::error_code ec;
  const auto real = fs::canonical(dir, ec);
  if (!visited.insert(ec ? dir : real).second) return;
  for (const auto& entry : list_directory(dir)) {
    if (entry.directory) {
      collect_images(entry.path, visited, found);
    } else if (entry.regular_file && has_image_extension(entry.path)) {
      found.emplace_back(dir.string(), entry.path.filename().string());
    }
  }
}

// torchvision's order: directories by path, then files by name within each.
std::vector<std::string> images_of_class(const fs::path& class_dir) {
  std::set<fs::path> visited;
  std::vector<std::pair<std::string, std::string>> found;
  collect_images(class_dir, visited, found);
  std::sort(found.begin(), found.end());
  std::vector<std::string> paths;
  paths.reserve(found.size());
  for (const auto& [dir, name] : found) paths.push_back((fs::path(dir) / name).string());
  return paths;
}

// ---------------------------------------------------------------------------------------------
// Labels files

// One labelled file of a labels file: a file name, or for Kaggle's CSV a name without extension.
struct LabelLine {
  std::string file;
  int64_t label;
  size_t line;
};

class LabelsParser {
 public:
  LabelsParser(std::string path, const std::vector<std::string>& class_names)
      : path_(std::move(path)), class_names_(class_names) {
    for (size_t i = 0; i < class_names.size(); ++i) {
      index_.emplace(class_names[i], static_cast<int64_t>(i));
    }
  }

  std::vector<LabelLine> parse() {
    std::error_code ec;
    const auto status = fs::status(path_, ec);
    TORCH_CHECK(fs::exists(status), "labels file ", path_, ": no such file");
    TORCH_CHECK(fs::is_regular_file(status), "labels file ", path_, ": not a regular file");
    std::ifstream in(path_);
    TORCH_CHECK(in.good(), "labels file ", path_, ": cannot open");
    std::vector<LabelLine> lines;
    std::string text;
    bool kaggle = false;
    for (size_t number = 1; std::getline(in, text); ++number) {
      clean(text, number);
      if (number == 1 && text == "ImageId,PredictionString") {
        kaggle = true;
      } else if (!text.empty()) {
        lines.push_back(kaggle ? kaggle_line(text, number) : plain_line(text, number));
      }
    }
    TORCH_CHECK(!in.bad(), "labels file ", path_, ": read error");
    TORCH_CHECK(!lines.empty(), "labels file ", path_, ": no labelled files");
    return lines;
  }

  std::string where(size_t line) const { return path_ + " line " + std::to_string(line); }

 private:
  // Windows line ends, a UTF-8 byte order mark, spaces around.
  static void clean(std::string& text, size_t number) {
    if (number == 1 && text.rfind("\xef\xbb\xbf", 0) == 0) text.erase(0, 3);
    const auto first = text.find_first_not_of(" \t\r");
    const auto last = text.find_last_not_of(" \t\r");
    text = first == std::string::npos ? "" : text.substr(first, last - first + 1);
  }

  // "<file> <class name or 0-based index>"
  LabelLine plain_line(const std::string& text, size_t number) const {
    std::istringstream fields(text);
    std::string file, label, extra;
    fields >> file >> label >> extra;
    TORCH_CHECK(!label.empty() && extra.empty(), "labels file ", where(number), ": '", text,
                "': expected '<file name> <class name or 0-based index>'",
                label.empty() ? " (the devkit's ILSVRC2012_validation_ground_truth.txt, one "
                                "ILSVRC id per line, needs converting to this form)"
                              : "");
    return {file, class_of(label, number, true), number};
  }

  // "ILSVRC2012_val_00008726,n02119789 255 142 454 329 n02119789 44 21 322 295"
  LabelLine kaggle_line(const std::string& text, size_t number) const {
    const auto comma = text.find(',');
    std::string synset;
    if (comma != std::string::npos) std::istringstream(text.substr(comma + 1)) >> synset;
    TORCH_CHECK(comma != std::string::npos && comma > 0 && !synset.empty(), "labels file ",
                where(number), ": '", text, "': expected 'ImageId,PredictionString' with the "
                "synset first in PredictionString");
    return {text.substr(0, comma), class_of(synset, number, false), number};
  }

  // A class name first (classes may be named by digits), then a 0-based index if allowed.
  int64_t class_of(const std::string& token, size_t number, bool index_allowed) const {
    const auto it = index_.find(token);
    if (it != index_.end()) return it->second;
    const bool digits = index_allowed && !token.empty() && token.size() < 19 &&
                        std::all_of(token.begin(), token.end(),
                                    [](unsigned char c) { return std::isdigit(c); });
    const int64_t n = static_cast<int64_t>(class_names_.size());
    if (digits && std::stoll(token) < n) return std::stoll(token);
    TORCH_CHECK(false, "labels file ", where(number), ": unknown class '", token, "' (",
                n, " classes, ", class_names_.front(), " to ", class_names_.back(),
                index_allowed ? ", or an index in [0, " + std::to_string(n) + ")" : "", ")");
  }

  std::string path_;
  const std::vector<std::string>& class_names_;
  std::unordered_map<std::string, int64_t> index_;
};

// The images of a flat folder by file name, and by name without extension for the CSV's ImageId
// (an empty value when two files share it).
struct FlatImages {
  std::vector<std::string> names;  // sorted
  std::unordered_map<std::string, size_t> by_name;
  std::unordered_map<std::string, std::string> by_stem;

  explicit FlatImages(const fs::path& dir) {
    for (const auto& entry : list_directory(dir)) {
      if (entry.regular_file && has_image_extension(entry.path)) {
        names.push_back(entry.path.filename().string());
      }
    }
    std::sort(names.begin(), names.end());
    for (size_t i = 0; i < names.size(); ++i) {
      by_name.emplace(names[i], i);
      const auto stem = fs::path(names[i]).stem().string();
      const auto [it, inserted] = by_stem.emplace(stem, names[i]);
      if (!inserted) it->second.clear();
    }
  }

  // The index in `names` of a labels file's name; -1 when there is no such image.
  int64_t find(const std::string& file, const std::string& where) const {
    auto it = by_name.find(file);
    if (it == by_name.end()) {
      const auto stem = by_stem.find(file);
      if (stem == by_stem.end()) return -1;
      TORCH_CHECK(!stem->second.empty(), "labels file ", where, ": '", file,
                  "' matches several images (same name, different extensions)");
      it = by_name.find(stem->second);
    }
    return static_cast<int64_t>(it->second);
  }
};

}  // namespace

FileList scan_image_folder(const std::string& root) {
  check_directory(root, "image folder");
  FileList list;
  list.class_names = class_folders(root);
  TORCH_CHECK(!list.class_names.empty(), "image folder ", root,
              ": no class folders (expected root/<class>/<image>)");
  for (size_t c = 0; c < list.class_names.size(); ++c) {
    const auto class_dir = fs::path(root) / list.class_names[c];
    auto paths = images_of_class(class_dir);
    TORCH_CHECK(!paths.empty(), "image folder ", root, ": class folder ", class_dir.string(),
                " has no .jpg, .jpeg or .png images");
    list.labels.insert(list.labels.end(), paths.size(), static_cast<int64_t>(c));
    std::move(paths.begin(), paths.end(), std::back_inserter(list.paths));
  }
  return list;
}

FileList read_flat_folder(const std::string& dir, const std::string& labels_file,
                          const std::vector<std::string>& class_names) {
  check_directory(dir, "flat image folder");
  TORCH_CHECK(!class_names.empty(), "flat image folder ", dir, ": no class names given");
  LabelsParser parser(labels_file, class_names);
  const auto lines = parser.parse();
  const FlatImages images(dir);
  std::vector<int64_t> labels(images.names.size(), -1);
  for (const auto& line : lines) {
    const auto where = parser.where(line.line);
    const int64_t i = images.find(line.file, where);
    TORCH_CHECK(i >= 0, "labels file ", where, ": no image '", line.file, "' in ", dir);
    TORCH_CHECK(labels[i] < 0, "labels file ", where, ": '", line.file, "' is listed twice");
    labels[i] = line.label;
  }
  const auto unlisted = std::find(labels.begin(), labels.end(), -1);
  TORCH_CHECK(unlisted == labels.end(), "flat image folder ", dir, ": ",
              std::count(labels.begin(), labels.end(), -1), " of its ", labels.size(),
              " images are not in labels file ", labels_file, " (the first: ",
              (fs::path(dir) / images.names[unlisted - labels.begin()]).string(), ")");
  FileList list;
  list.class_names = class_names;
  list.labels = std::move(labels);
  for (const auto& name : images.names) list.paths.push_back((fs::path(dir) / name).string());
  return list;
}

namespace {

// An ImageFolder validation split must have the training split's classes, in the same order,
// or every label after the first difference would be wrong.
void check_same_classes(const std::vector<std::string>& val, const std::vector<std::string>& train,
                        const fs::path& val_dir, const fs::path& train_dir) {
  if (val == train) return;
  const auto [v, t] = std::mismatch(val.begin(), val.end(), train.begin(), train.end());
  TORCH_CHECK(false, "image folder ", val_dir.string(), ": ", val.size(),
              " class folders, but ", train_dir.string(), " has ", train.size(),
              "; the first difference: '", v == val.end() ? "(none)" : *v, "' against '",
              t == train.end() ? "(none)" : *t, "'");
}

std::string find_labels_file(const fs::path& root) {
  for (const char* name : {"val_labels.txt", "LOC_val_solution.csv"}) {
    std::error_code ec;
    if (fs::is_regular_file(root / name, ec)) return (root / name).string();
  }
  TORCH_CHECK(false, "image folder ", (root / "val").string(),
              ": a flat folder (no class subfolders) needs a labels file: none given, and no ",
              (root / "val_labels.txt").string(), " or ",
              (root / "LOC_val_solution.csv").string());
}

}  // namespace

FileList load_image_folder_split(const std::string& root, bool train,
                                 const std::string& val_labels_file) {
  check_directory(root, "image data set root");
  const auto train_dir = fs::path(root) / "train";
  if (train) return scan_image_folder(train_dir.string());
  const auto val_dir = fs::path(root) / "val";
  check_directory(val_dir, "image folder");
  std::error_code ec;
  const bool have_train = fs::is_directory(train_dir, ec);
  if (!class_folders(val_dir).empty()) {
    TORCH_CHECK(val_labels_file.empty(), "image folder ", val_dir.string(),
                " has class subfolders; the labels file ", val_labels_file,
                " applies only to a flat folder");
    auto list = scan_image_folder(val_dir.string());
    if (have_train) check_same_classes(list.class_names, class_folders(train_dir), val_dir,
                                       train_dir);
    return list;
  }
  TORCH_CHECK(have_train, "image folder ", val_dir.string(), ": a flat validation folder takes "
              "its class names from ", train_dir.string(), ", which is not a directory");
  const auto classes = class_folders(train_dir);
  TORCH_CHECK(!classes.empty(), "image folder ", train_dir.string(),
              ": no class folders (expected root/<class>/<image>)");
  const auto labels = val_labels_file.empty() ? find_labels_file(root) : val_labels_file;
  return read_flat_folder(val_dir.string(), labels, classes);
}

}  // namespace convnn::data
