// `kiln bench` run as a user runs it on a CPU: it finishes in seconds with its figures, times its
// ops when asked, and refuses what the model cannot take.
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

// --profile times every op on a CPU as on a GPU (it printed empty tables there)
TEST(CliBench, ProfilesOpsOnACpu) {
  auto r = run_command(std::string(KILN_BINARY) + " bench " + fixture_path("qwen3_5_dense") +
                           " --device cpu --threads 2 --prompt-len 8 --gen 2 --runs 1 --no-matmul-peak --profile",
                       false);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const size_t prefill = r.output.find("prefill by op:"), decode = r.output.find("decode (", prefill);
  ASSERT_NE(prefill, std::string::npos) << r.output;
  ASSERT_NE(decode, std::string::npos) << r.output;
  for (const char* op : {"matmul", "gated_delta", "causal_conv1d", "attention"}) {
    const size_t in_prefill = r.output.find(std::string("  ") + op + " ", prefill);
    EXPECT_LT(in_prefill, decode) << op << " missing from the prefill's table: " << r.output;
    EXPECT_NE(r.output.find(std::string("  ") + op + " ", decode), std::string::npos) << op << ": " << r.output;
  }
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
