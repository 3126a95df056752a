"""Write quarter_shell.msh: 6 x 6 x 6 triquadratic hexahedra of a quarter of a thick cylindrical shell.

The domain is 1 <= r <= 2, 0 <= theta <= pi/2, 0 <= z <= 1; every node of the
27-node cells lies on the exact cylindrical map (so the cells are curved).
To look like a mesh from a generator rather than a grid, the point ids are
shuffled, the cells are shuffled and every cell's nodes are rotated by a
random proper symmetry of the cube. Run once: python examples/data/make_mesh.py
"""

import itertools
from pathlib import Path

import meshio
import numpy as np

from rnstensor.fem import HEX_NODES

N = 6
order, lattice = HEX_NODES["hexahedron27"]
m = N * order
t = np.linspace(0.0, 1.0, m + 1)
I, J, K = np.meshgrid(t, t, t, indexing="ij")
r, theta, z = 1.0 + I, 0.5 * np.pi * J, K
points = np.stack([r * np.cos(theta), r * np.sin(theta), z], axis=-1).reshape(-1, 3)
ids = np.arange(points.shape[0]).reshape((m + 1,) * 3)
cells = np.array([[ids[ex * order + a, ey * order + b, ez * order + c] for a, b, c in lattice]
                  for ex, ey, ez in itertools.product(range(N), repeat=3)])

rng = np.random.default_rng(20)
new = rng.permutation(points.shape[0])
shuffled = np.empty_like(points)
shuffled[new] = points
cells = new[cells][rng.permutation(len(cells))]
rotations = []
for perm in itertools.permutations(range(3)):
    for signs in itertools.product((1, -1), repeat=3):
        R = np.zeros((3, 3), dtype=int)
        R[range(3), perm] = signs
        if round(np.linalg.det(R)) == 1:
            # node k of the rotated cell is the old node at R (L_k - 1) + 1 in the lattice {0, 1, 2}^3
            moved = (lattice - 1) @ R.T + 1
            rotations.append([int(np.flatnonzero((lattice == q).all(axis=1))[0]) for q in moved])
for e in range(len(cells)):
    cells[e] = cells[e][rotations[rng.integers(len(rotations))]]

out = Path(__file__).with_name("quarter_shell.msh")
meshio.write(out, meshio.Mesh(shuffled, [("hexahedron27", cells)]), file_format="gmsh", binary=True)
print(f"wrote {out} ({out.stat().st_size} bytes): {len(cells)} hexahedron27 cells, {len(points)} points")
