// Time a token's draw from logits on the host (Sampler::sample) for a vocabulary the size of the
// models' (Gemma 4: 262,144; Qwen 3.5: 248,320), under the sampling settings requests commonly use.
// The logits are normal with a given spread: a flat stand-in for a model's, on which the cuts keep
// more candidates than a trained model's usually would.
//
// Usage: kiln_sampler_bench [--vocab N] [--spread S] [--draws N]
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include "runtime/sampler.h"

int main(int argc, char** argv) {
  int64_t vocab = 248320;
  float spread = 3.0f;
  int draws = 50;
  CLI::App app{"Host-side sampling time per token"};
  app.add_option("--vocab", vocab, "Vocabulary size")->check(CLI::PositiveNumber);
  app.add_option("--spread", spread, "Standard deviation of the logits")->check(CLI::PositiveNumber);
  app.add_option("--draws", draws, "Draws timed per setting")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, spread);
  std::vector<float> logits(static_cast<size_t>(vocab));
  for (float& l : logits) l = normal(rng);
  const std::vector<int32_t> history(512, 7);
  struct Setting {
    const char* name;
    kiln::SamplingParams params;
  };
  const Setting settings[] = {
      {"temperature 1", {.temperature = 1.0f}},
      {"temperature 0.7, top_p 0.95", {.temperature = 0.7f, .top_p = 0.95f}},
      {"temperature 0.6, top_k 20, top_p 0.95", {.temperature = 0.6f, .top_k = 20, .top_p = 0.95f}},
      {"temperature 1, top_k 64, min_p 0.05", {.temperature = 1.0f, .top_k = 64, .min_p = 0.05f}},
      {"temperature 0.8, presence 1.5, repetition 1.1",
       {.temperature = 0.8f, .repetition_penalty = 1.1f, .presence_penalty = 1.5f}},
  };
  for (const Setting& s : settings) {
    kiln::Sampler sampler(s.params);
    sampler.sample(logits, history);  // buffers sized
    const auto start = std::chrono::steady_clock::now();
    int64_t checksum = 0;
    for (int i = 0; i < draws; ++i) checksum += sampler.sample(logits, history);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    std::printf("%-48s %8.3f ms a token (checksum %lld)\n", s.name, ms / draws, static_cast<long long>(checksum));
  }
}
