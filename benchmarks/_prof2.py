import sys, copy, torch, time
sys.path.insert(0, ".")
import passline
from benchmarks.dynamic import Block
from torch.profiler import profile, ProfilerActivity
torch.manual_seed(0)
base = Block(768, 12).to("cuda", torch.bfloat16)
x = torch.randn(8, 1024, 768, device="cuda", dtype=torch.bfloat16, requires_grad=True)
for dyn in (False, True):
    torch._dynamo.reset()
    be = passline.backend(fallback="raise")
    m = torch.compile(copy.deepcopy(base), backend=be, dynamic=dyn)
    step = lambda: m(x).float().square().mean().backward()
    for _ in range(3): step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(20): step()
    torch.cuda.synchronize()
    print("dynamic" if dyn else "static", (time.perf_counter() - t0) / 20 * 1e3, "ms/step")
    for r in be.reports:
        print(r.name, r.kernels, r.externs, [(k.name[:30], k.chosen, k.blocks) for k in r.kernel_info][:40])
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5): step()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12)[:3500])
