// kiln_server_fuzz: randomized requests against a running `kiln serve` for a fixed time.
//
//   kiln_server_fuzz --url http://127.0.0.1:PORT [--seconds 60] [--seed N] [--threads 4]
//
// Bodies start from valid requests of every endpoint and are mutated: fields of the wrong type,
// huge and negative numbers, missing and unknown fields, deep nesting, invalid UTF-8, truncation,
// random bytes, oversize bodies. Every answer must be a well-formed response (2xx, or 4xx with an
// error object) and the connection must never fail; afterwards /health must still answer.
#include <httplib.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

using nlohmann::json;

namespace {

const char* kEndpoints[] = {"/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses"};

json valid_request(int endpoint, std::mt19937_64& rng) {
  switch (endpoint) {
    case 0:
      return json::parse(R"({"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}],
        "max_tokens":4,"temperature":0.5,"top_p":0.9,"stream":false,"stop":["x"],
        "tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"a":{"type":"string"}}}}}]})");
    case 1:
      return json::parse(R"({"prompt":[1,2,3,4],"max_tokens":4,"temperature":0,"stream":false,"seed":3})");
    case 3:
      return json::parse(R"({"max_output_tokens":4,"instructions":"Be brief.","input":[
        {"role":"user","content":[{"type":"input_text","text":"Hi"}]},
        {"type":"function_call","call_id":"c1","name":"f","arguments":"{\"a\":\"b\"}"},
        {"type":"function_call_output","call_id":"c1","output":"ok"}],"tool_choice":"auto",
        "tools":[{"type":"function","name":"f","parameters":{"type":"object","properties":{"a":{"type":"string"}}}}]})");
    default:
      return json::parse(
          R"({"model":"m","max_tokens":4,"system":"Be brief.","messages":[{"role":"user","content":[{"type":"text","text":"Hi"}]},
        {"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"f","input":{"a":"b"}}]},
        {"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"ok"}]}]})");
  }
}

json random_value(std::mt19937_64& rng, int depth = 0) {
  switch (rng() % 12) {
    case 0:
      return nullptr;
    case 1:
      return bool(rng() % 2);
    case 2:
      return int64_t(rng());
    case 3:
      return -int64_t(rng() % 1000);
    case 4:
      return 1e308;
    case 5:
      return double(rng() % 1000) / 7.0;
    case 6:
      return std::string(rng() % 50, char('a' + rng() % 26));
    case 7:
      return "";
    case 8:
      return uint64_t(-1);
    case 9: {
      json a = json::array();
      if (depth < 4)
        for (int i = int(rng() % 4); i > 0; --i) a.push_back(random_value(rng, depth + 1));
      return a;
    }
    case 10: {
      json o = json::object();
      if (depth < 4)
        for (int i = int(rng() % 4); i > 0; --i)
          o[std::string(1, char('a' + rng() % 26))] = random_value(rng, depth + 1);
      return o;
    }
    default:
      return "<tool_call><|im_start|><think>";
  }
}

// A random JSON pointer into `j` (its root included).
std::vector<json*> nodes(json& j) {
  std::vector<json*> out{&j};
  for (size_t i = 0; i < out.size() && out.size() < 200; ++i) {
    json& n = *out[i];
    if (n.is_object() || n.is_array())
      for (auto& child : n) out.push_back(&child);
  }
  return out;
}

std::string mutate(int endpoint, std::mt19937_64& rng) {
  json body = valid_request(endpoint, rng);
  const int kind = int(rng() % 10);
  if (kind <= 4) {
    // change some values in place
    for (int m = int(rng() % 3) + 1; m > 0; --m) {
      auto all = nodes(body);
      json* target = all[rng() % all.size()];
      if (target == &body) continue;
      *target = random_value(rng);
    }
    if (rng() % 2) body.erase(body.begin().key());
    std::string text = body.dump();
    if (rng() % 4 == 0) body["stream"] = true, text = body.dump();
    return text;
  }
  std::string text = body.dump();
  switch (kind) {
    case 5:
      return text.substr(0, rng() % text.size());  // truncated
    case 6: {                                      // invalid UTF-8 in a string
      const size_t at = text.find("Hi");
      if (at != std::string::npos) text.replace(at, 2, "\xff\xfe\xc3");
      return text;
    }
    case 7: {  // deep nesting
      const size_t depth = 10 + rng() % 100000;
      return "{\"messages\":" + std::string(depth, '[') + std::string(depth, ']') + "}";
    }
    case 8: {  // random bytes
      std::string s(rng() % 300, '\0');
      for (auto& c : s) c = char(rng());
      return s;
    }
    default: {  // byte flips
      for (int m = int(rng() % 5) + 1; m > 0; --m) text[rng() % text.size()] = char(rng());
      return text;
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string url = "http://127.0.0.1:8080";
  double seconds = 5;
  uint64_t seed = 1;
  int threads = 4;
  size_t max_body = 8 << 20;
  CLI::App app{"kiln_server_fuzz: randomized requests against a kiln server"};
  app.add_option("--url", url)->capture_default_str();
  app.add_option("--seconds", seconds)->capture_default_str();
  app.add_option("--seed", seed)->capture_default_str();
  app.add_option("--threads", threads)->capture_default_str();
  app.add_option("--max-body-bytes", max_body, "The server's body limit (oversize bodies are sent past it)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  std::atomic<int64_t> sent{0}, failures{0};
  std::mutex print;
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t)
    workers.emplace_back([&, t] {
      std::mt19937_64 rng(seed * 1000 + uint64_t(t));
      httplib::Client c(url);
      c.set_read_timeout(120, 0);
      while (std::chrono::steady_clock::now() < end) {
        const int endpoint = int(rng() % std::size(kEndpoints));
        std::string body = rng() % 50 == 0 ? std::string(max_body + 1 + rng() % 1000, 'x') : mutate(endpoint, rng);
        auto res = c.Post(kEndpoints[endpoint], body, "application/json");
        ++sent;
        std::string problem;
        if (!res) {
          problem = "no response (" + httplib::to_string(res.error()) + ")";
        } else if (res->status >= 500) {
          problem = "status " + std::to_string(res->status) + ": " + res->body.substr(0, 200);
        } else if (res->status >= 400) {
          json j = json::parse(res->body, nullptr, false);
          if (j.is_discarded() || !j.contains("error"))
            problem = "a 4xx without an error object: " + res->body.substr(0, 200);
        } else if (res->status != 200) {
          problem = "status " + std::to_string(res->status);
        }
        if (!problem.empty()) {
          ++failures;
          std::lock_guard lock(print);
          std::printf("FAIL %s with body %s: %s\n", kEndpoints[endpoint],
                      json(body.substr(0, 300)).dump(-1, ' ', false, json::error_handler_t::replace).c_str(),
                      problem.c_str());
        }
      }
    });
  for (auto& w : workers) w.join();
  httplib::Client c(url);
  auto health = c.Get("/health");
  const bool alive = health && health->status == 200;
  std::printf("%lld requests in %.0f s, %lld failures; /health %s\n", (long long)sent.load(), seconds,
              (long long)failures.load(), alive ? "answers" : "does NOT answer");
  return failures == 0 && alive ? 0 : 1;
}
