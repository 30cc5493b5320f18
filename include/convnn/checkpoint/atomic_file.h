#pragma once
// Files written so that a crash, a kill or a full disk leaves either the old file or the new one,
// never a truncated one: checkpoints, configs, metrics.
#include <filesystem>
#include <functional>
#include <string>

namespace convnn::checkpoint {

/// Writes `contents` to `path` through the temporary file `.<name>.tmp<pid>` beside it, synced
/// before the rename, and syncs the folder after it. The temporary file is removed on any
/// failure; those of this target left by processes that no longer exist (killed mid-write) are
/// removed first, those of live processes (writes in progress) are kept.
void write_file_atomically(const std::string& path, const std::string& contents);

/// Removes the temporary files in `folder` (empty: the working directory) of the targets `ours`
/// accepts whose writer no longer exists (killed mid-write). Best effort: a folder that cannot be
/// listed is left alone, and the write that follows reports what is wrong with it.
void remove_stale_temporaries(const std::filesystem::path& folder,
                              const std::function<bool(const std::string& target)>& ours);

}  // namespace convnn::checkpoint
