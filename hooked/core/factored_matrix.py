"""A low-rank matrix kept as the product of two factors.

Many interesting matrices in a transformer are products: the OV circuit of a head is
`W_V @ W_O` (`d_model x d_head` times `d_head x d_model`), the QK circuit is
`W_Q @ W_K.T`. The product is `d_model x d_model` but has rank at most `d_head`.
`FactoredMatrix(A, B)` represents `AB` without forming it, so that its SVD, norm and
eigenvalues cost work in the small inner dimension `m` rather than in `l x r`.

Leading (batch) dimensions broadcast, e.g. `A[n_layers, n_heads, l, m]` with
`B[n_layers, n_heads, m, r]` is a whole model's worth of per-head circuits.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

import torch
from jaxtyping import Complex, Float

from hooked.core.errors import InputError, LeadingDimsMismatchError, ShapeMismatchError

logger = logging.getLogger(__name__)

Scalar = int | float | torch.Tensor


class FactoredMatrix:
    """The matrix `A @ B` with `A[..., l, m]` and `B[..., m, r]` kept separate."""

    def __init__(self, A: Float[torch.Tensor, "... l m"], B: Float[torch.Tensor, "... m r"]):
        """Store the factors, broadcasting their leading dimensions against each other."""
        if A.ndim < 2 or B.ndim < 2:
            raise ShapeMismatchError(f"factors must be at least 2-D, got A{tuple(A.shape)} and B{tuple(B.shape)}")
        if A.size(-1) != B.size(-2):
            raise ShapeMismatchError(f"inner dimensions differ: A{tuple(A.shape)} @ B{tuple(B.shape)}")
        self.ldim, self.mdim, self.rdim = A.size(-2), A.size(-1), B.size(-1)
        try:
            lead = torch.broadcast_shapes(A.shape[:-2], B.shape[:-2])
        except RuntimeError as e:
            raise LeadingDimsMismatchError(
                f"Shape mismatch: leading dimensions do not broadcast: A{tuple(A.shape)}, B{tuple(B.shape)}"
            ) from e
        self.shape = torch.Size(lead + (self.ldim, self.rdim))
        self.A = A.broadcast_to(lead + (self.ldim, self.mdim))
        self.B = B.broadcast_to(lead + (self.mdim, self.rdim))
        self._svd_cache: tuple | None = None

    @property
    def has_leading_dims(self) -> bool:
        return self.ndim > 2

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def pair(self) -> tuple[Float[torch.Tensor, "... l m"], Float[torch.Tensor, "... m r"]]:
        return self.A, self.B

    # ----------------------------------------------------------------- products
    def __matmul__(self, other: Any) -> FactoredMatrix | Float[torch.Tensor, "... l"]:
        """`self @ X` stays factored: X is folded into whichever side keeps the inner dim small.

        A 1-D vector collapses the product to a plain `[..., l]` tensor.
        """
        if isinstance(other, FactoredMatrix):
            return (self @ other.A) @ other.B
        if not isinstance(other, torch.Tensor):
            return NotImplemented
        if other.size(0 if other.ndim == 1 else -2) != self.rdim:
            raise ShapeMismatchError(
                f"cannot multiply {self} by a tensor of shape {tuple(other.shape)}: its dim -2 must be {self.rdim}"
            )
        if other.ndim == 1:
            return (self.A @ (self.B @ other.unsqueeze(-1))).squeeze(-1)
        if self.rdim > self.mdim:
            return FactoredMatrix(self.A, self.B @ other)  # inner dim stays m
        return FactoredMatrix(self.AB, other)  # r <= m: r is the smaller inner dim

    def __rmatmul__(self, other: Any) -> FactoredMatrix | Float[torch.Tensor, "... r"]:
        """`X @ self`, the mirror image of `__matmul__`; a 1-D vector gives `[..., r]`."""
        if isinstance(other, FactoredMatrix):
            return other @ self
        if not isinstance(other, torch.Tensor):
            return NotImplemented
        if other.size(-1) != self.ldim:
            raise ShapeMismatchError(
                f"cannot multiply a tensor of shape {tuple(other.shape)} by {self}: its last dim must be {self.ldim}"
            )
        if other.ndim == 1:
            return ((other.unsqueeze(-2) @ self.A) @ self.B).squeeze(-2)
        if self.ldim > self.mdim:
            return FactoredMatrix(other @ self.A, self.B)
        return FactoredMatrix(other, self.AB)

    def __mul__(self, scalar: Scalar) -> FactoredMatrix:
        """Scaling distributes over the product, so only `A` is scaled."""
        if isinstance(scalar, torch.Tensor):
            if scalar.numel() != 1:
                raise InputError(f"* needs a scalar, got a tensor of shape {tuple(scalar.shape)}; use @")
            scalar = scalar.reshape(())  # a [1, 1] tensor must not add leading dims
        elif not isinstance(scalar, (int, float)):
            return NotImplemented
        return FactoredMatrix(self.A * scalar, self.B)

    def __rmul__(self, scalar: Scalar) -> FactoredMatrix:
        return self.__mul__(scalar)

    @property
    def AB(self) -> Float[torch.Tensor, "... l r"]:
        """The materialised product (as large as `l x r`; use sparingly)."""
        return self.A @ self.B

    @property
    def BA(self) -> Float[torch.Tensor, "... m m"]:
        """The reversed product `B @ A`; only defined for square matrices (l == r)."""
        if self.ldim != self.rdim:
            raise ShapeMismatchError(f"BA needs a square matrix, shape is {tuple(self.shape)}")
        return self.B @ self.A

    @property
    def T(self) -> FactoredMatrix:
        """The transpose: `(AB)^T = B^T A^T`."""
        return FactoredMatrix(self.B.transpose(-2, -1), self.A.transpose(-2, -1))

    # ------------------------------------------------------------ decompositions
    def svd(
        self,
    ) -> tuple[Float[torch.Tensor, "... l m"], Float[torch.Tensor, "... m"], Float[torch.Tensor, "... r m"]]:
        """Return `(U, S, V)` with `AB = U diag(S) V^T`, without forming AB.

        With reduced SVDs `A = Ua Sa Va^T` and `B = Ub Sb Vb^T`, the product is
        `Ua (Sa Va^T Ub Sb) Vb^T`; only the small middle matrix needs a further SVD,
        `M = Um Sm Vm^T`, and then `U = Ua Um`, `S = Sm`, `V = Vb Vm`.
        The result is cached (the factors are treated as immutable).
        """
        if self._svd_cache is not None and self._svd_cache[0] is self.A and self._svd_cache[1] is self.B:
            return self._svd_cache[2]
        Ua, Sa, Vha = torch.linalg.svd(self.A, full_matrices=False)
        Ub, Sb, Vhb = torch.linalg.svd(self.B, full_matrices=False)
        middle = Sa.unsqueeze(-1) * (Vha @ Ub) * Sb.unsqueeze(-2)
        Um, Sm, Vhm = torch.linalg.svd(middle, full_matrices=False)
        result = (Ua @ Um, Sm, Vhb.mT @ Vhm.mT)
        self._svd_cache = (self.A, self.B, result)
        return result

    @property
    def U(self) -> Float[torch.Tensor, "... l m"]:
        return self.svd()[0]

    @property
    def S(self) -> Float[torch.Tensor, "... m"]:
        return self.svd()[1]

    @property
    def V(self) -> Float[torch.Tensor, "... r m"]:
        return self.svd()[2]

    @property
    def Vh(self) -> Float[torch.Tensor, "... r m"]:
        """Deprecated alias of `V` (TransformerLens' name; it was never transposed)."""
        warnings.warn("FactoredMatrix.Vh is deprecated; it returns V, use .V", DeprecationWarning, stacklevel=2)
        return self.V

    @property
    def eigenvalues(self) -> Complex[torch.Tensor, "... m"]:
        """Eigenvalues of AB, computed from the small matrix BA.

        If `BAv = kv` then `AB(Av) = k(Av)`: AB and BA share their nonzero eigenvalues.
        """
        BA = self.BA
        if BA.dtype in (torch.float16, torch.bfloat16):
            logger.debug("upcasting %s to float32 for torch.linalg.eig", BA.dtype)
            BA = BA.float()
        return torch.linalg.eigvals(BA)

    def norm(self) -> Float[torch.Tensor, "..."]:
        """Frobenius norm: the root of the sum of squared singular values."""
        return self.S.pow(2).sum(-1).sqrt()

    def make_even(self) -> FactoredMatrix:
        """The same matrix refactored as `(U sqrt(S), sqrt(S) V^T)`: both halves are equally scaled."""
        root = self.S.sqrt()
        return FactoredMatrix(self.U * root.unsqueeze(-2), root.unsqueeze(-1) * self.V.mT)

    def collapse_l(self) -> Float[torch.Tensor, "... m r"]:
        """Drop the orthogonal left factor U: returns `S V^T`, shape `[..., m, r]`."""
        return self.S.unsqueeze(-1) * self.V.mT

    def collapse_r(self) -> Float[torch.Tensor, "... l m"]:
        """Drop the orthogonal right factor V: returns `U S`, shape `[..., l, m]`."""
        return self.U * self.S.unsqueeze(-2)

    # ------------------------------------------------------------------ shaping
    def unsqueeze(self, k: int) -> FactoredMatrix:
        """Insert a leading axis at position `k` of both factors."""
        if not -(self.ndim + 1) <= k <= self.ndim - 2 or k in (-1, -2):
            raise InputError(f"unsqueeze({k}) must add a leading axis of {self}")
        return FactoredMatrix(self.A.unsqueeze(k), self.B.unsqueeze(k))

    def __getitem__(self, idx: Any) -> FactoredMatrix:
        """Index the leading dimensions; indices for the last two axes slice A's rows / B's columns.

        An int on the last two axes keeps a length-1 axis, so the result stays a matrix.
        """
        idx = idx if isinstance(idx, tuple) else (idx,)
        n_lead = self.ndim - 2

        def width(i: Any) -> int:  # how many dimensions an index entry consumes
            if i is None:
                return 0
            if isinstance(i, torch.Tensor) and i.dtype == torch.bool:
                return i.ndim
            return 1

        if sum(i is Ellipsis for i in idx) > 1:
            raise IndexError("an index can only have a single ellipsis")
        if Ellipsis in idx:
            pos = next(p for p, i in enumerate(idx) if i is Ellipsis)
            fill = self.ndim - sum(width(i) for i in idx if i is not Ellipsis)
            idx = idx[:pos] + (slice(None),) * fill + idx[pos + 1 :]
        lead, rest, used = [], [], 0
        for i in idx:
            (lead if used < n_lead or (i is None and not rest) else rest).append(i)
            used += width(i)
        if used > self.ndim or None in rest:
            raise IndexError(f"index {idx} is invalid for {self}")
        rows, cols = (rest + [slice(None)] * 2)[:2]
        rows, cols = self._keep_axis(rows, self.ldim), self._keep_axis(cols, self.rdim)
        lead += [slice(None)] * (n_lead - sum(width(i) for i in lead))
        return FactoredMatrix(self.A[(*lead, rows, slice(None))], self.B[(*lead, slice(None), cols)])

    @staticmethod
    def _keep_axis(i: Any, size: int) -> Any:
        """Turn an int index into a length-1 slice (negative ints count from the end)."""
        if isinstance(i, int):
            if not -size <= i < size:
                raise IndexError(f"index {i} is out of range for an axis of size {size}")
            i %= size
            return slice(i, i + 1)
        return i

    def get_corner(self, k: int = 3) -> Float[torch.Tensor, "... k k"]:
        """The top-left `k x k` block of AB, computed from only k rows of A and k columns of B."""
        return self.A[..., :k, :] @ self.B[..., :, :k]

    def __repr__(self) -> str:
        return f"FactoredMatrix: Shape({tuple(self.shape)}), Hidden Dim({self.mdim})"

    __str__ = __repr__
