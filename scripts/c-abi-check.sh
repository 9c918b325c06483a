#!/usr/bin/env bash
# The C ABI's guard (include/keel/c/, docs/c-api.md). Within a major, a
# consumer built against an older header must keep working with every later
# plugin, so against the committed baseline abi/c-abi.txt it checks:
# - every field of every KEEL_ struct (clang's C11 layout) keeps its offset,
#   type and name; in KEEL_Api a field gone or moved is a removed function;
# - a struct grows only by appending, and only when it is growable: it
#   starts with `size_t struct_size`, is never embedded by value in another
#   KEEL_ struct, and never travels by value in an array (`const KEEL_X*`
#   followed by `size_t num_...` or `..._capacity`, or `KEEL_X*, size_t` in
#   a signature).
#   Every other struct's size is frozen; no struct shrinks;
# - every function-pointer typedef (`KEEL_*_Fn`, `KEEL_Compat_Function`) and
#   the loader's functions keep their signature;
# - the loader's and the plugin's dynamic symbols: one gone fails, one new
#   fails until the baseline is updated deliberately;
# - the plugin writes outputs through a setter that checks the caller's
#   struct_size, never `args->field = ...` (an older caller's struct ends
#   before the field).
#
#   scripts/c-abi-check.sh BUILD_DIR            compare; exit 1 on an incompatible change
#   scripts/c-abi-check.sh BUILD_DIR --update   write the baseline, deliberately
#
# Overrides (tests/abi/c_abi_guard_test.sh uses them): KEEL_ABI_INCLUDE (the
# folder holding keel/c/*.h, default include), KEEL_ABI_BASELINE (default
# abi/c-abi.txt), KEEL_ABI_LOADER and KEEL_ABI_PLUGIN (default BUILD_DIR's),
# KEEL_ABI_PLUGIN_SOURCES (default c_api/plugin). Exit 2: the inputs could not be read.
set -euo pipefail
usage='usage: scripts/c-abi-check.sh BUILD_DIR [--update]'
build=${1:?$usage}
mode=${2:-check}
case $mode in check | --update) ;; *) echo "$usage" >&2; exit 2 ;; esac
build=$(cd "$build" && pwd)
root=$(cd "$(dirname "$0")/.." && pwd)
die() { echo "keel c-abi: $*" >&2; exit 2; }
# Relative overrides are the caller's, so resolve them before anything moves.
abs() { case $1 in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }

include=$(abs "${KEEL_ABI_INCLUDE:-$root/include}")
baseline=$(abs "${KEEL_ABI_BASELINE:-$root/abi/c-abi.txt}")
loader=$(abs "${KEEL_ABI_LOADER:-$build/libkeel_loader.so}")
if [ -n "${KEEL_ABI_PLUGIN:-}" ]; then
  plugin=$(abs "$KEEL_ABI_PLUGIN")
else
  plugins=("$build"/libkeel-plugin-*-cpu.so)
  plugin=${plugins[0]}
fi
if [ -n "${KEEL_ABI_PLUGIN_SOURCES:-}" ]; then
  sources=$(abs "$KEEL_ABI_PLUGIN_SOURCES")
else
  sources=$root/c_api/plugin
fi
headers=("$include"/keel/c/*.h)
[ -f "${headers[0]}" ] || die "no C header in $include/keel/c"
for f in "$loader" "$plugin"; do [ -f "$f" ] || die "$f: not found"; done
[ -f "$baseline" ] || [ "$mode" = --update ] || die "$baseline: not found (run with --update)"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cflags=(-x c -std=c11 -fsyntax-only -I"$include" -I"$build/dlpack-include")

# Pass 1, clang's AST: the KEEL_ structs the headers define (however they
# are spelled) and the signatures of the function typedefs and functions.
for h in "${headers[@]}"; do echo "#include \"keel/c/${h##*/}\""; done > "$work/headers.c"
clang "${cflags[@]}" -Xclang -ast-dump=json "$work/headers.c" > "$work/ast.json" ||
  die "clang could not read the headers in $include"
python3 - "$work/ast.json" "$work/structs.txt" "$work/signatures.txt" <<'PY'
import json, sys
ast = json.load(open(sys.argv[1]))
structs, sigs = set(), set()
for n in ast.get("inner", []):
    name, kind = n.get("name", ""), n.get("kind")
    if kind == "RecordDecl" and name.startswith("KEEL_") and n.get("completeDefinition"):
        structs.add(name)
    # A typedef of a function (or of a pointer to one), and the loader's
    # functions: their type text, which clang prints without parameter names.
    elif (kind == "TypedefDecl" and name.startswith("KEEL_") and "(" in n["type"]["qualType"]) or (
            kind == "FunctionDecl" and name.lower().startswith("keel_")):
        sigs.add(f"signature {name} {' '.join(n['type']['qualType'].split())}")
open(sys.argv[2], "w").write("".join(f"{s}\n" for s in sorted(structs)))
open(sys.argv[3], "w").write("".join(f"{s}\n" for s in sorted(sigs)))
PY

# Pass 2: clang lays out each struct (a sizeof makes it dump the record).
{
  cat "$work/headers.c"
  echo 'int keel_abi_sizes[] = {'
  sed 's/.*/  sizeof(struct &),/' "$work/structs.txt"
  echo '};'
} > "$work/layouts.c"
clang "${cflags[@]}" -Xclang -fdump-record-layouts "$work/layouts.c" > "$work/dump.txt" ||
  die "clang could not lay out the structs in $include"
nm -D --defined-only "$loader" | awk 'NF == 3 {print "symbol loader " $3}' > "$work/symbols.txt"
nm -D --defined-only "$plugin" | awk 'NF == 3 {print "symbol plugin " $3}' >> "$work/symbols.txt"

status=0
python3 - "$mode" "$baseline" "$work/dump.txt" "$work/signatures.txt" "$work/symbols.txt" <<'PY' || status=$?
import re, sys
mode, baseline, dump, sigs_file, syms_file = sys.argv[1:]

def read_dump(path):
    """{struct: {"fields": [(offset, type, name)], "size": n}} from clang's dump."""
    structs, name = {}, None
    for line in open(path):
        m = re.match(r"\s*(\d+)(?::\S+)? \| (\s*)(.*)$", line)
        s = re.match(r"\s*\| \[sizeof=(\d+)", line)
        if m and m.group(2) == "":
            t = re.sub(r"^(struct|union) ", "", m.group(3))
            name = t if t.startswith("KEEL_") else None
            if name:
                structs[name] = {"fields": [], "size": None}
        elif m and name and len(m.group(2)) == 2:  # a top-level field, not a nested one
            typ, _, field = m.group(3).rpartition(" ")
            structs[name]["fields"].append((int(m.group(1)), typ, field))
        elif s and name:
            structs[name]["size"] = int(s.group(1))
            name = None
    return structs

def bare(t):
    """A type without qualifiers or tags, single-spaced."""
    return " ".join(re.sub(r"\b(const|volatile|struct|union)\b", " ", t).split())

def params(sig):
    """The parameter types of a signature's outermost parameter list."""
    i, depth, out, cur = sig.find("("), 0, [], ""
    for c in sig[i + 1:]:
        if c == "(":
            depth += 1
        elif c == ")":
            if depth == 0:
                break
            depth -= 1
        if c == "," and depth == 0:
            out.append(cur.strip()); cur = ""
        else:
            cur += c
    return out + [cur.strip()]

EMBEDDED, ARRAYS, UNSIZED = ("is embedded by value in", "travels in arrays",
                             "has no leading size_t struct_size")

def frozen_reasons(structs, sigs):
    """{struct: {reason: {where}}} for the structs whose size is frozen."""
    why = {s: {} for s in structs}
    for parent, st in structs.items():
        f = st["fields"]
        for i, (_, typ, name) in enumerate(f):
            m = re.fullmatch(r"(KEEL_\w+)(\s*\[\d*\])*", bare(typ))
            if m and m.group(1) in why:  # by value: the parent's layout holds its size
                why[m.group(1)].setdefault(EMBEDDED, set()).add(parent)
            m = re.fullmatch(r"(KEEL_\w+) \*", bare(typ))
            if (m and m.group(1) in why and i + 1 < len(f) and f[i + 1][1] == "size_t"
                    and re.fullmatch(r"num_\w+|\w+_(capacity|count)", f[i + 1][2])):
                # An array whose elements the caller's sizeof strides.
                why[m.group(1)].setdefault(ARRAYS, set()).add(f"{parent}.{name}")
    for name, sig in sigs.items():
        p = params(sig)
        for a, b in zip(p, p[1:]):
            m = re.fullmatch(r"(KEEL_\w+) \*", bare(a))
            if m and m.group(1) in why and b == "size_t":
                why[m.group(1)].setdefault(ARRAYS, set()).add(name)
    for name, st in structs.items():
        if not st["fields"] or st["fields"][0] != (0, "size_t", "struct_size"):
            why[name].setdefault(UNSIZED, set())
    return {s: r for s, r in why.items() if r}

def describe(reasons):
    """The reasons as phrases, the weightiest first: [(phrase, detail)]."""
    out = []
    for k in [ARRAYS, EMBEDDED, UNSIZED] + sorted(set(reasons) - {ARRAYS, EMBEDDED, UNSIZED}):
        where = ", ".join(sorted(reasons.get(k, ())))
        if k not in reasons:
            continue
        out.append((f"{k} {where}", "") if k == EMBEDDED else (k, where))
    return out

def parse_recorded(text):
    """A baseline's "frozen" line back into reasons."""
    reasons = {}
    for part in text.split("; "):
        m = re.fullmatch(r"(.*?)(?: \((.*)\))?", part)
        if part.startswith(EMBEDDED + " "):
            reasons.setdefault(EMBEDDED, set()).update(part[len(EMBEDDED) + 1:].split(", "))
        else:
            reasons.setdefault(m.group(1), set()).update(m.group(2).split(", ") if m.group(2) else ())
    return reasons

cur = read_dump(dump)
cur_sigs = {}
for line in open(sigs_file):
    _, name, sig = line.rstrip("\n").split(" ", 2)
    cur_sigs[name] = sig
cur_syms = {line.rstrip("\n") for line in open(syms_file)}
cur_frozen = frozen_reasons(cur, cur_sigs)

if mode == "--update":
    with open(baseline, "w") as out:
        out.write("# keel's C ABI baseline (scripts/c-abi-check.sh --update): struct layouts,\n"
                  "# which structs may grow, signatures and exported symbols\n")
        for s in sorted(cur):
            for off, typ, name in cur[s]["fields"]:
                out.write(f"struct {s} {off} {typ} {name}\n")
            out.write(f"struct {s} sizeof={cur[s]['size']}\n")
            phrases = [p + (f" ({d})" if d else "") for p, d in describe(cur_frozen.get(s, {}))]
            out.write(f"frozen {s}: {'; '.join(phrases)}\n" if phrases else f"growable {s}\n")
        out.writelines(f"signature {n} {cur_sigs[n]}\n" for n in sorted(cur_sigs))
        out.writelines(f"{line}\n" for line in sorted(cur_syms))
    print(f"keel c-abi: wrote {baseline}")
    sys.exit(0)

base, base_sigs, base_syms, recorded = {}, {}, set(), {}
for line in open(baseline):
    line = line.rstrip("\n")
    if m := re.fullmatch(r"struct (\S+) sizeof=(\d+)", line):
        base.setdefault(m.group(1), {"fields": [], "size": None})["size"] = int(m.group(2))
    elif m := re.fullmatch(r"struct (\S+) (\d+) (.*) (\S+)", line):
        base.setdefault(m.group(1), {"fields": [], "size": None})["fields"].append(
            (int(m.group(2)), m.group(3), m.group(4)))
    elif m := re.fullmatch(r"frozen (\S+): (.*)", line):
        recorded[m.group(1)] = parse_recorded(m.group(2))
    elif line.startswith("signature "):
        _, name, sig = line.split(" ", 2)
        base_sigs[name] = sig
    elif line.startswith("symbol "):
        base_syms.add(line)
for s in base.values():
    s["fields"].sort()
# Frozen if either side says so: the baseline's consumers are the ones to keep.
base_frozen = frozen_reasons(base, base_sigs)
frozen = {}
for side in (base_frozen, cur_frozen, recorded):
    for s, reasons in side.items():
        for k, where in reasons.items():
            frozen.setdefault(s, {}).setdefault(k, set()).update(where)

failures, notes = [], []
for s in sorted(base):
    if s not in cur:
        failures.append(f"{s} gone: a removed struct")
        continue
    old, new = base[s], cur[s]
    by_name = {name: (off, typ) for off, typ, name in new["fields"]}
    by_off = {off: f"{typ} {name}" for off, typ, name in new["fields"]}
    for off, typ, name in old["fields"]:
        function = s == "KEEL_Api" or typ.endswith("_Fn *")
        if name not in by_name:
            if function:
                failures.append(f"{s}.{name} gone: a removed function")
            else:
                held = f" (offset {off} now holds {by_off[off]})" if off in by_off else ""
                failures.append(f"{s}.{name} gone: a removed or renamed field{held}")
            continue
        noff, ntyp = by_name[name]
        if noff != off:
            failures.append(f"{s}.{name} moved, offset {off} -> {noff}"
                            + (": a removed function" if function else ""))
        if ntyp != typ:
            failures.append(f"{s}.{name} retyped: {typ} -> {ntyp}")
    old_names, old_offs = {f[2] for f in old["fields"]}, {f[0] for f in old["fields"]}
    last = max(old_offs, default=-1)
    for off, typ, name in new["fields"]:
        if name in old_names:
            continue
        if off > last:  # after every old field (its tail padding too: struct_size ends before it)
            if s not in frozen:
                notes.append(f"appended (compatible): {s}.{name} at offset {off} ({typ})")
            elif new["size"] == old["size"]:  # the size check below does not see it
                first, _ = describe(frozen[s])[0]
                failures.append(f"{s} {first}: its fields are frozen, {s}.{name} added")
        elif off not in old_offs:  # in old padding, which an older caller may leave dirty
            failures.append(f"{s}.{name} added between the old fields (offset {off}): "
                            "only fields after the last one are compatible")
    if new["size"] < old["size"]:
        failures.append(f"{s} shrank: sizeof {old['size']} -> {new['size']}")
    elif new["size"] != old["size"] and s in frozen:
        (first, detail), *rest = describe(frozen[s])
        extra = "; ".join(([detail] if detail else []) + [p + (f" ({d})" if d else "") for p, d in rest])
        failures.append(f"{s} {first}: its size is frozen, {old['size']} -> {new['size']}"
                        + (f" ({extra})" if extra else ""))
for s in sorted(set(cur) - set(base)):
    notes.append(f"appended (compatible): new struct {s}, sizeof {cur[s]['size']}")

for name in sorted(base_sigs):
    if name not in cur_sigs:
        failures.append(f"{name} gone: a removed signature")
    elif cur_sigs[name] != base_sigs[name]:
        failures.append(f"{name} changed: `{base_sigs[name]}` -> `{cur_sigs[name]}`")
for name in sorted(set(cur_sigs) - set(base_sigs)):
    notes.append(f"appended (compatible): signature {name} {cur_sigs[name]}")

for line in sorted(base_syms - cur_syms):
    _, lib, sym = line.split(" ", 2)
    failures.append(f"{lib} symbol {sym} gone: a removed symbol")
for line in sorted(cur_syms - base_syms):
    _, lib, sym = line.split(" ", 2)
    failures.append(f"{lib} symbol {sym} is new: update the baseline deliberately (--update)")

for line in notes + failures:
    print(f"keel c-abi: {line}")
sys.exit(1 if failures else 0)
PY
[ "$status" -le 1 ] || die "the comparison failed (exit $status)"
[ "$mode" = --update ] && exit 0

# Outputs: an older caller's struct ends before the fields a newer plugin
# knows, so the plugin writes each output through a setter that checks
# struct_size; a direct `args->field = ...` (or `+=`, ...) writes past it.
cpps=()
[ -d "$sources" ] && mapfile -t cpps < <(find "$sources" -name '*.cpp' | sort)
if [ ${#cpps[@]} -eq 0 ]; then
  echo "keel c-abi: no plugin source (*.cpp) under $sources to scan"; status=1
fi
assign='args->[A-Za-z_][A-Za-z0-9_]* *([-+*/%&|^]|<<|>>)?= *[^=]'
while IFS= read -r hit; do
  echo "keel c-abi: ${hit#"$root"/}: writes an output without checking the caller's struct_size"
  status=1
done < <(grep -nE "$assign" "${cpps[@]}" /dev/null | grep -vE '^[^:]+:[0-9]+: *(//|\*)' |
  sed -E 's/^([^:]+:[0-9]+):.*/\1/')

[ "$status" -eq 0 ] && echo "keel c-abi: layouts, signatures and symbols match $baseline"
exit "$status"
