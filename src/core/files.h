// Checks before a file is opened for reading: a FIFO, a device or a directory where a model file
// belongs would block the open or read as garbage, so it is refused by name instead.
#pragma once

#include <sys/stat.h>

#include <string>

#include "core/status.h"

namespace kiln {

// Passes when `path` is a regular file (symlinks followed) or does not exist, so that callers keep
// their own message for a missing file.
inline Status require_regular_file_if_present(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return ok_status();
  if (S_ISDIR(st.st_mode)) return make_error("{} is a directory, not a file", path);
  if (!S_ISREG(st.st_mode)) return make_error("{} is not a regular file", path);
  return ok_status();
}

}  // namespace kiln
