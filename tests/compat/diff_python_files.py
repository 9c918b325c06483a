"""keel-compat diff against files that Python's safetensors writes: every
kind of difference it must report, one named tensor each, and the exit
status of each way of running it.

    python diff_python_files.py KEEL_COMPAT WORK_DIR
"""
import json
import os
import subprocess
import sys

import numpy as np
from safetensors.numpy import save_file

keel_compat, work = sys.argv[1], sys.argv[2]
os.makedirs(work, exist_ok=True)
rng = np.random.default_rng(20261204)
failures = []


def expect(condition, what):
    if not condition:
        failures.append(what)
        print("FAIL", what)


# One tensor per case; B is A changed as the name says.
base = rng.standard_normal(100).astype(np.float32)
far = rng.standard_normal(10).astype(np.float32)
far_b = far.copy()
far_b[7] += 0.5  # beyond float32's 1e-5 at element 7 only
nan_a = rng.standard_normal(6).astype(np.float32)
nan_a[2] = np.nan
nan_moved_b = nan_a.copy()
nan_moved_b[2], nan_moved_b[4] = 1.0, np.nan
inf_a = np.array([1.0, np.inf, -np.inf], dtype=np.float32)
inf_b = np.array([1.0, np.inf, np.inf], dtype=np.float32)
a = {
    "same": rng.standard_normal((3, 4)).astype(np.float32),
    "close": base,
    "far": far,
    "nan_same": nan_a,
    "nan_moved": nan_a.copy(),
    "inf_sign": inf_a,
    "shape": np.zeros((2, 3), dtype=np.float32),
    "dtype": np.ones(4, dtype=np.float32),
    "ints": np.arange(5, dtype=np.int64),
    "only_a": np.ones(2, dtype=np.float32),
    "f64": rng.standard_normal(8),
}
b = dict(a)
b["close"] = (base * (1 + 2e-7)).astype(np.float32)
b["far"] = far_b
b["nan_moved"] = nan_moved_b
b["inf_sign"] = inf_b
b["shape"] = np.zeros((3, 2), dtype=np.float32)
b["dtype"] = np.ones(4, dtype=np.float64)
b["f64"] = a["f64"] + 1e-6  # far beyond float64's 1e-10
del b["only_a"]
b["only_b"] = np.ones(1, dtype=np.float32)
pa, pb = os.path.join(work, "a.safetensors"), os.path.join(work, "b.safetensors")
save_file(a, pa)
save_file(b, pb)


def diff(*args):
    out = os.path.join(work, "report.json")
    if os.path.exists(out):
        os.remove(out)
    r = subprocess.run([keel_compat, "diff", *args, "--json", out], capture_output=True, text=True)
    report = json.load(open(out)) if os.path.exists(out) else None
    return r, report


r, report = diff(pa, pb, "--html", os.path.join(work, "report.html"))
expect(r.returncode == 1, f"A vs B: exit 1 (differences), got {r.returncode}: {r.stderr}")
by = {t["name"]: t for t in report["tensors"]} if report else {}
want = {"same": "pass", "close": "pass", "far": "fail", "nan_same": "pass", "nan_moved": "fail",
        "inf_sign": "fail", "shape": "shape", "dtype": "dtype", "ints": "pass",
        "only_a": "missing", "only_b": "extra", "f64": "fail"}
for name, status in want.items():
    got = by.get(name, {}).get("status")
    expect(got == status, f"{name}: status {status}, got {got}")
if by:
    worst = by["far"]["worst"]
    expect(len(worst) == 1 and worst[0]["index"] == [7], f"far: worst element [7], got {worst}")
    expect(abs(by["far"]["max_abs"] - 0.5) < 1e-6, f"far: max_abs 0.5, got {by['far']['max_abs']}")
    expect(by["far"]["mismatched"] == 1, "far: one element beyond the tolerance")
    expect(by["nan_moved"]["nonfinite_mismatch"] == 2, "nan_moved: 2 NaNs placed differently")
    expect(by["inf_sign"]["nonfinite_mismatch"] == 1, "inf_sign: 1 infinity of the other sign")
    # An infinite maximum is JSON's null (JSON has no inf); never NaN.
    expect(by["nan_moved"]["max_abs"] is None and by["nan_moved"]["max_rel"] is None,
           "nan_moved: infinite maxima, written as null")
    expect("max rel inf" in r.stdout and "nan" not in r.stdout.split("nan_moved")[1].split("\n")[0],
           "the summary says inf, never nan")
    expect(by["close"]["tolerance_from"] == "policy (float32)", "close: judged by the float32 policy")
    expect(by["f64"]["tolerance_from"] == "policy (float64)", "f64: judged by the float64 policy")
    expect(by["shape"]["a"]["shape"] == [2, 3] and by["shape"]["b"]["shape"] == [3, 2],
           "shape: both shapes reported")
    expect(by["dtype"]["a"]["dtype"] == "float32" and by["dtype"]["b"]["dtype"] == "float64",
           "dtype: both dtypes reported")
    expect((report["passed"], report["failed"], report["missing"], report["extra"],
            report["mismatched"]) == (4, 4, 1, 1, 2), f"totals, got {report}")
expect("far" in r.stdout and "[7]: " in r.stdout, "the summary names the worst element")
html = open(os.path.join(work, "report.html")).read()
expect("<svg" in html and "nan_moved" in html and "</html>" in html, "the HTML report")

r, report = diff(pa, pa)
expect(r.returncode == 0, f"A vs A: exit 0, got {r.returncode}")
expect(report is not None and report["passed"] == len(a), "A vs A: every tensor passes")

r, report = diff(pa, pb, "--atol", "1", "--rtol", "0")
by = {t["name"]: t for t in report["tensors"]} if report else {}
expect(by.get("far", {}).get("status") == "pass", "--atol 1: far passes")
expect(by.get("f64", {}).get("tolerance_from") == "--atol/--rtol", "--atol applies to all")

policy = os.path.join(work, "policy.json")
json.dump({"fa*": {"atol": 1, "rtol": 0}, "f64": {"atol": 1e-5, "rtol": 0}}, open(policy, "w"))
r, report = diff(pa, pb, "--policy", policy)
by = {t["name"]: t for t in report["tensors"]} if report else {}
expect(by.get("far", {}).get("tolerance_from") == "policy file: fa*", "policy prefix fa*")
expect(by.get("far", {}).get("status") == "pass" and by.get("f64", {}).get("status") == "pass",
       "the policy file's tolerances apply")
expect(by.get("close", {}).get("tolerance_from") == "policy (float32)",
       "tensors the policy file does not name keep the dtype policy")

for bad_args, what in [(["--atol", "1"], "--atol without --rtol"),
                       (["--atol", "x", "--rtol", "0"], "--atol not a number"),
                       (["--policy", os.path.join(work, "none.json")], "missing policy file")]:
    r, _ = diff(pa, pb, *bad_args)
    expect(r.returncode == 2, f"{what}: exit 2, got {r.returncode}")

corrupt = os.path.join(work, "corrupt.safetensors")
with open(pb, "rb") as f:
    data = f.read()
with open(corrupt, "wb") as f:
    f.write(data[: len(data) // 2])
r, _ = diff(pa, corrupt)
expect(r.returncode == 2 and "corrupt_data" in r.stderr, f"a truncated file: exit 2, corrupt_data: {r.stderr}")

print("diff_python_files:", "FAILED" if failures else "ok", f"({len(failures)} failures)")
sys.exit(1 if failures else 0)
