"""Poisson and mass operators over a Dask array of elements: the same bits as in memory, for any chunking.

Run: python examples/dask_fem.py   (needs the 'dask' extra: pip install -e '.[dask]')

On a GPU (CuPy installed, pip install -e '.[gpu]'), the last section runs the same operators on
Dask arrays whose chunks are CuPy arrays: rnstensor.dask picks the 'cuda' backend from the chunk
type and returns CuPy chunks. A FEM operator takes NumPy, so each chunk makes an explicit host round
trip around it (its residue work still runs on the GPU); a ChainPlan and dgemm/zgemm/matmul keep
CuPy chunks on the device throughout. For several GPUs run one single-threaded worker per GPU:
dask_cuda.LocalCUDACluster() if dask_cuda is installed, or one `dask worker` process per device
started with CUDA_VISIBLE_DEVICES=<i> (see the rnstensor.dask module notes).
"""

import dask.array as da
import numpy as np

import rnstensor as rt
import rnstensor.dask as rd
from rnstensor.backends.cuda import cuda_available
from rnstensor.fem import MassOperator, PoissonOperator, TensorBasis, box_mesh

basis = TensorBasis(5, dim=3)  # degree 4
mesh = box_mesh(basis, shape=(6, 6, 4), curved=0.1)  # 144 curved hexahedra
M = MassOperator(basis, mesh.qdata)
A = PoissonOperator(basis, mesh.G)
u = mesh.gather(np.sin(np.pi * mesh.coords[:, 0]) * mesh.coords[:, 1])

U = da.from_array(u, chunks=(40, 5, 5, 5))  # element chunks; one chunk along every other axis
for name, op in (("mass", M), ("Poisson", A)):
    y_dask = rd.apply(op, U).compute()  # each chunk applies the operator to its own elements' geometry
    y_mem = op.apply(u)
    print(f"{name:8s}: Dask result equals the in-memory one bit for bit: {np.array_equal(y_dask, y_mem)}")

# global quantities from the element results
print(f"volume  = {mesh.scatter(rd.apply(M, da.ones_like(U)).compute()).sum():.15f}")
print(f"u^T A u = {np.vdot(u, rd.apply(A, U).compute()):.12f}  (the energy, summed over elements)")

# the same on CuPy chunks, where a GPU is present: the same bits, CuPy chunks out
if cuda_available():
    import cupy as cp

    U_gpu = U.map_blocks(cp.asarray)  # CuPy chunks (a CuPy _meta): backend 'cuda' is inferred
    for name, op in (("mass", M), ("Poisson", A)):
        y_gpu = rd.apply(op, U_gpu).compute()  # a CuPy array
        print(f"{name:8s}: CuPy chunks give the same bits: {np.array_equal(cp.asnumpy(y_gpu), op.apply(u))}")
    V = u.reshape(u.shape[0], -1)  # one row per element
    Vd = da.from_array(V, chunks=(40, 64)).map_blocks(cp.asarray)
    G = rd.dgemm(Vd, Vd, trans_b="T")  # the Gram matrix: encode, residue products, k sums, decode on the GPU
    print(f"Gram matrix on the GPU equals rt.dgemm bit for bit: {np.array_equal(cp.asnumpy(G.compute()), rt.dgemm(V, V, trans_b='T'))}")
else:
    print("no GPU: skipping the CuPy-chunk section")
