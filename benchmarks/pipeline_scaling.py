"""Pipeline time against graph size on a synthetic graph (a long chain plus a wide fan-out).

    python benchmarks/pipeline_scaling.py [--sizes 100,1000,10000] [--pipeline TEXT] [--repeat 3]

Prints one row per size: nodes before/after, seconds per pass and in total (the median of `--repeat`
runs on fresh graphs, each pass's time from that median run), so growth is visible.
"""
from __future__ import annotations

import argparse
import time

import passline
from passline.testing.synthetic import chain_and_fanout


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="100,300,1000,3000,10000")
    ap.add_argument("--pipeline", default=passline.DEFAULT_PIPELINE)
    ap.add_argument("--repeat", type=int, default=3, help="runs per size; the median run is printed")
    args = ap.parse_args(argv)
    print(f"pipeline: {args.pipeline}")
    print(f"{'nodes':>7} {'after':>6} {'build s':>8} {'fuse s':>8} {'total s':>8}  per pass")
    for n in [int(s) for s in args.sizes.split(",")]:
        runs = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            graph = chain_and_fanout(n)
            t1 = time.perf_counter()
            pm = passline.PassManager(args.pipeline, verify=False)
            graph_out, records = pm.run(graph)
            runs.append((time.perf_counter() - t1, t1 - t0, len(graph_out), records))
        runs.sort(key=lambda r: r[0])
        total, build, after, records = runs[len(runs) // 2]
        fuse = sum(r.seconds for r in records if r.name == "fuse")
        per = ", ".join(f"{r.call}{'#' + str(r.iteration) if r.iteration else ''} {r.seconds:.3f}" for r in records)
        print(f"{n:>7} {after:>6} {build:>8.3f} {fuse:>8.3f} {total:>8.3f}  {per}")


if __name__ == "__main__":
    main()
