"""Opens a keel-compat golden file with Python's safetensors, as it is, and
checks it independently of keel: the metadata, every tensor's dtype and
shape, and the recorded logsumexp outputs recomputed in numpy (float64).

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

with safe_open(path, framework="numpy") as f:
    meta = f.metadata()
    assert meta["keel_format"] == "1", meta
    cases = json.loads(meta["cases"])
    assert len(cases) > 0
    assert set(f.keys()) == names
    checked = 0
    for case in cases:
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
print(f"python safetensors: {len(names)} tensors, {len(cases)} cases, {checked} recomputed in numpy: ok")
