#!/usr/bin/env python3
"""The GPU check's summary: merges what scripts/gpu-check.sh wrote into
OUT (steps.jsonl, torch.json, nvidia-smi.txt, conformance-cuda.json,
gpu-bench.json, flex.json) into OUT/gpu-check.json, and judges each goal of
GOALS against the figures. The goals are data: a goal changes here, not in
the code that reads the benchmarks.

usage: gpu_summary.py OUT MODE GPU_PRESENT SECONDS BUDGET_SECONDS
"""
import json
import os
import sys

# Attention: keel against FlexAttention (tests/bench/flex_bench.py) on the
# same GPU, forward and forward+backward, per case.
ATTENTION_GOAL = {
    "cases": ["sliding_window_1024", "document_causal"],
    "max_keel_over_flex": 1.25,
}
# The fused loss against the naive one (logits materialised), per variant of
# tests/bench/gpu_bench.cpp; the default variant is keel's automatic chunking.
LOSS_GOAL = {
    "max_peak_memory_over_naive": 0.25,
    "max_time_over_naive": 1.2,
    "default_variant": "keel_chunk_0",
}


def load(out, name):
    try:
        with open(os.path.join(out, name)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def conformance(conf):
    cases = [t for s in conf.get("testsuites", []) for t in s.get("testsuite", [])]
    skipped = [t for t in cases if t.get("result") == "SKIPPED" or t.get("status") == "NOTRUN"]
    failed = [t["classname"] + "." + t["name"] for t in cases if t.get("failures")]
    return {"tests": len(cases), "failed": failed, "skipped": len(skipped),
            "passed": len(cases) - len(failed) - len(skipped),
            "note": "why a test skipped is in gpu-check.log (gtest's JSON does not carry it)"}


def attention_goals(bench, flex):
    goals = {}
    limit = ATTENTION_GOAL["max_keel_over_flex"]
    for case in ATTENTION_GOAL["cases"]:
        k, f = bench["attention"].get(case), flex.get(case)
        if not k or not f:
            continue
        fwd = k["keel_forward_ms"] / f["flex_forward_ms"]
        fb = k["keel_forward_backward_ms"] / f["flex_forward_backward_ms"]
        goals["attention." + case] = {
            "keel_over_flex_forward": round(fwd, 3),
            "keel_over_flex_forward_backward": round(fb, 3),
            "keel_over_sdpa_dense_forward":
                round(k["keel_forward_ms"] / k["sdpa_dense_mask_forward_ms"], 3),
            "goal": "keel / Flex <= %g" % limit, "met": fwd <= limit and fb <= limit,
            "keel_path": k.get("keel_path")}
    return goals


def loss_goal(bench):
    variants = bench["loss"]["variants"]
    naive = variants["naive"]
    rows = {}
    for name, r in variants.items():
        if name == "naive":
            continue
        mem = r["forward_backward_peak_bytes"] / naive["forward_backward_peak_bytes"]
        time = r["forward_backward_ms"] / naive["forward_backward_ms"]
        rows[name] = {"peak_memory_over_naive": round(mem, 3), "time_over_naive": round(time, 3),
                      "met": mem <= LOSS_GOAL["max_peak_memory_over_naive"]
                      and time <= LOSS_GOAL["max_time_over_naive"]}
    return {"goal": "peak memory / naive <= %g and time / naive <= %g"
                    % (LOSS_GOAL["max_peak_memory_over_naive"], LOSS_GOAL["max_time_over_naive"]),
            "variants": rows, "met_by": [n for n, r in rows.items() if r["met"]],
            "default_met": rows.get(LOSS_GOAL["default_variant"], {}).get("met", False)}


def main():
    out, mode, gpu = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
    seconds, budget = int(sys.argv[4]), int(sys.argv[5])
    steps = [json.loads(l) for l in open(os.path.join(out, "steps.jsonl")) if l.strip()]
    result = {"mode": mode, "gpu_present": gpu, "seconds": seconds, "budget_seconds": budget,
              "steps": steps, "torch": load(out, "torch.json")}
    smi = os.path.join(out, "nvidia-smi.txt")
    if os.path.exists(smi):
        result["nvidia_smi"] = open(smi).read().strip()
    conf = load(out, "conformance-cuda.json")
    if conf:
        result["conformance_cuda"] = conformance(conf)
    bench, flex = load(out, "gpu-bench.json"), load(out, "flex.json")
    result["gpu_bench"], result["flex_bench"] = bench, flex
    goals = {}
    if bench and flex and "attention" in bench:
        goals.update(attention_goals(bench, flex))
    if bench and "loss" in bench:
        goals["loss"] = loss_goal(bench)
    result["goals"] = goals
    if mode == "dry-run" or not gpu:
        result["note"] = ("no GPU on this machine: prerequisites, configure and build were "
                          "checked; the CUDA suite skips and no benchmark ran")
    with open(os.path.join(out, "gpu-check.json"), "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps({k: result[k] for k in ("mode", "gpu_present", "seconds", "goals")}, indent=2))


if __name__ == "__main__":
    main()
