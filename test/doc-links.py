#!/usr/bin/env python3
"""Checks every relative link of the Markdown files git tracks: the file or
directory it names exists, and an anchor (#section) names a heading of that
file, as GitHub derives anchors from headings. Links to other sites are not
followed. Prints each broken link as file:line: target and exits non-zero
if there is one; run from anywhere in the repository.

    test/doc-links.py            # every tracked *.md
    test/doc-links.py README.md  # some files
"""
import os
import re
import subprocess
import sys

LINK = re.compile(r"\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")


def repo_root():
    here = os.path.dirname(os.path.abspath(__file__))
    return subprocess.run(["git", "-C", here, "rev-parse", "--show-toplevel"],
                          capture_output=True, text=True, check=False).stdout.strip() \
        or os.path.dirname(here)


def prose_lines(path):
    """(line number, text) of the lines outside fenced code blocks."""
    fenced = False
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if FENCE.match(line):
                fenced = not fenced
                continue
            if not fenced:
                yield number, line


def slug(heading):
    """GitHub's anchor for a heading: lower case, markup and punctuation
    dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links: their text
    text = text.lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


anchors_of = {}


def anchors(path):
    if path not in anchors_of:
        found, seen = set(), {}
        for _, line in prose_lines(path):
            m = HEADING.match(line)
            if not m:
                continue
            base = slug(m.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
        for _, line in prose_lines(path):  # explicit <a name=...> / id=...
            found.update(re.findall(r"<a\s+(?:name|id)=\"([^\"]+)\"", line))
        anchors_of[path] = found
    return anchors_of[path]


def broken_links(path):
    for number, line in prose_lines(path):
        line = re.sub(r"`[^`]*`", "", line)  # code spans hold no links
        for target in LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, mailto:, …
                continue
            file_part, _, anchor = target.partition("#")
            linked = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) \
                if file_part else path
            if not os.path.exists(linked):
                yield number, target, "no such file"
            elif anchor and linked.endswith(".md") and anchor not in anchors(linked):
                yield number, target, "no such heading"
            else:
                yield number, target, None


checked = [0]


def main(args):
    root = repo_root()
    if args:
        files = [os.path.abspath(a) for a in args]
    else:
        listed = subprocess.run(["git", "-C", root, "ls-files", "-z", "*.md"],
                                capture_output=True, text=True, check=False)
        if listed.returncode == 0:
            files = [os.path.join(root, f) for f in listed.stdout.split("\0") if f]
        else:  # not a git checkout: every *.md but installed dependencies
            files = [os.path.join(d, f) for d, dirs, names in os.walk(root)
                     for f in names if f.endswith(".md") and "node_modules" not in d]
    broken = 0
    for path in files:
        for number, target, why in broken_links(path):
            if why is None:
                checked[0] += 1
                continue
            print(f"{os.path.relpath(path, root)}:{number}: {target} ({why})")
            broken += 1
    print(f"doc-links: {len(files)} files, {checked[0]} links, {broken} broken")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
