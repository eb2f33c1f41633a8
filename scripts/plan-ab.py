#!/usr/bin/env python3
"""Times `plan --refresh=false` of two or more gpuprov binaries on one project, runs
interleaved (A B A B ...) so that a drift in this VM's speed hits each binary alike.

Usage: scripts/plan-ab.py RUNS PROJECT_DIR BINARY...
Make PROJECT_DIR with `GPUPROV_BENCH_KEEP=DIR cargo bench --bench gpuprov -- --only plan`
(it keeps DIR/10, DIR/100, DIR/1000 and DIR/10000). Prints, per binary, the median,
fastest and 25th percentile wall clock in milliseconds.
"""
import os
import statistics
import subprocess
import sys
import time


def main() -> None:
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    runs, project, binaries = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
    env = dict(os.environ, GPUPROV_HOME=os.path.join(project, "home"), NO_COLOR="1")
    walls = {b: [] for b in binaries}
    for _ in range(runs):
        for b in binaries:
            start = time.perf_counter()
            done = subprocess.run(
                [b, "plan", "--refresh=false"],
                cwd=project,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            walls[b].append((time.perf_counter() - start) * 1000)
            if done.returncode != 0:
                sys.exit(f"{b}: plan exited {done.returncode}")
    for b, w in walls.items():
        w.sort()
        print(f"{b}: median {statistics.median(w):.1f} ms, fastest {w[0]:.1f}, p25 {w[len(w) // 4]:.1f}")


if __name__ == "__main__":
    main()
