// The prompt store: prefix-cache entries in files that outlive the process. A state written and
// read back continues with the same logits (recurrent and attention layers, sliding rings that
// wrapped, quantized caches); a scheduler started again on the same directory resumes a prompt it
// saw before with the same tokens; damaged and foreign files are skipped; the byte budget removes
// the least recently used files; the model fingerprint follows the weights.
#include <algorithm>
#include <filesystem>
#include <fstream>

#include "backend/cpu/cpu_backend.h"
#include "models/model.h"
#include "runtime/prefill.h"
#include "runtime/prompt_store.h"
#include "runtime/scheduler.h"
#include "scheduler_test_util.h"
#include "test_util.h"

namespace kiln::test {
namespace {

namespace fs = std::filesystem;

std::unique_ptr<Model> load(Backend& backend, const std::string& dir, ModelOptions options = {}) {
  auto model = load_model(dir, backend, options);
  EXPECT_TRUE(model.ok()) << (model.ok() ? "" : model.error().message);
  return model.ok() ? std::move(model).value() : nullptr;
}

std::unique_ptr<PromptStore> open_store(const std::string& dir, const std::string& fingerprint = "test",
                                        size_t budget = size_t(1) << 30) {
  auto store = PromptStore::open({.dir = dir, .fingerprint = fingerprint, .budget_bytes = budget});
  EXPECT_TRUE(store.ok()) << (store.ok() ? "" : store.error().message);
  return store.ok() ? std::move(store).value() : nullptr;
}

// Runs `ids` after whatever the state holds; returns the logits of every new position.
std::vector<float> continue_with(Model& model, SequenceState& state, std::span<const int32_t> ids, int64_t chunk) {
  auto logits = run_tokens(model, state, ids, chunk, LogitRows::all);
  EXPECT_TRUE(logits.ok()) << (logits.ok() ? "" : logits.error().message);
  return logits.ok() ? std::vector<float>(logits->data_as<float>(), logits->data_as<float>() + logits->numel())
                     : std::vector<float>();
}

std::vector<int32_t> joined(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// The entry files of a store's directory, sorted by name.
std::vector<fs::path> entry_files(const PromptStore& store) {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(store.directory()))
    if (e.path().extension() == ".state") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  return files;
}

struct RoundTrip {
  std::string fixture;
  KvQuant kv;
  const char* what;
};

TEST(PromptStore, RestoredStatesContinueWithTheSameLogits) {
  // gemma4_dense's sliding window is 24: with chunks of 8 its rings hold 31 slots, so a prefix of
  // 100 tokens wraps them; its full-attention rings and Qwen's do not wrap in 200
  for (const RoundTrip& c : {RoundTrip{"qwen3_5_dense", {}, "Gated DeltaNet and full attention"},
                             RoundTrip{"gemma4_dense", {}, "sliding rings that wrapped"},
                             RoundTrip{"gemma4_dense", {4, 32}, "quantized caches"},
                             RoundTrip{"qwen3_5_dense", {4, 32}, "quantized caches"}}) {
    SCOPED_TRACE(c.fixture + ": " + c.what);
    TempDir dir;
    CpuBackend backend(2);
    auto model = load(backend, fixture_path(c.fixture), {.max_chunk_tokens = 8, .kv_quant = c.kv});
    ASSERT_TRUE(model);
    const auto ids = fixture_ids(c.fixture);
    const std::vector<int32_t> prefix(ids.begin(), ids.begin() + 100), suffix(ids.begin() + 100, ids.begin() + 130);
    auto state = model->new_sequence(200);
    ASSERT_TRUE(state.ok());
    continue_with(*model, **state, prefix, 8);
    {
      auto store = open_store(dir.path());
      ASSERT_TRUE(store);
      store->save(prefix, **state, backend);
      store->save(prefix, **state, backend);  // a second save of the same tokens writes nothing more
      store->flush();
      EXPECT_EQ(store->entries(), 1u);
      // a ring that never wrapped keeps only its used slots
      EXPECT_LT(store->bytes(), (*state)->bytes());
    }
    const auto want = continue_with(*model, **state, suffix, 5);

    // another store on the directory (a process started again) finds the entry by its tokens
    auto store = open_store(dir.path());
    ASSERT_TRUE(store);
    ASSERT_EQ(store->entries(), 1u);
    EXPECT_FALSE(store->find(prefix)) << "an entry serves only prompts it is a proper prefix of";
    EXPECT_FALSE(store->find(joined(prefix, suffix), {}, 100)) << "nothing longer than 100 tokens";
    EXPECT_FALSE(store->find(joined(prefix, suffix), [](int64_t n) { return n != 100; }));
    const auto entry = store->find(joined(prefix, suffix));
    ASSERT_TRUE(entry);
    EXPECT_EQ(entry->tokens, 100);
    // loaded into the sequence that went on past it (its later slots are stale, not empty)
    const Status loaded = store->load(*entry, **state, backend);
    ASSERT_TRUE(loaded.ok()) << loaded.error().message;
    EXPECT_EQ((*state)->length(), 100);
    EXPECT_EQ(continue_with(*model, **state, suffix, 5), want) << "a stored state must continue identically";
  }
}

TEST(PromptStore, StatesOfAnotherShapeAreRefused) {
  TempDir dir;
  CpuBackend backend(2);
  auto model = load(backend, fixture_path("gemma4_dense"), {.max_chunk_tokens = 8});
  ASSERT_TRUE(model);
  const auto ids = fixture_ids("gemma4_dense");
  const std::vector<int32_t> prefix(ids.begin(), ids.begin() + 100);
  auto state = model->new_sequence(200);
  ASSERT_TRUE(state.ok());
  continue_with(*model, **state, prefix, 8);
  auto store = open_store(dir.path());
  ASSERT_TRUE(store);
  store->save(prefix, **state, backend);
  store->flush();
  const auto longer = joined(prefix, {5, 6});

  // sliding rings of another size (another chunk): a wrapped ring holds positions in its own slots
  auto other = load(backend, fixture_path("gemma4_dense"), {.max_chunk_tokens = 16});
  ASSERT_TRUE(other);
  auto other_state = other->new_sequence(200);
  ASSERT_TRUE(other_state.ok());
  continue_with(*other, **other_state, std::vector<int32_t>(ids.begin(), ids.begin() + 7), 8);
  auto entry = store->find(longer);
  ASSERT_TRUE(entry);
  const Status refused = store->load(*entry, **other_state, backend);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("rows"), std::string::npos) << refused.error().message;
  EXPECT_EQ((*other_state)->length(), 7) << "a refused entry leaves the state as it was";
  EXPECT_FALSE(store->find(longer)) << "a refused entry leaves the index";
  EXPECT_EQ(entry_files(*store).size(), 1u) << "a file that fits another state is not removed";

  // quantized caches where the file holds plain ones
  auto reopened = open_store(dir.path());
  auto quantized = load(backend, fixture_path("gemma4_dense"), {.max_chunk_tokens = 8, .kv_quant = KvQuant{4, 32}});
  ASSERT_TRUE(reopened && quantized);
  auto quantized_state = quantized->new_sequence(200);
  ASSERT_TRUE(quantized_state.ok());
  entry = reopened->find(longer);
  ASSERT_TRUE(entry);
  EXPECT_FALSE(reopened->load(*entry, **quantized_state, backend).ok());
}

SchedulerOptions with_dir(const std::string& dir, const std::string& fingerprint = "test") {
  return SchedulerOptions{.max_batch = 2,
                          .context = 400,
                          .prompt_cache_bytes = size_t(1) << 30,
                          .cache_dir = dir,
                          .fingerprint = fingerprint};
}

TEST(PromptStore, SchedulerResumesAPromptAfterARestart) {
  TempDir dir;
  std::vector<int32_t> prompt;
  Outcome first;
  {
    CpuBackend backend(2);
    auto model = load(backend, fixture_path("qwen3_5_dense"));
    ASSERT_TRUE(model);
    prompt = prompt_for(1, model->info().vocab_size, 300);
    auto s = Scheduler::create(*model, with_dir(dir.path()));
    ASSERT_TRUE(s.ok()) << s.error().message;
    first = drain(*(*s)->submit(greedy(prompt, 8)));
    EXPECT_EQ(first.cached, 0);
  }  // the scheduler goes first: its store writes what is queued
  CpuBackend backend(2);
  auto model = load(backend, fixture_path("qwen3_5_dense"));
  ASSERT_TRUE(model);
  auto s = Scheduler::create(*model, with_dir(dir.path()));
  ASSERT_TRUE(s.ok()) << s.error().message;
  const Outcome second = drain(*(*s)->submit(greedy(prompt, 8)));
  EXPECT_EQ(second.cached, 256) << "the snapshot at the first block boundary, from disk";
  EXPECT_EQ(second.tokens, first.tokens);
  // what was loaded went into the memory cache too
  const Outcome third = drain(*(*s)->submit(greedy(prompt, 8)));
  EXPECT_GT(third.cached, 0);
  EXPECT_EQ(third.tokens, first.tokens);
}

TEST(PromptStore, SchedulerRefusesADirectoryItCannotUse) {
  TempDir dir;
  CpuBackend backend(1);
  auto model = load(backend, fixture_path("qwen3_5_dense"));
  ASSERT_TRUE(model);
  const std::string file = dir.path() + "/a-file";
  std::ofstream(file) << "not a directory";
  auto s = Scheduler::create(*model, with_dir(file + "/cache"));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find(file), std::string::npos) << s.error().message;
  SchedulerOptions no_memory_cache = with_dir(dir.path());
  no_memory_cache.prompt_cache_bytes = 0;
  s = Scheduler::create(*model, no_memory_cache);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("prompt_cache_bytes"), std::string::npos) << s.error().message;
}

TEST(PromptStore, DamagedAndForeignFilesAreSkipped) {
  TempDir dir, elsewhere;
  CpuBackend backend(2);
  auto model = load(backend, fixture_path("qwen3_5_dense"));
  ASSERT_TRUE(model);
  const int64_t vocab = model->info().vocab_size;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 3; ++i) prompts.push_back(prompt_for(20 + i, vocab, 100));
  fs::path flipped;
  {
    // the first a byte flipped in its middle, the second cut short, the third written for another
    // model (under the right name, in the right directory)
    auto store = open_store(dir.path());
    auto foreign = open_store(elsewhere.path(), "another model");
    ASSERT_TRUE(store && foreign);
    for (int i = 0; i < 3; ++i) {
      auto state = model->new_sequence(400);
      ASSERT_TRUE(state.ok());
      continue_with(*model, **state, prompts[size_t(i)], 64);
      (i < 2 ? *store : *foreign).save(prompts[size_t(i)], **state, backend);
    }
    store->flush();
    foreign->flush();
    ASSERT_EQ(store->entries(), 2u);
    flipped = entry_files(*store)[0];
    const fs::path cut = entry_files(*store)[1];
    std::fstream f(flipped, std::ios::in | std::ios::out | std::ios::binary);
    const auto middle = std::streamoff(fs::file_size(flipped) / 2);
    f.seekg(middle);
    const char byte = char(f.get() ^ 0xff);
    f.seekp(middle);
    f.put(byte);
    f.close();
    fs::resize_file(cut, fs::file_size(cut) - 100);
    const auto foreign_file = entry_files(*foreign)[0];
    fs::copy_file(foreign_file, store->directory() / foreign_file.filename());
  }
  // cold runs of the same requests
  std::vector<Outcome> want;
  {
    auto cold = Scheduler::create(*model, SchedulerOptions{.max_batch = 2, .context = 400});
    ASSERT_TRUE(cold.ok());
    for (const auto& p : prompts) want.push_back(drain(*(*cold)->submit(greedy(joined(p, {1, 2, 3}), 6))));
  }
  auto s = Scheduler::create(*model, with_dir(dir.path()));
  ASSERT_TRUE(s.ok()) << s.error().message;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const Outcome got = drain(*(*s)->submit(greedy(joined(prompts[i], {1, 2, 3}), 6)));
    EXPECT_EQ(got.cached, 0) << "prompt " << i;
    EXPECT_EQ(got.tokens, want[i].tokens) << "prompt " << i;
  }
  EXPECT_FALSE(fs::exists(flipped)) << "a file whose checksum fails is removed";
}

TEST(PromptStore, TheBudgetRemovesTheLeastRecentlyUsed) {
  TempDir dir;
  CpuBackend backend(2);
  auto model = load(backend, fixture_path("qwen3_5_dense"));
  ASSERT_TRUE(model);
  const int64_t vocab = model->info().vocab_size;
  // token ids of as many digits each, so that every file has the same size
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 3; ++i) prompts.push_back(std::vector<int32_t>(40, int32_t(100 + i)));
  ASSERT_LT(102, vocab);
  std::vector<std::unique_ptr<SequenceState>> states;
  for (const auto& p : prompts) {
    states.push_back(std::move(model->new_sequence(128)).value());
    continue_with(*model, *states.back(), p, 64);
  }
  size_t one = 0;
  {
    auto store = open_store(dir.path());
    ASSERT_TRUE(store);
    store->save(prompts[0], *states[0], backend);
    store->flush();
    one = store->bytes();
  }
  auto store = open_store(dir.path(), "test", one * 5 / 2);
  ASSERT_TRUE(store);
  ASSERT_EQ(store->entries(), 1u);
  store->save(prompts[1], *states[1], backend);
  store->flush();
  ASSERT_EQ(store->entries(), 2u);
  // the first is used again, so the second is now the least recently used
  auto scratch = model->new_sequence(128);
  ASSERT_TRUE(scratch.ok());
  const auto first = store->find(joined(prompts[0], {7}));
  ASSERT_TRUE(first);
  ASSERT_TRUE(store->load(*first, **scratch, backend).ok());
  store->save(prompts[2], *states[2], backend);
  store->flush();
  EXPECT_EQ(store->entries(), 2u);
  EXPECT_LE(store->bytes(), one * 5 / 2);
  EXPECT_TRUE(store->find(joined(prompts[0], {7})));
  EXPECT_FALSE(store->find(joined(prompts[1], {7}))) << "the least recently used is removed";
  EXPECT_TRUE(store->find(joined(prompts[2], {7})));
  EXPECT_EQ(entry_files(*store).size(), 2u);
  // a store opened with a smaller budget removes the older file at once
  store.reset();
  auto smaller = open_store(dir.path(), "test", one * 3 / 2);
  ASSERT_TRUE(smaller);
  EXPECT_EQ(smaller->entries(), 1u);
  EXPECT_TRUE(smaller->find(joined(prompts[2], {7})));
}

TEST(PromptStore, ModelFingerprintFollowsTheWeights) {
  TempDir dir;
  const std::string model = dir.copy_fixture("qwen3_5_dense");
  auto before = model_fingerprint(model);
  ASSERT_TRUE(before.ok()) << before.error().message;
  EXPECT_EQ(before->size(), 64u);
  EXPECT_EQ(*model_fingerprint(fixture_path("qwen3_5_dense")), *before) << "the directory's path does not count";
  // a weight in the first 64 KiB of the data changed
  const fs::path weights = fs::path(model) / "model.safetensors";
  std::fstream f(weights, std::ios::in | std::ios::out | std::ios::binary);
  char length[8];
  f.read(length, 8);
  uint64_t header = 0;
  for (int i = 7; i >= 0; --i) header = (header << 8) | uint8_t(length[i]);
  const auto offset = std::streamoff(8 + header + 100);
  f.seekg(offset);
  const char byte = char(f.get() ^ 0x01);
  f.seekp(offset);
  f.put(byte);
  f.close();
  auto after = model_fingerprint(model);
  ASSERT_TRUE(after.ok());
  EXPECT_NE(*after, *before);
  fs::remove(fs::path(model) / "config.json");
  auto missing = model_fingerprint(model);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("config.json"), std::string::npos);
}

}  // namespace
}  // namespace kiln::test
