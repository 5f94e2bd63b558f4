#!/usr/bin/env python3
"""The release's version, stated in one place and agreed with everywhere.

The extension's version is default_version in idempotency.control (X.Y);
the packages carry it as X.Y.0: META.json (the distribution and the
extension it provides), debian/changelog (its newest entry), the npm
package (package.json, and package-lock.json twice), the Python package
(pyproject.toml and __version__) and the Go package (its Version constant;
a Go module's version is otherwise its tag). Prints each that disagrees and exits 1;
test/packaging.sh runs it. ROOT (the first argument) is the tree to check
(the repository by default).
"""
import ast
import json
import pathlib
import re
import sys
import tomllib

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parent.parent)


def read(path):
    return (root / path).read_text(encoding="utf-8")


control = re.search(r"^default_version = '([^']*)'$", read("idempotency.control"), re.M)
if control is None:
    sys.exit("idempotency.control has no default_version")
extension = control.group(1)
release = extension + ".0"

meta = json.loads(read("META.json"))
lock = json.loads(read("packages/node/package-lock.json"))
changelog = re.match(r"\S+ \(([^)]*)\)", read("debian/changelog"))
init = ast.parse(read("packages/python/src/idempotency_pg/__init__.py"))
python_version = next(
    (node.value.value for node in init.body if isinstance(node, ast.Assign)
     and any(isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets)
     and isinstance(node.value, ast.Constant)), None)
go_version = re.search(r'^const Version = "([^"]*)"$', read("packages/go/idempotency/doc.go"), re.M)

stated = {
    "META.json version": meta.get("version"),
    "META.json provides.idempotency.version": meta.get("provides", {}).get("idempotency", {}).get("version"),
    # The upstream part: a Debian revision (-1) may follow.
    "debian/changelog (newest entry)": changelog and changelog.group(1).split("-")[0],
    "packages/node/package.json version": json.loads(read("packages/node/package.json")).get("version"),
    "packages/node/package-lock.json version": lock.get("version"),
    'packages/node/package-lock.json packages[""].version': lock.get("packages", {}).get("", {}).get("version"),
    "packages/python/pyproject.toml project.version": tomllib.loads(read("packages/python/pyproject.toml")).get("project", {}).get("version"),
    "packages/python/src/idempotency_pg/__init__.py __version__": python_version,
    "packages/go/idempotency/doc.go Version": go_version and go_version.group(1),
}
wrong = {where: version for where, version in stated.items() if version != release}
for where, version in wrong.items():
    print(f"{where} is {version!r}, not {release!r} (idempotency.control's default_version {extension})")
if wrong:
    sys.exit(1)
print(f"versions: {len(stated)} agree with default_version {extension} ({release})")
