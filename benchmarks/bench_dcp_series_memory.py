"""Peak memory of one rank rewriting its file of the previous step as a delta
(InkSeriesWriter._rewrite_previous), for a series of a few large quantized tensors.
Reports the tracemalloc peak (numpy buffers) and the growth of VmHWM (peak RSS) during the
call, over what the process held when it began (Linux: /proc/self/clear_refs).

    python benchmarks/bench_dcp_series_memory.py OUT_DIR N_TENSORS ROWS LABEL

To compare revisions, run it with each revision's tree on PYTHONPATH."""
import os
import sys
import time
import tracemalloc

import torch
import torch.distributed.checkpoint as dcp
import inshrink.dcp.series as module
from inshrink.dcp.series import InkSeries

def kib(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1])

measured = {}
original = module.InkSeriesWriter._rewrite_previous

def measure(self, *args):
    open("/proc/self/clear_refs", "w").write("5")  # VmHWM := VmRSS
    rss = kib("VmRSS:")
    tracemalloc.start()
    began = time.process_time()
    try:
        return original(self, *args)
    finally:
        measured["cpu_s"] = time.process_time() - began
        measured["tracemalloc_peak_MiB"] = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
        measured["rss_growth_MiB"] = (kib("VmHWM:") - rss) / 1024

module.InkSeriesWriter._rewrite_previous = measure
out, count, rows = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
gen = torch.Generator().manual_seed(0)
series = InkSeries(os.path.join(out, "run"), policy="balanced", threads=1)
state = {"model": {f"w{i}": torch.randn(rows, 1024, generator=gen) for i in range(count)}}
dcp.save(state, storage_writer=series.writer(1), no_dist=True)
for t in state["model"].values():
    t.add_(1e-3 * torch.randn(t.shape, generator=gen))
dcp.save(state, storage_writer=series.writer(2), no_dist=True)
codecs = sorted({r["codec"] for r in series.describe(1)})
tensor_MiB = rows * 1024 * 4 / 2**20
print(f"{sys.argv[4]}: {count} tensors of {rows}x1024 fp32 ({tensor_MiB:.0f} MiB each, codes "
      f"{tensor_MiB / 2:.0f} MiB each), step 1 stored as {codecs}: " +
      ", ".join(f"{k} {v:.1f}" for k, v in measured.items()))
