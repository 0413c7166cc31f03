#include "convert/check_model.h"

#include "backend/meta/meta_backend.h"
#include "models/model.h"

namespace kiln {

Status check_model(const std::string& model_dir) {
  KILN_TRY(inspect_model(model_dir));
  return ok_status();
}

Result<std::vector<SetAsideFinding>> inspect_model(const std::string& model_dir) {
  MetaBackend backend;
  KILN_ASSIGN(auto model, load_model(model_dir, backend));
  return model->set_aside();
}

}  // namespace kiln
