#!/usr/bin/env python3
"""Checks the relative links of the project's Markdown documents.

Every link to a file in the tree must name a file or folder that exists,
and a link with a #fragment must name a heading of the Markdown file it
points at (GitHub's anchor rules: lower case, punctuation dropped, spaces
to hyphens, -1, -2 ... for repeated headings). External links (http:,
https:, mailto:) are not followed.

usage: check_links.py SOURCE_DIR
Exits 1 listing each broken link as FILE:LINE: LINK: REASON.
"""
import os
import re
import subprocess
import sys

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")


def slug(text):
    text = re.sub(r"`([^`]*)`", r"\1", text)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path, cache={}):
    if path not in cache:
        found, seen, fenced = set(), {}, False
        with open(path, encoding="utf-8") as f:
            for line in f:
                if FENCE.match(line):
                    fenced = not fenced
                    continue
                m = None if fenced else HEADING.match(line)
                if not m:
                    continue
                base = slug(m.group(2))
                n = seen.get(base, 0)
                seen[base] = n + 1
                found.add(base if n == 0 else "%s-%d" % (base, n))
        cache[path] = found
    return cache[path]


def markdown_files(root):
    out = subprocess.run(["git", "-C", root, "ls-files", "--cached", "--others",
                          "--exclude-standard", "*.md"],
                         capture_output=True, text=True, check=False)
    if out.returncode == 0 and out.stdout.strip():
        return [os.path.join(root, p) for p in out.stdout.split()]
    files = []
    for d, dirs, names in os.walk(root):
        dirs[:] = [x for x in dirs if x not in (".git", "build", "node_modules")]
        files += [os.path.join(d, n) for n in names if n.endswith(".md")]
    return files


def main():
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[-2], file=sys.stderr)
        return 2
    root = os.path.abspath(sys.argv[1])
    errors, checked = [], 0
    for path in sorted(markdown_files(root)):
        if not os.path.isfile(path):
            continue
        rel = os.path.relpath(path, root)
        fenced = False
        with open(path, encoding="utf-8") as f:
            lines = f.readlines()
        for number, line in enumerate(lines, 1):
            if FENCE.match(line):
                fenced = not fenced
                continue
            if fenced:
                continue
            for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
                if re.match(r"^[a-z]+:", target):
                    continue
                checked += 1
                file_part, _, fragment = target.partition("#")
                dest = path if not file_part else os.path.normpath(
                    os.path.join(os.path.dirname(path), file_part))
                if not os.path.exists(dest):
                    errors.append("%s:%d: %s: no such file" % (rel, number, target))
                    continue
                if fragment and dest.endswith(".md") and fragment not in anchors(dest):
                    errors.append("%s:%d: %s: no heading with that anchor in %s"
                                  % (rel, number, target, os.path.relpath(dest, root)))
    for e in errors:
        print(e)
    print("check_links: %d links checked, %d broken" % (checked, len(errors)))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
