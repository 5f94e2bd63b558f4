#!/usr/bin/python3
"""Judges what each driver configuration of the clients suite did (its
RESULT lines, see test/clients/run) against the extension's real effects:
the ledger and type_calls rows the business functions wrote. Also checks
that every snippet docs/drivers.md shows is, verbatim, code a driver runs.
Prints one line per check and closes with `clients: N passed, M failed`.

After changing a snippet (a `docs:begin NAME` ... `docs:end NAME` region of
a driver's source), rewrite the page's blocks from the sources:

    test/clients/check.py --update-docs --docs docs/drivers.md --sources test/clients
"""

import argparse
import json
import os
import re
import sys
import textwrap

import psycopg2

# Numbers with a fraction are compared as written, so that 12.5 is not
# taken for the 12.50 the drivers sent (numeric keeps its scale).
STAMP = "1767323045.000000"  # extract(epoch from '2026-01-02 03:04:05+00')
UUID = "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"
DOC = {"a": 1, "b": [True, None]}


def read_results(path):
    """{step: {field: value}} from the RESULT lines of one configuration."""
    results = {}
    if not os.path.exists(path):
        return results
    with open(path, encoding="utf-8") as out:
        for line in out:
            match = re.match(r"RESULT (\S+) (\S+) ?(.*)$", line.rstrip("\n"))
            if match:
                step, field, value = match.groups()
                results.setdefault(step, {})[field] = value
    return results


class Failed(Exception):
    pass


class Config:
    """One configuration's results, with assertions that name what failed."""

    def __init__(self, name, results):
        self.name = name
        self.results = results

    def value(self, step, field):
        try:
            return self.results[step][field]
        except KeyError:
            # An error ends a step; a loop's error is under its step's name.
            error = self.results.get(step, {}).get("error") or self.results.get(step.split(".")[0], {}).get("error")
            raise Failed(f"{step}: no {field}" + (f" (error: {error})" if error else "")) from None

    def expect(self, step, field, expected):
        actual = self.value(step, field)
        if actual.lower() != expected:
            raise Failed(f"{step} {field}: got {actual!r}, expected {expected!r}")

    def document(self, step, field="response"):
        text = self.value(step, field)
        try:
            return json.loads(text, parse_float=str)
        except ValueError:
            raise Failed(f"{step} {field}: not JSON: {text!r}") from None

    def expect_document(self, step, expected, field="response"):
        actual = self.document(step, field)
        if actual != expected:
            raise Failed(f"{step} {field}: got {actual!r}, expected {expected!r}")

    def expect_same_text(self, step, other_step):
        a, b = self.value(step, "response"), self.value(other_step, "response")
        if a != b:
            raise Failed(f"{step} response {a!r} is not byte for byte {other_step}'s {b!r}")


def expect_count(what, actual, expected):
    if actual != expected:
        raise Failed(f"{what}: {actual}, expected {expected}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--results")
    parser.add_argument("--run")
    parser.add_argument("--docs", required=True)
    parser.add_argument("--sources", required=True)
    parser.add_argument("--update-docs", action="store_true",
                        help="rewrite the snippet blocks of --docs from the sources, check nothing")
    parser.add_argument("configs", nargs="*")
    args = parser.parse_args()
    if args.update_docs:
        update_docs(args.docs, args.sources)
        return 0

    db = psycopg2.connect(dbname="clients", user="postgres")
    db.autocommit = True

    def count(sql, *params):
        with db.cursor() as cur:
            cur.execute(sql, params)
            return cur.fetchone()[0]

    def ledger(account):
        return count("SELECT count(*) FROM public.ledger WHERE account = %s", account)

    def type_calls(tag):
        return count("SELECT count(*) FROM public.type_calls WHERE tag = %s", tag)

    def types_document(tag, null):
        if null:
            return {"tag": tag, "flag": None, "at": None, "id": None, "doc": None, "amount": None}
        return {"tag": tag, "flag": True, "at": STAMP, "id": UUID, "doc": DOC, "amount": "12.50"}

    passed, failed = 0, 0

    def report(name, check):
        nonlocal passed, failed
        try:
            check()
        except Failed as failure:
            failed += 1
            print(f"not ok - {name}: {failure}")
        else:
            passed += 1
            print(f"ok - {name}")

    psql = Config("psql", read_results(os.path.join(args.results, "psql.out")))
    for index, name in enumerate(args.configs, start=1):
        c = Config(name, read_results(os.path.join(args.results, name + ".out")))
        account = index * 100
        prefix = f"{args.run}-{name}-"

        def first_call_runs():
            c.expect_document("first", {"account": account + 1, "balance": 9700})
            c.expect("first", "replayed", "false")

        def retry_replays_byte_identical():
            c.expect_same_text("retry", "first")
            c.expect("retry", "replayed", "true")
            expect_count("withdraw's executions", ledger(account + 1), 1)

        def other_value_is_ik422():
            c.expect("conflict", "sqlstate", "ik422")
            expect_count("withdraw's executions", ledger(account + 1), 1)

        def held_key_is_ik409_at_once():
            c.expect("busy", "sqlstate", "ik409")
            elapsed = int(c.value("busy", "elapsed_ms"))
            if elapsed >= 2000:
                raise Failed(f"IK409 took {elapsed} ms")
            c.expect_document("busy_after", {"account": account + 2, "balance": 9900})
            c.expect("busy_after", "replayed", "true")
            expect_count("withdraw's executions", ledger(account + 2), 1)

        def claim_complete_in_a_transaction():
            c.expect("handler_claim", "replayed", "false")
            c.expect_document("handler_work", {"account": account + 3, "balance": 9950})
            c.expect("handler_again", "replayed", "true")
            c.expect_document("handler_again", c.document("handler_work"))
            expect_count("withdraw's executions", ledger(account + 3), 1)

        def claim_batch_complete_batch():
            for i in range(3):
                c.expect(f"batch.{i}", "outcome", "claimed")
                c.expect_document(f"batch.{i}", {"account": account + 6 + i, "balance": 10000 - 10 * (i + 1)})
                expect_count("withdraw's executions", ledger(account + 6 + i), 1)

        def claim_batch_again_replays():
            for i in range(3):
                c.expect(f"batch_retry.{i}", "outcome", "replayed")
                c.expect_same_text(f"batch_retry.{i}", f"batch.{i}")
                expect_count("withdraw's executions", ledger(account + 6 + i), 1)
            # The first key again, under another request hash.
            c.expect("batch_retry.3", "outcome", "refused")
            c.expect("batch_retry.3", "sqlstate", "ik422")

        def claim_release_in_a_transaction():
            c.expect("release_lookup", "state", "absent")
            c.expect("release_again", "replayed", "false")

        def typed_arguments(step, null):
            def check():
                tag = prefix + step.replace("_", "-")
                c.expect_document(step, types_document(tag, null))
                c.expect(step, "replayed", "false")
                c.expect_same_text(step + "_retry", step)
                c.expect(step + "_retry", "replayed", "true")
                expect_count("record_types' executions", type_calls(tag), 1)
            return check

        def prepared_20_times(step, account):
            def check():
                balance = 10000
                for i in range(20):
                    balance -= i + 1
                    c.expect_document(f"{step}.run.{i}", {"account": account, "balance": balance})
                    c.expect_same_text(f"{step}.retry.{i}", f"{step}.run.{i}")
                expect_count("withdraw's executions", ledger(account), 20)
            return check

        def cross_driver(step):
            def check():
                c.expect(step, "replayed", "false" if name == "psql" else "true")
                if name != "psql":
                    actual, first = c.value(step, "response"), psql.value(step, "response")
                    if actual != first:
                        raise Failed(f"{step}: got {actual!r}, psql's first call answered {first!r}")
            return check

        for label, check in [
            ("first call runs", first_call_runs),
            ("retry replays byte-identical", retry_replays_byte_identical),
            ("same key, other value: IK422", other_value_is_ik422),
            ("key held by another transaction: IK409 in < 2 s", held_key_is_ik409_at_once),
            ("claim, complete in the driver's transaction", claim_complete_in_a_transaction),
            ("claim, release in the driver's transaction", claim_release_in_a_transaction),
            ("claim_batch, complete_batch in the driver's transaction", claim_batch_complete_batch),
            ("claim_batch again: replays byte-identical, another hash IK422", claim_batch_again_replays),
            ("text, boolean, timestamptz, uuid, jsonb, numeric", typed_arguments("types", False)),
            ("NULL arguments", typed_arguments("types_null", True)),
            ("prepared statement, 20 keys", prepared_20_times("prepared", account + 4)),
            ("prepared statement, 20 keys, generic plans", prepared_20_times("prepared_generic", account + 5)),
            ("cross-driver retry: withdraw", cross_driver("cross")),
            ("cross-driver retry: typed values", cross_driver("cross_types")),
        ]:
            report(f"{name}: {label}", check)

    def cross_driver_executions():
        expect_count("withdraw's executions for the cross-driver key", ledger(1), 1)
        expect_count("record_types' executions for the cross-driver key", type_calls(args.run + "-cross"), 1)

    report("all drivers: the cross-driver keys ran once", cross_driver_executions)

    with open(args.docs, encoding="utf-8") as page:
        shown = dict(shown_snippets(page.read()))
    for snippet_name, snippet in snippets(args.sources):
        def in_docs(snippet_name=snippet_name, snippet=snippet):
            if snippet_name not in shown:
                raise Failed(f"docs/drivers.md has no `<!-- snippet {snippet_name} -->` block")
            if shown[snippet_name] != snippet:
                raise Failed("the block differs from the source (test/clients/check.py --update-docs)")
        report(f"docs/drivers.md shows {snippet_name}'s snippet as the suite runs it", in_docs)

    print(f"clients: {passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


SHOWN = re.compile(r"(<!-- snippet (\S+) -->\n```[a-z]*\n)(.*?)(\n```)", re.S)


def shown_snippets(docs):
    """(name, text) of every snippet block of docs/drivers.md."""
    return [(match.group(2), match.group(3)) for match in SHOWN.finditer(docs)]


def update_docs(docs_path, root):
    """Rewrites docs/drivers.md's snippet blocks from the sources."""
    sources = dict(snippets(root))
    with open(docs_path, encoding="utf-8") as page:
        docs = page.read()
    docs = SHOWN.sub(lambda m: m.group(1) + sources.get(m.group(2), m.group(3)) + m.group(4), docs)
    with open(docs_path, "w", encoding="utf-8") as page:
        page.write(docs)


def snippets(root):
    """(name, text) of every `docs:begin NAME` ... `docs:end NAME` region of
    the drivers' sources, without the region's common indentation."""
    found = []
    for directory, _, files in sorted(os.walk(root)):
        for file in sorted(files):
            if directory == root or file.startswith(".") or "node_modules" in directory:
                continue
            path = os.path.join(directory, file)
            try:
                text = open(path, encoding="utf-8").read()
            except (UnicodeDecodeError, OSError):
                continue
            for match in re.finditer(r"docs:begin (\S+)[^\n]*\n(.*?)\n[^\n]*docs:end \1", text, re.S):
                found.append((match.group(1), textwrap.dedent(match.group(2))))
    return found


if __name__ == "__main__":
    sys.exit(main())
