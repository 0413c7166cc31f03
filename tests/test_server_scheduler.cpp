// The continuous-batching scheduler on the CPU backend with the oracle fixtures: a greedy
// generation gives the same tokens alone and among 31 others that arrive while it runs; the
// prefix cache gives the same tokens as a cold start, reports what it reused, and makes a second
// chat turn cheap; errors come back as values.
#include <algorithm>
#include <chrono>
#include <set>
#include <thread>

#include "backend/cpu/cpu_backend.h"
#include "models/model.h"
#include "runtime/scheduler.h"
#include "scheduler_test_util.h"
#include "test_util.h"

namespace kiln::test {
namespace {

std::unique_ptr<Model> load(Backend& backend, const std::string& fixture) {
  auto model = load_model(fixture_path(fixture), backend);
  EXPECT_TRUE(model.ok()) << (model.ok() ? "" : model.error().message);
  return model.ok() ? std::move(model).value() : nullptr;
}

class SchedulerBatching : public testing::TestWithParam<std::tuple<std::string, bool>> {};

TEST_P(SchedulerBatching, GreedyOutputDoesNotDependOnTheBatch) {
  const auto [fixture, invariant] = GetParam();
  CpuBackend backend(2);
  auto model = load(backend, fixture);
  ASSERT_TRUE(model);
  const int64_t vocab = model->info().vocab_size;
  constexpr int kRequests = 32;
  // alone, one at a time
  std::vector<std::vector<int32_t>> alone(kRequests);
  {
    auto s = Scheduler::create(
        *model, SchedulerOptions{.max_batch = 1, .context = 256, .prefill_chunk = 16, .batch_invariant = invariant});
    ASSERT_TRUE(s.ok()) << s.error().message;
    for (int i = 0; i < kRequests; ++i) {
      auto g = (*s)->submit(greedy(prompt_for(i, vocab, 5 + (i * 7) % 40), 12));
      ASSERT_TRUE(g.ok());
      alone[i] = drain(*g).tokens;
      ASSERT_EQ(alone[i].size(), 12u);
    }
  }
  std::set<std::vector<int32_t>> distinct(alone.begin(), alone.end());
  EXPECT_GT(distinct.size(), size_t(kRequests / 2)) << "the outputs are too alike to tell batches apart";
  // together: staggered arrivals join a running batch, prompts are prefilled in chunks between
  // decode steps
  auto s = Scheduler::create(
      *model, SchedulerOptions{.max_batch = 32, .context = 256, .prefill_chunk = 16, .batch_invariant = invariant});
  ASSERT_TRUE(s.ok());
  std::vector<std::shared_ptr<Generation>> gens;
  for (int i = 0; i < kRequests; ++i) {
    auto g = (*s)->submit(greedy(prompt_for(i, vocab, 5 + (i * 7) % 40), 12));
    ASSERT_TRUE(g.ok());
    gens.push_back(*g);
    if (i % 8 == 7) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (int i = 0; i < kRequests; ++i) EXPECT_EQ(drain(gens[i]).tokens, alone[i]) << "request " << i;
  EXPECT_GT((*s)->stats().step_rows, (*s)->stats().steps) << "the requests never shared a step";
}

// both with every row in one forward call (the CPU backend computes each row the same way at
// any row count) and with batch-invariant steps
INSTANTIATE_TEST_SUITE_P(Fixtures, SchedulerBatching,
                         testing::Combine(testing::Values("qwen3_5_dense", "gemma4_dense"), testing::Bool()));

// Forced tokens replace what a generation samples: from its first token, or once its output ends
// with `after`; then it samples freely again; and a reasoning's close once its budget is spent.
// Forced ids outside the vocabulary are refused.
TEST(Scheduler, ForcedTokensReplaceTheSampledOnes) {
  CpuBackend backend(2);
  auto model = load(backend, "qwen3_5_dense");
  ASSERT_TRUE(model);
  const int64_t vocab = model->info().vocab_size;
  auto s = Scheduler::create(*model, SchedulerOptions{.max_batch = 2, .context = 128});
  ASSERT_TRUE(s.ok());
  auto run = [&](ForcedTokens forced) {
    GenerationParams p = greedy(prompt_for(3, vocab, 12), 8);
    p.forced = std::move(forced);
    auto g = (*s)->submit(std::move(p));
    EXPECT_TRUE(g.ok());
    return g.ok() ? drain(*g).tokens : std::vector<int32_t>();
  };
  const std::vector<int32_t> free = run({});
  ASSERT_EQ(free.size(), 8u);
  // three ids the model did not choose next
  std::vector<int32_t> forced;
  for (int32_t id = 0; forced.size() < 3; ++id)
    if (std::find(free.begin(), free.end(), id) == free.end()) forced.push_back(id);
  const std::vector<int32_t> at_start = run({.after = {}, .tokens = forced});
  ASSERT_EQ(at_start.size(), 8u);
  EXPECT_EQ(std::vector<int32_t>(at_start.begin(), at_start.begin() + 3), forced);
  const std::vector<int32_t> after_two = run({.after = {free[0], free[1]}, .tokens = forced});
  ASSERT_EQ(after_two.size(), 8u);
  EXPECT_EQ(std::vector<int32_t>(after_two.begin(), after_two.begin() + 2),
            std::vector<int32_t>(free.begin(), free.begin() + 2));
  EXPECT_EQ(std::vector<int32_t>(after_two.begin() + 2, after_two.begin() + 5), forced);
  // `after` never seen: nothing is forced
  EXPECT_EQ(run({.after = {forced[0], forced[1]}, .tokens = forced}), free);
  // with an opener: a first token that is the opener makes the forced tokens wait for `after`...
  const std::vector<int32_t> opened =
      run({.after = {free[0], free[1]}, .tokens = forced, .opener = free[0], .at_once = {forced[2]}});
  EXPECT_EQ(opened, after_two);
  // ...and any other first token is replaced by `at_once`
  const std::vector<int32_t> not_opened =
      run({.after = {free[0], free[1]}, .tokens = forced, .opener = forced[0], .at_once = {forced[2], forced[1]}});
  ASSERT_EQ(not_opened.size(), 8u);
  EXPECT_EQ(std::vector<int32_t>(not_opened.begin(), not_opened.begin() + 2),
            (std::vector<int32_t>{forced[2], forced[1]}));
  // a stop token sampled while `after` is awaited becomes `after`, and the forced tokens follow
  GenerationParams stopping = greedy(prompt_for(3, vocab, 12), 8);
  stopping.stop_ids = {free[2]};
  stopping.forced = {.after = {forced[0]}, .tokens = {forced[1], forced[2]}};
  auto g = (*s)->submit(std::move(stopping));
  ASSERT_TRUE(g.ok());
  const std::vector<int32_t> cut = drain(*g).tokens;
  const size_t stop_at = size_t(std::find(free.begin(), free.end(), free[2]) - free.begin());
  ASSERT_GE(cut.size(), stop_at + 3);
  EXPECT_EQ(std::vector<int32_t>(cut.begin(), cut.begin() + long(stop_at)),
            std::vector<int32_t>(free.begin(), free.begin() + long(stop_at)));
  EXPECT_EQ(std::vector<int32_t>(cut.begin() + long(stop_at), cut.begin() + long(stop_at) + 3), forced);
  // a reasoning budget: two tokens after the opener, the close is forced...
  const std::vector<int32_t> capped =
      run({.reasoning_budget = 2, .reasoning_opener = free[1], .reasoning_close = {forced[0]}});
  ASSERT_EQ(capped.size(), 8u);
  const long closed_at = long(std::find(free.begin(), free.end(), free[1]) - free.begin()) + 3;
  EXPECT_EQ(std::vector<int32_t>(capped.begin(), capped.begin() + closed_at),
            std::vector<int32_t>(free.begin(), free.begin() + closed_at));
  EXPECT_EQ(capped[size_t(closed_at)], forced[0]);
  // ...from the first token without an opener; a reasoning closed within its budget is left alone
  EXPECT_EQ(run({.reasoning_budget = 1, .reasoning_close = {forced[1], forced[2]}})[1], forced[1]);
  EXPECT_EQ(run({.reasoning_budget = 2, .reasoning_close = {free[1]}}), free);
  GenerationParams outside = greedy(prompt_for(3, vocab, 12), 8);
  outside.forced.tokens = {int32_t(vocab)};
  EXPECT_FALSE((*s)->submit(std::move(outside)).ok());
  GenerationParams outside_close = greedy(prompt_for(3, vocab, 12), 8);
  outside_close.forced = {.reasoning_budget = 1, .reasoning_close = {int32_t(vocab)}};
  EXPECT_FALSE((*s)->submit(std::move(outside_close)).ok());
}

TEST(SchedulerPrefixCache, SameTokensFromACachedPrefix) {
  for (const std::string fixture : {"qwen3_5_dense", "gemma4_dense"}) {
    CpuBackend backend(2);
    auto model = load(backend, fixture);
    ASSERT_TRUE(model);
    const auto base = prompt_for(1, model->info().vocab_size, 70);
    auto longer = base;
    for (int32_t t : prompt_for(2, model->info().vocab_size, 9)) longer.push_back(t);
    auto cold = Scheduler::create(*model, SchedulerOptions{.max_batch = 2, .context = 200});
    ASSERT_TRUE(cold.ok());
    const Outcome want = drain(*(*cold)->submit(greedy(longer, 10)));
    EXPECT_EQ(want.cached, 0);

    auto warm = Scheduler::create(
        *model, SchedulerOptions{.max_batch = 2, .context = 200, .prompt_cache_bytes = 1 << 30, .cache_block = 32});
    ASSERT_TRUE(warm.ok());
    const Outcome first = drain(*(*warm)->submit(greedy(base, 4)));
    EXPECT_EQ(first.cached, 0);
    const Outcome got = drain(*(*warm)->submit(greedy(longer, 10)));
    EXPECT_EQ(got.cached, 70) << fixture;  // the first prompt's end-of-prompt snapshot
    EXPECT_EQ(got.tokens, want.tokens) << fixture;
    // a prompt that shares only the first 40 tokens starts from the block snapshot at 32
    auto branch = std::vector<int32_t>(base.begin(), base.begin() + 40);
    branch.push_back(3);
    const Outcome b = drain(*(*warm)->submit(greedy(branch, 3)));
    EXPECT_EQ(b.cached, 32) << fixture;
    EXPECT_GT((*warm)->stats().cache_hits, 0);
  }
}

TEST(SchedulerPrefixCache, EvictsWithinTheBudget) {
  CpuBackend backend(1);
  auto model = load(backend, "qwen3_5_dense");
  ASSERT_TRUE(model);
  auto probe = model->new_sequence(128);
  ASSERT_TRUE(probe.ok());
  const size_t one = (*probe)->bytes();
  auto s = Scheduler::create(*model, SchedulerOptions{.max_batch = 1, .context = 128, .prompt_cache_bytes = 3 * one});
  ASSERT_TRUE(s.ok());
  for (int i = 0; i < 6; ++i) drain(*(*s)->submit(greedy(prompt_for(10 + i, model->info().vocab_size, 20), 2)));
  EXPECT_LE((*s)->stats().cache_bytes, 3 * one);
  EXPECT_EQ((*s)->stats().cache_entries, 3);
}

// A 2,000-token conversation, then the same conversation plus a 50-token message: the second
// prefill runs only what the cache lacks.
TEST(SchedulerPrefixCache, SecondTurnPrefillsOnlyTheNewMessage) {
  CpuBackend backend(2);
  auto model = load(backend, "qwen3_5_dense");
  ASSERT_TRUE(model);
  const auto turn1 = prompt_for(3, model->info().vocab_size, 2000);
  auto s = Scheduler::create(*model,
                             SchedulerOptions{.max_batch = 1, .context = 2200, .prompt_cache_bytes = size_t(1) << 30});
  ASSERT_TRUE(s.ok());
  const Outcome first = drain(*(*s)->submit(greedy(turn1, 8)));
  auto turn2 = turn1;
  turn2.insert(turn2.end(), first.tokens.begin(), first.tokens.end());
  for (int32_t t : prompt_for(4, model->info().vocab_size, 50)) turn2.push_back(t);
  const Outcome second = drain(*(*s)->submit(greedy(turn2, 8)));
  EXPECT_GE(second.cached, 2000);
  std::printf("[ prefill ] first turn %zu tokens %.1f ms; second turn %zu tokens (%lld cached) %.1f ms (%.0f%%)\n",
              turn1.size(), first.prompt_seconds * 1e3, turn2.size(), (long long)second.cached,
              second.prompt_seconds * 1e3, 100.0 * second.prompt_seconds / first.prompt_seconds);
  EXPECT_LE(second.prompt_seconds, 0.25 * first.prompt_seconds);
}

TEST(Scheduler, ErrorsAreValues) {
  CpuBackend backend(1);
  auto model = load(backend, "qwen3_5_dense");
  ASSERT_TRUE(model);
  auto s = Scheduler::create(*model, SchedulerOptions{.max_batch = 1, .context = 32});
  ASSERT_TRUE(s.ok());
  EXPECT_FALSE((*s)->submit(greedy({}, 4)).ok());
  EXPECT_FALSE((*s)->submit(greedy(prompt_for(0, 320, 40), 4)).ok());
  EXPECT_FALSE((*s)->submit(greedy(prompt_for(0, 320, 10), 40)).ok());
  EXPECT_FALSE((*s)->submit(greedy({1, 2, 100000}, 4)).ok());
  // a cancelled generation ends and frees its slot; the next one runs
  auto g = (*s)->submit(greedy(prompt_for(0, 320, 4), 20));
  ASSERT_TRUE(g.ok());
  (*g)->cancel();
  EXPECT_EQ(drain(*g).finish, FinishReason::cancelled);
  auto next = (*s)->submit(greedy(prompt_for(1, 320, 4), 3));
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(drain(*next).tokens.size(), 3u);
  // shutting down cancels what runs and refuses new work
  auto long_one = (*s)->submit(greedy(prompt_for(2, 320, 4), 27));
  ASSERT_TRUE(long_one.ok());
  (*s)->shutdown(false);
  EXPECT_NE(drain(*long_one).finish, FinishReason::running);
  EXPECT_FALSE((*s)->submit(greedy(prompt_for(3, 320, 4), 3)).ok());
}

}  // namespace
}  // namespace kiln::test
