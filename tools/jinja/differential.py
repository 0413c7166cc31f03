#!/usr/bin/env python3
"""Differential test of kiln's Jinja engine against Python's jinja2 on random templates.

    python3 tools/jinja/differential.py [--seed N] [--count N] [--show N] [--build DIR]

Random templates come from the robustness test's generator (kiln_jinja_fuzz --print-templates),
rendered by kiln (kiln_jinja_fuzz --render-batch) and by jinja2 set up as transformers sets it up
(render_reference.py), with tests/jinja/cases/variables.json. A case agrees when both render the
same text, or both fail with the same kind of error (or kiln stops at one of its limits). Prints
the disagreements; the known differences are listed in docs/chat-templates.md.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import render_reference as reference  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def read_records(data, with_head):
    records, i = [], 0
    while i < len(data):
        head = None
        if with_head:
            j = data.index(b"\n", i)
            head, i = data[i:j].decode(), j + 1
        j = data.index(b"\n", i)
        n = int(data[i:j])
        records.append((head, data[j + 1 : j + 1 + n]))
        i = j + 1 + n
    return records


class Timeout(Exception):
    pass


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--show", type=int, default=10)
    parser.add_argument("--build", default=str(ROOT / "build"))
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    os.environ["TZ"] = "UTC"
    time.tzset()

    fuzz = str(Path(args.build) / "tests" / "jinja" / "kiln_jinja_fuzz")
    raw = subprocess.run([fuzz, "--print-templates", str(args.count), "--seed", str(args.seed)],
                         capture_output=True, check=True).stdout
    templates = [body for _, body in read_records(raw, with_head=False)]
    batch = b"".join(str(len(t)).encode() + b"\n" + t for t in templates)
    rendered = subprocess.run([fuzz, "--render-batch"], input=batch, capture_output=True, check=True).stdout
    results = read_records(rendered, with_head=True)
    variables = json.loads((ROOT / "tests" / "jinja" / "cases" / "variables.json").read_text(encoding="utf-8"))

    def on_alarm(signum, frame):
        raise Timeout()

    signal.signal(signal.SIGALRM, on_alarm)
    stats = {"same output": 0, "same error": 0, "different": 0, "skipped": 0}
    shown = 0
    for template, (head, body) in zip(templates, results):
        try:
            source = template.decode("utf-8")
        except UnicodeDecodeError:  # Python could not read such a template at all
            stats["skipped"] += 1
            continue
        signal.alarm(2)
        try:
            expected = reference.outcome(lambda: reference.ENV.from_string(source).render(**variables))
        except (Timeout, RecursionError):
            stats["skipped"] += 1
            continue
        finally:
            signal.alarm(0)
        if "output" in expected and head == "OK" and body.decode("utf-8", "replace") == expected["output"]:
            stats["same output"] += 1
            continue
        if "error" in expected and head.startswith("ERR ") and head[4:] in (expected["error"]["kind"], "limit"):
            stats["same error"] += 1
            continue
        stats["different"] += 1
        if shown < args.show:
            shown += 1
            print("--- template:", repr(source)[:1200])
            print("    jinja2:", repr(expected)[:600])
            print("    kiln:  ", head, repr(body[:600]))
    print(stats)


if __name__ == "__main__":
    main()
