#!/usr/bin/env python3
"""The self-test of test/doc-links.py: in a scratch directory, a file whose
links all resolve passes, each file with one planted broken link of a kind
fails and names that link's line, and a directory without Markdown files
fails. In a scratch repository whose docs/settings.md and docs/errors.md
define a setting and an SQLSTATE, those definitions pass, each planted
definition elsewhere (a table row, a heading) fails at its line, a page that
only mentions or links them passes, and the words per page are reported. Prints one line per check and "doc-links-test: N passed, M failed".
"""
import os
import subprocess
import sys
import tempfile

CHECKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "doc-links.py")

GOOD = """# Good

## A section

An [inline link](other.md), one [with an anchor](other.md#elsewhere), one to
[this file's section](#a-section), a [link whose text
wraps a line](other.md), a [reference link][other], a [collapsed one][], a
definition only a shortcut uses ([shortcut]) and [a site](https://example.org).
Code is not prose: `[not a link](missing.md)` and `[not][a-reference]`.

```
[not a link either](missing.md)
```

[other]: other.md
[collapsed one]: <other.md#elsewhere>
[shortcut]: other.md "with a title"
"""

# name: (text, the line doc-links.py must report)
BROKEN = {
    "inline": ("A [link](missing.md) to nothing.\n", 1),
    "anchor": ("Text.\n\nA [link](other.md#nowhere) to no heading.\n", 3),
    "wrapped-text": ("Some text and a [link whose text\nwraps a line](missing.md).\n", 1),
    "wrapped-target": ("Some text and a [link](\nmissing.md).\n", 1),
    "reference-target": ("A [reference][ref].\n\n[ref]: missing.md\n", 3),
    "reference-anchor": ("A [reference][ref].\n\n[ref]: other.md#nowhere\n", 3),
    "reference-undefined": ("Text.\nA [reference][undefined] without a definition.\n", 2),
    "collapsed-undefined": ("A [collapsed reference][] without a definition.\n", 1),
}

# The homes of a scratch repository, and pages that only mention them.
HOMES = {
    "docs/settings.md": "# Settings\n\n| setting | default |\n| --- | --- |\n| `idempotency.ttl` | `24h` |\n",
    "docs/errors.md": "# Errors\n\n| SQLSTATE | meaning |\n| --- | --- |\n| `IK409`, `40001` | busy |\n\n## `2BP01`\n",
    "docs/mentions.md": ("# Mentions\n\n`idempotency.ttl` ([settings](settings.md)) and `IK409`.\n\n"
                         "| case | result |\n| --- | --- |\n| key held | `IK409` ([errors](errors.md)) |\n"
                         "| `idempotency.ttl` set per role | kept |\n| `IK409` p99 | 1 ms |\n"),
}

# name: (text of docs/planted.md, the line doc-links.py must report)
DUPLICATE = {
    "setting-row": ("# Planted\n\n| setting | default |\n| --- | --- |\n| `idempotency.ttl` | `1h` |\n", 5),
    "setting-heading": ("# Planted\n\n## `idempotency.ttl`\n", 3),
    "sqlstate-row": ("# Planted\n\n| code | meaning |\n| --- | --- |\n| `IK409` | busy |\n", 5),
    "sqlstate-list-row": ("# Planted\n\n| code | meaning |\n| --- | --- |\n| `55P03`, `40001` | busy |\n", 5),
    "sqlstate-heading": ("# Planted\n\n## What IK409 means\n", 3),
    "errors-own-code-heading": ("# Planted\n\nText.\n\n### `2BP01` for DBAs\n", 5),
}

results = []


def check(name, ok, detail=""):
    results.append(ok)
    print(f"{'ok' if ok else 'not ok'} - {name}{'' if ok else ': ' + detail}")


def run(*args):
    done = subprocess.run([sys.executable, CHECKER, *args], capture_output=True, text=True, check=False)
    return done.returncode, done.stdout + done.stderr


with tempfile.TemporaryDirectory() as scratch:
    with open(os.path.join(scratch, "other.md"), "w", encoding="utf-8") as f:
        f.write("# Other\n\n## Elsewhere\n")
    good = os.path.join(scratch, "good.md")
    with open(good, "w", encoding="utf-8") as f:
        f.write(GOOD)
    status, output = run(good)
    check("a file whose links resolve passes", status == 0 and "0 broken" in output, output)
    # 3 definitions and 5 inline links (the site too: it is counted, not followed).
    check("every kind of link in it is checked", "8 links" in output, output)

    for name, (text, line) in BROKEN.items():
        path = os.path.join(scratch, f"broken-{name}.md")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        status, output = run(path)
        check(f"a broken link ({name}) fails and is reported at its line",
              status != 0 and f"broken-{name}.md:{line}:" in output and "1 broken" in output, output)
        os.remove(path)

    empty = os.path.join(scratch, "empty")
    os.mkdir(empty)
    status, output = run(empty)
    check("no Markdown file to check fails", status != 0 and "0 files" in output, output)

with tempfile.TemporaryDirectory() as scratch:
    for name, text in HOMES.items():
        os.makedirs(os.path.dirname(os.path.join(scratch, name)), exist_ok=True)
        with open(os.path.join(scratch, name), "w", encoding="utf-8") as f:
            f.write(text)
    root = f"--root={scratch}"
    status, output = run(root, scratch)
    check("definitions in their homes, and mentions elsewhere, pass",
          status == 0 and "0 definitions outside" in output, output)
    check("the words of each page and their total are reported",
          "docs/settings.md" in output and "doc-words:" in output and " total" in output, output)
    for name, (text, line) in DUPLICATE.items():
        path = os.path.join(scratch, "docs", "planted.md")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        status, output = run(root, scratch)
        check(f"a planted duplicate definition ({name}) fails and is reported at its line",
              status != 0 and f"planted.md:{line}:" in output and "1 definitions outside" in output, output)
        os.remove(path)
    path = os.path.join(scratch, "docs", "planted.md")
    with open(path, "w", encoding="utf-8") as f:
        f.write("# Planted\n\nSee [the settings](settings.md#no-such-heading).\n")
    status, output = run(root, scratch)
    check("a planted broken link in the scratch repository fails",
          status != 0 and "planted.md:3:" in output and "1 broken" in output, output)

passed = sum(results)
print(f"doc-links-test: {passed} passed, {len(results) - passed} failed")
sys.exit(0 if passed == len(results) else 1)
