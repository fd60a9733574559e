"""Hypothesis fuzzing of the public API: any input gives a valid result or a documented error
(ValueError / TypeError), never another exception. Example counts are bounded (seconds)."""

import numpy as np
import pytest
from fuzz_cases import DOCUMENTED, check_result, junk, junk_size, verify_args
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from flashspec.bandits import POLICIES, BanditConfig
from flashspec.cli import main
from flashspec.config import SamplingConfig
from flashspec.loop import SpecConfig
from flashspec.reference import verify
from flashspec.simulate import Environment, simulate

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(verify_args())
def test_reference_verify(case):
    (z, x), kw = case
    try:
        res = verify(z, x, **kw)
    except DOCUMENTED:
        return
    check_result(res, z, x)


@FAST
@given(temperature=st.one_of(st.floats(), st.just(10**400), junk), top_k=st.one_of(st.integers(), junk), top_p=st.one_of(st.floats(), junk))
def test_sampling_config(temperature, top_k, top_p):
    try:
        cfg = SamplingConfig(temperature, top_k, top_p)
    except ValueError:
        return
    assert cfg.temperature >= 0 and cfg.top_k >= 0 and 0 < cfg.top_p <= 1


@FAST
@given(gamma=st.one_of(st.integers(), junk), max_new_tokens=st.one_of(st.integers(), junk),
       max_steps=st.one_of(st.none(), st.integers(), junk))
def test_spec_config(gamma, max_new_tokens, max_steps):
    try:
        SpecConfig(gamma, max_new_tokens, max_steps)
    except ValueError:
        pass


FIELDS = ["objective", "likelihood", "prior_a", "prior_b", "gamma", "discount", "cd_delta", "cd_threshold",
          "cd_warmup", "restart", "fixed_arm", "per_request"]


@FAST
@given(st.dictionaries(st.sampled_from(FIELDS), st.one_of(junk, st.sampled_from(["acceptance", "token", "arm"])),
                       max_size=3),
       st.sampled_from(sorted(POLICIES)), st.one_of(st.integers(-1, 4), junk_size), st.one_of(st.integers(-1, 3), junk_size),
       st.lists(st.tuples(junk, junk, junk, junk), max_size=3))
def test_policies(fields, name, num_arms, batch, observations):
    try:
        policy = POLICIES[name](num_arms, BanditConfig(**fields), rng=0, batch=batch)
    except DOCUMENTED:
        return
    for obs in observations:
        for call in ("choose", "observe"):
            try:
                policy.choose() if call == "choose" else policy.observe(*obs)
            except ValueError:
                pass


@FAST
@given(means=st.one_of(st.tuples(st.floats(-0.5, 1.5)), st.tuples(st.floats(0, 1), st.floats(0, 1)), junk),
       reward=st.one_of(st.sampled_from(["bernoulli", "acceptance"]), junk),
       gamma=st.one_of(st.integers(-1, 80), st.tuples(st.integers(0, 5), st.integers(0, 5)), junk),
       switch_at=st.one_of(st.tuples(st.integers(-1, 30)), st.just(()), junk),
       costs=st.one_of(st.none(), st.tuples(st.floats(-1, 2), st.floats(-1, 2)), junk),
       rounds=st.one_of(st.integers(-1, 30), junk_size), seeds=st.one_of(st.integers(-1, 4), junk_size))
@example(means=(0.0,), reward="bernoulli", gamma=4, switch_at=(), costs=False, rounds=1, seeds=1)  # found: len(False)
def test_simulator(means, reward, gamma, switch_at, costs, rounds, seeds):
    try:
        env = Environment(means, reward=reward, gamma=gamma, switch_at=switch_at, costs=costs)
        result = simulate(lambda b, rng: POLICIES["thompson"](env.num_arms, rng=rng, batch=b), env, rounds, seeds)
    except ValueError:
        return
    assert result.regret.shape == (seeds,) and np.all(result.regret >= -1e-9)


OPTIONS = ["--policy", "--means", "--rounds", "--seeds", "--seed", "--reward", "--gamma", "--switch-every",
           "--switch-at", "--costs", "--objective", "--likelihood", "--discount", "--cd-delta", "--cd-threshold",
           "--cd-warmup", "--restart", "--fixed-arm", "--json"]
VALUES = st.one_of(st.text(max_size=6), st.sampled_from(["0", "1", "-1", "0.5", "0.3,0.7", "nan", "1e9", "3,3",
                                                         "all", "ucb1", "fixed", "acceptance", "throughput", ""]))


def exit_status(argv) -> int:
    try:
        return main(argv)
    except SystemExit as e:  # argparse's own errors
        return e.code


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(OPTIONS), VALUES), max_size=5))
def test_cli_bandit_sim_arguments(capsys, pairs):
    argv = ["bandit-sim"] + [s for pair in pairs for s in pair]
    argv += ["--rounds", "20", "--seeds", "2"]  # the last occurrence wins: keeps every run short
    status = exit_status(argv)
    err = capsys.readouterr().err.strip()
    assert status in (0, 2), (argv, err)
    if status == 2:
        assert len(err.splitlines()) == 1 and "Traceback" not in err, (argv, err)


GENERATE_OPTIONS = ["--gamma", "--temperature", "--top-k", "--top-p", "--max-new-tokens", "--seed", "--policy",
                    "--backend", "--draft", "--json", "--no-speculation", "--no-chat"]


class FakeEngine:
    """Stands in for the model: the fuzz checks the CLI's own parsing and checks, in microseconds."""

    rank = 0  # one process: this rank prints

    def generate(self, prompt, **kw):
        return {"text": "ok", "tokens": [1], "new_tokens": 1, "tokens_per_s": 1.0, "steps": 1, "acceptance": 0.5,
                "arm_pulls": {}, "arm_acceptance": {}, "step_latency_ms": {"p50": 1.0, "p90": 1.0}, "wall_s": 1.0,
                "interrupted": False}


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(max_size=8), st.lists(st.tuples(st.sampled_from(GENERATE_OPTIONS), VALUES), max_size=5))
@example(prompt="", pairs=[("--json", "\r0")])  # found by CI: argparse quoted the \r into a second line
def test_cli_generate_arguments(capsys, prompt, pairs):
    import flashspec.engine

    argv = ["generate", prompt] + [s for pair in pairs for s in pair]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(flashspec.engine, "engine_class", lambda backend: lambda *a, **k: FakeEngine())
        status = exit_status(argv)
    err = capsys.readouterr().err.strip()
    assert status in (0, 2), (argv, err)
    if status == 2:
        assert len(err.splitlines()) == 1 and "Traceback" not in err, (argv, err)
