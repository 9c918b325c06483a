#!/usr/bin/env python3
"""keel::comm::Communicator against raw c10d from C++ (a ProcessGroupGloo
built by hand) and torch.distributed from Python (init_process_group with
Gloo): float32 all_reduce bus bandwidth from 4 KiB to 64 MiB, N ranks on
loopback, in one run.

    $KEEL_DEPS_DIR/peers-venv/bin/peers-python tests/bench/peers/comm_peers.py \
        --out docs/peers-comm.json [--worlds 2,4] [--rounds 5]

Every round launches the C++ ranks (keel_peer_bench comm) and the Python
ranks, in an order rotated from round to round. Per size, the C++ ranks run
--pairs pairs of short blocks (about 32 MiB moved per block, 1 to 50
operations), keel and raw c10d in turn (ABBA; which first alternates from
round to round), so that each pair shares the load of its moment; the
Python ranks run one warm-up all_reduce and then about 32 MiB of traffic (2
to 200 operations). Bus bandwidth is nccl-tests' definition,
S / t * 2 (n - 1) / n. Reported: medians over rounds (a round's keel or raw
time is the median of its blocks); keel / raw is the median of the ratios
of all pairs of all rounds, keel / torch.distributed the median of
per-round ratios.
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from alternation import DEFAULT_KEEL_BENCH, machine, median, median_ratio, rotated, write_json  # noqa: E402

SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
TIMEOUT_S = 600


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def python_worker(rank, world, port, sizes):
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    for nbytes in sizes:
        t = torch.ones(nbytes // 4)
        iterations = min(200, max(2, (32 << 20) // nbytes))
        dist.barrier()
        dist.all_reduce(t)  # warm-up
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iterations):
            dist.all_reduce(t)
        s = (time.perf_counter() - t0) / iterations
        if rank == 0:
            print(json.dumps({"bytes": nbytes, "iterations": iterations, "torch_distributed_s": s}),
                  flush=True)
    dist.barrier()
    dist.destroy_process_group()


def launch(commands):
    """Runs one process per rank; returns rank 0's JSON lines."""
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, text=True) for c in commands]
    try:
        out, _ = procs[0].communicate(timeout=TIMEOUT_S)
        for p in procs[1:]:
            p.wait(timeout=60)
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        raise
    if any(p.returncode != 0 for p in procs):
        raise RuntimeError(f"a rank failed: {[p.returncode for p in procs]} for {commands[0]}")
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--keel", default=DEFAULT_KEEL_BENCH)
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--pairs", type=int, default=8)
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--rank", type=int)
    ap.add_argument("--world", type=int)
    ap.add_argument("--port", type=int)
    ap.add_argument("--sizes", default=",".join(str(s) for s in SIZES))
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.worker:
        python_worker(args.rank, args.world, args.port, sizes)
        return 0

    import torch
    result = {"machine": machine(torch), "command": " ".join(sys.argv), "worlds": []}
    for world in (int(w) for w in args.worlds.split(",")):
        times = {s: {"keel": [], "raw_c10d": [], "torch_distributed": []} for s in sizes}
        pair_ratios = {s: [] for s in sizes}  # raw time / keel time: keel / raw bus bandwidth
        loads = []

        def run_cpp(r, world=world, times=times, pair_ratios=pair_ratios):
            port = free_port()
            order = "keel" if r % 2 == 0 else "raw"
            lines = launch([[args.keel, "comm", "--rank", str(i), "--world", str(world),
                             "--port", str(port), "--sizes", args.sizes, "--order", order,
                             "--pairs", str(args.pairs)]
                            for i in range(world)])
            for x in lines:
                times[x["bytes"]]["keel"].append(median(x["keel_s"]))
                times[x["bytes"]]["raw_c10d"].append(median(x["raw_s"]))
                pair_ratios[x["bytes"]] += [raw / keel for keel, raw in zip(x["keel_s"], x["raw_s"])]

        def run_python(r, world=world, times=times):
            port = free_port()
            lines = launch([[sys.executable, os.path.abspath(__file__), "--worker", "--rank", str(i),
                             "--world", str(world), "--port", str(port), "--sizes", args.sizes]
                            for i in range(world)])
            for x in lines:
                times[x["bytes"]]["torch_distributed"].append(x["torch_distributed_s"])

        runners = [("cpp", run_cpp), ("python", run_python)]
        for r in range(args.rounds):
            loads.append(os.getloadavg())
            for _, run in rotated(runners, r):
                run(r)
            print(f"world {world}: round {r + 1}/{args.rounds} done", flush=True)
        factor = 2.0 * (world - 1) / world
        rows = []
        for s in sizes:
            t = times[s]
            bus = {n: [s / x * factor / 1e9 for x in v] for n, v in t.items()}
            row = {"bytes": s, "rounds": len(t["keel"]),
                   "median_us": {n: median(v) * 1e6 for n, v in t.items()},
                   "median_bus_GBps": {n: median(v) for n, v in bus.items()},
                   "keel/raw_c10d bus bandwidth": median(pair_ratios[s]),
                   "pairs": len(pair_ratios[s]),
                   "keel/torch_distributed bus bandwidth": median_ratio(bus["keel"], bus["torch_distributed"]),
                   "seconds": t, "keel/raw_c10d per pair": pair_ratios[s]}
            rows.append(row)
            print(f"  {world} ranks {s:>9d} B  keel {row['median_us']['keel']:10.1f} us  "
                  f"raw {row['median_us']['raw_c10d']:10.1f} us  "
                  f"torch.distributed {row['median_us']['torch_distributed']:10.1f} us  "
                  f"keel/raw {row['keel/raw_c10d bus bandwidth']:.3f}  "
                  f"keel/td {row['keel/torch_distributed bus bandwidth']:.3f}", flush=True)
        result["worlds"].append({"world": world, "rounds": args.rounds, "pairs": args.pairs,
                                 "load_averages": loads,
                                 "rows": rows})
        if args.out:
            write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
