import time, numpy as np, cupy, statistics
from native import gemm as ng
from falsification.gemm_tests import host_us, overhead
from falsification.registry import FalsifyContext
from cupy.cuda import cublas
m,k,n=4096,256,1024
a=cupy.ones((m,k),cupy.float16); b=cupy.ones((k,n),cupy.float16); c=cupy.zeros((m,n),cupy.float16)
def t(f, N=200000):
    f(); t0=time.perf_counter()
    for _ in range(N): f()
    return (time.perf_counter()-t0)/N*1e9
gc=ng.get_context("cuda"); gc._ensure_bound()
ng.matmul(a,b,c=c,device="cuda")
print("has get_current_stream_ptr", hasattr(cupy.cuda.stream, "get_current_stream_ptr"))
print("signature ns", t(lambda: ng._cupy_signature(a,b,c)))
key=(ng._cupy_signature(a,b,c), False, False, 1.0, 0.0, None, "cuda", ng.COMPUTE_32F, ng.cublas_args)
print("key+get ns", t(lambda: ng._PREPARED.get((ng._cupy_signature(a,b,c), False, False, 1.0, 0.0, None, "cuda", ng.COMPUTE_32F, ng.cublas_args))))
print("current ptr ns", t(gc._current_ptr))
alpha, beta = np.array(1.0, np.float32), np.array(0.0, np.float32)
pa, pb = alpha.ctypes.data, beta.ctypes.data
t_=ng.DATA_TYPES["float16"]
def raw(): cublas.gemmEx(gc.handle, 0, 0, n, m, k, pa, b.data.ptr, t_, n, a.data.ptr, t_, k, pb, c.data.ptr, t_, n, ng.COMPUTE_32F, -1)
def wr(): ng.matmul(a,b,c=c,device="cuda")
r, w = [], []
for _ in range(7):
    r.append(host_us(raw, 800)); w.append(host_us(wr, 800))
print("host_us raw", statistics.median(r), "wrapper", statistics.median(w), "all", [round(x,2) for x in r], [round(x,2) for x in w])
for _ in range(2):
    o = overhead(FalsifyContext("cuda", "full", 0, {"id": "bench", "params": {"shapes": [[4096, 256, 1024, "float16"]]}}))
    print(o.status, o.evidence["timings_ms"])
