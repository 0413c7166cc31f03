// The public API (include/kiln/engine.h) on the bundled model: its greedy tokens are the
// reference's, events carry the finish reason and usage, stop strings cut the text, a cancelled
// request ends early, and bad requests fail at once.
#include <gtest/gtest.h>

#include "bundled_model.h"
#include "kiln/engine.h"

namespace kiln::test {
namespace {

struct Collected {
  std::vector<int32_t> tokens;
  std::string content;
  Event last;
  int events_with_finish = 0;
};

Collected collect(Stream& stream, int cancel_after_tokens = -1) {
  Collected c;
  Event event;
  while (stream.next(event)) {
    c.tokens.insert(c.tokens.end(), event.tokens.begin(), event.tokens.end());
    c.content += event.content;
    if (cancel_after_tokens >= 0 && int(c.tokens.size()) >= cancel_after_tokens) stream.cancel();
    if (event.finish != Finish::none) {
      c.last = event;
      ++c.events_with_finish;
    }
  }
  return c;
}

class EngineApi : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto loaded = Engine::load(bundled_model_dir(), {.device = "cpu", .threads = 1, .context = 256});
    ASSERT_TRUE(loaded.ok()) << loaded.error().message;
    engine_ = std::move(loaded).value().release();
  }
  static void TearDownTestSuite() {
    delete engine_;
    engine_ = nullptr;
  }
  static inline Engine* engine_ = nullptr;
};

TEST_F(EngineApi, GreedyTokensFollowTheReference) {
  const RecordedPrompt p = recorded_prompts().front();
  auto stream = engine_->submit({.ids = p.prompt, .sampling = {.temperature = 0.0f}, .max_tokens = 16});
  ASSERT_TRUE(stream.ok()) << stream.error().message;
  const Collected c = collect(**stream);
  EXPECT_EQ(c.tokens, std::vector<int32_t>(p.tokens.begin(), p.tokens.begin() + 16));
  EXPECT_EQ(c.events_with_finish, 1);
  EXPECT_EQ(c.last.finish, Finish::length);
  EXPECT_EQ(c.last.usage.prompt_tokens, int64_t(p.prompt.size()));
  EXPECT_EQ(c.last.usage.completion_tokens, 16);
  EXPECT_FALSE(c.content.empty());  // ids in, text out: the model has a tokenizer
}

TEST_F(EngineApi, StopStringsCutTheText) {
  Request request{.text = "And it came to pass", .sampling = {.temperature = 0.0f}, .max_tokens = 24};
  auto whole = engine_->submit(request);
  ASSERT_TRUE(whole.ok()) << whole.error().message;
  const Collected all = collect(**whole);
  ASSERT_GE(all.content.size(), 12u);
  const std::string stop = all.content.substr(6, 4);
  request.stop = {stop};
  auto cut = engine_->submit(request);
  ASSERT_TRUE(cut.ok()) << cut.error().message;
  const Collected c = collect(**cut);
  EXPECT_EQ(c.last.finish, Finish::stop);
  EXPECT_EQ(c.content, all.content.substr(0, all.content.find(stop)));
}

TEST_F(EngineApi, CancelEndsTheRequest) {
  auto stream = engine_->submit({.text = "In the beginning", .sampling = {.temperature = 0.0f}, .max_tokens = 200});
  ASSERT_TRUE(stream.ok()) << stream.error().message;
  const Collected c = collect(**stream, /*cancel_after_tokens=*/1);
  EXPECT_EQ(c.last.finish, Finish::cancelled);
  EXPECT_LT(c.tokens.size(), 200u);
}

TEST_F(EngineApi, BadRequestsFailAtOnce) {
  auto empty = engine_->submit({});
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.error().message.find("empty"), std::string::npos) << empty.error().message;
  std::vector<int32_t> long_prompt(300, 1);
  auto too_long = engine_->submit({.ids = long_prompt});
  ASSERT_FALSE(too_long.ok());
  EXPECT_NE(too_long.error().message.find("context of 256 tokens"), std::string::npos) << too_long.error().message;
  auto outside = engine_->submit({.ids = {1, 2, int32_t(engine_->summary().vocab_size)}});
  EXPECT_FALSE(outside.ok());
}

}  // namespace
}  // namespace kiln::test
