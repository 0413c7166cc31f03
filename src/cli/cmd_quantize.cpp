// kiln quantize IN_DIR OUT_DIR [--bits 4] [--group-size 64] [--override MODULE_GLOB=BITS[:GROUP] ...]
// Writes an MLX affine-quantized copy of a model directory, as mlx-lm's convert lays it out.
#include <fmt/format.h>

#include <chrono>

#include "cli/commands.h"
#include "cli/model_source.h"
#include "cli/validators.h"
#include "convert/quantize_model.h"

namespace kiln::cli {

namespace {

struct QuantizeArgs {
  std::string in_dir, out_dir;
  int bits = 4;
  int group_size = 64;
  std::vector<std::string> overrides;
  int threads = 0;
};

Status run_quantize(const QuantizeArgs& a) {
  QuantizeOptions options;
  options.bits = a.bits;
  options.group_size = a.group_size;
  options.threads = a.threads;
  for (const auto& text : a.overrides) {
    KILN_ASSIGN(QuantOverride o, parse_quant_override(text));
    options.overrides.push_back(o);
  }
  const auto start = std::chrono::steady_clock::now();
  KILN_ASSIGN(QuantizeReport report, quantize_model_dir(a.in_dir, a.out_dir, options));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (report.indivisible_modules > 0)
    fmt::print(stderr, "{} modules left unquantized: the group size does not divide their input size (first: {})\n",
               report.indivisible_modules, report.indivisible_example);
  fmt::print(stderr, "wrote {}: {} quantized modules, {:.3f} bits per weight, {:.2f} GB, in {:.1f} s\n", a.out_dir,
             report.quantized_modules, report.bits_per_weight, double(report.bytes_written) / 1e9, seconds);
  return ok_status();
}

}  // namespace

void add_quantize_command(CLI::App& app, Action& action, const Environment& env) {
  auto a = std::make_shared<QuantizeArgs>();
  auto* cmd = app.add_subcommand("quantize", "Write an MLX affine-quantized copy of a model directory");
  cmd->add_option("in_dir", a->in_dir,
                  "Model directory (bf16, f16 or f32) or Hugging Face id ORG/NAME[@REV] in the cache")
      ->required();
  cmd->add_option("out_dir", a->out_dir, "Directory to write")->required();
  cmd->add_option("--bits", a->bits, "Bits per weight (2, 3, 4, 5, 6, 8)");
  cmd->add_option("--group-size", a->group_size, "Weights per scale and bias (32, 64, 128)");
  cmd->add_option("--override", a->overrides,
                  "MODULE_GLOB=BITS[:GROUP] (BITS 'none' keeps a module unquantized); the last match wins");
  cmd->add_option("--threads", a->threads, "Worker threads (0: all cores)")->check(number_in(0, kMaxThreads));
  cmd->callback([a, &action, &env] {
    action = [a, &env]() -> Status {
      KILN_ASSIGN(const ModelSource model, resolve_model(a->in_dir, env));
      a->in_dir = model.dir;
      return run_quantize(*a);
    };
  });
}

}  // namespace kiln::cli
