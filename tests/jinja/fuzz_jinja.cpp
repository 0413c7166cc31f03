// Randomized robustness test of kiln's Jinja engine. It builds random templates from a grammar of
// template fragments (statements, expressions, filters, tests, methods, whitespace markers) over
// the variables of the conformance tests, mutates some with random byte noise, and parses and
// renders each with tight limits. It passes when nothing crashes and no render is slow: every
// outcome (text or error) is fine. Run longer from the command line:
//   kiln_jinja_fuzz --seconds 60 [--seed N] [--verbose]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "text/jinja/jinja.h"

namespace {

using kiln::jinja::FailureKind;
using kiln::jinja::Template;
using kiln::jinja::TemplateFailure;

const char* const kNames[] = {"messages",
                              "tools",
                              "n",
                              "neg",
                              "f",
                              "big",
                              "s",
                              "padded",
                              "u",
                              "d",
                              "nested",
                              "l",
                              "words",
                              "people",
                              "e",
                              "ed",
                              "es",
                              "z",
                              "t",
                              "fl",
                              "zero",
                              "pi",
                              "x",
                              "y",
                              "item",
                              "loop",
                              "ns",
                              "m",
                              "k",
                              "v",
                              "caller",
                              "varargs",
                              "kwargs",
                              "range",
                              "namespace",
                              "dict",
                              "cycler",
                              "joiner",
                              "raise_exception",
                              "strftime_now",
                              "add_generation_prompt"};
const char* const kFilters[] = {
    "abs",      "attr",       "batch",    "capitalize", "center",  "count",       "d",           "default",
    "dictsort", "e",          "escape",   "first",      "float",   "forceescape", "format",      "indent",
    "int",      "items",      "join",     "last",       "length",  "list",        "lower",       "map",
    "max",      "min",        "reject",   "rejectattr", "replace", "reverse",     "round",       "safe",
    "select",   "selectattr", "slice",    "sort",       "string",  "striptags",   "sum",         "title",
    "tojson",   "trim",       "truncate", "unique",     "upper",   "wordcount",   "nosuchfilter"};
const char* const kTests[] = {"defined", "undefined", "none",        "string",    "number",   "integer", "float",
                              "boolean", "mapping",   "iterable",    "sequence",  "callable", "true",    "false",
                              "even",    "odd",       "divisibleby", "eq",        "equalto",  "ne",      "lt",
                              "gt",      "le",        "ge",          "in",        "sameas",   "lower",   "upper",
                              "escaped", "filter",    "test",        "nosuchtest"};
const char* const kMethods[] = {"upper",     "lower",      "strip",      "lstrip",     "rstrip",  "split",  "rsplit",
                                "replace",   "startswith", "endswith",   "find",       "rfind",   "count",  "join",
                                "format",    "title",      "capitalize", "splitlines", "isdigit", "center", "zfill",
                                "partition", "items",      "keys",       "values",     "get",     "index",  "append",
                                "pop",       "update",     "copy",       "__class__"};
const char* const kOperators[] = {" + ",  " - ",  " * ",  " / ", " // ", " % ", " ** ", " ~ ",  " and ",
                                  " or ", " == ", " != ", " < ", " <= ", " > ", " >= ", " in ", " not in "};
const char* const kNoise[] = {"{{",
                              "}}",
                              "{%",
                              "%}",
                              "{#",
                              "#}",
                              "-",
                              "+",
                              "'",
                              "\"",
                              "(",
                              ")",
                              "[",
                              "]",
                              "{",
                              "}",
                              "|",
                              ".",
                              ",",
                              ":",
                              "\\",
                              "\n",
                              " ",
                              "is",
                              "not",
                              "if",
                              "else",
                              "endif",
                              "for",
                              "endfor",
                              "in",
                              "set",
                              "=",
                              "\xc3\xa9",
                              "\xe2\x98\x83",
                              "\xf0\x9f\x98\x80",
                              "\xff",
                              "\xc3",
                              "\xe2\x82",
                              "\x00",
                              "\r",
                              "\t",
                              "\xe3\x80\x80"};

class TemplateGenerator {
 public:
  explicit TemplateGenerator(uint64_t seed) : rng_(seed) {}

  std::string generate() {
    std::string out;
    int statements = pick(1, 8);
    for (int i = 0; i < statements; ++i) out += statement(0);
    if (chance(0.2)) out = mutate(out);
    return out;
  }

 private:
  int pick(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  bool chance(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }
  template <size_t N>
  const char* one_of(const char* const (&items)[N]) {
    return items[pick(0, int(N) - 1)];
  }

  std::string open_tag() { return chance(0.2) ? "{%-" : chance(0.1) ? "{%+" : "{%"; }
  std::string close_tag() { return chance(0.2) ? "-%}" : chance(0.1) ? "+%}" : "%}"; }
  std::string tag(const std::string& body) { return open_tag() + " " + body + " " + close_tag(); }

  std::string literal() {
    switch (pick(0, 11)) {
      case 0:
        return std::to_string(pick(-1000, 1000));
      case 1:
        return chance(0.5) ? "9223372036854775807" : "0x1F";
      case 2:
        return std::to_string(pick(-100, 100)) + "." + std::to_string(pick(0, 999));
      case 3:
        return chance(0.5) ? "1e308" : "1e-7";
      case 4:
        return "'str\\n" + std::to_string(pick(0, 9)) + "'";
      case 5:
        return "\"\\u00e9\\x41 \xe2\x98\x83\"";
      case 6:
        return chance(0.5) ? "true" : "none";
      case 7:
        return "[" + expression(3) + ", " + expression(3) + "]";
      case 8:
        return "{'k': " + expression(3) + ", 1: 2}";
      case 9:
        return "(" + expression(3) + ",)";
      case 10:
        return "''";
      default:
        return "[]";
    }
  }

  std::string arguments(int depth) {
    std::string out = "(";
    int n = pick(0, 3);
    bool keywords = false;
    for (int i = 0; i < n; ++i) {
      if (i) out += ", ";
      keywords = keywords || chance(0.2);  // keyword arguments come after positional ones
      if (keywords) out += std::string(chance(0.5) ? "attribute" : "default") + "=";
      out += expression(depth + 1);
    }
    return out + ")";
  }

  std::string filter_name() { return chance(0.01) ? "nosuchfilter" : one_of(kFilters); }
  std::string test_name() { return chance(0.01) ? "nosuchtest" : one_of(kTests); }

  std::string postfix(std::string base, int depth) {
    switch (pick(0, 9)) {
      case 0:
        return base + "." + one_of(kNames);
      case 1:
        return base + "[" + expression(depth + 1) + "]";
      case 2:
        return base + "[" + std::to_string(pick(-3, 3)) + ":" + (chance(0.5) ? "" : "-1") + ":" +
               (chance(0.5) ? "-1" : "2") + "]";
      case 3:
        return base + "." + one_of(kMethods) + arguments(depth);
      case 4:
        return base + "|" + filter_name() + (chance(0.5) ? arguments(depth) : "");
      case 5:  // parenthesized: a test's argument would swallow a following `if`
        return "(" + base + " is " + (chance(0.3) ? "not " : "") + test_name() + ")";
      case 6:
        return base + arguments(depth);
      default:
        return base;
    }
  }

  std::string expression(int depth) {
    if (depth > 5) return chance(0.5) ? literal() : one_of(kNames);
    switch (pick(0, 9)) {
      case 0:
      case 1:
        return literal();
      case 2:
      case 3:
        return postfix(one_of(kNames), depth);
      case 4:
        return expression(depth + 1) + one_of(kOperators) + expression(depth + 1);
      case 5:
        return "(" + expression(depth + 1) + ")";
      case 6:
        return "(" + expression(depth + 1) + " if " + expression(depth + 1) +
               (chance(0.7) ? " else " + expression(depth + 1) : "") + ")";
      case 7:
        return (chance(0.5) ? "not " : "-") + expression(depth + 1);
      case 8:
        return postfix(postfix(expression(depth + 1), depth + 1), depth + 1);
      default:
        return one_of(kNames) + std::string("(") + expression(depth + 1) + ")";
    }
  }

  std::string body(int depth) {
    std::string out;
    int n = pick(0, 3);
    for (int i = 0; i < n; ++i) out += statement(depth + 1);
    return out;
  }

  std::string statement(int depth) {
    if (depth > 4) return "text";
    switch (pick(0, 16)) {
      case 0:
      case 1:
        return chance(0.5) ? "plain text\n" : "  indented \xc3\xa9 ";
      case 2:
      case 3:
        return (chance(0.2) ? "{{- " : "{{ ") + expression(0) + (chance(0.2) ? " -}}" : " }}");
      case 4:
        return tag("if " + expression(0)) + body(depth) +
               (chance(0.4) ? tag("elif " + expression(0)) + body(depth) : "") +
               (chance(0.4) ? tag("else") + body(depth) : "") + tag("endif");
      case 5:
        return tag("for " + std::string(chance(0.3) ? "k, v" : "item") + " in " + expression(1) +
                   (chance(0.2) ? " if " + expression(1) : "") + (chance(0.1) ? " recursive" : "")) +
               body(depth) + (chance(0.2) ? tag(chance(0.5) ? "break" : "continue") : "") +
               (chance(0.2) ? tag("else") + body(depth) : "") + tag("endfor");
      case 6:
        return tag("set " + std::string(one_of(kNames)) + " = " + expression(0));
      case 7:
        return tag("set ns = namespace(a=" + expression(1) + ")") + tag("set ns.a = " + expression(1));
      case 8:
        return tag("set x") + body(depth) + tag("endset");
      case 9:
        return tag("macro m(a, b=" + expression(2) + ")") + body(depth) + tag("endmacro") + "{{ m(" + expression(1) +
               ") }}";
      case 10:
        return tag("macro w()") + "[{{ caller() }}]" + tag("endmacro") + tag("call w()") + body(depth) + tag("endcall");
      case 11:
        return tag("filter " + std::string(one_of(kFilters))) + body(depth) + tag("endfilter");
      case 12:
        return tag("with y = " + expression(1)) + body(depth) + tag("endwith");
      case 13:
        return "{# comment " + expression(1) + " #}";
      case 14:
        return tag("raw") + "{{ raw }}" + tag("endraw");
      case 15:
        return tag("generation") + body(depth) + tag("endgeneration");
      default:
        return "{{ raise_exception('boom') if " + expression(1) + " else '' }}";
    }
  }

  std::string mutate(std::string text) {
    int edits = pick(1, 6);
    for (int i = 0; i < edits; ++i) {
      size_t at = text.empty() ? 0 : size_t(pick(0, int(text.size())));
      switch (pick(0, 3)) {
        case 0:
          text.insert(at, one_of(kNoise));
          break;
        case 1:
          if (!text.empty()) text.erase(at, size_t(pick(1, 8)));
          break;
        case 2:
          text.insert(at, 1, char(pick(0, 255)));
          break;
        default:
          if (!text.empty()) text.insert(at, text.substr(size_t(pick(0, int(text.size()) - 1)), size_t(pick(1, 20))));
      }
    }
    return text;
  }

  std::mt19937_64 rng_;
};

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 10;
  uint64_t seed = std::random_device{}();
  bool verbose = false;
  std::string last_case_path;  // each template is written here before it runs, to catch a hang
  long print_templates = 0;    // print this many templates (length-prefixed) and exit, for differential runs
  bool render_batch = false;   // render length-prefixed templates from stdin (tools/jinja/differential.py)
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--seconds" && i + 1 < argc) {
      seconds = std::atof(argv[++i]);
    } else if (arg == "--seed" && i + 1 < argc) {
      seed = std::strtoull(argv[++i], nullptr, 10);
    } else if (arg == "--verbose") {
      verbose = true;
    } else if (arg == "--last-case" && i + 1 < argc) {
      last_case_path = argv[++i];
    } else if (arg == "--print-templates" && i + 1 < argc) {
      print_templates = std::atol(argv[++i]);
    } else if (arg == "--render-batch") {
      render_batch = true;
    } else {
      std::fprintf(
          stderr,
          "usage: %s [--seconds N] [--seed S] [--verbose] [--last-case FILE] [--print-templates N] [--render-batch]\n",
          argv[0]);
      return 2;
    }
  }
  auto variables = nlohmann::ordered_json::parse(
      read_text(std::filesystem::path(KILN_SOURCE_DIR) / "tests" / "jinja" / "cases" / "variables.json"));

  if (render_batch) {
    // Each "<bytes>\n<template>" from stdin becomes "OK\n<bytes>\n<text>" or
    // "ERR <kind>\n<bytes>\n<message>", rendered as the conformance tests render.
    static const char* const kinds[] = {"syntax", "raised", "undefined", "security", "runtime", "limit"};
    kiln::jinja::RenderOptions reference;
    reference.now = std::chrono::system_clock::time_point(std::chrono::seconds(1700000000));
    std::string header;
    while (std::getline(std::cin, header)) {
      std::string source(std::strtoull(header.c_str(), nullptr, 10), '\0');
      std::cin.read(source.data(), std::streamsize(source.size()));
      TemplateFailure failure;
      auto compiled = Template::parse(source, &failure);
      auto result =
          compiled ? compiled->render(variables, reference, &failure) : kiln::Result<std::string>(compiled.error());
      std::string head = result ? "OK" : std::string("ERR ") + kinds[int(failure.kind)];
      const std::string& body = result ? *result : failure.message;
      std::printf("%s\n%zu\n", head.c_str(), body.size());
      std::fwrite(body.data(), 1, body.size(), stdout);
    }
    return 0;
  }

  kiln::jinja::RenderOptions options;
  options.limits.max_output_bytes = 1 << 20;
  options.limits.max_container_items = 1 << 16;
  options.limits.max_steps = 200000;
  options.limits.max_call_depth = 64;
  options.now = std::chrono::system_clock::time_point(std::chrono::seconds(1700000000));

  if (print_templates > 0) {
    TemplateGenerator printer(seed);
    for (long i = 0; i < print_templates; ++i) {
      std::string source = printer.generate();  // as "<bytes>\n<template>"
      std::printf("%zu\n", source.size());
      std::fwrite(source.data(), 1, source.size(), stdout);
    }
    return 0;
  }
  std::printf("kiln_jinja_fuzz: seed %llu, %.0f s\n", static_cast<unsigned long long>(seed), seconds);
  std::fflush(stdout);
  TemplateGenerator generator(seed);
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::duration<double>(seconds);
  uint64_t cases = 0, parsed = 0, rendered = 0;
  uint64_t failures[6] = {};
  double slowest = 0;
  std::string slowest_template;
  while (std::chrono::steady_clock::now() < deadline) {
    std::string source = generator.generate();
    if (!last_case_path.empty()) std::ofstream(last_case_path, std::ios::binary) << source;
    auto case_start = std::chrono::steady_clock::now();
    TemplateFailure failure;
    auto compiled = Template::parse(source, &failure);
    if (compiled) {
      ++parsed;
      auto result = compiled->render(variables, options, &failure);
      if (result) ++rendered;
    }
    if (!compiled || failure.message.size()) {
      ++failures[int(failure.kind)];
      if (verbose && failures[int(failure.kind)] <= 5)
        std::printf("[%s] %s\n", compiled ? "render" : "parse", failure.message.c_str());
    }
    double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - case_start).count();
    if (elapsed > slowest) slowest = elapsed, slowest_template = source;
    if (verbose && cases % 1000 == 0) std::printf("case %llu: %zu bytes\n", (unsigned long long)cases, source.size());
    ++cases;
  }
  std::printf(
      "%llu templates: %llu parsed, %llu rendered; failures by kind: syntax %llu, raised %llu, "
      "undefined %llu, security %llu, runtime %llu, limit %llu; slowest case %.3f s\n",
      (unsigned long long)cases, (unsigned long long)parsed, (unsigned long long)rendered,
      (unsigned long long)failures[0], (unsigned long long)failures[1], (unsigned long long)failures[2],
      (unsigned long long)failures[3], (unsigned long long)failures[4], (unsigned long long)failures[5], slowest);
  // A render that needs seconds is a hang in the making (limits should stop any template sooner).
  if (slowest > 2.0) {
    std::printf("FAIL: slowest template took %.3f s:\n%s\n", slowest, slowest_template.c_str());
    return 1;
  }
  return 0;
}
