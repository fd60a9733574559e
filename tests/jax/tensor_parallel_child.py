"""Run by test_jax_tensor_parallel.py in a subprocess whose XLA_FLAGS give the CPU 2 devices (set
before JAX starts): a tiny random fp32 target generates on one device and split over 2 (greedy and
sampled, n-gram speculation and plain decoding, per-request seeds), and the split forward's
compiled HLO is scanned for its collectives. Prints one JSON object."""

import json
import re
import sys

import jax
import jax.numpy as jnp
from char_tokenizer import VOCAB, CharTokenizer  # tests/char_tokenizer.py
from flax import nnx

from flashspec_jax import parallel
from flashspec_jax.engine import Engine
from flashspec_jax.model import LlamaConfig
from flashspec_jax.weights import LoadedModel, random_model

CONFIG = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                     head_dim=8, max_position_embeddings=256, tie_word_embeddings=False)
CASES = {"greedy-ngram": (0.0, True), "sampled-ngram": (0.8, True), "sampled-plain": (0.8, False)}


def tokens(target: LoadedModel, n: int) -> dict:
    engine = Engine(target, ("ngram",), policy="fixed", tensor_parallel=n)
    out = {}
    for name, (temperature, speculation) in CASES.items():
        r = engine.generate(["abcabcabcab", "hello hello he"], temperature=temperature, max_new_tokens=10,
                            seed=[3, 4], speculation=speculation, chat=False)
        out[name] = r["tokens"]
    return out


def collectives(model) -> dict:
    """Counts of each collective in the compiled forward of ``model`` (layers unrolled), and the
    shapes the all-gathers produce."""
    model.scan_layers = False
    graphdef, weights = nnx.split(model)

    def forward(weights, ids, pos):
        m = nnx.merge(graphdef, weights)
        return m(ids, pos, m.new_cache(2, 64))

    ids = jnp.zeros((2, 5), jnp.int32)
    pos = jnp.broadcast_to(jnp.arange(5, dtype=jnp.int32), (2, 5))
    text = jax.jit(forward).lower(weights, ids, pos).compile().as_text()
    ops = re.findall(r"= (\S+) (all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)(?:-start)?\(", text)
    counts = {kind: sum(1 for _, k in ops if k == kind) for _, kind in ops}
    return {"counts": counts, "gathered": [shape for shape, kind in ops if kind == "all-gather"]}


def main() -> None:
    target = LoadedModel(random_model(CONFIG, dtype=jnp.float32, seed=1, std=0.3), CharTokenizer(), "tiny")
    split = parallel.shard_model(target.model, parallel.make_mesh(2, "cpu"))
    result = {"devices": len(jax.devices()), "one": tokens(target, 1), "two": tokens(target, 2),
              "layers": CONFIG.num_layers, "hlo": collectives(split),
              "cache": str(split.new_cache(2, 64).k.sharding.spec)}
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
