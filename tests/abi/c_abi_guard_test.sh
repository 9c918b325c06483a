#!/usr/bin/env bash
# Tests the C ABI's guard (scripts/c-abi-check.sh): on a copy of the C
# headers, each case makes one breaking change and asserts that the guard
# fails with the reason; one compatible append must pass. The headers change
# often, so the mutations find structs and fields by name, never by line.
#
#   tests/abi/c_abi_guard_test.sh BUILD_DIR   (its loader and plugin make the baseline)
set -euo pipefail
build=$(cd "${1:?usage: tests/abi/c_abi_guard_test.sh BUILD_DIR}" && pwd)
root=$(cd "$(dirname "$0")/../.." && pwd)
check=$root/scripts/c-abi-check.sh
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

mkdir -p "$work/pristine/keel/c"
cp "$root"/include/keel/c/*.h "$work/pristine/keel/c/"
# A stand-in for the plugin's sources that writes its output the checked
# way, so that only the unchecked_output case is about the sources.
mkdir "$work/clean-src"
cat > "$work/clean-src/plugin.cpp" <<'CPP'
KEEL_Error* forward(KEEL_Attention_Forward_Args* args) {
  set_output(args, &KEEL_Attention_Forward_Args::out, nullptr);
  return nullptr;
}
CPP
export KEEL_ABI_BASELINE=$work/baseline.txt KEEL_ABI_PLUGIN_SOURCES=$work/clean-src
KEEL_ABI_INCLUDE=$work/pristine "$check" "$build" --update > /dev/null ||
  { echo "FAIL baseline: the guard could not read the unmodified headers"; exit 1; }

# mutate.py HEADER_DIR OP ARGS...: edits the headers in place and prints
# what it changed (the name the guard's message must carry); exit 1, with
# the reason, when the struct or field to mutate is not there.
cat > "$work/mutate.py" <<'PY'
import glob, re, sys

def die(msg):
    sys.exit(f"mutate: {msg}")

def find_struct(headers, name):
    """(path, lines, body start, closing line) of `struct NAME {`."""
    for path in headers:
        lines = open(path).read().split("\n")
        for i, line in enumerate(lines):
            if re.search(rf"\bstruct {name}\s*\{{", line):
                depth = 0
                for j in range(i, len(lines)):
                    code = lines[j].split("//")[0]
                    depth += code.count("{") - code.count("}")
                    if depth == 0:
                        return path, lines, i + 1, j
                die(f"struct {name} in {path} has no closing brace")
    die(f"no struct {name} in the headers: the case cannot run, update it")

def fields(lines, start, end):
    """[(first line, last line, type, name)] of the body's declarations; a
    comment-only line after a declaration belongs to it."""
    out, first, code = [], None, ""
    for i in range(start, end):
        text = lines[i].split("//")[0].strip()
        if not text:
            if out and first is None:
                out[-1][1] = i
            continue
        first = i if first is None else first
        code += " " + text
        if code.rstrip().endswith(";"):
            decl = " ".join(code.rstrip(" ;").split())
            m = re.search(r"\(\s*\*\s*(\w+)\s*\)", decl) or re.search(r"(\w+)\s*(\[[^\]]*\]\s*)*$", decl)
            typ = decl[:m.start()].strip() if m else decl
            out.append([first, i, typ, m.group(1) if m else decl])
            first, code = None, ""
    return out

headers = sorted(glob.glob(f"{sys.argv[1]}/keel/c/*.h"))
op, name, *rest = sys.argv[2:]
if op == "retypedef":  # NAME's return type: void <-> int32_t
    for path in headers:
        text = open(path).read()
        m = re.search(rf"typedef\s+([^;]*?)\s*\b{name}\s*\(", text)
        if m:
            new = "int32_t " if m.group(1).strip() == "void" else "void "
            open(path, "w").write(text[:m.start(1)] + new + text[m.end(1):])
            print(name)
            sys.exit(0)
    die(f"no typedef {name}(...) in the headers: the case cannot run, update it")

path, lines, start, end = find_struct(headers, name)
decls = fields(lines, start, end)
rest_decls = [d for d in decls if d[3] != "struct_size"]
if op == "append":  # a field before the closing brace
    lines.insert(end, f"  {rest[0]}")
    chosen = rest[0].rstrip(";").split()[-1]
elif op == "swap":  # the first two adjacent fields after struct_size
    if len(rest_decls) < 2:
        die(f"{name} has fewer than two fields to swap")
    a, b = rest_decls[0], rest_decls[1]
    lines[a[0]:b[1] + 1] = lines[b[0]:b[1] + 1] + lines[a[0]:a[1] + 1]
    chosen = a[3]
elif op == "retype":  # the first field of type rest[0] made rest[1]
    hit = [d for d in decls if d[2] == rest[0]]
    if not hit:
        die(f"{name} has no {rest[0]} field to retype")
    d = hit[0]
    lines[d[0]] = re.sub(rf"\b{re.escape(rest[0])}\b", rest[1], lines[d[0]], count=1)
    chosen = d[3]
elif op == "remove":  # rest[0]: "middle" (a field inside) or "last"
    if not rest_decls:
        die(f"{name} has no field to remove")
    d = rest_decls[-1] if rest[0] == "last" else rest_decls[len(rest_decls) // 2]
    del lines[d[0]:d[1] + 1]
    chosen = d[3]
    # Macros beside the struct name its fields (KEEL_DEFINE_STRUCT_TRAITS(S,
    # last, last)): point them at a surviving field so the header compiles.
    keep = [x[3] for x in rest_decls if x is not d]
    if keep:
        swap_in = lambda m: re.sub(rf"\b{chosen}\b", keep[-1], m.group(0))
        lines = re.sub(rf"\b\w+\(\s*{name}\s*,[^;{{}}]*\)", swap_in, "\n".join(lines)).split("\n")
else:
    die(f"unknown operation {op}")
open(path, "w").write("\n".join(lines))
print(chosen)
PY

# inject.py FOLDER: inserts `args->out = nullptr;` as the first statement of
# a function that takes args (else any function; else a new one at the end)
# in the folder's *.cpp that writes args the most; prints FILE:LINE of it.
cat > "$work/inject.py" <<'PY'
import glob, re, sys
cpps = glob.glob(f"{sys.argv[1]}/**/*.cpp", recursive=True)
if not cpps:
    sys.exit(f"inject: no *.cpp under {sys.argv[1]}")
cpps.sort(key=lambda p: (-open(p).read().count("args->"), p))
lines = open(cpps[0]).read().split("\n")
defs = [i + 1 for i, l in enumerate(lines)
        if re.match(r"[A-Za-z_].*\)\s*(const\s*)?(noexcept\s*)?\{\s*$", l)]
at = next((i for i in defs if re.search(r"\bargs\b", lines[i - 1])), defs[0] if defs else None)
if at is None:
    lines += ["void keel_abi_guard_probe(KEEL_Attention_Forward_Args* args) {", "}"]
    at = len(lines) - 1
lines.insert(at, "  args->out = nullptr;")
open(cpps[0], "w").write("\n".join(lines))
print(f"{cpps[0]}:{at + 1}")
PY

failed=0
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1: $2"; failed=1; }
fresh() { rm -rf "$work/inc"; cp -r "$work/pristine" "$work/inc"; }
mutate() { python3 "$work/mutate.py" "$work/inc" "$@"; }
# expect NAME RC FRAGMENT [VAR=VALUE...]: the guard, on $work/inc, exits RC
# and prints FRAGMENT.
expect() {
  local name=$1 rc=$2 fragment=$3 got=0
  shift 3
  env KEEL_ABI_INCLUDE="$work/inc" "$@" "$check" "$build" > "$work/out.txt" 2>&1 || got=$?
  if [ "$got" -ne "$rc" ]; then
    fail "$name" "the guard exited $got, not $rc:"; sed 's/^/    /' "$work/out.txt"
  elif ! grep -qF -- "$fragment" "$work/out.txt"; then
    fail "$name" "no \"$fragment\" in:"; sed 's/^/    /' "$work/out.txt"
  else
    pass "$name"
  fi
}
# case NAME RC FRAGMENT-WITH-@ OP ARGS...: a fresh copy, one mutation, and
# the guard's verdict; @ in the fragment stands for what the mutation chose.
case_() {
  local name=$1 rc=$2 fragment=$3 chosen
  shift 3
  fresh
  if ! chosen=$(mutate "$@" 2>&1); then fail "$name" "$chosen"; return; fi
  expect "$name" "$rc" "${fragment//@/$chosen}"
}

fresh
expect unmodified 0 "layouts, signatures and symbols match"
case_ appended_field_ok 0 "appended (compatible): KEEL_Attention_Forward_Args.new_field" \
  append KEEL_Attention_Forward_Args "int32_t new_field;"
case_ array_element_grows 1 "KEEL_NamedTensor travels in arrays: its size is frozen" \
  append KEEL_NamedTensor "int32_t new_field;"
case_ embedded_struct_grows 1 "KEEL_Api_Version is embedded by value in KEEL_Api: its size is frozen" \
  append KEEL_Api_Version "uint32_t patch;"
case_ field_reordered 1 "KEEL_Attention_Forward_Args.@ moved" swap KEEL_Attention_Forward_Args
case_ field_retyped 1 "KEEL_Logsumexp_Args.@ retyped: int32_t -> int64_t" \
  retype KEEL_Logsumexp_Args int32_t int64_t
case_ field_removed 1 "KEEL_Mask.@ gone" remove KEEL_Mask middle
case_ function_removed 1 "KEEL_Api.@ gone: a removed function" remove KEEL_Api last
case_ signature_changed 1 "@ changed" retypedef KEEL_Comm_Destroy_Fn

fresh
printf 'int keel_abi_guard_other(void) { return 0; }\n' > "$work/other.c"
cc -shared -fPIC -o "$work/libother.so" "$work/other.c"
expect symbol_removed 1 "plugin symbol keel_plugin_get_api gone" KEEL_ABI_PLUGIN="$work/libother.so"

# The plugin's real sources, one unchecked write added.
src=$root/c_api/plugin
mkdir "$work/src-copy"
cp -r "$src/." "$work/src-copy/"
if at=$(python3 "$work/inject.py" "$work/src-copy" 2>&1); then
  expect unchecked_output 1 "$at: writes an output without checking the caller's struct_size" \
    KEEL_ABI_PLUGIN_SOURCES="$work/src-copy"
else
  fail unchecked_output "$at"
fi

exit "$failed"
