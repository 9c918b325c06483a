#!/usr/bin/env python3
"""clang-tidy over files of one build, each result cached as ccache caches a
compilation (scripts/lint.sh).

A file is linted again only when something clang-tidy reads changed: the
key of a clean result hashes the file, its compile command, every header
the build's dependency log lists for its object (`ninja -t deps`: keel's,
libtorch's and the system's), the .clang-tidy files and clang-tidy's
version. Paths inside the checkout are made relative first, so a clean
clone elsewhere on the machine reuses the results (the cache is
$KEEL_LINT_CACHE, default ~/.cache/keel/clang-tidy). A file whose object has
no dependency record is always linted; only a clean result is cached.

usage: lint_tidy.py LINT_DIR BUILD_DIR FILE...   (LINT_DIR holds the commands)
"""
import concurrent.futures
import hashlib
import json
import os
import shlex
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def file_hash(path, memo):
    if path not in memo:
        try:
            with open(path, "rb") as f:
                memo[path] = hashlib.sha256(f.read()).hexdigest()
        except OSError:
            memo[path] = "missing"
    return memo[path]


def relative(text):
    return text.replace(ROOT, "<root>")


def dependencies(build, entry):
    """The headers the build read for this file's object, or None."""
    args = shlex.split(entry["command"])
    if "-o" not in args:
        return None
    obj = args[args.index("-o") + 1]
    r = subprocess.run(["ninja", "-C", build, "-t", "deps", obj], capture_output=True,
                       text=True)
    lines = r.stdout.splitlines()
    if r.returncode != 0 or not lines or "(VALID)" not in lines[0]:
        return None
    return [os.path.normpath(os.path.join(build, line.strip())) for line in lines[1:]
            if line.strip()]


def main():
    lint_dir, build, files = sys.argv[1], os.path.abspath(sys.argv[2]), sys.argv[3:]
    cache = os.environ.get("KEEL_LINT_CACHE",
                           os.path.expanduser("~/.cache/keel/clang-tidy"))
    os.makedirs(cache, exist_ok=True)
    with open(os.path.join(lint_dir, "compile_commands.json")) as f:
        entries = {e["file"]: e for e in json.load(f)}
    version = subprocess.run(["clang-tidy", "--version"], capture_output=True,
                             text=True).stdout
    configs = subprocess.run(["git", "-C", ROOT, "ls-files", "*.clang-tidy", ".clang-tidy"],
                             capture_output=True, text=True).stdout.split()
    memo = {}
    base = hashlib.sha256(version.encode())
    for c in sorted(configs):
        base.update((c + file_hash(os.path.join(ROOT, c), memo)).encode())
    jobs = []
    hits = 0
    for f in files:
        path = os.path.join(ROOT, f)
        entry = entries[path]
        deps = dependencies(build, entry)
        key = None
        if deps is not None:
            h = base.copy()
            h.update(relative(entry["command"]).encode())
            h.update((f + file_hash(path, memo)).encode())
            # In the order of the relative paths: absolute paths sort the
            # checkout among libtorch's and the system's headers by where it
            # lies, which would make each clone's keys its own.
            for d in sorted(deps, key=relative):
                h.update((relative(d) + file_hash(d, memo)).encode())
            key = h.hexdigest()
            if os.path.exists(os.path.join(cache, key)):
                hits += 1
                continue
        jobs.append((f, key))

    def tidy(job):
        f, key = job
        r = subprocess.run(["clang-tidy", "--quiet", "-p", lint_dir, f], cwd=ROOT,
                           capture_output=True, text=True)
        # clang-tidy exits 0 with findings unless they are errors: any
        # "warning:" or "error:" line is a finding.
        clean = r.returncode == 0 and " warning: " not in r.stdout and " error: " not in r.stdout
        if clean and key is not None:
            open(os.path.join(cache, key), "w").close()
        return f, clean, r.stdout + r.stderr

    failed = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        for f, clean, output in pool.map(tidy, jobs):
            if not clean:
                failed += 1
                print(f"keel: clang-tidy: {f}\n{output}")
    print(f"keel: clang-tidy on {len(files)} files: {hits} unchanged since a clean run "
          f"(cached), {len(jobs)} linted, {failed} with findings")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
