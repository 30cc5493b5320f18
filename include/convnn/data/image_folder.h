#pragma once
// Image data sets on disk, as lists of files with labels, in the two layouts ImageNet users have:
//   ImageFolder:  root/<class>/<file>, classes sorted by name, files sorted (torchvision's rule),
//                 .jpg .jpeg .png in any case; other files are ignored.
//   ILSVRC-2012:  a flat validation folder plus a labels file, with classes from the training
//                 folder. Accepted labels files: "<file name> <class>" per line, where <class> is
//                 a class (synset) name or a 0-based index; or Kaggle's LOC_val_solution.csv
//                 ("ImageId,PredictionString" whose first token is the synset).
// Errors (missing folder, no classes, a class with no images, a labels line naming an unknown
// class or a missing file) are c10::Error naming the path and the line.
#include <cstdint>
#include <string>
#include <vector>

namespace convnn::data {

struct FileList {
  std::vector<std::string> paths;
  std::vector<int64_t> labels;  // in [0, class_names.size())
  std::vector<std::string> class_names;

  int64_t size() const { return static_cast<int64_t>(paths.size()); }
  int64_t num_classes() const { return static_cast<int64_t>(class_names.size()); }
};

FileList scan_image_folder(const std::string& root);

/// The flat validation folder `dir` labelled by `labels_file`; classes as in `class_names`
/// (the training folder's). Every listed file must exist; every image in `dir` must be listed.
FileList read_flat_folder(const std::string& dir, const std::string& labels_file,
                          const std::vector<std::string>& class_names);

/// The split of an ImageNet-style root: root/train as an ImageFolder; root/val as an ImageFolder
/// when it has class subfolders, else as a flat folder with the labels file found beside it
/// (root/val_labels.txt, root/LOC_val_solution.csv) or given explicitly.
FileList load_image_folder_split(const std::string& root, bool train,
                                 const std::string& val_labels_file = "");

}  // namespace convnn::data
