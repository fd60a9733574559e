"""Host side of the persistent verify schedule (``KernelConfig(schedule="persistent")``; the kernel
and the deadlock / reset argument are in ``flashspec_torch/kernels/persistent.py``): its grid and
the counter workspace that every launch leaves at zero."""

from __future__ import annotations

import contextlib
import math

import torch

HEAD = 32  # ints before the per-tile counters: the ticket counter, padded to 128 bytes
workspaces: dict[torch.device, torch.Tensor] = {}
retired: list[torch.Tensor] = []  # replaced workspaces stay allocated: a captured CUDA graph may use them


def grid(programs: int, lookahead: int, tiles: int, per_tile: int) -> tuple[int, int]:
    """(P, L) of a launch with per_tile work items per batch tile: at most ``programs`` programs
    (no more than there are items), and the lookahead (0: automatic) in batch tiles. Automatic:
    a phase-2 item is handed out about L * per_tile tickets after its tile's phase-1 items, so
    L = ceil(P / per_tile) + 1 leaves the P programs in flight about one item time to finish them."""
    p = max(1, min(programs, tiles * per_tile))
    return p, min(lookahead or math.ceil(p / per_tile) + 1, tiles)


def buffer(device: torch.device, tiles: int) -> torch.Tensor:
    """The zeroed int32 counter buffer of ``device``, with room for ``tiles`` batch tiles."""
    ws = workspaces.get(device)
    cap = 0 if ws is None else (ws.numel() - HEAD) // 2
    if cap < tiles:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"the persistent verify needs a counter workspace for {tiles} batch tiles: run one call "
                               "of this shape (or a larger batch) before capturing it in a CUDA graph")
        if ws is not None:
            retired.append(ws)
        cap = max(2 * cap, 32 * math.ceil(tiles / 32), 1024)
        ws = workspaces[device] = torch.zeros(HEAD + 2 * cap, dtype=torch.int32, device=device)
    return ws


@contextlib.contextmanager
def workspace(device: torch.device, tiles: int):
    """(ticket [1], finish counters [tiles], ready counters [tiles]): int32 views of one zeroed
    buffer per device, kept across calls. Every persistent launch leaves it at zero, so a CUDA
    graph replays the launch without a host write. Launches on one device must not run
    concurrently on different streams (they would share the counters). If the launch raises
    (e.g. in the interpreter), the buffer is replaced by a fresh zeroed one."""
    ws = buffer(device, tiles)
    cap = (ws.numel() - HEAD) // 2
    try:
        yield ws[:1], ws[HEAD:HEAD + tiles], ws[HEAD + cap:HEAD + cap + tiles]
    except BaseException:
        if workspaces.get(device) is ws:
            retired.append(workspaces.pop(device))
        raise
