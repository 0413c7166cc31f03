#include "cli/environment.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>

namespace kiln::cli {

namespace {

std::string variable(const char* name) {
  const char* value = std::getenv(name);
  return value ? value : "";
}

// "~/x" -> "$HOME/x", as Python's os.path.expanduser.
std::string expand_home(const std::string& path) {
  if (path.empty() || path[0] != '~' || (path.size() > 1 && path[1] != '/')) return path;
  return variable("HOME") + path.substr(1);
}

// The token file's first line, trimmed ("" when there is none).
std::string read_token_file(const std::string& path) {
  std::ifstream in(path);
  std::string token;
  std::getline(in, token);
  while (!token.empty() && (token.back() == '\r' || token.back() == ' ' || token.back() == '\t')) token.pop_back();
  return token;
}

}  // namespace

Environment read_environment() {
  Environment env;
  const std::string xdg_cache = variable("XDG_CACHE_HOME");
  std::string hf_home = variable("HF_HOME");
  if (hf_home.empty()) hf_home = (xdg_cache.empty() ? std::string("~/.cache") : xdg_cache) + "/huggingface";
  hf_home = expand_home(hf_home);

  std::string cache = variable("HF_HUB_CACHE");
  if (cache.empty()) cache = variable("HUGGINGFACE_HUB_CACHE");
  if (cache.empty()) cache = hf_home + "/hub";
  env.hub.cache_root = expand_home(cache);

  env.hub.endpoint = variable("HF_ENDPOINT");
  if (env.hub.endpoint.empty()) env.hub.endpoint = "https://huggingface.co";
  while (env.hub.endpoint.size() > 1 && env.hub.endpoint.back() == '/') env.hub.endpoint.pop_back();

  for (const char* name : {"HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"}) {
    env.hub.token = variable(name);
    if (!env.hub.token.empty()) {
      env.hub.token_source = name;
      break;
    }
  }
  if (env.hub.token.empty()) {
    std::string path = variable("HF_TOKEN_PATH");
    path = path.empty() ? hf_home + "/token" : expand_home(path);
    env.hub.token = read_token_file(path);
    if (!env.hub.token.empty()) env.hub.token_source = path;
  }
  std::string offline = variable("HF_HUB_OFFLINE");
  std::transform(offline.begin(), offline.end(), offline.begin(), [](unsigned char c) { return std::toupper(c); });
  env.hub.offline = offline == "1" || offline == "ON" || offline == "YES" || offline == "TRUE";
#ifdef KILN_VERSION
  env.hub.user_agent = "kiln/" KILN_VERSION;
#endif
  return env;
}

}  // namespace kiln::cli
