// kiln: run Gemma 4 and Qwen 3.5 models. Argument parsing and error reporting; the work happens
// in the engine library.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <exception>
#include <new>
#include <string>
#include <vector>

#include "cli/commands.h"

#ifndef KILN_VERSION
#define KILN_VERSION "0.0.0"
#endif

int main(int argc, char** argv) {
  CLI::App app{"kiln: Gemma 4 and Qwen 3.5 inference on NVIDIA GPUs and CPUs"};
  app.set_version_flag("--version", std::string("kiln ") + KILN_VERSION);
  app.require_subcommand(1);
  app.fallthrough();
  int verbosity = 0;
  app.add_flag("-v,--verbose", verbosity, "More log output (repeat for debug)");

  // the environment is read here, once; commands get what they need of it
  const kiln::cli::Environment env = kiln::cli::read_environment();
  kiln::cli::Action action;
  kiln::cli::add_logits_command(app, action, env);
  kiln::cli::add_synth_model_command(app, action);
  kiln::cli::add_quantize_command(app, action, env);
  kiln::cli::add_bench_command(app, action, env);
  kiln::cli::add_tokenize_command(app, action, env);
  kiln::cli::add_template_command(app, action, env);
  kiln::cli::add_generate_command(app, action, env);
  kiln::cli::add_chat_command(app, action, env);
  kiln::cli::add_serve_command(app, action, env);
  kiln::cli::add_pull_command(app, action, env);
  kiln::cli::add_ls_command(app, action, env);
  kiln::cli::add_fit_command(app, action, env);

  // CLI11 reports an unknown command as a missing one
  if (argc > 1 && argv[1][0] != '-') {
    std::vector<std::string> names;
    for (const CLI::App* command : app.get_subcommands([](const CLI::App*) { return true; }))
      names.push_back(command->get_name());
    if (std::find(names.begin(), names.end(), argv[1]) == names.end()) {
      fmt::print(stderr, "kiln: error: unknown command '{}'; the commands are {} (see --help)\n",
                 kiln::one_line(argv[1]), fmt::join(names, ", "));
      return 109;  // CLI11's exit code for arguments it did not expect
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    fmt::print(stderr, "kiln: error: {} (see --help)\n", kiln::one_line(e.what()));
    return e.get_exit_code();
  }

  auto logger = spdlog::stderr_color_mt("kiln");
  spdlog::set_default_logger(logger);
  spdlog::set_pattern("%^%l%$: %v");
  spdlog::set_level(verbosity >= 2 ? spdlog::level::debug : verbosity == 1 ? spdlog::level::info : spdlog::level::warn);

  if (!action) return 0;
  kiln::Status status;
  try {
    status = action();
  } catch (const std::bad_alloc&) {  // a last resort: errors are returned, not thrown
    status = kiln::make_error("out of memory");
  } catch (const std::exception& e) {
    status = kiln::make_error("{}", e.what());
  }
  if (!status) {
    fmt::print(stderr, "kiln: error: {}\n", kiln::one_line(status.error().message));
    return 1;
  }
  return 0;
}
