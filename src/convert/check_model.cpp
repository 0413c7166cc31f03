#include "convert/check_model.h"

#include "backend/meta/meta_backend.h"
#include "models/model.h"

namespace kiln {

Status check_model(const std::string& model_dir) {
  MetaBackend backend;
  KILN_TRY(load_model(model_dir, backend));
  return ok_status();
}

}  // namespace kiln
