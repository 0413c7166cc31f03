// kiln serve [MODEL_DIR] [--host H] [--port P] [--device cpu|cuda] [--max-batch N] [--ctx N]
//            [--prompt-cache-bytes N] [--cache-dir DIR [--cache-dir-bytes N]] [--api-key KEY]
// An OpenAI- and Anthropic-compatible HTTP server over the continuous-batching scheduler. The
// first SIGINT/SIGTERM stops taking requests and lets those in flight finish (for at most
// --grace seconds); a second cancels them. Prints "kiln: listening on http://HOST:PORT" once
// ready.
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include "cli/commands.h"
#include "cli/model_source.h"
#include "cli/validators.h"
#include "engine/engine_internal.h"
#include "server/server.h"

namespace kiln::cli {

namespace {

struct ServeOptions {
  std::string model_dir;
  std::string served_name;
  server::ServerOptions http;
  SchedulerOptions scheduler{
      .max_batch = 32, .context = 4096, .prefill_chunk = 256, .prompt_cache_bytes = size_t(2) << 30};
  int grace_seconds = 30;
  std::string generation_config = "auto";  // auto: the model's sampling defaults; none: kiln's
  server::ImageFetchOptions image_fetch;
  ImageLimits image_limits;
  RunOptions run;
};

// SIGINT/SIGTERM reach the server through a pipe: the handler only writes a byte (any thread may
// receive the signal, the BLAS library's included), and a thread of ours reads it.
int signal_pipe[2] = {-1, -1};

extern "C" void on_stop_signal(int) {
  const char byte = 1;
  [[maybe_unused]] ssize_t n = write(signal_pipe[1], &byte, 1);
}

// Waits for a byte on the signal pipe for at most `timeout_ms` (-1: no limit).
bool wait_for_signal(int timeout_ms) {
  pollfd p{.fd = signal_pipe[0], .events = POLLIN, .revents = 0};
  if (poll(&p, 1, timeout_ms) <= 0) return false;
  char byte;
  return read(signal_pipe[0], &byte, 1) == 1;
}

Status serve(ServeOptions o, const Environment& env) {
  // the bundled model when none is named; an id names a snapshot in the Hugging Face cache
  if (!o.scheduler.cache_dir.empty() && o.scheduler.prompt_cache_bytes == 0)
    return make_error("--cache-dir keeps the prefix cache's entries: it needs --prompt-cache-bytes above 0");
  KILN_ASSIGN(const ModelSource source, resolve_model(o.model_dir, env));
  const std::string& model_dir = source.dir;
  if (pipe(signal_pipe) != 0) return make_error("cannot create the signal pipe");
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);

  KILN_ASSIGN(auto backend, make_backend(o.run));
  const std::string backend_name = backend->name();
  KILN_ASSIGN(auto engine, engine::load_engine(model_dir,
                                               LoadOptions{.context = o.scheduler.context,
                                                           .max_batch = o.scheduler.max_batch,
                                                           .prefill_chunk = o.scheduler.prefill_chunk,
                                                           .prompt_cache_bytes = o.scheduler.prompt_cache_bytes,
                                                           .cache_dir = o.scheduler.cache_dir,
                                                           .cache_dir_bytes = o.scheduler.cache_dir_bytes,
                                                           .use_generation_config = o.generation_config == "auto",
                                                           .batch_invariant = o.scheduler.batch_invariant,
                                                           .max_image_pixels = o.image_limits.max_pixels,
                                                           .kv_bits = o.run.kv_bits,
                                                           .kv_group_size = o.run.kv_group_size},
                                               std::move(backend)));
  Engine::Impl& loaded = engine->impl();
  if (!loaded.tokenizer)
    spdlog::warn("no tokenizer ({}): prompts must be token ids", loaded.tokenizer_error);
  else if (!loaded.chat_template)
    spdlog::warn("no chat template ({}): /v1/chat/completions and /v1/messages are unavailable",
                 loaded.chat_template_error);
  if (const std::string defaults = engine->sampling_defaults({}); !defaults.empty())
    spdlog::info(
        "sampling defaults from generation_config.json: {} (a request's own settings win; "
        "--generation-config none ignores them)",
        defaults);
  Scheduler* scheduler = loaded.scheduler.get();
  server::ServedModel served{.scheduler = scheduler,
                             .tokenizer = loaded.tokenizer,
                             .chat_template = loaded.chat_template,
                             .sampling = engine::sampling_params({}, loaded.defaults),
                             .images = loaded.images.get(),
                             .image_fetch = o.image_fetch};
  if (loaded.images)
    spdlog::info("images: {}{}", loaded.images->processor().describe(),
                 o.image_fetch.allow_urls ? fmt::format("; image URLs fetched (at most {} bytes, {} s)",
                                                        o.image_fetch.max_bytes, o.image_fetch.timeout_seconds)
                                          : std::string("; image URLs refused (data: URLs only)"));
  else if (!loaded.images_error.empty())
    spdlog::warn("images are refused: {}", loaded.images_error);
  // as vLLM names it: --served-model-name, else the repository id, else the directory's name
  served.name = !o.served_name.empty()    ? o.served_name
                : !source.repo_id.empty() ? source.repo_id
                                          : std::filesystem::path(model_dir).lexically_normal().filename().string();
  if (served.name.empty()) served.name = std::filesystem::path(model_dir).parent_path().filename().string();
  if (o.image_fetch.allow_urls) server::init_image_fetching();
  KILN_ASSIGN(auto http, server::Server::create(std::move(served), o.http));
  KILN_ASSIGN(const int port, http->bind());
  fmt::print("kiln: listening on http://{}:{} (model {}, batch {}, context {}, {}, {})\n", o.http.host, port,
             source.repo_id.empty() ? std::filesystem::path(model_dir).filename().string() : source.repo_id,
             scheduler->options().max_batch, scheduler->options().context,
             scheduler->options().batch_invariant ? "batch-invariant" : "batched rows", backend_name);
  std::fflush(stdout);

  std::thread waiter([&] {
    while (!wait_for_signal(-1)) {
    }
    spdlog::warn("stopping: finishing the requests in flight (signal again to cancel them)");
    std::thread drain([&] {
      scheduler->shutdown(true);
      http->stop_after_streams();
      on_stop_signal(0);  // done: wake the waiter below
    });
    // a second signal, or the grace period over, cancels what still runs
    wait_for_signal(o.grace_seconds * 1000);
    scheduler->shutdown(false);
    drain.join();
  });
  Status status = http->listen();
  if (!status) on_stop_signal(0);
  waiter.join();
  KILN_TRY(status);
  return loaded.backend->status();
}

}  // namespace

void add_serve_command(CLI::App& app, Action& action, const Environment& env) {
  auto o = std::make_shared<ServeOptions>();
  auto* cmd = app.add_subcommand("serve", "Serve the model over HTTP (OpenAI and Anthropic APIs)");
  cmd->add_option("MODEL_DIR", o->model_dir,
                  "Model directory or Hugging Face id ORG/NAME[@REV] in the cache (default: the bundled model)");
  cmd->add_option("--host", o->http.host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", o->http.port, "Port (0: any free port)")->capture_default_str()->check(number_in(0, 65535));
  cmd->add_option("--api-key", o->http.api_key, "Require this bearer token on every request");
  cmd->add_option("--max-batch", o->scheduler.max_batch, "Most requests decoding at once")
      ->capture_default_str()
      ->check(number_in(1, 1024));
  cmd->add_option("--ctx", o->scheduler.context, "Context per request in tokens (prompt plus output)")
      ->capture_default_str()
      ->check(number_in(2, 1 << 24));
  cmd->add_option("--prefill-chunk", o->scheduler.prefill_chunk, "Most prompt tokens per batched step")
      ->capture_default_str()
      ->check(number_in(1, 1 << 16));
  cmd->add_option("--prompt-cache-bytes", o->scheduler.prompt_cache_bytes, "Prefix cache budget in bytes (0: off)")
      ->capture_default_str();
  cmd->add_option("--cache-dir", o->scheduler.cache_dir,
                  "Keep the prefix cache's entries in files under DIR too, so that prompts seen before a restart "
                  "start warm");
  cmd->add_option("--cache-dir-bytes", o->scheduler.cache_dir_bytes,
                  "Budget of --cache-dir's files in bytes (the least recently used are removed)")
      ->capture_default_str()
      ->check(positive_number());
  cmd->add_flag("--batch-invariant,!--no-batch-invariant", o->scheduler.batch_invariant,
                "Greedy output independent of the other requests in the batch (default on; off batches more "
                "rows per forward call)");
  cmd->add_option("--max-queue", o->http.max_waiting,
                  "Requests waiting for a batch slot before new ones get 503 (0: as many as the HTTP threads allow)")
      ->check(non_negative_number());
  cmd->add_option("--max-body-bytes", o->http.max_body_bytes, "Largest request body accepted")->capture_default_str();
  cmd->add_option("--read-timeout", o->http.read_timeout_s,
                  "Seconds a request's headers may take, and any pause in it, before it gets 408")
      ->capture_default_str()
      ->check(number_in(1, 3600));
  cmd->add_option("--served-model-name", o->served_name,
                  "The model id clients use (default: the repository id, else the directory name)");
  cmd->add_option("--grace", o->grace_seconds, "Seconds in-flight requests get to finish on SIGINT/SIGTERM")
      ->capture_default_str()
      ->check(non_negative_number());
  cmd->add_option("--generation-config", o->generation_config,
                  "auto: sampling a request leaves unset follows the model's generation_config.json; none: "
                  "kiln's defaults (temperature 1, no cuts)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "none"}));
  cmd->add_option("--max-image-pixels", o->image_limits.max_pixels,
                  "Largest image accepted, in pixels (width x height as stored in the file)")
      ->capture_default_str()
      ->check(positive_number());
  cmd->add_flag("--allow-image-urls", o->image_fetch.allow_urls,
                "Fetch images that requests name by http(s) URL (otherwise only data: URLs and base64)");
  cmd->add_flag("--allow-private-image-urls", o->image_fetch.allow_private,
                "With --allow-image-urls, also fetch from loopback, private and link-local addresses");
  cmd->add_option("--image-url-max-bytes", o->image_fetch.max_bytes, "Largest image fetched from a URL")
      ->capture_default_str()
      ->check(positive_number());
  cmd->add_option("--image-url-timeout", o->image_fetch.timeout_seconds,
                  "Seconds to fetch all of a request's image URLs")
      ->capture_default_str()
      ->check(positive_number());
  add_run_options(*cmd, o->run);
  cmd->callback([o, &action, &env] { action = [o, &env] { return serve(*o, env); }; });
}

}  // namespace kiln::cli
