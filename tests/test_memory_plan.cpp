// `kiln fit`'s memory plan: a model loaded on the planning backend predicts the bytes of the real
// CPU backend's sequence states at any context (sliding rings and quantized caches included), its
// arithmetic answers what fits, and the command reports it in text and JSON.
#include "backend/cpu/cpu_backend.h"
#include "backend/meta/plan_backend.h"
#include "bundled_model.h"
#include "models/model.h"
#include "runtime/memory_plan.h"
#include "test_util.h"

namespace kiln::test {
namespace {

TEST(MemoryPlan, PredictsTheCpuBackendsSequenceStates) {
  struct Case {
    std::string dir;
    std::optional<KvQuant> kv;
  };
  const std::vector<Case> cases = {{fixture_path("qwen3_5_dense"), std::nullopt},
                                   {fixture_path("gemma4_dense"), std::nullopt},
                                   {fixture_path("gemma4_ple_shared"), KvQuant{4, 32}},
                                   {fixture_path("qwen3_5_moe"), KvQuant{8, 32}},
                                   {bundled_model_dir(), KvQuant{8, 64}}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.dir);
    const ModelOptions options{.max_chunk_tokens = 64, .kv_quant = c.kv};
    PlanBackend plan_backend(cpu_plan_target());
    auto planned = load_model(c.dir, plan_backend, options);
    ASSERT_TRUE(planned.ok()) << planned.error().message;
    const size_t weights = plan_backend.live_memory_bytes();
    EXPECT_GT(weights, 0u);
    auto plan = plan_memory(**planned, weights, 64, 0);
    ASSERT_TRUE(plan.ok()) << plan.error().message;
    EXPECT_GT(plan->bytes_per_token(), 0u);
    EXPECT_GT(plan->step_workspace(1), 0u);
    EXPECT_GE(plan->step_workspace(64), plan->step_workspace(1));

    CpuBackend cpu(1);
    auto real = load_model(c.dir, cpu, options);
    ASSERT_TRUE(real.ok()) << real.error().message;
    for (const int64_t context : {1, 17, 64, 100, 1000, 3000}) {
      auto state = (*real)->new_sequence(context);
      ASSERT_TRUE(state.ok());
      EXPECT_EQ(plan->sequence_bytes(context), (*state)->bytes()) << "context " << context;
    }
  }
}

TEST(MemoryPlan, AnswersWhatFits) {
  MemoryPlan plan;
  plan.weights = 1000;
  plan.states = {LayerStatePlan{.kind = "full attention", .layers = 2, .bytes_per_token = 10},
                 LayerStatePlan{.kind = "sliding window", .layers = 1, .bytes_per_sequence = 200, .ring = 20},
                 LayerStatePlan{.kind = "recurrent", .layers = 1, .bytes_per_sequence = 50}};
  plan.step_workspace_1 = 100;
  plan.step_workspace_64 = 100 + 63 * 4;
  plan.max_positions = 100000;
  EXPECT_EQ(plan.sequence_bytes(5), 5 * 10 + 50 + 50u);  // 5 of the ring's 20 slots
  EXPECT_EQ(plan.sequence_bytes(40), 40 * 10 + 200 + 50u);
  EXPECT_EQ(plan.total(40, 3), 1000 + (100 + 2 * 4) + 3 * (400 + 250u));
  const size_t budget = 10000;
  const int64_t ctx = plan.max_context(budget, 3);
  EXPECT_LE(plan.total(ctx, 3), budget);
  EXPECT_GT(plan.total(ctx + 1, 3), budget);
  const int64_t batch = plan.max_batch(budget, 40);
  EXPECT_LE(plan.total(40, batch), budget);
  EXPECT_GT(plan.total(40, batch + 1), budget);
  EXPECT_EQ(plan.max_context(1000, 1), 0) << "the weights alone fill the budget";
  EXPECT_EQ(plan.max_context(size_t(1) << 40, 1), 100000) << "capped at the model's positions";
}

TEST(MemoryPlan, FitCommandReportsThePlan) {
  auto r = run_command(std::string(KILN_BINARY) + " fit " + fixture_path("gemma4_dense") +
                           " --device cpu --ctx 1000 --batch 3 --memory 50000000 --json",
                       false);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j["model_type"], "gemma4_text");
  EXPECT_EQ(j["budget_bytes"], 50000000);
  EXPECT_TRUE(j["fits"].get<bool>());
  EXPECT_GT(j["max_context"].get<int64_t>(), 1000);
  EXPECT_GT(j["max_batch"].get<int64_t>(), 3);
  ASSERT_EQ(j["states"].size(), 2u);
  EXPECT_EQ(j["states"][0]["kind"], "full attention");
  EXPECT_EQ(j["states"][1]["kind"], "sliding window");
  const size_t peak = j["peak_memory_bytes"];
  EXPECT_EQ(peak, j["weights_bytes"].get<size_t>() + j["workspace_bytes"].get<size_t>() +
                      3 * (1000 * j["kv_bytes_per_token"].get<size_t>() + j["state_bytes_per_sequence"].get<size_t>()));

  // 8-bit caches: fewer bytes a token; a budget too small for the weights fits nothing
  auto q = run_command(std::string(KILN_BINARY) + " fit " + fixture_path("gemma4_dense") +
                           " --device cpu --kv-bits 8 --kv-group-size 32 --memory 1000 --json",
                       false);
  ASSERT_EQ(q.exit_code, 0) << q.output;
  const auto jq = nlohmann::json::parse(q.output);
  EXPECT_LT(jq["kv_bytes_per_token"].get<size_t>(), j["kv_bytes_per_token"].get<size_t>() / 3);
  EXPECT_FALSE(jq["fits"].get<bool>());
  EXPECT_EQ(jq["max_context"], 0);

  auto text = run_command(std::string(KILN_BINARY) + " fit " + fixture_path("qwen3_5_dense") + " --device cpu");
  ASSERT_EQ(text.exit_code, 0) << text.output;
  for (const char* want : {"weights", "full attention (2 layers)", "recurrent (6 layers)", "longest context"})
    EXPECT_NE(text.output.find(want), std::string::npos) << want << "\n" << text.output;
  auto bad = run_command(std::string(KILN_BINARY) + " fit " + fixture_path("qwen3_5_dense") + " --memory lots");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("--memory lots"), std::string::npos) << bad.output;
}

}  // namespace
}  // namespace kiln::test
