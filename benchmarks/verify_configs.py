"""The Triton verify variants timed by ``benchmarks/verify_variants.py`` (and named by ``verify_sass.py``,
``verify_ncu.py``): name -> ``KernelConfig`` for one shape, "lanes" being the default (``choose_config``).
Each block says what it tries; the measured outcome of each is in docs/kernel_notes.md and README.md."""

from __future__ import annotations

import dataclasses
import math


def variants(b: int, g: int, v: int, itemsize: int, device) -> dict:
    """name -> KernelConfig; "lanes" is the default (choose_config)."""
    from flashspec_torch.verify import KernelConfig, choose_config, device_sms, interpreting, tile_config

    if device.type != "cuda" or interpreting():
        base = KernelConfig(block_b=1, block_v=256, sweep_v=128, num_chunks=2)
        return {"lanes": base, "tile": dataclasses.replace(base, stream="tile", sweep="tile"),
                "lanes-no-prune": dataclasses.replace(base, prune=False),
                "lanes-pdl": dataclasses.replace(base, pdl=True),  # no PDL in the interpreter: the plain pair runs
                "lanes-hint": dataclasses.replace(base, prune_hint=True, sweep_chunks=5),
                "lanes-slots": dataclasses.replace(base, sweep_slots=4),
                "lanes-lazy": dataclasses.replace(base, sweep_slots=4, prune=True, lazy_draft=True),
                "persistent": dataclasses.replace(base, schedule="persistent", programs_per_sm=2),
                "persistent-la1": dataclasses.replace(base, schedule="persistent", programs_per_sm=3, lookahead=1),
                "tickets": dataclasses.replace(base, schedule="persistent", programs_per_sm=3, sweep_chunks=5,
                                               sweep_slots=4, prune=True),
                "bounds": dataclasses.replace(base, sweep_slots=4, tile_bounds=True),
                "topdown": dataclasses.replace(base, block_v=128, top_down=True),
                "tdr1": dataclasses.replace(base, block_v=128, top_down=True, sweep_chunks=1, top_down_seeds=4,
                                            top_down_blocks=4),
                "tdz8": dataclasses.replace(base, block_v=128, top_down=True, top_down_maxima="final", sweep_chunks=3,
                                            top_down_seeds=2, top_down_blocks=2)}
    lanes = choose_config(b, g, v, device, itemsize)
    persistent = dataclasses.replace(lanes, schedule="persistent")  # one launch, ticketed items (kernels/persistent.py)
    out = {
        "lanes": lanes,
        "tile": tile_config(b, g, v, device),
        "lanes-stream+tile-sweep": dataclasses.replace(lanes, sweep="tile", sweep_v=2048, num_warps=4),
        "tile-stream+lanes-sweep": dataclasses.replace(tile_config(b, g, v, device), sweep="lanes", sweep_v=1024),
        "lanes-exact-log": dataclasses.replace(lanes, fast_math=False),
        "lanes-no-prune": dataclasses.replace(lanes, prune=False),
        # the default before 2026-12-02: one pruning vote per tile, pruning only from ~8 sweep tiles per program
        "lanes-tile-vote": dataclasses.replace(lanes, sweep_slots=0, prune=v / lanes.num_chunks / 1024 >= 7.5),
        "lanes-pdl": dataclasses.replace(lanes, pdl=True),  # the final launch starts in the stats launch's tail
        "lanes-prune": dataclasses.replace(lanes, prune=True),
        "lanes-sweep512": dataclasses.replace(lanes, sweep_v=512),
        "lanes-w8": dataclasses.replace(lanes, num_warps=8, sweep_v=2048),
        "lanes-half-chunks": dataclasses.replace(lanes, num_chunks=max(1, lanes.num_chunks // 2)),
        "lanes-double-chunks": dataclasses.replace(lanes, num_chunks=lanes.num_chunks * 2,
                                                   block_v=max(256, lanes.block_v // 2)),
        "lanes-small-tiles": dataclasses.replace(lanes, block_v=max(256, lanes.block_v // 2), sweep_v=512),
        # the persistent schedule measured slower than two launches at every shape (2026-12-01: B=256 bf16 2.42x
        # the floor against 1.85x; its other variants were 2.08-3.21x); these two stay as its reference points
        "persistent": persistent,  # choose_config's tiling, P = 3 programs per SM (all resident), automatic lookahead
        "persistent-p4-r128": dataclasses.replace(persistent, programs_per_sm=4, max_registers=128),  # 4 resident
    }
    wanted = min(math.ceil(16 * device_sms(device) / b), 128 if b < 8 else 32)  # choose_config's split before 2026-12-01's sweep
    old_v = min(8192 // itemsize, max(256, 1 << (math.ceil(v / wanted) - 1).bit_length()))
    old_chunks = min(math.ceil(v / old_v), wanted)
    out["lanes-16-per-sm"] = dataclasses.replace(lanes, block_v=old_v, num_chunks=old_chunks, prune=v / old_chunks / 1024 >= 7.5)
    for k in (2, 4, 8):  # fewer, longer programs (the recombine and the last-finisher work are per program)
        chunks = max(1, lanes.num_chunks // k)
        out[f"lanes-c{k}"] = dataclasses.replace(lanes, num_chunks=chunks, prune=v / chunks / 1024 >= 7.5)
    out["lanes-pdl-c2"] = dataclasses.replace(out["lanes-c2"], pdl=True)
    # the final launch's own split of row n: more, smaller programs (1-2 warps: the pruning vote of a tile is
    # one warp's, no CTA barrier), 8 logits per thread per sweep tile; "-r96": ptxas register cap (more resident)
    pdl = out["lanes-pdl"]
    for k, warps in ((4, 4), (8, 2), (8, 1), (16, 1), (16, 2), (1, 1), (2, 1), (2, 2), (4, 1), (4, 2)):
        out[f"pdl-s{k}-w{warps}"] = dataclasses.replace(pdl, sweep_chunks=lanes.num_chunks * k, sweep_warps=warps,
                                                        sweep_v=256 * warps)
    out["pdl-s4-w4-v2048"] = dataclasses.replace(out["pdl-s4-w4"], sweep_v=2048)
    out["pdl-s8-w2-r96"] = dataclasses.replace(out["pdl-s8-w2"], max_registers=96)
    # fewer registers per thread, more resident warps: 4 logits per thread, or a ptxas cap
    out["pdl-s8-w1-v128"] = dataclasses.replace(out["pdl-s8-w1"], sweep_v=128)
    out["pdl-s16-w1-v128"] = dataclasses.replace(out["pdl-s16-w1"], sweep_v=128)
    out["pdl-s8-w1-r80"] = dataclasses.replace(out["pdl-s8-w1"], max_registers=80)
    out["pdl-s8-w1-r64"] = dataclasses.replace(out["pdl-s8-w1"], max_registers=64)
    # the sweep's pruning floor starts from the keys of row n's chunk maxima (lanes.hint_floor)
    out["lanes-hint"] = dataclasses.replace(lanes, prune_hint=True, prune=True)
    out["lanes-hint-no-split"] = dataclasses.replace(lanes, prune_hint=True, prune=True, sweep_chunks=0, sweep_warps=0,
                                                     sweep_v=1024)
    out["pdl-s8-w1-hint"] = dataclasses.replace(out["pdl-s8-w1"], prune_hint=True, prune=True)
    # the programs of a row share the sweep's pruning floor (lanes.sweep_row_lanes SHARE_K)
    out["pdl-shared"] = dataclasses.replace(pdl, shared_floor=True, prune=True, sweep_slots=0)
    for k, warps in ((4, 1), (8, 1), (16, 1), (8, 2), (4, 4)):
        out[f"pdl-s{k}-w{warps}-shared"] = dataclasses.replace(pdl, sweep_chunks=lanes.num_chunks * k, sweep_warps=warps,
                                                               sweep_v=256 * warps, shared_floor=True, prune=True,
                                                               sweep_slots=0)
    # the sweep's vote per slot (kernels/slots.py): 8 votes per 256-logit tile of one warp, 8 per 1024 of four
    lanes_p = dataclasses.replace(lanes, prune=True)
    out["lanes-slots8"] = dataclasses.replace(lanes_p, sweep_slots=8)
    out["lanes-slots4"] = dataclasses.replace(lanes_p, sweep_slots=4)
    for k, warps in ((8, 1), (4, 1), (16, 1)):
        out[f"pdl-s{k}-w{warps}-slots8"] = dataclasses.replace(pdl, sweep_chunks=lanes.num_chunks * k, sweep_warps=warps,
                                                               sweep_v=256 * warps, prune=True, sweep_slots=8)
    out["pdl-s8-w1-slots4"] = dataclasses.replace(out["pdl-s8-w1-slots8"], sweep_slots=4)
    # the slot-vote sweep with 2 or 3 tiles of row n in flight instead of 1 (more bytes in flight per warp)
    for k in (2, 3):
        out[f"lanes-ahead{k}"] = dataclasses.replace(lanes_p, sweep_slots=lanes_p.sweep_slots or 4, sweep_ahead=k)
    out["lanes-ahead2-slots8"] = dataclasses.replace(out["lanes-ahead2"], sweep_slots=8)
    # the sweep's tiles loaded in their own iteration, the loop pipelined by Triton (cp.async through shared memory)
    for k in (2, 3, 4):
        out[f"lanes-pipe{k}"] = dataclasses.replace(lanes_p, sweep_slots=lanes_p.sweep_slots or 4, sweep_ahead=0,
                                                    sweep_stages=k)
    # more resident warps: ptxas's register cap on the final launch (72: 28 one-warp programs per SM, 64: 32)
    for regs in (72, 64):
        out[f"lanes-pipe2-r{regs}"] = dataclasses.replace(out["lanes-pipe2"], max_registers=regs)
        out[f"lanes-r{regs}"] = dataclasses.replace(lanes, max_registers=regs)
    # the final launch's one-warp programs as k whole waves: ncu (results/ncu_2026-12-04) counts 20 resident per
    # SM at 96 registers (28 at a 72-register cap), so the default's 8x split (B = 256: 6144 programs) is 2.33
    # waves, its last one a third full; "-wave{k}": sweep_chunks = k waves / B (programs of whole 256-logit tiles)
    sms = device_sms(device)
    for k in (1, 2):
        for name, base, resident in (("lanes", lanes_p, 20), ("lanes-pipe2-r72", out["lanes-pipe2-r72"], 28)):
            out[f"{name}-wave{k}"] = dataclasses.replace(
                base, sweep_slots=base.sweep_slots or 4, sweep_chunks=max(1, k * resident * sms // b), sweep_warps=1,
                sweep_v=256)
    # row n of the draft read only for the threads whose logits can reach the floor (slots.sweep_row_slots_lazy)
    out["lanes-lazy"] = dataclasses.replace(lanes_p, sweep_slots=lanes_p.sweep_slots or 4, lazy_draft=True)
    out["lanes-lazy-slots8"] = dataclasses.replace(out["lanes-lazy"], sweep_slots=8)
    # bfloat16 rows read by plain loads and widened by Triton, or as int32 pairs (slots.load_slot_tile; the
    # default from B = 128)
    out["lanes-no-pairs"] = dataclasses.replace(lanes, bf16_pairs=False)
    out["lanes-pairs"] = dataclasses.replace(lanes, bf16_pairs=True)
    # the final launch's own duration (without PDL it does not start in the stats launch's tail, so the
    # profiler's time is its own), with and without its finer split of row n
    out["lanes-no-pdl"] = dataclasses.replace(lanes, pdl=False)
    out["lanes-no-pdl-no-split"] = dataclasses.replace(lanes, pdl=False, sweep_chunks=0, sweep_warps=0, sweep_v=1024)
    # the final launch sweeps the last chunks of the last rows first: those the stats launch read last (in L2)
    out["lanes-reverse"] = dataclasses.replace(lanes, reverse_final=True)
    # tile bounds: the stats launch bounds the keys of every block_v tile of every target row, one final program
    # per row sweeps only row n's tiles that can hold a winner (kernels/bounds.py); "-w4": four warps a program,
    # "-t{k}": tiles k times smaller than the stats launch's default (tighter bounds, more stores)
    out["bounds"] = dataclasses.replace(lanes_p, sweep_slots=lanes_p.sweep_slots or 4, tile_bounds=True)
    out["bounds-w4"] = dataclasses.replace(out["bounds"], sweep_warps=4, sweep_v=1024)
    for k in (2, 4):
        out[f"bounds-t{k}"] = dataclasses.replace(out["bounds"], block_v=max(256, lanes.block_v // k))
    # the FINAL draw under the top-down noise (kernels/topdown.py): the stats launch keeps every block of 64 logits'
    # maximum, the final programs draw only the blocks of row n that can reach the floor; "-s{k}": k final programs
    # per stats chunk (one warp each), "-w4": four-warp final programs
    out["topdown"] = dataclasses.replace(lanes, top_down=True)
    for k in (1, 2, 8, 16, 32):
        out[f"topdown-s{k}"] = dataclasses.replace(lanes, top_down=True, sweep_chunks=k * lanes.num_chunks, sweep_warps=1)
    out["topdown-w4"] = dataclasses.replace(lanes, top_down=True, sweep_warps=4)
    for per in (2, 4, 8):  # blocks drawn together by a final program (their loads in flight at once); not yet timed
        out[f"topdown-b{per}"] = dataclasses.replace(lanes, top_down=True, top_down_blocks=per)
        out[f"topdown-s16-b{per}"] = dataclasses.replace(out["topdown-s16"], top_down_blocks=per)
    # "tdr{k}": k four-warp final programs per row, each drawing the best blocks of 16 / k segments of its range as
    # one tile, then its listed blocks 32 at a time (a few round trips a program); "-w8": eight warps, "-b16": 16
    # blocks at a time, "-s{k}": k seed segments
    for k in (1, 2, 4, 8):
        out[f"tdr{k}"] = dataclasses.replace(lanes, top_down=True, sweep_chunks=k, sweep_warps=4,
                                             top_down_seeds=max(4, 16 // k), top_down_blocks=32)
    out["tdr1-w8"] = dataclasses.replace(out["tdr1"], sweep_warps=8)
    out["tdr1-b16"] = dataclasses.replace(out["tdr1"], top_down_blocks=16)
    for k in (4, 32):
        out[f"tdr1-s{k}"] = dataclasses.replace(out["tdr1"], top_down_seeds=k)
    # "tdz{k}": k one-warp final programs per stats chunk that find row n's block maxima themselves (z of row n read
    # once, one max per logit; the stats launch unchanged), 4 seed blocks, then 4 listed blocks at a time
    for k in (2, 4, 8, 16, 32):
        out[f"tdz{k}"] = dataclasses.replace(lanes, top_down=True, top_down_maxima="final", sweep_chunks=k * lanes.num_chunks,
                                             sweep_warps=1, top_down_seeds=4, top_down_blocks=4)
        for r in (40, 48):  # a register cap for more resident one-warp programs (72 registers: 28 a SM); not yet timed
            out[f"tdz{k}-r{r}"] = dataclasses.replace(out[f"tdz{k}"], max_registers=r)
    out["tdz8-w2"] = dataclasses.replace(out["tdz8"], sweep_warps=2)
    out["tdz8-b8"] = dataclasses.replace(out["tdz8"], top_down_seeds=8, top_down_blocks=8)
    out["tdz8-s1"] = dataclasses.replace(out["tdz8"], top_down_seeds=1, top_down_blocks=2)
    out["lanes-again"] = lanes  # the default timed once more, after the others: the run's noise
    # batch groups: a stats + final pair per k rows, chained by PDL, so that group j + 1's stats stream while
    # group j sweeps its rows n (re-read from L2 rather than DRAM); with the whole batch's tiling ("bg{k}") or
    # with the tiling choose_config gives k rows ("bg{k}-own")
    for k in (b // 8, b // 4, b // 2):
        if k >= 4:
            out[f"bg{k}"] = dataclasses.replace(lanes, batch_group=k)
            out[f"bg{k}-own"] = dataclasses.replace(choose_config(k, g, v, device, itemsize), batch_group=k)
    out.update(ticket_variants(lanes, itemsize, device_sms(device)))
    return out


def ticket_variants(lanes, itemsize: int, sms: int) -> dict:
    """One launch of ticketed items (the persistent kernel) as many short programs of 1-2 warps: a
    phase-1 item streams 1/4 (1 warp) or 1/2 (2 warps) of what a stats program of the default streams,
    a phase-2 item sweeps what a final program of the default sweeps (8 chunks per stats chunk, the
    slot vote), and ptxas's register cap lets p programs per SM be resident ("tickets-w{w}-p{p}").
    Hypothesis: the issue-bound sweeps of early tiles run beside the memory-bound stats of later ones,
    and row n comes from L2. "-la{k}": k times the automatic lookahead (fewer waits, less L2 reuse)."""
    out = {}
    for warps, per_sm, regs in ((1, 16, 128), (1, 21, 96), (1, 12, 168), (2, 8, 128), (2, 10, 96)):
        split = 4 // warps
        tickets = dataclasses.replace(
            lanes, schedule="persistent", num_warps=warps, block_v=2048 * warps // itemsize,
            num_chunks=lanes.num_chunks * split, sweep_chunks=8 * lanes.num_chunks, sweep_v=256 * warps,
            sweep_slots=4, prune=True, pdl=False, programs_per_sm=per_sm, max_registers=regs, sweep_warps=0)
        auto = math.ceil(sms * per_sm / (tickets.num_chunks + tickets.sweep_chunks)) + 1  # persistent.grid's
        out[f"tickets-w{warps}-p{per_sm}"] = tickets
        out[f"tickets-w{warps}-p{per_sm}-la2"] = dataclasses.replace(tickets, lookahead=2 * auto)
        out[f"tickets-w{warps}-p{per_sm}-la-half"] = dataclasses.replace(tickets, lookahead=max(1, auto // 2))
    return out


# ----------------------------------------------------------------------------- torch
