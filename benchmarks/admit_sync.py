"""Whether the served slot path makes the host wait for the device (issue #35, the served concurrency-16 loss):
each call the scheduler makes between and for its steps (``admit``, ``prefill_chunk`` inside
``StepTimer.outside``; ``step_slots``, ``decode_slots`` at launch) runs with a step in flight under
``torch.cuda.set_sync_debug_mode("error")``; a call that synchronizes raises, and its message is recorded. A wait
inside ``outside`` hides the step in flight from the policy's step time (docs/adaptive.md). Prints one JSON object.

    python benchmarks/admit_sync.py --device cuda          # a few seconds on a GPU; on the CPU: the calls only
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "shared"), str(ROOT), str(ROOT / "benchmarks")]

from adaptive_bench import GREEDY, load_model  # noqa: E402
from flashspec_torch.slots import TorchSlotBackend  # noqa: E402
from flashspec_torch.drafts import LookupDraft  # noqa: E402


def watched(name: str, call, cuda: bool, out: dict) -> None:
    """Run ``call()`` with synchronizing CUDA calls raising; out[name]: None (no sync) or the error's first line."""
    if cuda:
        torch.cuda.set_sync_debug_mode("error")
    try:
        call()
        out[name] = None
    except RuntimeError as e:
        out[name] = str(e).splitlines()[0][:300]
    finally:
        if cuda:
            torch.cuda.set_sync_debug_mode(0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--model", default="smollm2-135m")
    args = ap.parse_args()
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    out: dict = {"device": torch.cuda.get_device_name() if cuda else "cpu", "model": args.model,
                 "note": "null: no host wait; a message: the call synchronized (with a step in flight)"}
    with torch.inference_mode():
        model, *_ = load_model(args.model, device)
        vocab = model.config.vocab_size
        g = torch.Generator().manual_seed(0)
        prompt = lambda n: torch.randint(0, vocab, (n,), generator=g).tolist()  # noqa: E731
        b = TorchSlotBackend(model, [LookupDraft()], eos_ids=[])
        b.open_slots(8, 512)
        b.admit([0, 1], [prompt(40), prompt(60)], [200, 200], [0, 0])
        rows = np.zeros(8, bool)
        rows[:2] = True
        for _ in range(2):  # capture and warm every call watched below
            b.step_slots(0, 4, GREEDY, rows).fetch()
            b.decode_slots(GREEDY, rows).fetch()
        b.prefill_chunk(5, prompt(32), 0)
        b.admit([4], [prompt(50)], [200], [0])
        b.admit([5], [prompt(48)], [200], [0], cached=[32])
        rows[4:6] = True
        b.step_slots(0, 4, GREEDY, rows).fetch()
        handle = b.step_slots(0, 4, GREEDY, rows)  # in flight while the scheduler admits
        watched("admit", lambda: b.admit([2], [prompt(70)], [200], [0]), cuda, out)
        watched("prefill_chunk", lambda: b.prefill_chunk(6, prompt(32), 0), cuda, out)
        watched("admit_after_chunk", lambda: b.admit([6], [prompt(40)], [200], [0], cached=[32]), cuda, out)
        handle.fetch()
        rows[2] = rows[6] = True
        b.step_slots(0, 4, GREEDY, rows).fetch()  # the new rows' buckets, captured outside the watch
        b.decode_slots(GREEDY, rows).fetch()
        handle = b.decode_slots(GREEDY, rows)
        watched("step_slots_launch", lambda: out.setdefault("_h", b.step_slots(0, 4, GREEDY, rows)), cuda, out)
        handle.fetch()
        h = out.pop("_h", None)
        if h is not None:
            h.fetch()
        watched("decode_slots_launch", lambda: out.setdefault("_h", b.decode_slots(GREEDY, rows)), cuda, out)
        h = out.pop("_h", None)
        if h is not None:
            h.fetch()
    out["host_waits"] = sorted(k for k in ("admit", "prefill_chunk", "admit_after_chunk", "step_slots_launch",
                                           "decode_slots_launch") if out.get(k))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
