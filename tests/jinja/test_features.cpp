// Focused feature tests: every case in tests/jinja/cases/features/*.cases rendered by kiln and
// compared with jinja2's output (tests/jinja/expected/features.json). Test names are
// <family>__<case>, so a regression names the feature.
#include "jinja_test_util.h"

namespace kiln::jinja::test {
namespace {

std::vector<FeatureCase> load_feature_cases() {
  std::vector<FeatureCase> all;
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(jinja_tests_dir() / "cases" / "features"))
    if (entry.path().extension() == ".cases") files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  for (const auto& file : files) {
    auto cases = read_case_file(file, file.stem().string());
    all.insert(all.end(), cases.begin(), cases.end());
  }
  return all;
}

const Json& features_expected() {
  static const Json expected = read_json(jinja_tests_dir() / "expected" / "features.json");
  return expected;
}

const Json& shared_variables() {
  static const Json variables = read_json(jinja_tests_dir() / "cases" / "variables.json");
  return variables;
}

class Features : public testing::TestWithParam<FeatureCase> {};

TEST_P(Features, MatchesJinja2) {
  const FeatureCase& c = GetParam();
  const std::string key = c.family + "/" + c.name;
  ASSERT_TRUE(features_expected().contains(key))
      << key << " has no expected outcome: run tools/jinja/render_reference.py";
  Json variables = shared_variables();
  for (const auto& [name, value] : c.variables.items()) variables[name] = value;
  SCOPED_TRACE("template:\n" + c.source);
  TemplateFailure failure;
  auto compiled = Template::parse(c.source, &failure);
  Result<std::string> result =
      compiled ? compiled->render(variables, reference_options(), &failure) : Result<std::string>(compiled.error());
  expect_matches(features_expected()[key], result, failure);
}

INSTANTIATE_TEST_SUITE_P(Jinja, Features, testing::ValuesIn(load_feature_cases()),
                         [](const testing::TestParamInfo<FeatureCase>& info) {
                           return test_name(info.param.family) + "__" + test_name(info.param.name);
                         });

TEST(FeatureCases, EveryExpectedOutcomeHasACase) {
  size_t cases = load_feature_cases().size();
  EXPECT_EQ(cases, features_expected().size()) << "case files and expected/features.json are out of sync";
}

}  // namespace
}  // namespace kiln::jinja::test
