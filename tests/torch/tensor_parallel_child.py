"""Run by test_tensor_parallel.py under ``torchrun --standalone --nproc-per-node 2`` (gloo on the
CPU): rank 0 first generates with the whole tiny target (tensor_parallel=1), then both ranks with
it split over the two (greedy and sampled, n-gram and layer-skip speculation with an acceptance-
rewarded policy, and plain decoding, per-request seeds), and asks for graphed steps on the CPU
(refused). Rank 0 prints one JSON object."""

import json

import torch.distributed as dist

from fault_helpers import tiny_target
from flashspec_torch.backend import TorchBackend
from flashspec_torch.engine import Engine

CASES = {"greedy-spec": (0.0, True), "sampled-spec": (0.8, True), "sampled-plain": (0.8, False)}


def tokens(engine: Engine) -> dict:
    out = {}
    for name, (temperature, speculation) in CASES.items():
        r = engine.generate(["abcabcabcab", "hello hello he"], temperature=temperature, max_new_tokens=10,
                            seed=[3, 4], speculation=speculation, chat=False)
        out[name] = r["tokens"]
        if speculation:
            out[f"{name} pulls"] = r["arm_pulls"]
    return out


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    drafts, options = ("ngram", "layerskip:2"), dict(policy="thompson-token", objective="acceptance", device="cpu")
    one = tokens(Engine(tiny_target(0), drafts, **options)) if rank == 0 else None
    split = Engine(tiny_target(0), drafts, tensor_parallel=2, **options)
    two = tokens(split)
    if rank == 0:
        layer = split.target.model.layers[0]
        shapes = {name: list(getattr(layer, name).weight.shape) for name in ("qkv", "o", "gate_up", "down")}
        shapes["embed"] = list(split.target.model.embed.weight.shape)
        try:
            TorchBackend(split.target.model, [], graphs=True)
            graphs = "accepted"
        except ValueError as e:
            graphs = str(e)
        print(json.dumps({"one": one, "two": two, "shapes": shapes, "world": dist.get_world_size(), "graphs": graphs}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
