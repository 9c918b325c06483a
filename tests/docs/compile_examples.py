#!/usr/bin/env python3
"""Compiles every example of a doc page, as its readers would (docs/c-api.md).

Each fenced block whose first line is `// docs-example: KIND` is written to a
file and compiled with keel's warning flags (-Wall -Wextra -Wpedantic
-Werror), syntax only:
  c         as C11, once against each DLPack include folder given;
  c++       as C++17 and C++20, with keel's include/ and DLPack only;
  libtorch  in the build's C++ standard, with libtorch's headers too.
A page with no example, or a KIND it does not know, fails: an example that
is not compiled must not pass for one that is.

usage: compile_examples.py DOC --cc CC --cxx CXX --include DIR --dlpack DIR
       [--dlpack DIR ...] --torch-include DIR [--torch-include DIR ...] --std N
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

WARNINGS = ["-Wall", "-Wextra", "-Wpedantic", "-Werror"]


def examples(doc):
    text = open(doc, encoding="utf-8").read()
    for m in re.finditer(r"^```(\w[\w+]*)\n(.*?)^```", text, re.S | re.M):
        body = m.group(2)
        first = body.split("\n", 1)[0]
        k = re.match(r"\s*//\s*docs-example:\s*(\S+)", first)
        if k:
            line = text.count("\n", 0, m.start()) + 1
            yield line, k.group(1), body


def main():
    p = argparse.ArgumentParser()
    p.add_argument("doc")
    p.add_argument("--cc", required=True)
    p.add_argument("--cxx", required=True)
    p.add_argument("--include", required=True)
    p.add_argument("--dlpack", action="append", required=True)
    p.add_argument("--torch-include", action="append", default=[])
    p.add_argument("--std", required=True)
    a = p.parse_args()
    failures = 0
    found = 0
    with tempfile.TemporaryDirectory() as work:
        for line, kind, body in examples(a.doc):
            found += 1
            runs = []
            if kind == "c":
                source = os.path.join(work, f"example_{line}.c")
                for d in a.dlpack:
                    runs.append((f"C11, DLPack from {d}", [a.cc, "-x", "c", "-std=c11", *WARNINGS, "-I", a.include,
                                 "-I", d, "-fsyntax-only", source]))
            elif kind == "c++":
                source = os.path.join(work, f"example_{line}.cpp")
                for std in ("17", "20"):
                    runs.append((f"C++{std}", [a.cxx, f"-std=c++{std}", *WARNINGS, "-I",
                                 a.include, "-I", a.dlpack[0], "-fsyntax-only", source]))
            elif kind == "libtorch":
                source = os.path.join(work, f"example_{line}.cpp")
                flags = [f for d in a.torch_include for f in ("-isystem", d)]
                runs.append((f"C++{a.std} with libtorch", [a.cxx, f"-std=c++{a.std}", *WARNINGS,
                             "-I", a.include, "-I", a.dlpack[0], *flags, "-fsyntax-only",
                             source]))
            else:
                print(f"{a.doc}:{line}: unknown docs-example kind '{kind}'")
                failures += 1
                continue
            with open(source, "w", encoding="utf-8") as f:
                f.write(body)
            for what, cmd in runs:
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
                if r.returncode != 0:
                    failures += 1
                    print(f"FAIL {a.doc}:{line} ({kind}, {what}):\n{r.stderr}")
                else:
                    print(f"ok   {a.doc}:{line} ({kind}, {what})")
    if found == 0:
        print(f"{a.doc}: no `// docs-example:` block")
        return 1
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
