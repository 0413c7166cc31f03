// kiln_serve_load: a bounded load test of a running `kiln serve`.
//
//   kiln_serve_load --url http://127.0.0.1:8080 [--clients 32] [--requests 4] [--prompt-len 64]
//                   [--max-tokens 64] [--vocab N] [--second-turn 2000]
//                   [--temperature T --top-k K --top-p P]
//
// Prompts are token ids (so models without tokenizer files work) sent to /v1/completions as
// streamed requests that ask for the generated ids (return_token_ids): greedy, or sampled with
// --temperature (each request seeded with its index, so its single run is still its reference). It runs every
// prompt alone first (single-stream decode speed and the reference outputs), then all of them
// from `clients` concurrent clients, `requests` each, and checks that every stream completed,
// was well formed, and produced exactly the tokens of its single run. Prints single-stream and
// aggregate decode throughput. With --second-turn N it also times the prefill of an N-token
// conversation and of the same conversation plus a 50-token message (time to first token).
// Exit status 0 only when every check passed.
#include <httplib.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

struct Options {
  std::string url = "http://127.0.0.1:8080";
  int clients = 32;
  int requests = 4;
  int prompt_len = 64;
  int max_tokens = 64;
  int64_t vocab = 0;  // 0: from /v1/models' model (asked via a probe) or 32000
  int second_turn = 0;
  double temperature = 0;  // 0: greedy
  int top_k = 0;
  double top_p = 1;
};

// The sampling fields of request `index`'s body.
json sampling_fields(const Options& o, int index) {
  json j = {{"temperature", o.temperature}};
  if (o.temperature > 0) {
    j["seed"] = index;
    if (o.top_k > 0) j["top_k"] = o.top_k;
    if (o.top_p < 1) j["top_p"] = o.top_p;
  }
  return j;
}

struct Run {
  std::vector<int32_t> tokens;
  double first_token_s = 0;  // from request to first token
  double total_s = 0;
  std::string error;        // empty when the stream was complete and well formed
  bool unanswered = false;  // the connection failed before any response byte arrived
  int retries = 0;
};

std::vector<int32_t> make_prompt(int index, int length, int64_t vocab) {
  std::vector<int32_t> p;
  uint64_t x = 0x9E3779B97F4A7C15ull * uint64_t(index + 1);
  for (int i = 0; i < length; ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    p.push_back(int32_t(x % uint64_t(vocab)));
  }
  return p;
}

std::unique_ptr<httplib::Client> client(const std::string& url) {
  auto c = std::make_unique<httplib::Client>(url);
  c->set_read_timeout(600, 0);
  c->set_write_timeout(60, 0);
  c->set_connection_timeout(10, 0);
  return c;
}

// One streamed completion (greedy unless `sampling` says otherwise); parses every server-sent event.
Run complete_once(const std::string& url, const std::vector<int32_t>& prompt, int max_tokens, const json& sampling) {
  Run run;
  auto c = client(url);
  json body = {{"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0},
               {"stream", true},   {"return_token_ids", true}, {"stream_options", {{"include_usage", true}}}};
  body.update(sampling);
  std::string buffer;
  bool done = false, finished = false;
  int64_t usage_tokens = -1;
  const auto t0 = Clock::now();
  bool answered = false;
  auto receiver = [&](const char* data, size_t n) {
    answered = true;
    buffer.append(data, n);
    for (size_t end; (end = buffer.find("\n\n")) != std::string::npos;) {
      std::string event = buffer.substr(0, end);
      buffer.erase(0, end + 2);
      if (event.rfind("data: ", 0) != 0) {
        run.error = "an event without data: " + event.substr(0, 80);
        continue;
      }
      const std::string payload = event.substr(6);
      if (payload == "[DONE]") {
        done = true;
        continue;
      }
      json j = json::parse(payload, nullptr, false);
      if (j.is_discarded() || !j.contains("choices")) {
        run.error = "a malformed event: " + payload.substr(0, 80);
        continue;
      }
      if (j.contains("usage") && j["usage"].is_object()) usage_tokens = j["usage"].value("completion_tokens", -1);
      for (const auto& choice : j["choices"]) {
        if (choice.contains("token_ids"))
          for (const auto& id : choice["token_ids"]) {
            if (run.tokens.empty()) run.first_token_s = std::chrono::duration<double>(Clock::now() - t0).count();
            run.tokens.push_back(id.get<int32_t>());
          }
        if (choice.contains("finish_reason") && !choice["finish_reason"].is_null()) finished = true;
      }
    }
    return true;
  };
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) { return receiver(data, n); };
  auto res = c->send(req);
  run.total_s = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!res) {
    run.error = "request failed: " + httplib::to_string(res.error());
    run.unanswered = !answered;
  } else if (res->status != 200) {
    run.error = "HTTP " + std::to_string(res->status) + ": " + res->body.substr(0, 200);
  } else if (run.error.empty() && (!done || !finished || usage_tokens != int64_t(run.tokens.size()))) {
    run.error = "incomplete stream (done " + std::to_string(done) + ", finished " + std::to_string(finished) +
                ", usage " + std::to_string(usage_tokens) + ", tokens " + std::to_string(run.tokens.size()) + ")";
  }
  return run;
}

// As a client library does (the official SDKs retry twice), a request whose connection failed
// before any byte of a response arrived is sent again: with 32 clients connecting at once on a
// loaded machine, the listening socket's short accept queue can drop a connection. A response
// that breaks off after it began is not retried: it counts as a failure. Retries are reported.
Run complete(const std::string& url, const std::vector<int32_t>& prompt, int max_tokens,
             const json& sampling = json::object()) {
  Run run;
  for (int attempt = 0; attempt < 3; ++attempt) {
    const int retries = attempt;
    run = complete_once(url, prompt, max_tokens, sampling);
    run.retries = retries;
    if (!run.unanswered) break;
  }
  return run;
}

double decode_rate(const std::vector<Run>& runs) {
  double tokens = 0, seconds = 0;
  for (const auto& r : runs) {
    if (r.tokens.size() < 2) continue;
    tokens += double(r.tokens.size() - 1);
    seconds += r.total_s - r.first_token_s;
  }
  return seconds > 0 ? tokens / seconds : 0;
}

int64_t probe_vocab(const std::string& url) {
  // the largest id the model accepts, by bisection on the server's validation
  int64_t lo = 1, hi = int64_t(1) << 22;
  auto c = client(url);
  while (lo + 1 < hi) {
    const int64_t mid = (lo + hi) / 2;
    json body = {{"prompt", {mid - 1}}, {"max_tokens", 1}, {"temperature", 0}};
    auto res = c->Post("/v1/completions", body.dump(), "application/json");
    if (res && res->status == 200)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"kiln_serve_load: concurrent streaming load on a kiln server, checked against single runs"};
  app.add_option("--url", o.url, "Server base URL")->capture_default_str();
  app.add_option("--clients", o.clients, "Concurrent clients")->capture_default_str()->check(CLI::Range(1, 1024));
  app.add_option("--requests", o.requests, "Requests per client")->capture_default_str()->check(CLI::Range(1, 1000));
  app.add_option("--prompt-len", o.prompt_len, "Prompt tokens")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  app.add_option("--max-tokens", o.max_tokens, "Tokens per completion")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--vocab", o.vocab, "Token ids are drawn below this (default: probed)");
  app.add_option("--second-turn", o.second_turn, "Also time a second chat turn after this many tokens (0: skip)");
  app.add_option("--temperature", o.temperature, "Sample at this temperature (0: greedy)")->check(CLI::Range(0.0, 2.0));
  app.add_option("--top-k", o.top_k, "Sampled requests' top_k (0: none)")->check(CLI::Range(0, 1 << 20));
  app.add_option("--top-p", o.top_p, "Sampled requests' top_p")->check(CLI::Range(0.0, 1.0));
  CLI11_PARSE(app, argc, argv);

  if (o.vocab <= 0) o.vocab = probe_vocab(o.url);
  std::printf("server %s, vocabulary %lld, %d clients x %d requests, prompt %d, max_tokens %d\n", o.url.c_str(),
              (long long)o.vocab, o.clients, o.requests, o.prompt_len, o.max_tokens);
  if (o.temperature > 0)
    std::printf("sampled: temperature %.2f, top_k %d, top_p %.2f, each request seeded with its index\n", o.temperature,
                o.top_k, o.top_p);
  const int total = o.clients * o.requests;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < total; ++i) prompts.push_back(make_prompt(i, o.prompt_len, o.vocab));

  // 1. every prompt alone
  std::vector<Run> single;
  for (int i = 0; i < total; ++i) {
    single.push_back(complete(o.url, prompts[i], o.max_tokens, sampling_fields(o, i)));
    if (!single.back().error.empty()) {
      std::printf("FAIL single request %d: %s\n", i, single.back().error.c_str());
      return 1;
    }
  }
  const double single_rate = decode_rate(single);
  std::printf("single stream: %.1f tok/s decode (mean time to first token %.1f ms)\n", single_rate, [&] {
    double s = 0;
    for (const auto& r : single) s += r.first_token_s;
    return 1e3 * s / double(single.size());
  }());

  // 2. all at once
  std::vector<Run> together(static_cast<size_t>(total));
  const auto t0 = Clock::now();
  std::vector<std::thread> threads;
  for (int c = 0; c < o.clients; ++c)
    threads.emplace_back([&, c] {
      for (int r = 0; r < o.requests; ++r) {
        const int i = c * o.requests + r;
        together[size_t(i)] = complete(o.url, prompts[size_t(i)], o.max_tokens, sampling_fields(o, i));
      }
    });
  for (auto& t : threads) t.join();
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  int failed = 0, differ = 0, retried = 0;
  int64_t tokens = 0;
  for (int i = 0; i < total; ++i) {
    const Run& r = together[size_t(i)];
    tokens += int64_t(r.tokens.size());
    retried += r.retries;
    if (!r.error.empty()) {
      if (++failed <= 5) std::printf("FAIL concurrent request %d: %s\n", i, r.error.c_str());
    } else if (r.tokens != single[size_t(i)].tokens) {
      if (++differ <= 5) std::printf("DIFFERS request %d: its tokens differ from its single run\n", i);
    }
  }
  const double aggregate = double(tokens) / wall;
  std::printf("%d concurrent: %d requests, %lld tokens in %.2f s: %.1f tok/s aggregate (%.2fx single stream)\n",
              o.clients, total, (long long)tokens, wall, aggregate, single_rate > 0 ? aggregate / single_rate : 0);
  std::printf("complete and well formed: %d/%d; identical to single runs: %d/%d; connections retried: %d\n",
              total - failed, total, total - failed - differ, total, retried);

  // 3. a second chat turn
  if (o.second_turn > 0) {
    auto conversation = make_prompt(100000, o.second_turn, o.vocab);
    const Run first = complete(o.url, conversation, 1);
    auto next = conversation;
    for (int32_t t : make_prompt(100001, 50, o.vocab)) next.push_back(t);
    const Run second = complete(o.url, next, 1);
    std::printf("second turn: %d-token conversation %.1f ms to first token; plus 50 tokens %.1f ms (%.0f%%)\n",
                o.second_turn, first.first_token_s * 1e3, second.first_token_s * 1e3,
                100.0 * second.first_token_s / first.first_token_s);
  }
  return failed == 0 && differ == 0 ? 0 : 1;
}
