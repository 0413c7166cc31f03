#!/usr/bin/env bash
# Builds the training corpus for the demo model from Debian's King James Version packages.
#
#   bible-kjv-text 4.38  the KJV text (copyright expired: translated in 1611; public domain)
#   bible-kjv      4.38  the `bible` program that prints it (GPL-2+)
#
# Runs on Debian 12 (needs apt-get download, dpkg-deb, python3). Writes, under tools/train-demo/data/:
#   kjv_raw.txt    the text exactly as `bible` prints it
#   train.txt      chapters not held out: one verse per line, verse numbers removed,
#                  a blank line between chapters
#   valid.txt      every 20th chapter (chapter index i, counted from 0 over the whole Bible,
#                  with i % 20 == 19), same layout
#   manifest.json  packages, versions, licences, split rule, counts and sha256 of each file
# Deterministic: the same package versions give byte-identical files.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
data="$here/data"
work="$(mktemp -d)"
chown _apt "$work" 2>/dev/null || chmod 777 "$work"  # apt-get download fetches as the _apt user
trap 'rm -rf "$work"' EXIT

want_version="4.38"
mkdir -p "$data"
(cd "$work" && apt-get download bible-kjv-text="$want_version" bible-kjv="$want_version" >/dev/null)
for deb in "$work"/*.deb; do dpkg-deb -x "$deb" "$work/root"; done

"$work/root/usr/bin/bible" -p "$work/root/usr/lib" "Gen1:1-Rev22:21" > "$data/kjv_raw.txt"

python3 "$here/kjv_to_text.py" \
  --raw "$data/kjv_raw.txt" --out-dir "$data" \
  --package "bible-kjv-text=$(dpkg-deb -f "$work"/bible-kjv-text_*.deb Version)" \
  --package "bible-kjv=$(dpkg-deb -f "$work"/bible-kjv_*.deb Version)" \
  --copyright "$work/root/usr/share/doc/bible-kjv-text/copyright"
