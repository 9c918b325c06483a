"""Opens a keel-compat golden file with Python's safetensors, as it is, and
checks it independently of keel: the metadata, every tensor's dtype and
shape, the recorded logsumexp outputs recomputed in numpy (float64), and
the comm cases' rank outputs recomputed exactly from their stored inputs.

    python check_golden_in_python.py GOLDEN.safetensors
"""
import json
import sys

import numpy as np
from safetensors import deserialize, safe_open

path = sys.argv[1]
with open(path, "rb") as f:
    raw = deserialize(f.read())  # every dtype, bfloat16 included
names = {name for name, _ in raw}

raw_by_name = dict(raw)


def as_array(name):
    """A tensor as numpy, bfloat16 widened to float32 (exactly)."""
    t = raw_by_name[name]
    data = np.frombuffer(t["data"], dtype={"F32": np.float32, "I64": np.int64,
                                           "BF16": np.uint16}[t["dtype"]])
    if t["dtype"] == "BF16":
        data = (data.astype(np.uint32) << 16).view(np.float32)
    return data.reshape(t["shape"]), t["dtype"]


def round_bf16(x):
    """float32 to the nearest bfloat16 (ties to even), as float32."""
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return u.astype(np.uint32).view(np.float32)


def check_comm(case):
    """A comm case's rank outputs, from its stored rank inputs alone."""
    cid, opt = case["id"], case["options"]
    a, dtype = as_array(f"{cid}/in/rank0")
    b, _ = as_array(f"{cid}/in/rank1")
    rnd = round_bf16 if dtype == "BF16" else (lambda x: x)
    op = opt["op"]
    if op == "all_reduce":
        if opt["reduce"] == "sum":
            want = [rnd(a + b)] * 2
        elif opt["reduce"] == "avg":
            want = [rnd(a + b) / 2] * 2
        else:
            want = [np.maximum(a, b)] * 2
    elif op == "all_gather":
        want = [np.concatenate([a, b])] * 2
    elif op == "reduce_scatter":
        s = rnd(a + b)
        want = [s[: len(s) // 2], s[len(s) // 2:]]
    else:
        want = [[a, b][opt["root"]]] * 2
    for r in range(2):
        got, got_dtype = as_array(f"{cid}/out/rank{r}")
        assert got_dtype == dtype, (cid, r, got_dtype, dtype)
        assert got.shape == want[r].shape, (cid, r, got.shape, want[r].shape)
        assert np.array_equal(got, want[r]), (cid, r)
    assert case["atol"] == 0 and case["rtol"] == 0, cid


with safe_open(path, framework="numpy") as f:
    meta = f.metadata()
    assert meta["keel_format"] == "1", meta
    cases = json.loads(meta["cases"])
    assert len(cases) > 0
    assert set(f.keys()) == names
    checked = 0
    comm = 0
    for case in cases:
        if case["operation"] == "comm":
            check_comm(case)
            comm += 1
            continue
        if case["operation"] != "logsumexp" or case["dtype"] not in ("float32", "float64"):
            continue
        cid = case["id"]
        x = f.get_tensor(f"{cid}/in/input").astype(np.float64)
        dim, keepdim = case["options"]["dim"], case["options"]["keepdim"]
        if f"{cid}/in/mask" in names:
            x = np.where(f.get_tensor(f"{cid}/in/mask"), x, -np.inf)
        m = np.max(x, axis=dim, keepdims=True)
        m = np.where(np.isfinite(m), m, 0.0)
        with np.errstate(divide="ignore"):
            want = np.log(np.sum(np.exp(x - m), axis=dim, keepdims=True)) + m
        if not keepdim:
            want = np.squeeze(want, axis=dim)
        got = f.get_tensor(f"{cid}/out/value").astype(np.float64)
        assert got.shape == want.shape, (cid, got.shape, want.shape)
        tol = 1e-9 if case["dtype"] == "float64" else 2e-4
        finite = np.isfinite(want)
        assert np.array_equal(np.isfinite(got), finite), cid
        err = np.max(np.abs(got[finite] - want[finite]) / np.maximum(1.0, np.abs(want[finite])))
        assert err <= tol, (cid, err)
        checked += 1
    assert checked >= 4, checked
    assert comm == 0 or comm == 14, comm
print(f"python safetensors: {len(names)} tensors, {len(cases)} cases, "
      f"{checked} logsumexp and {comm} comm cases recomputed in numpy: ok")
