// Post-processors of tokenizer.json ("post_processor"): the special tokens that encode adds
// around a single sequence when asked to (add_special_tokens). Supported: TemplateProcessing
// (its "single" template), ByteLevel (offsets only: no ids change), BertProcessing,
// RobertaProcessing, Sequence.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/status.h"

namespace kiln::tokenization {

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  virtual void add_special_tokens(std::vector<int32_t>& ids) const = 0;
  virtual std::string describe() const = 0;
};

// `depth`: how many Sequences hold this one (refused past kMaxComponentNesting).
Result<std::unique_ptr<PostProcessor>> parse_post_processor(const nlohmann::json& spec, int depth = 0);

// Adds fixed ids before and after the sequence (also used for tokenizer_config.json's
// add_bos_token/add_eos_token when tokenizer.json has no post-processor).
class SurroundProcessor final : public PostProcessor {
 public:
  SurroundProcessor(std::vector<int32_t> before, std::vector<int32_t> after, std::string name)
      : before_(std::move(before)), after_(std::move(after)), name_(std::move(name)) {}
  void add_special_tokens(std::vector<int32_t>& ids) const override {
    ids.insert(ids.begin(), before_.begin(), before_.end());
    ids.insert(ids.end(), after_.begin(), after_.end());
  }
  std::string describe() const override { return name_; }

 private:
  std::vector<int32_t> before_;
  std::vector<int32_t> after_;
  std::string name_;
};

}  // namespace kiln::tokenization
