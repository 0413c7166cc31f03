// kiln ls [--json]
// Lists the models in the Hugging Face cache: id, revisions (ref -> short commit), model_type,
// parameter count, how the weights are stored, size on disk, and what kiln runs of it (the
// model check `kiln logits` and the server make before loading, run without reading weights).
// The details come from the snapshot "main" names, else from the newest one.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "convert/check_model.h"
#include "hub/hub_cache.h"
#include "io/checkpoint_summary.h"
#include "models/model.h"

namespace kiln::cli {

namespace {

struct LsOptions {
  bool json = false;
};

struct Row {
  std::string id;
  std::string revisions;  // "main→1a2b3c4, dev→5d6e7f8"
  std::string model_type;
  std::string parameters;
  std::string quantization;
  std::string size;
  std::string runs;  // "text", or why not
  nlohmann::json json;
};

std::string format_size(uint64_t bytes) {
  const double b = double(bytes);
  if (b >= 1e9) return fmt::format("{:.2f} GB", b / 1e9);
  if (b >= 1e6) return fmt::format("{:.1f} MB", b / 1e6);
  if (b >= 1e3) return fmt::format("{:.1f} kB", b / 1e3);
  return fmt::format("{} B", bytes);
}

// Characters, not bytes (fmt pads by characters too): UTF-8 continuation bytes are not counted.
size_t display_width(const std::string& text) {
  return size_t(
      std::count_if(text.begin(), text.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; }));
}

// A check's error in a few words: the snapshot's path dropped, the first clause kept.
std::string short_reason(std::string message, const std::string& dir) {
  for (size_t pos; (pos = message.find(dir + "/")) != std::string::npos;) message.erase(pos, dir.size() + 1);
  for (size_t pos; (pos = message.find(dir)) != std::string::npos;) message.replace(pos, dir.size(), ".");
  if (const size_t paren = message.find(" ("); paren != std::string::npos) message.resize(paren);
  if (message.size() > 60) message = message.substr(0, 57) + "...";
  return message;
}

Row describe(const hub::CachedRepo& repo) {
  Row row{.id = repo.repo, .size = format_size(repo.blob_bytes)};
  row.json = {{"id", repo.repo}, {"path", repo.dir.string()}, {"size_bytes", repo.blob_bytes}};
  if (repo.incomplete_bytes > 0) row.json["incomplete_bytes"] = repo.incomplete_bytes;
  nlohmann::json revisions = nlohmann::json::array();
  for (const hub::CachedRevision& r : repo.revisions) {
    const std::string short_commit = r.commit.substr(0, 7);
    if (r.refs.empty()) row.revisions += (row.revisions.empty() ? "" : ", ") + short_commit;
    for (const std::string& name : r.refs)
      row.revisions += (row.revisions.empty() ? "" : ", ") + name + "→" + short_commit;
    revisions.push_back({{"commit", r.commit}, {"refs", r.refs}, {"path", r.dir.string()}});
  }
  row.json["revisions"] = revisions;
  if (repo.revisions.empty()) {
    row.runs = "no snapshot";
    row.json["runs"] = row.runs;
    return row;
  }

  const std::string dir = repo.revisions.front().dir.string();
  auto summary = summarize_checkpoint(dir);
  if (summary) {
    row.model_type = summary->model_type;
    if (summary->parameters > 0) row.parameters = format_count(summary->parameters);
    row.quantization = summary->quantization;
    row.json["model_type"] = summary->model_type;
    row.json["parameters"] = summary->parameters;
    row.json["quantization"] = summary->quantization;
  } else {
    row.json["error"] = summary.error().message;
  }
  const auto check = inspect_model(dir);
  row.runs = check.ok() ? "text" : short_reason(check.error().message, dir);
  if (check.ok() && !check->empty()) {
    std::string parts;
    for (const auto& p : *check) parts += (parts.empty() ? "" : ", ") + p.part;
    row.runs += " (set aside: " + parts + ")";
    row.json["set_aside"] = nlohmann::json::array();
    for (const auto& p : *check) row.json["set_aside"].push_back({{"part", p.part}, {"not_yet", p.not_yet}});
  }
  row.json["runs"] = row.runs;
  if (!check.ok()) row.json["check_error"] = check.error().message;
  return row;
}

Status run_ls(const LsOptions& o, const Environment& env) {
  KILN_ASSIGN(const std::vector<hub::CachedRepo> repos, hub::scan_cache(env.hub.cache_root));
  // the model checks' own warnings (unused tensors and the like) are not this listing's business
  const auto level = spdlog::get_level();
  spdlog::set_level(spdlog::level::err);
  std::vector<Row> rows;
  for (const hub::CachedRepo& repo : repos) rows.push_back(describe(repo));
  spdlog::set_level(level);

  if (o.json) {
    nlohmann::json out = nlohmann::json::array();
    for (const Row& row : rows) out.push_back(row.json);
    fmt::print("{}\n", out.dump(2));
    return ok_status();
  }
  if (rows.empty()) {
    fmt::print(stderr, "no models in the Hugging Face cache ({}); kiln pull ORG/NAME downloads one\n",
               env.hub.cache_root.string());
    return ok_status();
  }
  const std::vector<std::string> header = {"ID", "REVISIONS", "MODEL_TYPE", "PARAMS", "QUANT", "SIZE", "RUNS"};
  std::vector<std::vector<std::string>> table = {header};
  auto cell = [](const std::string& text) { return text.empty() ? std::string("-") : text; };
  for (const Row& r : rows)
    table.push_back(
        {r.id, cell(r.revisions), cell(r.model_type), cell(r.parameters), cell(r.quantization), r.size, r.runs});
  std::vector<size_t> width(header.size(), 0);
  for (const auto& line : table)
    for (size_t c = 0; c < line.size(); ++c) width[c] = std::max(width[c], display_width(line[c]));
  for (const auto& line : table) {
    std::string text;
    for (size_t c = 0; c < line.size(); ++c)
      text += c + 1 < line.size() ? fmt::format("{:<{}}  ", line[c], width[c]) : line[c];
    fmt::print("{}\n", text);
  }
  return ok_status();
}

}  // namespace

void add_ls_command(CLI::App& app, Action& action, const Environment& env) {
  auto options = std::make_shared<LsOptions>();
  auto* cmd = app.add_subcommand("ls", "List the models in the Hugging Face cache");
  cmd->add_flag("--json", options->json, "Print a JSON array");
  cmd->callback([options, &action, &env] { action = [options, &env] { return run_ls(*options, env); }; });
}

}  // namespace kiln::cli
