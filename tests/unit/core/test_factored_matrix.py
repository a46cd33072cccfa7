"""FactoredMatrix against the materialised product AB (float64 for tight tolerances)."""

import pytest
import torch

from hooked.core.factored_matrix import FactoredMatrix

torch.set_num_threads(1)
TOL = dict(rtol=1e-10, atol=1e-10)


def rand(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64)


def fm(l=5, m=3, r=4, lead=(2, 3), seed=0):  # noqa: E741 - l, m, r: the dimensions ldim, mdim, rdim
    return FactoredMatrix(rand(*lead, l, m, seed=seed), rand(*lead, m, r, seed=seed + 1))


def test_attributes_and_repr():
    f = fm()
    assert f.shape == torch.Size([2, 3, 5, 4]) and f.ndim == 4
    assert (f.ldim, f.mdim, f.rdim) == (5, 3, 4)
    assert f.pair[0] is f.A and f.pair[1] is f.B
    assert "(2, 3, 5, 4)" in repr(f) and "Hidden Dim(3)" in str(f)


def test_broadcast_leading_dims():
    A, B = rand(2, 1, 5, 3), rand(4, 3, 6, seed=1)
    f = FactoredMatrix(A, B)
    assert f.shape == (2, 4, 5, 6)
    assert f.A.shape == (2, 4, 5, 3) and f.B.shape == (2, 4, 3, 6)
    torch.testing.assert_close(f.AB, A @ B, **TOL)


@pytest.mark.unchecked  # a wrongly typed argument on purpose: the library's own error, which the checks would preempt
@pytest.mark.parametrize("A,B", [((5, 3), (4, 6)), ((2, 5, 3), (3, 3, 6)), ((3,), (3, 4))])
def test_bad_shapes_raise(A, B):
    with pytest.raises(ValueError):
        FactoredMatrix(rand(*A), rand(*B))


def test_ab_ba_transpose():
    f = fm(l=4, r=4)
    torch.testing.assert_close(f.AB, f.A @ f.B, **TOL)
    torch.testing.assert_close(f.BA, f.B @ f.A, **TOL)
    assert isinstance(f.T, FactoredMatrix)
    torch.testing.assert_close(f.T.AB, f.AB.transpose(-2, -1), **TOL)
    with pytest.raises(ValueError):
        _ = fm(l=5, r=4).BA


@pytest.mark.parametrize("r", [6, 2])  # r > m folds X into B; r <= m folds into AB
def test_matmul_tensor(r):
    f = fm(l=5, m=3, r=r)
    X = rand(2, 3, r, 7, seed=5)
    out = f @ X
    assert isinstance(out, FactoredMatrix) and out.shape == (2, 3, 5, 7)
    assert out.mdim == (3 if r > 3 else r)
    torch.testing.assert_close(out.AB, f.AB @ X, **TOL)


def test_matmul_broadcasts_unbatched_tensor():
    f, X = fm(), rand(4, 2, seed=5)
    torch.testing.assert_close((f @ X).AB, f.AB @ X, **TOL)


def test_matmul_vector():
    f, v = fm(), rand(4, seed=5)
    out = f @ v
    assert isinstance(out, torch.Tensor) and out.shape == (2, 3, 5)
    torch.testing.assert_close(out, f.AB @ v, **TOL)


def test_matmul_mismatch_raises():
    with pytest.raises(ValueError):
        fm(r=4) @ rand(5, 2)


def test_matmul_factored():
    f, g = fm(r=4), fm(l=4, m=2, r=6, seed=7)
    out = f @ g
    assert isinstance(out, FactoredMatrix) and out.shape == (2, 3, 5, 6)
    torch.testing.assert_close(out.AB, f.AB @ g.AB, **TOL)


@pytest.mark.parametrize("l", [6, 2])  # l > m folds X into A; l <= m folds into AB
def test_rmatmul_tensor(l):  # noqa: E741 - l, m, r: the dimensions ldim, mdim, rdim
    f = fm(l=l, m=3, r=4)
    X = rand(2, 3, 7, l, seed=5)
    out = X @ f
    assert isinstance(out, FactoredMatrix) and out.shape == (2, 3, 7, 4)
    assert out.mdim == (3 if l > 3 else l)
    torch.testing.assert_close(out.AB, X @ f.AB, **TOL)


def test_rmatmul_vector():
    f, v = fm(), rand(5, seed=5)
    out = v @ f
    assert isinstance(out, torch.Tensor) and out.shape == (2, 3, 4)
    torch.testing.assert_close(out, v @ f.AB, **TOL)


@pytest.mark.parametrize(
    "s", [2.5, 3, torch.tensor(-1.5, dtype=torch.float64), torch.tensor([0.5], dtype=torch.float64)]
)
def test_scalar_mul(s):
    f = fm()
    expected = f.AB * s
    torch.testing.assert_close((f * s).AB, expected, **TOL)
    torch.testing.assert_close((s * f).AB, expected, **TOL)
    assert torch.equal((f * s).B, f.B)  # only A is scaled


def test_mul_by_one_element_tensor_keeps_shape():
    assert (fm() * torch.ones(1, 1, 1, 1, 1, dtype=torch.float64)).shape == (2, 3, 5, 4)


def test_mul_by_tensor_needs_one_element():
    with pytest.raises(ValueError):
        fm() * rand(2)


@pytest.mark.parametrize("l,m,r", [(5, 3, 4), (4, 6, 5), (3, 3, 3)])
def test_svd(l, m, r):  # noqa: E741 - l, m, r: the dimensions ldim, mdim, rdim
    f = fm(l=l, m=m, r=r)
    U, S, V = f.svd()
    k = min(l, m, r)
    assert U.shape == (2, 3, l, k) and S.shape == (2, 3, k) and V.shape == (2, 3, r, k)
    torch.testing.assert_close(U @ torch.diag_embed(S) @ V.mT, f.AB, **TOL)
    eye = torch.eye(k, dtype=torch.float64).expand(2, 3, k, k)
    torch.testing.assert_close(U.mT @ U, eye, **TOL)
    torch.testing.assert_close(V.mT @ V, eye, **TOL)
    torch.testing.assert_close(S, torch.linalg.svdvals(f.AB)[..., :k], **TOL)
    assert f.svd() is f.svd()  # cached
    assert f.U is U and f.S is S and f.V is V


def test_vh_is_deprecated_alias_of_v():
    f = fm()
    with pytest.warns(DeprecationWarning):
        Vh = f.Vh
    assert Vh is f.V


def test_eigenvalues_match_nonzero_eigenvalues_of_ab():
    f = fm(l=6, m=3, r=6)
    eig = f.eigenvalues
    assert eig.shape == (2, 3, 3) and eig.is_complex()
    full = torch.linalg.eigvals(f.AB)  # 6 eigenvalues: the 3 of BA plus 3 zeros
    top = full.gather(-1, full.abs().argsort(-1, descending=True)[..., :3])
    key = lambda z: z.real * 1e3 + z.imag  # noqa: E731 - a total order on complex values
    sort = lambda z: z.gather(-1, key(z).argsort(-1))  # noqa: E731
    torch.testing.assert_close(sort(eig), sort(top), rtol=1e-8, atol=1e-8)
    torch.testing.assert_close(eig.sum(-1).real, torch.diagonal(f.AB, dim1=-2, dim2=-1).sum(-1), **TOL)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_eigenvalues_upcast_half(dtype):
    f = FactoredMatrix(rand(4, 2).to(dtype), rand(2, 4, seed=1).to(dtype))
    eig = f.eigenvalues
    assert eig.dtype == torch.complex64
    torch.testing.assert_close(eig.sum().real, torch.trace(f.BA.float()), rtol=1e-5, atol=1e-5)


def test_norm():
    f = fm()
    torch.testing.assert_close(f.norm(), torch.linalg.matrix_norm(f.AB), **TOL)


def test_make_even():
    f = fm()
    e = f.make_even()
    torch.testing.assert_close(e.AB, f.AB, **TOL)
    torch.testing.assert_close(torch.linalg.svdvals(e.A), torch.linalg.svdvals(e.B), **TOL)
    torch.testing.assert_close(torch.linalg.svdvals(e.A), f.S.sqrt(), **TOL)


def test_collapse():
    f = fm()
    cl, cr = f.collapse_l(), f.collapse_r()
    assert cl.shape == (2, 3, 3, 4) and cr.shape == (2, 3, 5, 3)
    torch.testing.assert_close(f.U @ cl, f.AB, **TOL)
    torch.testing.assert_close(cr @ f.V.mT, f.AB, **TOL)
    torch.testing.assert_close(cr @ cl, f.U @ torch.diag_embed(f.S**2) @ f.V.mT, **TOL)


@pytest.mark.parametrize("k", [0, 2, -3, -5])
def test_unsqueeze(k):
    f = fm()
    u = f.unsqueeze(k)
    torch.testing.assert_close(u.AB, f.AB.unsqueeze(k), **TOL)
    assert u.ndim == f.ndim + 1


@pytest.mark.parametrize("k", [-1, -2, 3, -6])
def test_unsqueeze_rejects_matrix_axes(k):
    with pytest.raises(ValueError):
        fm().unsqueeze(k)


@pytest.mark.parametrize(
    "idx,expected",
    [  # expected: the same selection applied to AB, with ints on the last two axes kept as length 1
        (1, (1,)),
        ((1, 2), (1, 2)),
        ((slice(None), 0), (slice(None), 0)),
        ((..., slice(1, 4), slice(None)), (..., slice(1, 4), slice(None))),
        ((1, 2, slice(1, 4)), (1, 2, slice(1, 4))),
        ((1, 2, 3), (1, 2, slice(3, 4))),
        ((0, slice(None), 2, 3), (0, slice(None), slice(2, 3), slice(3, 4))),
        ((1, 2, -1, -2), (1, 2, slice(4, 5), slice(2, 3))),
        ((..., 2), (..., slice(2, 3))),
        ((None, 0), (None, 0)),
        ((1, None, 2), (1, None, 2)),
        ((torch.tensor([1, 0]),), (torch.tensor([1, 0]),)),
    ],
)
def test_getitem(idx, expected):
    f = fm()
    g = f[idx]
    assert isinstance(g, FactoredMatrix)
    torch.testing.assert_close(g.AB, f.AB[expected], **TOL)


def test_getitem_too_long_raises():
    with pytest.raises(IndexError):
        fm()[0, 0, 0, 0, 0]


def test_get_corner():
    f = fm(l=5, r=6)
    torch.testing.assert_close(f.get_corner(), f.AB[..., :3, :3], **TOL)
    torch.testing.assert_close(f.get_corner(2), f.AB[..., :2, :2], **TOL)
