// Image data sets on disk (include/convnn/data/image_folder.h): torchvision's ImageFolder rule,
// the ILSVRC-2012 flat validation folder with both labels file formats, the train/val split of
// an ImageNet-style root, and the errors that name the path or line.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "convnn/data/image_folder.h"
#include "data/fixtures.h"

namespace convnn::data {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;
using testing::expect_error;
using testing::write_file;

// Listing never opens the files: one byte stands for an image.
void touch(const TempDir& dir, const std::string& name) { write_file(dir.file(name), {0}); }

void write_text(const TempDir& dir, const std::string& name, const std::string& text) {
  write_file(dir.file(name), testing::Bytes(text.begin(), text.end()));
}

std::vector<std::string> relative(const FileList& list, const TempDir& dir) {
  std::vector<std::string> names;
  for (const auto& path : list.paths) {
    names.push_back(fs::path(path).lexically_relative(dir.path()).string());
  }
  return names;
}

using Names = std::vector<std::string>;
using Labels = std::vector<int64_t>;

TEST(ImageFolder, ScanSortsClassesAndFilesAndLabelsByClassIndex) {
  TempDir dir;
  for (const char* name : {"zebra/2.png", "zebra/10.JPG", "ant/b.Jpeg", "ant/a.jpg", "cat/x.PNG"}) {
    touch(dir, name);
  }
  const auto list = scan_image_folder(dir.path().string());
  EXPECT_EQ(list.class_names, (Names{"ant", "cat", "zebra"}));
  EXPECT_EQ(relative(list, dir),
            (Names{"ant/a.jpg", "ant/b.Jpeg", "cat/x.PNG", "zebra/10.JPG", "zebra/2.png"}));
  EXPECT_EQ(list.labels, (Labels{0, 0, 1, 2, 2}));
  EXPECT_EQ(list.size(), 5);
  EXPECT_EQ(list.num_classes(), 3);
}

TEST(ImageFolder, ScanIgnoresHiddenEntriesOtherExtensionsAndLooseFiles) {
  TempDir dir;
  for (const char* name : {"a/keep.jpg", "a/.hidden.jpg", "a/notes.txt", "a/anim.gif",
                           "a/keep.jpg.bak", "a/.thumbs/t.jpg", ".ipynb_checkpoints/c.jpg",
                           "loose.jpg"}) {
    touch(dir, name);
  }
  const auto list = scan_image_folder(dir.path().string());
  EXPECT_EQ(list.class_names, (Names{"a"}));
  EXPECT_EQ(relative(list, dir), (Names{"a/keep.jpg"}));
}

// torchvision walks each class folder recursively, sorted(os.walk(...)): directories in path
// order, then files by name. "c/a" precedes "c/a b" (a prefix first), although the full path
// "c/a b/w.jpg" sorts before "c/a/x.jpg".
TEST(ImageFolder, ScanRecursesIntoSubfoldersInTorchvisionOrder) {
  TempDir dir;
  for (const char* name : {"c/z/y.jpg", "c/b.jpg", "c/a/x.jpg", "c/a b/w.jpg"}) touch(dir, name);
  EXPECT_EQ(relative(scan_image_folder(dir.path().string()), dir),
            (Names{"c/b.jpg", "c/a/x.jpg", "c/a b/w.jpg", "c/z/y.jpg"}));
}

TEST(ImageFolder, ScanFollowsSymbolicLinksAndEndsOnLinkLoops) {
  TempDir dir, elsewhere;
  touch(elsewhere, "dogs/d.jpg");
  touch(elsewhere, "one.png");
  touch(dir, "cats/c.jpg");
  fs::create_directory_symlink(elsewhere.path() / "dogs", dir.path() / "dogs");
  fs::create_symlink(elsewhere.path() / "one.png", dir.path() / "cats" / "linked.png");
  fs::create_directory_symlink(dir.path() / "cats", dir.path() / "cats" / "loop");
  const auto list = scan_image_folder(dir.path().string());
  EXPECT_EQ(list.class_names, (Names{"cats", "dogs"}));
  EXPECT_EQ(relative(list, dir), (Names{"cats/c.jpg", "cats/linked.png", "dogs/d.jpg"}));
}

TEST(ImageFolder, ScanBrokenLinkToAnImageIsAnError) {
  TempDir dir;
  touch(dir, "a/ok.jpg");
  fs::create_symlink(dir.path() / "gone.jpg", dir.path() / "a" / "dangling.jpg");
  expect_error([&] { scan_image_folder(dir.path().string()); }, dir.file("a/dangling.jpg"),
               "a symbolic link to no regular file");
}

TEST(ImageFolder, ScanMissingFolderNoClassesAndEmptyClassAreErrorsNamingThePath) {
  TempDir dir;
  expect_error([&] { scan_image_folder(dir.file("nope")); }, dir.file("nope"),
               "no such directory");
  touch(dir, "file.jpg");
  expect_error([&] { scan_image_folder(dir.file("file.jpg")); }, dir.file("file.jpg"),
               "not a directory");
  expect_error([&] { scan_image_folder(dir.path().string()); }, dir.path().string(),
               "no class folders");
  touch(dir, "full/a.jpg");
  touch(dir, "empty/readme.txt");
  expect_error([&] { scan_image_folder(dir.path().string()); }, dir.file("empty"),
               "has no .jpg, .jpeg or .png images");
}

// The flat folder of the tests below: three images, classes "n01" and "n02".
const Names kClasses = {"n01", "n02"};
void make_flat(const TempDir& dir) {
  for (const char* name : {"val/v3.JPEG", "val/v1.JPEG", "val/v2.png", "val/README.txt"}) {
    touch(dir, name);
  }
}

TEST(ImageFolder, FlatFolderWithPlainLabelsFileTakesClassNamesOrIndices) {
  TempDir dir;
  make_flat(dir);
  write_text(dir, "labels.txt", "v3.JPEG n01\n\nv1.JPEG 1\r\n  v2.png\tn02  \n");
  const auto list = read_flat_folder(dir.file("val"), dir.file("labels.txt"), kClasses);
  EXPECT_EQ(relative(list, dir), (Names{"val/v1.JPEG", "val/v2.png", "val/v3.JPEG"}));
  EXPECT_EQ(list.labels, (Labels{1, 1, 0}));
  EXPECT_EQ(list.class_names, kClasses);
}

TEST(ImageFolder, FlatFolderWithKaggleCsvMatchesImageIdsWithoutExtension) {
  TempDir dir;
  make_flat(dir);
  write_text(dir, "LOC_val_solution.csv",
             "\xef\xbb\xbfImageId,PredictionString\r\n"
             "v2,n01 1 2 3 4 n01 5 6 7 8\r\n"
             "v1,n02 10 20 30 40\r\n"
             "v3,n01 0 0 9 9\r\n");
  const auto list = read_flat_folder(dir.file("val"), dir.file("LOC_val_solution.csv"), kClasses);
  EXPECT_EQ(relative(list, dir), (Names{"val/v1.JPEG", "val/v2.png", "val/v3.JPEG"}));
  EXPECT_EQ(list.labels, (Labels{1, 0, 0}));
}

TEST(ImageFolder, FlatFolderUnknownClassIsAnErrorNamingTheLine) {
  TempDir dir;
  make_flat(dir);
  const auto labels = dir.file("labels.txt");
  write_text(dir, "labels.txt", "v1.JPEG n01\nv2.png n99\nv3.JPEG n01\n");
  expect_error([&] { read_flat_folder(dir.file("val"), labels, kClasses); }, labels + " line 2",
               "unknown class 'n99'");
  write_text(dir, "labels.txt", "v1.JPEG n01\nv2.png 2\nv3.JPEG n01\n");  // index out of range
  expect_error([&] { read_flat_folder(dir.file("val"), labels, kClasses); }, labels + " line 2",
               "unknown class '2' (2 classes, n01 to n02, or an index in [0, 2))");
  write_text(dir, "labels.txt", "ImageId,PredictionString\nv1,3 1 2 3 4\n");  // CSV: names only
  expect_error([&] { read_flat_folder(dir.file("val"), labels, kClasses); }, labels + " line 2",
               "unknown class '3'");
}

TEST(ImageFolder, FlatFolderListedFileMissingIsAnErrorNamingTheLine) {
  TempDir dir;
  make_flat(dir);
  const auto labels = dir.file("labels.txt");
  write_text(dir, "labels.txt", "v1.JPEG n01\nv2.png n01\nv3.JPEG n01\nv4.JPEG n02\n");
  expect_error([&] { read_flat_folder(dir.file("val"), labels, kClasses); }, labels + " line 4",
               "no image 'v4.JPEG' in " + dir.file("val"));
}

TEST(ImageFolder, FlatFolderUnlistedOrTwiceListedImageIsAnError) {
  TempDir dir;
  make_flat(dir);
  const auto labels = dir.file("labels.txt");
  write_text(dir, "labels.txt", "v1.JPEG n01\nv3.JPEG n01\n");
  expect_error([&] { read_flat_folder(dir.file("val"), labels, kClasses); }, dir.file("val/v2.png"),
               "1 of its 3 images are not in labels file " + labels);
  write_text(dir, "labels.txt", "v1.JPEG n01\nv2.png n01\nv3.JPEG n01\nv1.JPEG n02\n");
  expect_error([&] { read_flat_folder(dir.file("val"), labels, kClasses); }, labels + " line 4",
               "'v1.JPEG' is listed twice");
}

TEST(ImageFolder, FlatFolderMalformedOrMissingLabelsFileIsAnError) {
  TempDir dir;
  make_flat(dir);
  const auto labels = dir.file("labels.txt");
  write_text(dir, "labels.txt", "490\n361\n171\n");  // the devkit's ground truth, unconverted
  expect_error([&] { read_flat_folder(dir.file("val"), labels, kClasses); }, labels + " line 1",
               "expected '<file name> <class name or 0-based index>'");
  write_text(dir, "labels.txt", "v1.JPEG n01 extra\n");
  expect_error([&] { read_flat_folder(dir.file("val"), labels, kClasses); }, labels + " line 1",
               "expected '<file name>");
  write_text(dir, "labels.txt", "ImageId,PredictionString\nv1\n");
  expect_error([&] { read_flat_folder(dir.file("val"), labels, kClasses); }, labels + " line 2",
               "expected 'ImageId,PredictionString'");
  write_text(dir, "labels.txt", "\n\n");
  expect_error([&] { read_flat_folder(dir.file("val"), labels, kClasses); }, labels,
               "no labelled files");
  expect_error([&] { read_flat_folder(dir.file("val"), dir.file("nope.txt"), kClasses); },
               dir.file("nope.txt"), "no such file");
  expect_error([&] { read_flat_folder(dir.file("nope"), labels, kClasses); }, dir.file("nope"),
               "no such directory");
}

// An ImageNet-style root: train/<class>/..., and val either the same or flat.
void make_train(const TempDir& dir) {
  for (const char* name : {"train/n02/t3.JPEG", "train/n01/t1.JPEG", "train/n01/t2.JPEG"}) {
    touch(dir, name);
  }
}

TEST(ImageFolder, SplitReadsTrainAndImageFolderVal) {
  TempDir dir;
  make_train(dir);
  for (const char* name : {"val/n01/v1.JPEG", "val/n02/v2.JPEG"}) touch(dir, name);
  const auto root = dir.path().string();
  const auto train = load_image_folder_split(root, true);
  EXPECT_EQ(relative(train, dir),
            (Names{"train/n01/t1.JPEG", "train/n01/t2.JPEG", "train/n02/t3.JPEG"}));
  EXPECT_EQ(train.labels, (Labels{0, 0, 1}));
  const auto val = load_image_folder_split(root, false);
  EXPECT_EQ(relative(val, dir), (Names{"val/n01/v1.JPEG", "val/n02/v2.JPEG"}));
  EXPECT_EQ(val.labels, (Labels{0, 1}));
  EXPECT_EQ(val.class_names, train.class_names);
}

TEST(ImageFolder, SplitFlatValFindsItsLabelsFileOrTakesTheGivenOne) {
  TempDir dir;
  make_train(dir);
  for (const char* name : {"val/v1.JPEG", "val/v2.JPEG"}) touch(dir, name);
  const auto root = dir.path().string();
  expect_error([&] { load_image_folder_split(root, false); }, dir.file("val_labels.txt"),
               "needs a labels file");
  write_text(dir, "LOC_val_solution.csv", "ImageId,PredictionString\nv1,n02 1 1 2 2\nv2,n01\n");
  EXPECT_EQ(load_image_folder_split(root, false).labels, (Labels{1, 0}));
  write_text(dir, "val_labels.txt", "v1.JPEG 0\nv2.JPEG 0\n");  // preferred when both exist
  EXPECT_EQ(load_image_folder_split(root, false).labels, (Labels{0, 0}));
  write_text(dir, "mine.txt", "v1.JPEG n02\nv2.JPEG n02\n");
  const auto val = load_image_folder_split(root, false, dir.file("mine.txt"));
  EXPECT_EQ(val.labels, (Labels{1, 1}));
  EXPECT_EQ(val.class_names, (Names{"n01", "n02"}));
}

TEST(ImageFolder, SplitValWithOtherClassesThanTrainIsAnError) {
  TempDir dir;
  make_train(dir);
  for (const char* name : {"val/n01/v1.JPEG", "val/n03/v2.JPEG"}) touch(dir, name);
  expect_error([&] { load_image_folder_split(dir.path().string(), false); }, dir.file("val"),
               "the first difference: 'n03' against 'n02'");
  expect_error(
      [&] { load_image_folder_split(dir.path().string(), false, dir.file("labels.txt")); },
      dir.file("labels.txt"), "applies only to a flat folder");
}

TEST(ImageFolder, SplitMissingFoldersAreErrorsNamingThePath) {
  TempDir dir;
  const auto root = dir.path().string();
  expect_error([&] { load_image_folder_split(dir.file("nope"), true); }, dir.file("nope"),
               "no such directory");
  expect_error([&] { load_image_folder_split(root, true); }, dir.file("train"),
               "no such directory");
  expect_error([&] { load_image_folder_split(root, false); }, dir.file("val"),
               "no such directory");
  touch(dir, "val/v1.JPEG");
  expect_error([&] { load_image_folder_split(root, false); }, dir.file("train"),
               "takes its class names from");
}

}  // namespace
}  // namespace convnn::data
