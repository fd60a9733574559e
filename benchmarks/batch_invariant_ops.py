"""The per-op parts of ``benchmarks/batch_invariant_gpu.py`` (its docstring says what each measures): each
projection of a shape alone (``products``), the products' epilogues against the product then their kernel
(``epilogue_part``), decode attention (``attention_part``). ``c``: a shape's ``LlamaConfig`` fields (a dict of
``batch_invariant_gpu.SHAPES``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.testing


def products(c: dict, ms, device: str) -> list[dict]:
    """Every projection of a shape (random bf16) at each M in ``ms``, us per call (CUDA graphs off, L2
    flushed: ``triton.testing.do_bench``) of the batch-invariant product at the engine's tiling with up
    to 4 row tiles per program (``rows4_us``), with one 16-row tile per program (``rows1_us``), with one
    64-row tile per program (``m64_us``), of cuBLAS (``F.linear``), all on the product's input, and of
    the per-row kernel the engine runs before the product (``prologue_us``: add + RMSNorm, SwiGLU);
    pass: row 0 has the same bits as alone in each tiling."""
    from dataclasses import replace

    from flashspec_torch import invariant_matmul as I
    from flashspec_torch.layers import add_rms_norm, silu_mul

    h, i, hd = c["hidden_size"], c["intermediate_size"], c["head_dim"]
    projections = (("qkv", "add_rms_norm", (c["num_heads"] + 2 * c["num_kv_heads"]) * hd, h), ("o", "none", h, c["num_heads"] * hd),
                   ("gate_up", "add_rms_norm", 2 * i, h), ("down", "silu_mul", h, i), ("lm_head", "add_rms_norm", c["vocab_size"], h))
    g = torch.Generator(device=device).manual_seed(0)
    out = []
    for proj, prologue, n, k in projections:
        rnd = lambda *s: (torch.randn(*s, generator=g, device=device) * 0.5).to(torch.bfloat16)  # noqa: E731
        w, norm, big = rnd(n, k) * 0.05, rnd(k), max(ms)
        x, d, gu, hres = rnd(big, k), rnd(big, k), rnd(big, 2 * k), rnd(big, k)  # hres: add_rms_norm's h, updated in place
        t = I.invariant_tiling(n, k, torch.bfloat16)
        tilings = dict(rows4=replace(t, block_m=16, row_tiles=4), rows1=replace(t, block_m=16, row_tiles=1),
                       m64=replace(t, block_m=64, row_tiles=1))
        alone = {v: I.launch(x[:1], w, True, tt) for v, tt in tilings.items()}
        for m in ms:
            row = dict(projection=proj, prologue=prologue, n=n, k=k, m=m, tiling=vars(t), splits=t.slices(k))
            got = {v: I.launch(x[:m], w, True, tt) for v, tt in tilings.items()}
            row["pass"] = all(torch.equal(got[v][:1], alone[v]) for v in tilings)
            row["m64_equals_rows4"] = bool(torch.equal(got["m64"], got["rows4"]))  # informational
            if device == "cuda":
                row.update({f"{v}_us": triton.testing.do_bench(lambda: I.launch(x[:m], w, True, tt)) * 1e3
                            for v, tt in tilings.items()})
                row["cublas_us"] = triton.testing.do_bench(lambda: F.linear(x[:m], w)) * 1e3
                row.update({f"{v}_over_cublas": row[f"{v}_us"] / row["cublas_us"] for v in tilings})
                if prologue == "silu_mul":
                    row["prologue_us"] = triton.testing.do_bench(lambda: silu_mul(gu[:m], "triton", True)) * 1e3
                elif prologue == "add_rms_norm":
                    row["prologue_us"] = triton.testing.do_bench(
                        lambda: add_rms_norm(hres[:m], d[:m], norm, 1e-5, "triton", True)) * 1e3
            out.append(row)
        del w, x, d, gu, hres
    return out


def epilogue_part(name: str, c: dict, ms, device: str) -> list[dict]:
    """The shape's gate_up and qkv (random bf16) at each M in ``ms`` (qkv: M / 5 requests of 5 tokens where 5
    divides M, else M of one): pass when the product's epilogue (SwiGLU; RoPE + KV write: q and both caches)
    gives the bits of the product, then ``silu_mul``'s or ``rope_kv``'s kernel, both with the engine's launch on
    this card (the kernels the timing modes compiled)."""
    from flashspec_torch import invariant_matmul as I
    from flashspec_torch.layers import rope_kv, silu_mul

    h, i, heads, kv_heads, d = (c[f] for f in ("hidden_size", "intermediate_size", "num_heads", "num_kv_heads", "head_dim"))
    g = torch.Generator(device=device).manual_seed(2)
    rnd = lambda *s, scale=1.0: (torch.randn(*s, generator=g, device=device) * scale).to(torch.bfloat16)  # noqa: E731
    x, gate_up, qkv = rnd(max(ms), h, scale=0.5), rnd(2 * i, h, scale=0.02), rnd((heads + 2 * kv_heads) * d, h, scale=0.02)
    cos, sin, slots = rnd(max(ms), d), rnd(max(ms), d), 64
    out = []
    for proj, w in (("gate_up", gate_up), ("qkv", qkv)):
        for m in ms:
            if proj == "gate_up":
                got = [I.launch(x[:m], w, True, None, "swiglu")]
                want = [silu_mul(I.launch(x[:m], w, True), "triton", True)]
            else:
                b, tt = (m // 5, 5) if m % 5 == 0 else (m, 1)
                shaped = lambda a: a[:m].reshape(b, tt, -1)  # noqa: E731
                positions = torch.arange(tt, device=device).repeat(b, 1)
                caches = [torch.zeros(2, b, kv_heads, slots, d, dtype=torch.bfloat16, device=device) for _ in range(2)]
                rope = I.RopeKV(shaped(cos), shaped(sin), positions, *caches[0], heads, kv_heads)
                got = [I.launch(x[:m], w, True, None, "rope_kv", rope), *caches[0]]
                want = [rope_kv(I.launch(x[:m], w, True).reshape(b, tt, -1), shaped(cos), shaped(sin), positions,
                                *caches[1], heads, kv_heads, "triton", True), *caches[1]]
            out.append(dict(check=f"{name} {proj} M={m}: epilogue == product then its kernel",
                            **{"pass": all(torch.equal(a, b) for a, b in zip(got, want))}))
    return out


def attention_part(c: dict, contexts, device: str) -> list[dict]:
    """Decode attention of one row (random bf16 cache of ``context`` slots, the shape's heads): us per call
    invariant (query tile max(16, group), KV splits of 256 slots, merged in order) vs the default kernel
    (``do_bench``), and whether the last position's bits alone == as the last of 5 scoring rows == in a
    prefill pass of the last 40 positions (pass)."""
    from flashspec_torch.layers import attention

    h, kv, hd = c["num_heads"], c["num_kv_heads"], c["head_dim"]
    g = torch.Generator(device=device).manual_seed(1)
    out = []
    for context in contexts:
        k, v = (torch.randn(1, kv, context, hd, generator=g, device=device).to(torch.bfloat16) for _ in range(2))
        q = torch.randn(1, h, 40, hd, generator=g, device=device).to(torch.bfloat16)
        pos = torch.arange(context - 40, context, device=device)[None]

        def run(t0, invariant):
            return attention(q[:, :, t0:].contiguous(), k, v, pos[:, t0:], None, kv, "triton", True, context,
                             invariant=invariant)[0, -1]

        row = dict(context=context, splits=-(-context // 256),
                   **{"pass": bool(torch.equal(run(39, True), run(35, True)) and torch.equal(run(39, True), run(0, True)))})
        if device == "cuda":
            row["invariant_us"] = triton.testing.do_bench(lambda: run(39, True)) * 1e3
            row["default_us"] = triton.testing.do_bench(lambda: run(39, False)) * 1e3
            row["invariant_over_default"] = row["invariant_us"] / row["default_us"]
        out.append(row)
    return out
