"""Fused mHC kernels against the float64 reference (operators.md §5.4), under ``TRITON_INTERPRET=1`` on
the CPU (on CUDA when present): the conformance kit on fresh seeds, more modality groups than one
launch serves, non-finite semantics, the rounding points, strided streams."""

from __future__ import annotations

import os
import random

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import magi2_core as m2
from magi2_core.contracts import acceptance as acc
from magi2_core.testing import call_record, run_kit
from magi2_core.testing.op_cases.mhc_pre import mhc_parameters, mhc_streams

DEVICE = "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"


def _inputs(seed: int, t: int, n: int, d: int, dtype: torch.dtype, m: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(a.to(DEVICE) for a in (mhc_streams(g, t, n, d, dtype), *mhc_parameters(g, m, n, d)))


def _pre(args: tuple[torch.Tensor, ...], provider: str, **kw: object) -> tuple[torch.Tensor, ...]:
    return tuple(o.cpu() for o in m2.mhc_pre(*args, provider=provider, **kw))  # type: ignore[arg-type]


def test_the_kit_passes_on_a_fresh_seed() -> None:
    seed = random.SystemRandom().randrange(2**31)
    report = run_kit(["triton"], ops=["mhc_pre", "mhc_mix"], devices=[DEVICE], seed=seed)
    assert report.ok, f"seed {seed}:\n{report.format()}"
    assert len(report.results) > 60


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_more_modality_groups_than_one_launch_serves(dtype: torch.dtype) -> None:
    sizes = [3, 0, 2, 0, 4, 1]  # six groups, two of them empty: two launches of the logits kernel
    args = _inputs(11, sum(sizes), 4, 24, dtype, len(sizes))
    got = _pre(args, "triton", modality_sizes=sizes, out_dtype=torch.float32)
    ref = _pre(args, "reference", modality_sizes=sizes, out_dtype=torch.float32)
    x = args[0].cpu()
    for verdict in (
        acc.accept_mhc_branch_input(got[0], ref[0], x),
        acc.accept_mhc_coefficients(got[1], ref[1], "post"),
        acc.accept_mhc_coefficients(got[2], ref[2], "residual"),
    ):
        assert verdict, str(verdict)
    # the kernels read the weight by modality offset: passed as [M, n·D] rows it gives the same bits
    rows = (args[0], args[1].view(len(sizes), -1), *args[2:])
    for a, b in zip(_pre(rows, "triton", modality_sizes=sizes, out_dtype=torch.float32), got, strict=True):
        assert torch.equal(a, b)


def test_nonfinite_tokens_and_a_nan_residual_bias_match_the_reference() -> None:
    args = list(_inputs(4, 9, 4, 16, torch.bfloat16, 1))
    args[0][2, 1, 5] = float("inf")
    args[0][6, 3, 0] = float("nan")
    got, ref = _pre(tuple(args), "triton"), _pre(tuple(args), "reference")
    for a, b in zip(got, ref, strict=True):
        assert torch.equal(a.isnan(), b.isnan())
    assert got[2][2].isnan().all() and got[2][0].isfinite().all()
    args[-1] = args[-1].clone()
    args[-1][3, 0] = float("nan")
    assert _pre(tuple(args), "triton")[2].isnan().all()


def test_coefficients_in_bf16_are_the_fp32_results_rounded_once() -> None:
    args = _inputs(8, 13, 4, 32, torch.bfloat16, 1)
    h16, post16, res16 = _pre(args, "triton")
    h32, post32, res32 = _pre(args, "triton", out_dtype=torch.float32)
    assert torch.equal(h16, h32)  # the branch input does not depend on the coefficients' dtype
    assert torch.equal(post16, post32.bfloat16()) and torch.equal(res16, res32.bfloat16())


def test_the_mix_rounds_each_term_before_the_sum() -> None:
    x = torch.tensor([[[1.0], [0.0]]], dtype=torch.bfloat16, device=DEVICE)
    residual = torch.tensor([[[1.0 + 2**-8, 0.0], [0.0, 1.0]]], device=DEVICE)
    post = torch.tensor([[2**-8, 0.0]], device=DEVICE)
    y = torch.tensor([[1.0]], dtype=torch.bfloat16, device=DEVICE)
    assert m2.mhc_mix(x, y, post, residual, provider="triton")[0, 0, 0].item() == 1.0  # not 1 + 2⁻⁷


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_strided_streams_and_coefficients(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(3)
    wide = mhc_streams(g, 10, 4, 48, dtype).to(DEVICE)
    x = wide[:, :, :40]  # rows of a wider tensor, read in place
    y = mhc_streams(g, 10, 1, 40, dtype)[:, 0].to(DEVICE)
    post = torch.rand(4, 10, generator=g).to(DEVICE).t()  # [T, n] with token stride 1
    res = torch.rand(10, 4, 4, generator=g).to(DEVICE).transpose(1, 2)
    got = m2.mhc_mix(x, y, post, res, provider="triton").cpu()
    ref = m2.mhc_mix(x, y, post, res, provider="reference").cpu()
    verdict = acc.accept_mhc_mix(got, ref, call_record("mhc_mix", x.cpu(), y.cpu(), post.cpu(), res.cpu()))
    assert verdict, str(verdict)
    args = (x, *_inputs(5, 10, 4, 40, dtype, 1)[1:])
    got_pre, ref_pre = _pre(args, "triton"), _pre(args, "reference")
    verdict = acc.accept_mhc_branch_input(got_pre[0], ref_pre[0], x.cpu())
    assert verdict, str(verdict)
    # a flat norm weight with a stride of 2 (every other element of a wider tensor): read as its values
    strided = torch.zeros(2 * args[1].numel(), device=DEVICE)
    strided[::2] = args[1]
    for provider, want in (("triton", got_pre), ("reference", ref_pre)):
        for a, b in zip(_pre((x, strided[::2], *args[2:]), provider), want, strict=True):
            assert torch.equal(a, b), provider


@pytest.mark.parametrize(
    ("sizes", "width", "split_k"),
    [
        (None, 24, 1),
        ([5, 0, 19, 3], 24, 1),
        ([40, 7], 48, 1),
        ([5, 0, 19, 3], 24, 3),  # three chunks of 32
        ([3, 0, 2, 0, 4, 1, 20], 24, 4),  # seven groups (two launches); the fourth chunk is past K
        ([40, 7], 48, 2),
    ],
)
def test_the_split_bf16_logits_meet_the_contract(sizes: list[int] | None, width: int, split_k: int) -> None:
    """``bf16x3`` launches, whole rows or rows in chunks, against the float64 reference: branch input,
    post and residual coefficients by the contract's rules."""
    from magi2_backend_triton import mhc_pre as kernel

    t = 29 if sizes is None else sum(sizes)
    args = _inputs(21, t, 4, width, torch.bfloat16, 1 if sizes is None else len(sizes))
    call = call_record("mhc_pre", *args, modality_sizes=sizes)
    cfg = kernel.LogitsConfig(block_t=16, block_k=32, precision="bf16x3", split_k=split_k)
    got = tuple(o.cpu() for o in kernel.launch_mhc_pre(call, cfg))
    ref = _pre(args, "reference", modality_sizes=sizes)
    x = args[0].cpu()
    for verdict in (
        acc.accept_mhc_branch_input(got[0], ref[0], x),
        acc.accept_mhc_coefficients(got[1], ref[1], "post"),
        acc.accept_mhc_coefficients(got[2], ref[2], "residual"),
    ):
        assert verdict, str(verdict)


def _torch_pieces(w: torch.Tensor, phi: torch.Tensor, block_n: int) -> torch.Tensor:
    """The split in torch ops (RNE casts): what the pieces kernel must reproduce bit for bit."""
    m, k = w.shape
    nl = phi.shape[1]
    folded = torch.zeros((m, k, block_n), dtype=torch.float32, device=phi.device)
    folded[:, :, :nl] = (w.view(m, k, 1) + 1.0) * phi.view(1, k, nl)
    hi = folded.to(torch.bfloat16)
    rest = folded - hi.float()
    mid = rest.to(torch.bfloat16)
    lo = (rest - mid.float()).to(torch.bfloat16)
    return torch.stack((hi, mid, lo), dim=1)


@pytest.mark.parametrize(
    ("m", "k", "nl", "block_n", "flat"), [(3, 96, 24, 32, True), (1, 200, 8, 16, False), (2, 64, 32, 32, False)]
)
def test_the_split_pieces_are_the_torch_split_summing_to_the_fold(
    m: int, k: int, nl: int, block_n: int, flat: bool
) -> None:
    from magi2_backend_triton.mhc_pre import split_pieces

    g = torch.Generator().manual_seed(random.SystemRandom().randrange(2**31))
    w = torch.randn(m, k, generator=g) * 0.1
    phi = torch.randn(k, nl, generator=g) * 0.02
    phi[0, 0], phi[-1, -1] = 3.0e-30, -7.5e5  # a tiny and a large product: every piece in play
    pieces = split_pieces((w.reshape(-1) if flat else w).to(DEVICE), phi.to(DEVICE), block_n).cpu()
    assert pieces.shape == (m, 3, k, block_n) and pieces.dtype == torch.bfloat16
    assert torch.equal(pieces.view(torch.int16), _torch_pieces(w, phi, block_n).view(torch.int16))
    got = pieces.double().sum(dim=1)[:, :, :nl]
    exact = ((w.view(m, k, 1) + 1.0) * phi.view(1, k, nl)).double()  # the FP32 product the pieces split
    assert torch.equal(got, exact)
    assert torch.all(pieces[:, :, :, nl:] == 0)


@pytest.mark.parametrize(
    "bad", [{"precision": "tf32"}, {"block_t": 8}, {"block_k": 96}, {"split_k": 0}, {"split_k": 2, "precision": "ieee"}]
)
def test_a_logits_launch_that_cannot_run_is_refused_by_name(bad: dict[str, object]) -> None:
    from magi2_backend_triton.mhc_pre import LogitsConfig

    with pytest.raises(ValueError, match="LogitsConfig"):
        LogitsConfig(**bad)  # type: ignore[arg-type]


_PACK = (25842, 3323, 747)  # video, audio, text tokens of the 272p / 10 s pack (benchmarks/mhc.py)
_SHIPPED_LAUNCH = (128, 64, 8, 4, 1)  # mhc_pre.LOGITS: block_t, block_k, num_warps, num_stages, split_k


@pytest.fixture(scope="module")
def split_pack() -> dict[str, object]:
    """A pack-sized BF16 call on the GPU and its logits in float64 (the projection of the normalised rows)."""
    if DEVICE != "cuda":
        pytest.skip("needs a CUDA GPU (the pack-sized split-BF16 launches)")
    sizes = list(_PACK)
    n, d = 4, 3072
    seed = random.SystemRandom().randrange(2**31)
    args = _inputs(seed, sum(sizes), n, d, torch.bfloat16, len(sizes))
    x, w, phi = args[0].reshape(sum(sizes), n * d), args[1].view(len(sizes), n * d), args[2]
    truth, scale, t0 = [], [], 0
    for g, s in enumerate(sizes):
        xs = x[t0 : t0 + s].double()
        folded = (w[g].double() + 1.0)[:, None] * phi.double()
        inv = torch.rsqrt((xs * xs).mean(1) + 1e-6)[:, None]
        truth.append((xs @ folded) * inv)
        scale.append((xs.abs() @ folded.abs()) * inv)
        t0 += s
    return {"seed": seed, "args": args, "sizes": sizes, "truth": torch.cat(truth), "scale": torch.cat(scale)}


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("block_t", "block_k", "num_warps", "num_stages", "split_k"),
    [
        (64, 128, 4, 3, 1),
        (64, 64, 4, 3, 1),
        (64, 64, 4, 4, 1),
        (128, 64, 8, 3, 1),
        (128, 128, 8, 4, 1),
        (128, 128, 4, 3, 1),
        (128, 64, 8, 4, 2),
        (128, 64, 8, 4, 4),
        (64, 64, 4, 4, 4),
        (64, 128, 8, 3, 8),
        _SHIPPED_LAUNCH,
    ],
)
def test_the_split_bf16_logits_are_exact_and_repeatable_at_the_pack(
    split_pack: dict[str, object], block_t: int, block_k: int, num_warps: int, num_stages: int, split_k: int
) -> None:
    """Pipelined ``bf16x3`` launches on the GPU, the shipped one among them: every row's logits within
    FP32 accumulation error of float64, and bitwise the same on a second run (launches of an earlier
    form of this kernel gave rows that moved from run to run)."""
    from magi2_backend_triton import mhc_pre as kernel

    d = kernel.LOGITS
    assert (d.block_t, d.block_k, d.num_warps, d.num_stages, d.split_k) == _SHIPPED_LAUNCH, "keep the default listed"
    args, sizes = split_pack["args"], split_pack["sizes"]
    assert isinstance(args, tuple) and isinstance(sizes, list)
    x, w, phi = args[0], args[1], args[2]
    t, k = x.shape[0], x.shape[1] * x.shape[2]
    cfg = kernel.LogitsConfig(block_t, block_k, "bf16x3", num_warps, num_stages, split_k)
    at = f"{cfg}, seed {split_pack['seed']}"
    first, second = (kernel._split_partials(x.reshape(t, k), w, phi, sizes, cfg) for _ in range(2))
    for name, u, v in zip(("sums", "sums of squares"), first, second, strict=True):
        rows = int((u != v).reshape(u.shape[0], t, -1).any(2).any(0).sum())
        assert torch.equal(u, v), f"{at}: two runs' {name} differ in {rows} rows"
    parts, sumsq = first  # the chunks added and normalised, as the apply kernel does (its order may differ)
    logits = parts.sum(0) * torch.rsqrt(sumsq.sum(0) / k + 1e-6)[:, None]
    rel = (logits.double() - split_pack["truth"]).abs() / split_pack["scale"]  # type: ignore[operator]
    bad = (rel.amax(1) > 1e-5).nonzero().flatten()
    assert bad.numel() == 0, f"{at}: {bad.numel()} rows off (first {bad[:6].tolist()}), worst {float(rel.max()):.2e}"
