#!/usr/bin/env python3
"""Proves the layers are build facts (docs/architecture.md, rule 6).

The layers are the build's (BUILD_DIR/layers.json, written from each
folder's keel_layer() declaration); this file holds only the probes. For
each layer, takes the include paths of its first source from
compile_commands.json and preprocesses a one-line file per include: every
include the layer has no right to must fail with "No such file", and one it
has a right to must succeed (so the check itself can fail). A layer of the
build without probes here fails, so a new layer cannot go unchecked.

usage: check_layers.py BUILD_DIR/compile_commands.json CXX
"""
import json
import os
import shlex
import subprocess
import sys

# layer: (forbidden includes, permitted includes)
PROBES = {
    "keel_kernels": (["dispatch/attention.h", "guard.h", "validate.h", "c10d_engine.h",
                      "comm/liveness.h"],
                     ["attention_mask.h"]),
    "keel_adapter_c10d": (["comm/liveness.h", "dispatcher.h", "attention_mask.h",
                           "compat/compat_adapter.h", "c10d_backends.h"],
                          ["dispatch/comm.h", "c10d/c10d_backends.h"]),
    "keel_adapter_compat": (["comm/liveness.h", "dispatcher.h", "guard.h", "validate.h",
                             "native/native_adapter.h", "comm.h"],
                            ["dispatch/comm.h", "masked_logsumexp.h", "c10d/c10d_backends.h",
                             "compat/comm.h"]),
    "keel_adapter_native": (["comm/liveness.h", "dispatcher.h", "compat/compat_adapter.h",
                             "attention.h"],
                            ["dispatch/comm.h", "accumulation.h", "c10d/c10d_engine.h",
                             "native/attention.h"]),
    "keel_registry": (["comm/liveness.h", "masked_logsumexp.h", "c10d/c10d_backends.h"],
                      ["compat/compat_adapter.h", "native/native_adapter.h"]),
    "keel_core": (["masked_logsumexp.h", "attention_mask.h", "accumulation.h", "flash_plan.h",
                   "c10d_backends.h", "compat/compat_adapter.h", "golden.h", "engine/golden.h",
                   "suite/suite.h", "common.h", "dlpack_bridge.h", "plugin/common.h",
                   "c_api/plugin/common.h"],
                  ["dispatch/comm.h", "dispatch/capability.h", "keel/v1/dtype.h",
                   "comm/liveness.h"]),
    "keel_compat_engine": (["suite/suite.h", "suite.h", "record_compare.h", "validate.h",
                            "dispatcher.h", "dispatch/capability.h", "attention_mask.h"],
                           ["safetensors.h", "keel/v1/compat.h"]),
    "keel_c_api": (["validate.h", "dispatcher.h", "guard.h", "attention_mask.h",
                    "c10d/c10d_backends.h", "compat/compat_adapter.h", "comm/liveness.h",
                    "engine/golden.h", "suite/suite.h"],
                   ["keel/keel.h", "keel/c/keel.h", "dlpack/dlpack.h"]),
    "keel_loader": (["ATen/ATen.h", "validate.h", "dispatcher.h", "plugin/common.h",
                     "common.h", "dlpack_bridge.h"],
                    ["keel/c/loader.h", "dlpack/dlpack.h"]),
    "keel_compat_suite": (["validate.h", "dispatcher.h", "dispatch/capability.h",
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


def preprocess(cxx, flags, header, language="c++"):
    text = f'#include "{header}"\n'
    return subprocess.run([cxx, "-E", "-x", language, "-o", "/dev/null", *flags, "-"],
                          input=text, capture_output=True, text=True, timeout=120)


def main():
    compile_commands, cxx = sys.argv[1], sys.argv[2]
    with open(compile_commands) as f:
        entries = json.load(f)
    with open(os.path.join(os.path.dirname(compile_commands), "layers.json")) as f:
        layers = {row["name"]: row for row in json.load(f)["layers"]}
    failures = [f"{layer}: a layer of this build with no probes in {__file__}"
                for layer in layers if layer not in PROBES]
    for layer, (forbidden, permitted) in PROBES.items():
        if layer not in layers:
            print(f"{layer}: not in this build")
            continue
        source = layers[layer]["sources"][0]
        match = [e for e in entries if e["file"].endswith("/" + source)]
        if not match:
            failures.append(f"{layer}: {source} is not in {compile_commands}")
            continue
        entry = match[0]
        command = entry.get("command") or shlex.join(entry["arguments"])
        flags = include_flags(command)
        language = "c" if source.endswith(".c") else "c++"  # the loader is C
        for header in forbidden:
            r = preprocess(cxx, flags, header, language)
            # GCC: "No such file or directory"; clang: "file not found".
            refused = r.returncode != 0 and ("No such file" in r.stderr or
                                             "file not found" in r.stderr)
            print(f"{layer}: #include \"{header}\" -> {'refused' if refused else 'ALLOWED'}")
            if not refused:
                failures.append(f"{layer} may include {header}: a layering slip compiles")
        for header in permitted:
            r = preprocess(cxx, flags, header, language)
            print(f"{layer}: #include \"{header}\" -> {'found' if r.returncode == 0 else 'REFUSED'}")
            if r.returncode != 0:
                failures.append(f"{layer} cannot include {header}, which it has a right to:\n"
                                f"{r.stderr[-2000:]}")
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
