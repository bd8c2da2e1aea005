"""Redraw ``fault_tolerance.png`` from several ``bench_fault.py`` JSON files.

    python benchmarks/fault_plot.py results/fault_a.json results/fault_b.json results/fault_cnn.json

Partial sweeps (``--only ...``) skip the baselines that do not depend on inshrink's settings;
their rows (``seed``, ``lossless``, ``fp16``, ``int8``, seed 0) are read from the HISTORY.md
section named by ``--baselines``. The first ``ref`` of each model is kept.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_fault  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
BASELINES = "## Fault tolerance — 2026-11-29, format 1.3"


def baseline_rows(results_md: str, heading: str) -> list[dict]:
    """The baseline runs of one HISTORY.md fault-tolerance table."""
    text = open(results_md, encoding="utf-8").read()
    start = text.index(heading)
    end = text.find("\n## ", start + 1)
    rows = []
    for line in text[start:end if end > 0 else None].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 20 or cells[0] not in ("lm", "cnn") or \
                cells[1] not in ("seed", "lossless", "fp16", "int8"):
            continue

        def pct(s: str) -> float:
            return math.inf if s == "diverged" else float(s.rstrip("%").replace("−", "-")) / 100
        degradation = {"loss": pct(cells[11])}
        if cells[13] != "-":
            degradation["acc"] = pct(cells[13])
        rows.append({"model": cells[0], "run": cells[1], "method": cells[2],
                     "ratio": float(cells[6]), "degradation": degradation})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", nargs="+")
    ap.add_argument("--baselines", default=BASELINES, help="HISTORY.md heading to read them from")
    ap.add_argument("--plot", default=os.path.join(HERE, "fault_tolerance.png"))
    args = ap.parse_args(argv)
    rows, refs = [], set()
    for path in args.json:
        for r in json.load(open(path))["results"]:
            if r["run"] == "ref":
                if r["model"] in refs:
                    continue
                refs.add(r["model"])
            rows.append(r)
    have = {(r["model"], r["run"]) for r in rows}
    rows += [r for r in baseline_rows(os.path.join(HERE, "HISTORY.md"), args.baselines)
             if (r["model"], r["run"]) not in have]
    rows.sort(key=lambda r: (r["model"] != "lm", r["run"] != "ref"))
    bench_fault.plot(rows, args.plot)
    print(f"plot: {args.plot} ({len(rows)} runs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
