#!/usr/bin/env python3
"""Turns the output of `bible -p ... "Gen1:1-Rev22:21"` into plain training text.

Input layout (from the bible-kjv package): a blank line, a chapter heading such as "Genesis 1",
a blank line, then verses "  N text..." wrapped at about 80 columns, continuation lines
unindented. Output: one verse per line without its number, a blank line between chapters;
every 20th chapter goes to valid.txt, the rest to train.txt. Standard library only.
"""

import argparse
import hashlib
import json
import os
import re

HELD_OUT_EVERY = 20  # chapter i (from 0) is held out when i % 20 == 19

HEADING = re.compile(r"^((?:[123] )?[A-Z][A-Za-z ]*?) (\d+)$")
VERSE = re.compile(r"^  (\d+) (.*)$")


def parse(raw_text):
    """Returns [(book, chapter, [verse text, ...]), ...] in Bible order."""
    chapters = []
    verse_no = 0
    for line in raw_text.split("\n"):
        line = line.rstrip()
        if not line:
            continue
        m = VERSE.match(line)
        if m:
            n = int(m.group(1))
            if not chapters or n != verse_no + 1:
                raise ValueError(f"verse {n} out of order after verse {verse_no}: {line!r}")
            verse_no = n
            chapters[-1][2].append(m.group(2).strip())
            continue
        h = HEADING.match(line)
        if h and not line.startswith(" "):
            chapters.append((h.group(1), int(h.group(2)), []))
            verse_no = 0
            continue
        if line.startswith(" ") or not chapters or not chapters[-1][2]:
            raise ValueError(f"unexpected line: {line!r}")
        chapters[-1][2][-1] += " " + line.strip()  # wrapped continuation of the last verse
    for book, number, verses in chapters:
        if not verses:
            raise ValueError(f"empty chapter {book} {number}")
    return chapters


def chapter_text(verses):
    return "\n".join(" ".join(v.split()) for v in verses) + "\n"


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--raw", required=True)
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--package", action="append", default=[], help="name=version, recorded in the manifest")
    ap.add_argument("--copyright", help="the package's copyright file, quoted in the manifest")
    args = ap.parse_args()

    with open(args.raw, encoding="utf-8") as f:
        chapters = parse(f.read())

    train, valid = [], []
    valid_refs = []
    for i, (book, number, verses) in enumerate(chapters):
        if i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1:
            valid.append(chapter_text(verses))
            valid_refs.append(f"{book} {number}")
        else:
            train.append(chapter_text(verses))

    paths = {}
    for name, parts in (("train.txt", train), ("valid.txt", valid)):
        path = os.path.join(args.out_dir, name)
        with open(path, "w", encoding="utf-8", newline="\n") as f:
            f.write("\n".join(parts))
        paths[name] = path

    copyright_text = None
    if args.copyright:
        with open(args.copyright, encoding="utf-8", errors="replace") as f:
            copyright_text = f.read()
    manifest = {
        "source": "King James Version (1611), as shipped by Debian",
        "packages": dict(p.split("=", 1) for p in args.package),
        "licence": {
            "text": "public domain (the package's copyright file: the copyright of the KJV text is expired)",
            "bible-kjv software": "GPL-2+",
        },
        "extraction": 'bible -p <pkg>/usr/lib "Gen1:1-Rev22:21", then kjv_to_text.py',
        "layout": "one verse per line without its number; a blank line between chapters",
        "split": f"chapter i (0-based, Bible order) is held out when i % {HELD_OUT_EVERY} == {HELD_OUT_EVERY - 1}",
        "chapters": {"total": len(chapters), "train": len(train), "valid": len(valid)},
        "verses": sum(len(v) for _, _, v in chapters),
        "valid_chapters": valid_refs,
        "files": {name: {"bytes": os.path.getsize(p), "sha256": sha256(p)} for name, p in paths.items()},
        "raw_sha256": sha256(args.raw),
        "copyright_file": copyright_text,
    }
    with open(os.path.join(args.out_dir, "manifest.json"), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2)
        f.write("\n")
    print(f"chapters {len(chapters)} (train {len(train)}, valid {len(valid)}), "
          f"verses {manifest['verses']}, train {manifest['files']['train.txt']['bytes']} bytes, "
          f"valid {manifest['files']['valid.txt']['bytes']} bytes")


if __name__ == "__main__":
    main()
