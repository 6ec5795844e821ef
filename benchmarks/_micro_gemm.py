import time, numpy as np, cupy, statistics
from native import gemm as ng
from falsification.gemm_tests import host_us
from cupy.cuda import cublas
m,k,n=4096,256,1024
a=cupy.ones((m,k),cupy.float16); b=cupy.ones((k,n),cupy.float16); c=cupy.zeros((m,n),cupy.float16)
gc=ng.get_context("cuda"); gc._ensure_bound()
ng.matmul(a,b,c=c,device="cuda")
key=(ng._cupy_signature(a,b,c), False, False, 1.0, 0.0, None, "cuda", ng.COMPUTE_32F, ng.cublas_args)
prepared = ng._PREPARED[key]
cells = dict(zip(prepared.__code__.co_freevars, [x.cell_contents for x in prepared.__closure__]))
inst_run = cells["run"]
icells = dict(zip(inst_run.__code__.co_freevars, [x.cell_contents for x in inst_run.__closure__]))
back_run = icells["inner"]
alpha, beta = np.array(1.0, np.float32), np.array(0.0, np.float32)
pa, pb = alpha.ctypes.data, beta.ctypes.data
t_=ng.DATA_TYPES["float16"]
h=gc.handle
def raw_ctypes(): cublas.gemmEx(h, 0, 0, n, m, k, alpha.ctypes.data, b.data.ptr, t_, n, a.data.ptr, t_, k, beta.ctypes.data, c.data.ptr, t_, n, 68, -1)
def raw(): cublas.gemmEx(h, 0, 0, n, m, k, pa, b.data.ptr, t_, n, a.data.ptr, t_, k, pb, c.data.ptr, t_, n, 68, -1)
variants = {"raw_ctypes": raw_ctypes, "raw": raw, "backend_run": lambda: back_run(b, a, c), "instrumented_run": lambda: inst_run(b, a, c),
            "prepared": lambda: prepared(a, b, c), "matmul": lambda: ng.matmul(a, b, c=c, device="cuda"),
            "cupy.matmul": lambda: cupy.matmul(a, b, out=c)}
res = {k_: [] for k_ in variants}
for _ in range(7):
    for name, f in variants.items():
        res[name].append(host_us(f, 800))
for name, v in res.items():
    print(f"{name:18s} median {statistics.median(v):6.2f} us  min {min(v):6.2f}")
import torch
print("gpu time us (events, 200 raw back-to-back):")
s, e = cupy.cuda.Event(), cupy.cuda.Event()
for f in (raw, variants["matmul"]):
    for _ in range(50): f()
    s.record()
    for _ in range(200): f()
    e.record(); e.synchronize(); print(cupy.cuda.get_elapsed_time(s, e) / 200 * 1e3)
