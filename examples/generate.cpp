// A program that uses kiln through its public API alone (include/kiln/): loads a model, streams
// the answer to a chat message, and reports why it ended and what it cost.
//
//   build/kiln_example_generate [MODEL_DIR] [MESSAGE]
//
// MODEL_DIR defaults to the model that ships in the repository. Ctrl-C is not caught: the
// example cancels its request after 30 seconds instead, to show how.
#include <kiln/engine.h>

#include <chrono>
#include <cstdio>
#include <string>

int main(int argc, char** argv) {
  const std::string model_dir = argc > 1 ? argv[1] : KILN_SOURCE_DIR "/models/kiln-kjv-31m";
  const std::string message = argc > 2 ? argv[2] : "Who made the heaven and the earth?";

  // Load: the model, its tokenizer, chat template and generation_config.json on a device.
  auto engine = kiln::Engine::load(model_dir, {.device = "cpu", .context = 1024});
  if (!engine.ok()) {
    std::fprintf(stderr, "error: %s\n", engine.error().message.c_str());
    return 1;
  }

  // Submit: a chat message, greedy, at most 64 tokens, ending before a blank line.
  kiln::Request request{.messages = {{.role = "user", .content = message}},
                        .sampling = {.temperature = 0.0f},
                        .max_tokens = 64,
                        .stop = {"\n\n"}};
  auto stream = (*engine)->submit(request);
  if (!stream.ok()) {
    std::fprintf(stderr, "error: %s\n", stream.error().message.c_str());
    return 1;
  }

  // Stream: text as it becomes final; the last event carries the finish reason and usage.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  kiln::Event event;
  while ((*stream)->next(event)) {
    std::fputs(event.reasoning.c_str(), stdout);
    std::fputs(event.content.c_str(), stdout);
    std::fflush(stdout);
    // Cancel: the request ends at the next step, with Finish::cancelled.
    if (std::chrono::steady_clock::now() > deadline) (*stream)->cancel();
    if (event.finish == kiln::Finish::none) continue;
    if (event.finish == kiln::Finish::error) {
      std::fprintf(stderr, "\nerror: %s\n", event.error.c_str());
      return 1;
    }
    std::printf("\n");
    std::fprintf(stderr, "finish: %s; prompt %lld tokens, generated %lld tokens in %.2f s\n",
                 kiln::finish_name(event.finish), static_cast<long long>(event.usage.prompt_tokens),
                 static_cast<long long>(event.usage.completion_tokens),
                 event.usage.prompt_seconds + event.usage.decode_seconds);
  }
  return 0;
}
