// `kiln bench` run as a user runs it on a CPU: it finishes in seconds with its figures, and refuses
// what the model cannot take.
#include <chrono>
#include <nlohmann/json.hpp>

#include "test_util.h"

namespace kiln::test {
namespace {

TEST(CliBench, FinishesQuicklyOnACpuWithItsFigures) {
  const auto start = std::chrono::steady_clock::now();
  auto r = run_command(std::string(KILN_BINARY) + " bench " + fixture_path("qwen3_5_dense") +
                           " --device cpu --threads 2 --prompt-len 16 --gen 4 --runs 1 --json",
                       false);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // the matrix peak is measured on a product sized to the device (an 8192³ one took minutes here)
  EXPECT_LT(seconds, 60.0);
  const auto j = nlohmann::json::parse(r.output);
  EXPECT_GT(j["matmul_peak_tflop_s"].get<double>(), 0.0);
  EXPECT_GT(j["prefill_tok_s"].get<double>(), 0.0);
  EXPECT_GT(j["decode_tok_s"].get<double>(), 0.0);
  EXPECT_EQ(j["context"].get<int64_t>(), 16 + 4 + 1);
}

TEST(CliBench, RefusesMorePositionsThanTheModelHas) {
  // the fixture has 4096 positions; without --ctx the prompt and the tokens generated must fit them
  auto r = run_command(std::string(KILN_BINARY) + " bench " + fixture_path("qwen3_5_dense") +
                       " --device cpu --prompt-len 5000 --gen 2 --no-matmul-peak");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--prompt-len 5000 and --gen 2 need 5003 positions; the model has 4096"), std::string::npos)
      << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
}

}  // namespace
}  // namespace kiln::test
