"""What every peer orchestrator shares: the keel driver process
(keel_peer_bench serve), the rotated order of contenders within a round,
medians, per-round ratios, and the machine's description."""
import json
import math
import os
import platform
import random
import statistics
import subprocess
import time

# Contenders in two processes take turns on the same cores. Both run with
# the OpenMP wait policy of the caller's environment, libgomp's default when
# unset: what a service gets. OMP_WAIT_POLICY=PASSIVE, used before
# 2026-12-03, puts every idle OpenMP thread to sleep at once, so each
# parallel region pays a futex wake-up: that penalises a contender that
# makes many kernel calls (keel's block-sparse route, the chunked losses)
# against one that makes one (Flex): keel on documents at L=8192 float32
# took 150 ms (116-204) under PASSIVE and 100 ms (89-131) under the default,
# in the same process. Under the default, a call right after the other
# process's (SDPA, then a pause) measured within 10% of the call alone
# (documents at L=8192: median 100 ms against 92), inside the noise.
PAUSE_S = 0.2  # between two contenders' turns, outside any timing

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
DEFAULT_KEEL_BENCH = os.path.join(REPO, "build", "torch-2.15.0", "tests", "keel_peer_bench")


class KeelServer:
    """A contender in a process of its own that answers one JSON line per
    request line: keel_peer_bench serve by default, or any `argv` speaking
    the same protocol (keel-generate --bench-serve, smollm2_worker.py)."""

    def __init__(self, path=DEFAULT_KEEL_BENCH, argv=None, name="keel_peer_bench", env=None):
        self.name = name
        self.proc = subprocess.Popen(argv or [path, "serve"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, bufsize=1, env=env)

    def read(self, line):
        answer = self.proc.stdout.readline()
        if not answer:
            raise RuntimeError(f"{self.name} exited on '{line}'")
        result = json.loads(answer)
        if "error" in result:
            raise RuntimeError(f"{self.name}: {result['error']} (request '{line}')")
        return result

    def request(self, line):
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self.read(line)

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def pause():
    time.sleep(PAUSE_S)


def rotated(items, round_index):
    """The contenders in the order of this round: rotated by one each round,
    so that load from other processes falls on all of them alike."""
    k = round_index % len(items)
    return items[k:] + items[:k]


def median(values):
    return statistics.median(values) if values else float("nan")


def median_ci95(values, resamples=2000):
    """A bootstrap 95% interval of the median (fixed seed: reproducible)."""
    rng = random.Random(0)
    medians = sorted(median(rng.choices(values, k=len(values))) for _ in range(resamples))
    return medians[int(0.025 * resamples)], medians[int(0.975 * resamples) - 1]


def geometric_mean(values):
    return math.exp(sum(math.log(x) for x in values) / len(values))


def median_ratio(a, b):
    """The median of the per-round ratios a[r] / b[r]."""
    return median([x / y for x, y in zip(a, b)])


def timed_ms(f):
    t0 = time.perf_counter()
    f()
    return (time.perf_counter() - t0) * 1e3


def machine(torch=None):
    info = {"platform": platform.platform(), "python": platform.python_version(),
            "cpus": os.cpu_count(), "load_average_at_start": os.getloadavg()}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info["OMP_WAIT_POLICY"] = os.environ.get("OMP_WAIT_POLICY", "unset (libgomp default)")
    if torch is not None:
        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
    return info


def write_json(path, data):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)
