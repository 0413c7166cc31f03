// The model a command runs, as named on its command line: a directory, a Hugging Face repository
// id (ORG/NAME[@REVISION]) found in the local cache, or nothing (the bundled model). Every command
// that takes a MODEL_DIR resolves it here, once; the library below only ever sees a directory.
#pragma once

#include <string>

#include "cli/environment.h"
#include "core/status.h"

namespace kiln::cli {

struct ModelSource {
  std::string dir;      // the directory to load (a cache snapshot for an id: read in place)
  std::string repo_id;  // "ORG/NAME" when named by id, else ""
};

// `given` as a directory when one of that path exists; else, when it reads as ORG/NAME[@REV], the
// cached snapshot of that revision (branch, tag or commit; main by default), or an error naming
// the cache path looked in and suggesting `kiln pull`; otherwise `given` itself, for the loader to
// report. An empty `given` is the bundled model.
Result<ModelSource> resolve_model(const std::string& given, const Environment& env);

}  // namespace kiln::cli
