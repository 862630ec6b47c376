import cProfile, pstats, sys, copy, torch, io
sys.path.insert(0, ".")
import passline
from benchmarks.launch import CASES, step_fn
name = sys.argv[1] if len(sys.argv) > 1 else "layer_norm"
make, shape = CASES[name]
m = make(shape[-1]).to("cuda", torch.bfloat16)
x = torch.randn(*shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)
be = passline.backend(fallback="raise")
step = step_fn(torch.compile(m, backend=be))
for _ in range(5): step(x)
torch.cuda.synchronize()
for r in be.reports:
    ks = [d[0] for _, n, d in r.runner.steps if d]
    print(r.name, r.kernels, r.externs, [(len(k.binaries), k.info.chosen, k.info.blocks) for k in ks])
print(be.reports[-1].runner.source[:2500])
pr = cProfile.Profile(); pr.enable()
for _ in range(300): step(x)
torch.cuda.synchronize(); pr.disable()
s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(25); print(s.getvalue()[:5000])
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    for _ in range(20): step(x)
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=15)[:5000])
