"""Finite elements in the residue domain: 1-D rules, tensor bases, mass and Poisson operators, box and hexahedral meshes.

Every operator application runs between one encode and one decode: mode
products with the 1-D matrices, Hadamard products with the encoded
per-element quadrature fields, transposed products and sums, with drops and
base extensions planned once so that no step leaves the residue range.
"""

from .hexmesh import HEX_NODES, HexMesh, read_mesh
from .mesh import BoxMesh, FEMesh, Geometry, box_mesh, element_geometry
from .meshop import MeshOperator
from .operators import METHODS, InvertedElementError, MassOperator, PoissonOperator
from .quadrature import gauss, gll, lagrange_matrices
from .tensorbasis import TensorBasis

__all__ = [
    "gauss",
    "gll",
    "lagrange_matrices",
    "TensorBasis",
    "MassOperator",
    "PoissonOperator",
    "METHODS",
    "InvertedElementError",
    "box_mesh",
    "BoxMesh",
    "Geometry",
    "element_geometry",
    "FEMesh",
    "HexMesh",
    "read_mesh",
    "HEX_NODES",
    "MeshOperator",
]
