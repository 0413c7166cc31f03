#!/usr/bin/env python3
"""Checks that every #include in src/ (and include/) points at the file's own floor or at a floor
below it that its floor depends on, directly or through others.

The floor table comes from the kiln_floor() declarations in CMakeLists.txt, which the configure step
writes to floors.txt in the build directory: one line per floor, `floor: dependency ...`, and
`alias: name floor` for a public-header prefix that belongs to a floor (include/kiln/ -> engine), or
one public header (kiln/status.h -> core: errors as values, which every floor and the API share).

  check-floors.py --table build/floors.txt --source-dir . [--cmake CMakeLists.txt]  # exit 1 on a violation
  check-floors.py --table build/floors.txt --source-dir . --self-test

A file's floor is the first folder of its path under src/ (src/layers/mlp.h: layers); an included
floor is the first folder of the quoted path (#include "models/model.h": models). Includes of the
file's own folder and of third-party headers are not checked.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOTS = ("src", "include")
EXTENSIONS = (".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh", ".inc")
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')


def read_table(path):
    deps, aliases = {}, {}
    with open(path) as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            name, _, rest = line.partition(":")
            if not _:
                sys.exit(f"{path}:{number}: expected 'floor: dependency ...', got '{line}'")
            if name == "alias":
                alias, floor = rest.split()
                aliases[alias] = floor
                continue
            for dep in rest.split():
                if dep not in deps:  # declarations go bottom to top, so this also rules out cycles
                    sys.exit(f"{path}:{number}: floor {name} depends on {dep}, which is not declared before it")
            deps[name.strip()] = rest.split()
    return deps, aliases


def check_doc_table(cmake_lists, deps):
    """The floor table in the comment at the top of CMakeLists.txt (`#   floor | depends on | ...`) must
    say what the kiln_floor() declarations say."""
    problems, seen = [], set()
    shown = os.path.basename(cmake_lists)
    with open(cmake_lists) as f:
        for number, line in enumerate(f, 1):
            m = re.match(r"^#\s+(\w+)\s*\|([^|]*)\|", line)
            if not m or m.group(1) == "floor":
                continue
            floor, said = m.group(1), sorted(m.group(2).split())
            seen.add(floor)
            if floor not in deps:
                problems.append(f"{shown}:{number}: the floor table lists {floor}, which kiln_floor() does not declare")
            elif said != sorted(deps[floor]):
                problems.append(f"{shown}:{number}: the floor table says {floor} depends on '{' '.join(said)}', "
                                f"kiln_floor() says '{' '.join(deps[floor])}'")
    for floor in deps:
        if floor not in seen:
            problems.append(f"{shown}:1: the floor table at the top does not list {floor}")
    return problems


def closure(deps):
    """floor -> every floor it may include: itself, its dependencies, theirs, and so on."""
    allowed = {}
    for floor in deps:  # in declaration order, so every dependency is already done
        reach = {floor}
        for dep in deps[floor]:
            reach |= allowed[dep]
        allowed[floor] = reach
    return allowed


def source_files(source_dir):
    for root in ROOTS:
        top = os.path.join(source_dir, root)
        for folder, subdirs, files in os.walk(top):
            subdirs.sort()
            for name in sorted(files):
                if name.endswith(EXTENSIONS):
                    path = os.path.join(folder, name)
                    yield root, os.path.relpath(path, top), path


def check(source_dir, deps, aliases):
    """Returns the violations as 'file:line: message' strings."""
    allowed = closure(deps)
    roots = [os.path.join(source_dir, r) for r in ROOTS]
    problems = []

    def floor_of(first, whole=None):
        # an alias names a prefix folder (kiln -> engine) or one header (kiln/status.h -> core)
        if whole is not None and whole in aliases:
            return aliases[whole]
        return aliases.get(first, first)

    for root, rel, path in source_files(source_dir):
        parts = rel.split(os.sep)
        shown = os.path.relpath(path, source_dir)
        if len(parts) < 2:
            problems.append(f"{shown}:1: a file directly in {root}/ belongs to no floor")
            continue
        floor = floor_of(parts[0], "/".join(parts))
        if floor not in deps:
            problems.append(f"{shown}:1: floor '{floor}' is not declared; add kiln_floor({floor} ...) to CMakeLists.txt")
            continue
        with open(path, errors="replace") as f:
            for number, line in enumerate(f, 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                bracket, target = m.groups()
                if target.startswith("."):  # relative to the file: name it from the root
                    target = os.path.relpath(os.path.normpath(os.path.join(os.path.dirname(path), target)),
                                             os.path.join(source_dir, root))
                pieces = target.split("/")
                if len(pieces) < 2:
                    continue  # a header of the file's own folder
                exists = any(os.path.exists(os.path.join(r, target)) for r in roots)
                if bracket == "<" and not exists:
                    continue  # a system or third-party header
                included = floor_of(pieces[0], target)
                if included not in deps:
                    if exists or os.path.isdir(os.path.join(source_dir, "src", pieces[0])):
                        problems.append(f"{shown}:{number}: includes {target}, of floor '{included}', "
                                        f"which is not declared")
                    continue
                if included not in allowed[floor]:
                    problems.append(f"{shown}:{number}: {floor} includes {target}, but {floor} does not depend on "
                                    f"{included} (it may include: {', '.join(sorted(allowed[floor]))})")
    return problems


def self_test(args, deps):
    """Plants, into a copy of the tree, one include of a floor below and one of a floor above in a header
    of every floor, and checks that each upward one, and only those, is reported with its file and line."""
    allowed = closure(deps)
    order = list(deps)
    plants = []  # (floor, header relative to src/, allowed include or None, forbidden include)
    for floor in order:
        above = [f for f in order[order.index(floor) + 1:] if f not in allowed[floor]]
        headers = sorted(os.path.relpath(os.path.join(d, n), os.path.join(args.source_dir, "src"))
                         for d, _, names in os.walk(os.path.join(args.source_dir, "src", floor))
                         for n in names if n.endswith(".h"))
        if above and headers:
            below = sorted(allowed[floor] - {floor})
            plants.append((floor, headers[0], f"{below[0]}/planted.h" if below else None, f"{above[0]}/planted.h"))
    if not plants:
        print("self-test: no floor has a header and a floor above it")
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        for root in ROOTS:
            if os.path.isdir(os.path.join(args.source_dir, root)):
                shutil.copytree(os.path.join(args.source_dir, root), os.path.join(tmp, root))

        def run():
            p = subprocess.run([sys.executable, __file__, "--table", args.table, "--source-dir", tmp],
                               capture_output=True, text=True)
            return p.returncode, p.stdout.splitlines()

        _, before = run()
        expected = []
        for floor, header, good, bad in plants:
            path = os.path.join(tmp, "src", header)
            with open(path) as f:
                lines = f.read().splitlines()
            planted = ([f'#include "{good}"'] if good else []) + [f'#include "{bad}"']
            with open(path, "w") as f:
                f.write("\n".join(lines[:1] + planted + lines[1:]) + "\n")
            expected.append(f"src/{header}:{1 + len(planted)}: {floor} includes {bad}, but {floor} does not "
                            f"depend on {bad.split('/')[0]}")
            print(f"self-test: planted {', '.join(planted)} in src/{header}")
        rc, after = run()
    new = [line for line in after if line not in before]
    missing = [e for e in expected if not any(line.startswith(e) for line in new)]
    extra = [line for line in new if not any(line.startswith(e) for e in expected)]
    for line in new:
        print(f"  reported: {line}")
    if rc != 1 or missing or extra:
        print(f"self-test FAILED: exit {rc} (expected 1)")
        for e in missing:
            print(f"  not reported: {e}")
        for line in extra:
            print(f"  reported but not planted: {line}")
        return 1
    print(f"self-test passed: {len(expected)} planted upward includes reported, the downward ones not")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--table", required=True, help="floors.txt, as CMake writes it")
    parser.add_argument("--source-dir", default=".", help="the repository root (holding src/)")
    parser.add_argument("--cmake", help="CMakeLists.txt, whose comment table must match the declarations")
    parser.add_argument("--self-test", action="store_true", help="check that a planted upward include fails")
    args = parser.parse_args()
    deps, aliases = read_table(args.table)
    if args.self_test:
        return self_test(args, deps)
    problems = check(args.source_dir, deps, aliases)
    if args.cmake:
        problems += check_doc_table(args.cmake, deps)
    for line in problems:
        print(line)
    if problems:
        print(f"{len(problems)} problem(s) with the floors; floors and their dependencies are declared with "
              f"kiln_floor() in CMakeLists.txt", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
