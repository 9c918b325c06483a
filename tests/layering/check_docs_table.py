#!/usr/bin/env python3
"""The table of layers in docs/architecture.md is the build's (layers.md,
written from the keel_layer() declarations): every row of the build's table
stands in the document as it is, and the document has no other row but
those of layers this build leaves out (the native adapter before 2.13).

usage: check_docs_table.py docs/architecture.md BUILD_DIR/layers.md
"""
import sys

OPTIONAL = {"`keel_adapter_native`"}


def rows(lines):
    return [line.strip() for line in lines if line.strip().startswith("| `")]


def main():
    doc_path, built_path = sys.argv[1], sys.argv[2]
    doc = open(doc_path).read()
    begin, end = doc.find("<!-- layers:"), doc.find("<!-- /layers -->")
    if begin < 0 or end < begin:
        print(f"FAIL: {doc_path} has no <!-- layers: ... --> block")
        return 1
    documented = rows(doc[begin:end].splitlines())
    built = rows(open(built_path).read().splitlines())
    failures = [f"the build's row is not in {doc_path}: {r}" for r in built if r not in documented]
    failures += [f"{doc_path} has a row the build does not: {r}" for r in documented
                 if r not in built and r.split(" |")[0].lstrip("| ") not in OPTIONAL]
    for f in failures:
        print("FAIL:", f)
    if not failures:
        print(f"{len(built)} rows of {built_path} stand in {doc_path}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
