#!/usr/bin/env python3
"""Proves the layers are build facts (docs/architecture.md, rule 6).

For each layer, takes the include paths of one of its own sources from
compile_commands.json and preprocesses a one-line file per include: every
include the layer has no right to must fail with "No such file", and one it
has a right to must succeed (so the check itself can fail).

usage: check_layers.py BUILD_DIR/compile_commands.json CXX
"""
import json
import shlex
import subprocess
import sys

# layer: (one of its sources, forbidden includes, permitted includes)
# The native adapter is built on 2.13 and later only.
OPTIONAL = {"keel_adapter_native"}
LAYERS = {
    "keel_kernels": ("kernels/decode_attention.cpp",
                     ["dispatch/attention.h", "guard.h", "validate.h", "c10d_engine.h",
                      "comm/liveness.h"],
                     ["attention_mask.h"]),
    "keel_adapter_c10d": ("adapters/c10d/c10d_engine.cpp",
                          ["comm/liveness.h", "dispatcher.h", "attention_mask.h",
                           "compat/compat_adapter.h", "c10d_backends.h"],
                          ["dispatch/comm.h", "c10d/c10d_backends.h"]),
    "keel_adapter_compat": ("adapters/compat/comm.cpp",
                            ["comm/liveness.h", "dispatcher.h", "guard.h", "validate.h",
                             "native/native_adapter.h", "comm.h"],
                            ["dispatch/comm.h", "masked_logsumexp.h", "c10d/c10d_backends.h",
                             "compat/comm.h"]),
    "keel_adapter_native": ("adapters/native/native_adapter.cpp",
                            ["comm/liveness.h", "dispatcher.h", "compat/compat_adapter.h",
                             "attention.h"],
                            ["dispatch/comm.h", "accumulation.h", "c10d/c10d_engine.h",
                             "native/attention.h"]),
    "keel_registry": ("adapters/registry.cpp",
                      ["comm/liveness.h", "masked_logsumexp.h", "c10d/c10d_backends.h"],
                      ["compat/compat_adapter.h", "native/native_adapter.h"]),
    "keel_core": ("src/logsumexp.cpp",
                  ["masked_logsumexp.h", "attention_mask.h", "accumulation.h", "flash_plan.h",
                   "c10d_backends.h", "compat/compat_adapter.h", "golden.h", "engine/golden.h",
                   "suite/suite.h"],
                  ["dispatch/comm.h", "dispatch/capability.h", "keel/v1/dtype.h",
                   "comm/liveness.h"]),
    "keel_compat_engine": ("compat/engine/golden.cpp",
                           ["suite/suite.h", "suite.h", "record_compare.h", "validate.h",
                            "dispatcher.h", "dispatch/capability.h", "attention_mask.h"],
                           ["safetensors.h", "keel/v1/compat.h"]),
    "keel_compat_suite": ("compat/suite/suite.cpp",
                          ["validate.h", "dispatcher.h", "dispatch/capability.h",
                           "attention_mask.h", "c10d_backends.h", "golden.h"],
                          ["engine/golden.h", "suite/rank_workers.h"]),
}


def include_flags(command):
    args = shlex.split(command)
    flags = []
    i = 0
    while i < len(args):
        a = args[i]
        if a in ("-I", "-isystem") and i + 1 < len(args):
            flags += [a, args[i + 1]]
            i += 1
        elif a.startswith(("-I", "-isystem", "-D", "-std=")):
            flags.append(a)
        i += 1
    return flags


def preprocess(cxx, flags, header):
    text = f'#include "{header}"\n'
    return subprocess.run([cxx, "-E", "-x", "c++", "-o", "/dev/null", *flags, "-"],
                          input=text, capture_output=True, text=True, timeout=120)


def main():
    compile_commands, cxx = sys.argv[1], sys.argv[2]
    with open(compile_commands) as f:
        entries = json.load(f)
    failures = []
    for layer, (source, forbidden, permitted) in LAYERS.items():
        match = [e for e in entries if e["file"].endswith("/" + source)]
        if not match and layer in OPTIONAL:
            print(f"{layer}: not in this build")
            continue
        if not match:
            failures.append(f"{layer}: {source} is not in {compile_commands}")
            continue
        entry = match[0]
        command = entry.get("command") or shlex.join(entry["arguments"])
        flags = include_flags(command)
        for header in forbidden:
            r = preprocess(cxx, flags, header)
            # GCC: "No such file or directory"; clang: "file not found".
            refused = r.returncode != 0 and ("No such file" in r.stderr or
                                             "file not found" in r.stderr)
            print(f"{layer}: #include \"{header}\" -> {'refused' if refused else 'ALLOWED'}")
            if not refused:
                failures.append(f"{layer} may include {header}: a layering slip compiles")
        for header in permitted:
            r = preprocess(cxx, flags, header)
            print(f"{layer}: #include \"{header}\" -> {'found' if r.returncode == 0 else 'REFUSED'}")
            if r.returncode != 0:
                failures.append(f"{layer} cannot include {header}, which it has a right to:\n"
                                f"{r.stderr[-2000:]}")
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
