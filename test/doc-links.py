#!/usr/bin/env python3
"""Checks every relative link of the Markdown files git tracks: the file or
directory it names exists, and an anchor (#section) names a heading of that
file, as GitHub derives anchors from headings. Inline links ([text](target),
their text may wrap lines) and reference links ([text][ref], [text][] with
a definition [ref]: target) are checked; a reference without a definition is
broken too. Links to other sites are not followed. Prints each broken link
as file:line: target and exits non-zero if there is one, or if there was no
file to check; run from anywhere in the repository.

Each fact has one home: a setting (`idempotency.name`, as the library
defines it or docs/settings.md lists it) is defined only in
docs/settings.md, an SQLSTATE (the extension's IKnnn, or a code
docs/errors.md defines) only in docs/errors.md. A definition is a table row
whose first cell is the name (or a list of names), or a heading that
names it; any
other page that has one fails, reported as file:line. Last, the words of
each page of README.md and docs/ are printed, and their total.

    test/doc-links.py            # every tracked *.md
    test/doc-links.py README.md  # some files
    test/doc-links.py docs       # every *.md under a directory
    test/doc-links.py --root=DIR DIR   # DIR's docs/settings.md and docs/errors.md as the homes
"""
import os
import re
import subprocess
import sys

# Link text: anything but brackets (one level of nested brackets allowed),
# across line breaks but not across a blank line (a paragraph's end).
TEXT = r"\[((?:[^\]\[\n]|\n(?![ \t]*\n)|\[[^\]\n]*\])*)\]"
LINK = re.compile(TEXT + r"\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(TEXT + r"\[([^\]\[]*)\]")
DEFINITION = re.compile(r"^ {0,3}\[([^\]\n]+)\]:[ \t]*<?([^\s>]+)>?.*$", re.M)
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


def label(text):
    """A reference's label as Markdown matches it: case and runs of white
    space do not matter."""
    return " ".join(text.split()).lower()


def prose(path):
    """The text outside fenced code blocks, code spans blanked (so no link is
    found in them) with line breaks kept, so offsets still give lines."""
    lines = dict(prose_lines(path))
    with open(path, encoding="utf-8") as f:
        text = "".join(line if number in lines else "\n" for number, line in enumerate(f, 1))
    return re.sub(r"`[^`\n]*`", lambda m: " " * len(m.group(0)), text)


def resolve(path, target):
    """Why target, a link of path, is broken, or None when it resolves or
    names another site."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, mailto:, …
        return None
    file_part, _, anchor = target.partition("#")
    linked = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) \
        if file_part else path
    if not os.path.exists(linked):
        return "no such file"
    if anchor and linked.endswith(".md") and anchor not in anchors(linked):
        return "no such heading"
    return None


def broken_links(path):
    """(line, target, why broken or None) of every link of path."""
    text = prose(path)
    line_of = lambda offset: text.count("\n", 0, offset) + 1  # noqa: E731
    definitions = {}
    for m in DEFINITION.finditer(text):
        definitions.setdefault(label(m.group(1)), m.group(2))
        yield line_of(m.start()), m.group(2), resolve(path, m.group(2))
    without_definitions = DEFINITION.sub(lambda m: " " * len(m.group(0)), text)
    for m in LINK.finditer(without_definitions):
        yield line_of(m.start()), m.group(2), resolve(path, m.group(2))
    for m in REFERENCE.finditer(LINK.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), without_definitions)):
        ref = label(m.group(2) or m.group(1))
        if ref not in definitions:
            yield line_of(m.start()), f"[{m.group(1)}][{m.group(2)}]", "no such reference"


checked = [0]

SETTINGS_HOME = os.path.join("docs", "settings.md")
ERRORS_HOME = os.path.join("docs", "errors.md")
SETTING = re.compile(r"idempotency\.[a-z_]+\b(?!\s*\()")
IK_SQLSTATE = re.compile(r"\bIK[0-9A-Z]{3}\b")
SQLSTATE = re.compile(r"\b(?=[0-9A-Z]*[0-9])[0-9A-Z]{5}\b")
ROW = re.compile(r"^\s*\|([^|\n]*)\|")


def first_cell(line):
    """The text of a table row's first cell, markup dropped, or None when
    the line is no table row (or its separator)."""
    m = ROW.match(line)
    if not m or re.fullmatch(r"[\s:-]*", m.group(1)):
        return None
    return m.group(1).replace("`", "").replace("*", "").strip()


def definitions(path):
    """(line, name, how) of every setting or SQLSTATE that a line of path
    defines: a table row whose first cell starts with it, or a heading
    naming it."""
    for number, line in prose_lines(path):
        heading = HEADING.match(line)
        if heading:
            text = heading.group(2).replace("`", "")
            for m in SETTING.finditer(text):
                yield number, m.group(0), "heading"
            for m in SQLSTATE.finditer(text):
                yield number, m.group(0), "heading"
            continue
        cell = first_cell(line)
        if not cell:
            continue
        # A row introduces what its first cell is: one name, or a list of
        # them ("`40001`, `40P01`"); a cell that says more about a name
        # (a promise, a measurement) is no definition.
        names = re.split(r"\s*(?:,|/|\band\b|\bor\b)\s*", cell)
        if all(SETTING.fullmatch(n) or SQLSTATE.fullmatch(n) for n in names):
            for n in names:
                yield number, n, "table row"


def source_settings(root):
    """The settings the library defines (DefineCustom*Variable)."""
    found = set()
    src = os.path.join(root, "src")
    for d, _, names in os.walk(src):
        for name in names:
            if name.endswith((".cpp", ".c")):
                with open(os.path.join(d, name), encoding="utf-8", errors="replace") as f:
                    found.update(re.findall(r"DefineCustom\w+Variable\(\s*\"(idempotency\.[a-z_]+)\"", f.read()))
    return found


def misplaced_definitions(root, files):
    """(file, line, name, home) of each definition outside its home page.
    A setting is a name the library defines or the settings page defines;
    an SQLSTATE is an IK code, or a code the errors page defines."""
    settings_home = os.path.join(root, SETTINGS_HOME)
    errors_home = os.path.join(root, ERRORS_HOME)
    settings = source_settings(root)
    if os.path.exists(settings_home):
        settings.update(n for _, n, how in definitions(settings_home) if SETTING.fullmatch(n))
    sqlstates = set()
    if os.path.exists(errors_home):
        sqlstates.update(n for _, n, _ in definitions(errors_home) if SQLSTATE.fullmatch(n))
    for path in files:
        for number, name, how in definitions(path):
            if name in settings and path != settings_home:
                yield path, number, name, how, SETTINGS_HOME
            elif (IK_SQLSTATE.fullmatch(name) or name in sqlstates) \
                    and not SETTING.fullmatch(name) and path != errors_home:
                yield path, number, name, how, ERRORS_HOME


def words(path):
    with open(path, encoding="utf-8") as f:
        return len(f.read().split())


def report_words(root, files):
    """Words of README.md and every page under docs/, as wc -w counts them."""
    pages = sorted(p for p in files if os.path.relpath(p, root) == "README.md"
                   or os.path.relpath(p, root).startswith("docs" + os.sep))
    total = 0
    for path in pages:
        n = words(path)
        total += n
        print(f"doc-words: {n:6d} {os.path.relpath(path, root)}")
    if pages:
        print(f"doc-words: {total:6d} total")


def main(args):
    root = repo_root()
    for arg in [a for a in args if a.startswith("--root=")]:
        root = os.path.abspath(arg[len("--root="):])
        args = [a for a in args if a != arg]
    if args:
        files = []
        for arg in args:
            if os.path.isdir(arg):
                files += sorted(os.path.join(d, f) for d, dirs, names in os.walk(os.path.abspath(arg))
                                for f in names if f.endswith(".md") and "node_modules" not in d)
            else:
                files.append(os.path.abspath(arg))
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
    if not files:
        print("doc-links: no Markdown file to check")
        return 1
    misplaced = 0
    for path, number, name, how, home in misplaced_definitions(root, files):
        print(f"{os.path.relpath(path, root)}:{number}: {name} defined here ({how}); "
              f"its home is {home}: link to it instead")
        misplaced += 1
    print(f"doc-links: {misplaced} definitions outside their home page")
    report_words(root, files)
    return 1 if broken or misplaced else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
