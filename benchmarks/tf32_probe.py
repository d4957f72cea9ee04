"""How compiled Triton feeds fp32 operands to TF32 tensor cores, and which model of triton_fa2
reproduces its fp32 outputs on the open TF32 findings (benchmarks/gpu_findings/).

Part 1, operands: tl.dot(a, I) and tl.dot(I, b) for a, b whose low 13 mantissa bits are drawn
at random, each operand either loaded from memory or computed in registers (times a runtime 1.0,
as the kernel's P is), at a 16x16 tile (mma.sync) and a 64x64 one (wgmma). Each result is
matched against the operand truncated to TF32 and rounded to nearest: the fraction of entries
each explains is printed.

Part 2, findings: each TF32 finding's case is run through triton_fa2 with its configuration,
and through float64 emulations of the kernel's online softmax (its key blocks, exp2 in fp32)
that convert q, k, P and v to TF32 by truncation, by rounding, or not at all. The emulation
whose output sits closest to the kernel's is how the kernel converts.

    python benchmarks/tf32_probe.py [FINDING.json ...]

Without CUDA (TRITON_INTERPRET=1) only part 2 runs, on the interpreter's IEEE dots: a check of
the emulation, whose no-conversion model must then match the kernel.
"""
from __future__ import annotations

import itertools
import math
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

LOW_BITS = 0x1FFF          # the 13 fp32 mantissa bits TF32 drops


def tf32_truncate(x: torch.Tensor) -> torch.Tensor:
    return (x.contiguous().view(torch.int32) & ~LOW_BITS).view(torch.float32).view(x.shape)


def tf32_round(x: torch.Tensor) -> torch.Tensor:
    """Round to nearest, ties away from zero (PTX cvt.rna.tf32.f32) on the magnitude bits."""
    bits = x.contiguous().view(torch.int32)
    return ((bits + 0x1000) & ~LOW_BITS).view(torch.float32).view(x.shape)


CONVERSIONS = {"none": lambda t: t, "trunc": tf32_truncate, "round": tf32_round}


@triton.jit
def _probe_kernel(A, B, C, one, SIZE: tl.constexpr, A_IN_REGISTERS: tl.constexpr,
                  B_IN_REGISTERS: tl.constexpr, B_TRANSPOSED: tl.constexpr):
    rows = tl.arange(0, SIZE)
    a = tl.load(A + rows[:, None] * SIZE + rows[None, :])
    b = tl.load(B + rows[:, None] * SIZE + rows[None, :])
    if A_IN_REGISTERS:
        a = a * one
    if B_IN_REGISTERS:
        b = b * one
    if B_TRANSPOSED:           # the kernel's tl.dot(q, tl.trans(k))
        c = tl.dot(a, tl.trans(b))
    else:
        c = tl.dot(a, b)
    tl.store(C + rows[:, None] * SIZE + rows[None, :], c)


def probe_operands() -> None:
    print("== operand conversion: fraction of entries explained (trunc / round), 4096+ entries")
    g = torch.Generator().manual_seed(0)
    for size, side, registers, transposed in itertools.product(
            (16, 64), ("A", "B"), (False, True), (False, True)):
        if side == "A" and transposed:
            continue
        x = torch.randn(size, size, generator=g)
        # Low bits at random so ties are rare and truncation and rounding disagree on ~half.
        x = (x.view(torch.int32) | torch.randint(0, LOW_BITS, (size, size), generator=g,
                                                 dtype=torch.int32)).view(torch.float32)
        eye = torch.eye(size)
        a, b = (x, eye) if side == "A" else (eye, x.T.contiguous() if transposed else x)
        a, b = a.cuda(), b.cuda()
        c = torch.empty(size, size, device="cuda")
        _probe_kernel[(1,)](a, b, c, 1.0, SIZE=size, A_IN_REGISTERS=registers and side == "A",
                            B_IN_REGISTERS=registers and side == "B", B_TRANSPOSED=transposed,
                            num_warps=4)
        got = c.cpu()
        trunc = (got == tf32_truncate(x)).float().mean().item()
        rnd = (got == tf32_round(x)).float().mean().item()
        where = "registers" if registers else "memory"
        print(f"  {size}x{size} operand {side} ({where}{', tl.trans' if transposed else ''}): "
              f"trunc {trunc:.3f}  round {rnd:.3f}")


def emulate(q, k, v, case, block_n: int, conv_qk, conv_p, conv_v) -> torch.Tensor:
    """triton_fa2's forward, float64 except where the kernel rounds: scores times
    scale*log2(e) in fp32, p = exp2 in fp32, converted operands, online softmax over blocks."""
    from fuzzattn.judge.oracle import visible_keys
    q, k, v = (t.float().cpu() for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    qc, kc, vc = conv_qk(q).double(), conv_qk(k).double(), conv_v(v).double()
    qk_scale = torch.tensor(case.softmax_scale * 1.4426950408889634, dtype=torch.float32)
    mask = visible_keys(case.seq_q, case.seq_k, case.causal, "cpu")
    shape = q.shape[:3]
    m = torch.full(shape, -math.inf, dtype=torch.float32)
    l = torch.zeros(shape, dtype=torch.float64)
    acc = torch.zeros(q.shape, dtype=torch.float64)
    for start in range(0, case.seq_k, block_n):
        stop = min(start + block_n, case.seq_k)
        s = ((qc @ kc[:, :, start:stop].transpose(-1, -2)).float() * qk_scale)
        if mask is not None:
            s = s.masked_fill(~mask[:, start:stop], -math.inf)
        m_new = torch.maximum(m, s.amax(-1))
        m_safe = torch.where(m_new == -math.inf, torch.zeros_like(m_new), m_new)
        p = torch.exp2(s - m_safe[..., None])
        alpha = torch.exp2(m - m_safe).double()
        l = l * alpha + p.double().sum(-1)
        acc = acc * alpha[..., None] + conv_p(p).double() @ vc[:, :, start:stop]
        m = m_new
    return acc / torch.where(l > 0, l, torch.ones_like(l))[..., None]


def probe_findings(paths, device: str) -> None:
    from fuzzattn.campaigns import regression_file
    from fuzzattn.inputs.materialize import materialize
    from fuzzattn.judge.oracle import oracle
    from fuzzattn.kernels.triton_fa2 import CONFIG_SPACE, triton_fa2_forward
    print("== findings: max |kernel - model| / max |kernel - oracle| (smaller = the kernel's model)")
    for path in paths:
        record = regression_file.load(path)
        case = record.case
        if case.dtype != "float32" or record.impl != "triton_fa2" or record.check not in ("out", "out_rms"):
            continue
        config = {axis: case.config_dict[axis] for axis in CONFIG_SPACE}
        inputs = materialize(case, device)
        out, _ = triton_fa2_forward(*inputs.tensors(), causal=False if case.causal == "none" else case.causal,
                                    scale=case.softmax_scale,
                                    config=config)
        out = out.double().cpu()
        exact = oracle(*(t.cpu() for t in inputs.tensors()), case).out
        kernel_err = (out - exact).abs().max().item()
        print(f"  {Path(path).name}: kernel error {kernel_err:.3e} ({record.check} finding "
              f"{record.observed_error or 0:.3e} > {record.allowed_error or 0:.3e})")
        rows = []
        for (nq, cq), (np_, cp), (nv, cv) in itertools.product(CONVERSIONS.items(), repeat=3):
            model = emulate(*inputs.tensors(), case, config["BLOCK_N"], cq, cp, cv)
            gap = (out - model).abs().max().item()
            model_err = (model - exact).abs().max().item()
            rows.append((gap, f"qk={nq:5} p={np_:5} v={nv:5}", model_err))
        for gap, name, model_err in sorted(rows)[:6]:
            print(f"    {name}  gap/kernel_err {gap / max(kernel_err, 1e-300):.3f}  "
                  f"model error {model_err:.3e}")


def main() -> int:
    paths = sys.argv[1:] or sorted(str(p) for p in (ROOT / "benchmarks" / "gpu_findings").glob("*.json"))
    if torch.cuda.is_available():
        probe_operands()
        probe_findings(paths, "cuda")
    else:   # the interpreter's IEEE dots: a check of the emulation itself (qk=none p=none v=none)
        probe_findings(paths, "cpu")
    return 0


if __name__ == "__main__":
    sys.exit(main())
