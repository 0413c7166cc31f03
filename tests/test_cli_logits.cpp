// `kiln logits`, the public parity check, run as a user runs it, against every oracle fixture.
#include "test_util.h"

namespace kiln::test {
namespace {

class CliLogits : public testing::TestWithParam<std::string> {};

TEST_P(CliLogits, MatchesOracle) {
  const std::string fixture = GetParam();
  const auto ids = fixture_ids(fixture);
  std::string csv;
  for (int32_t id : ids) csv += (csv.empty() ? "" : ",") + std::to_string(id);
  TempDir tmp;
  for (const std::string chunk : {"", " --prefill-chunk 7"}) {
    const std::string out = tmp.path() + "/logits.npy";
    auto r = run_command(std::string(KILN_BINARY) + " logits " + fixture_path(fixture) + " --ids " + csv + " --out " +
                         out + chunk + " --device cpu");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    auto got = read_npy(out);
    auto want = read_npy(fixture_path(fixture) + "/logits.npy");
    ASSERT_TRUE(got.ok() && want.ok());
    ASSERT_EQ(got->shape, want->shape);
    auto c = compare_logits(got->f32.data(), want->f32.data(), want->shape[0], want->shape[1]);
    EXPECT_LE(c.relative(), 1e-4) << chunk;
    EXPECT_GE(c.argmax_agreement, 0.99) << chunk;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CliLogits, testing::ValuesIn(fixture_names()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace kiln::test
