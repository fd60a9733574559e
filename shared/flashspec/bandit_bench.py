"""The standard bandit scenarios, their JSON reports and PNG regret curves (``flashspec bench bandit``)."""

from __future__ import annotations

import datetime
import json
import platform
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from . import __version__
from .bandits import POLICIES, BanditConfig
from .simulate import Environment, SimResult, bounds, simulate, switch_every

MEANS = (0.3, 0.7, 0.5)
ROUNDS = 10_000
SEEDS = 200


def run_policies(names, env: Environment, config: BanditConfig, rounds: int, seeds: int,
                 seed: int = 0) -> dict[str, SimResult]:
    """Simulate each named policy on ``env``, each with the same environment seed."""
    results = {}
    for name in names:
        make = POLICIES[name]
        results[name] = simulate(
            lambda batch, rng: make(env.num_arms, config, rng=rng, batch=batch),
            env, rounds, seeds, seed=seed, name=name,
        )
    return results


def report(results: dict[str, SimResult], env: Environment, config: BanditConfig, rounds: int,
           seeds: int, seed: int, command: str) -> dict:
    """The JSON object ``bandit-sim --json`` prints and ``bench bandit`` writes."""
    return {
        "command": command,
        "environment": {
            "means": list(env.means), "reward": env.reward, "gamma": env.gamma,
            "switch_at": list(env.switch_at), "costs": env.costs, "objective": env.objective,
            "free": list(env.free),
            "arm_values": env.values(np.array(env.means)).tolist(),
        },
        "rounds": rounds, "seeds": seeds, "seed": seed,
        "config": config.as_dict(),
        "bounds": bounds(env, rounds),
        "policies": {name: r.summary() for name, r in results.items()},
    }


def machine() -> dict:
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "flashspec": __version__, "python": platform.python_version(),
        "numpy": np.__version__, "platform": platform.platform(), "processor": platform.machine(),
    }


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    env: Environment
    config: BanditConfig
    policies: tuple[str, ...]

    def sim_command(self, rounds, seeds) -> str:
        e = self.env
        cmd = [f"flashspec bandit-sim --policy {' --policy '.join(self.policies)}",
               f"--means {','.join(map(str, e.means))} --rounds {rounds} --seeds {seeds}",
               f"--reward {e.reward}"]
        if e.reward == "acceptance":
            cmd.append(f"--gamma {e.gamma}")
        if e.switch_at:
            cmd.append(f"--switch-at {','.join(map(str, e.switch_at))}")
        if e.objective != "acceptance":
            cmd.append(f"--objective {e.objective}")
        if e.costs:
            cmd.append(f"--costs {','.join(map(str, e.costs))}")
        if e.free:
            cmd.append(f"--free {','.join(map(str, e.free))}")
        if self.config.likelihood != "bernoulli":
            cmd.append(f"--likelihood {self.config.likelihood}")
        return " ".join(cmd + ["--json"])


ALL = tuple(POLICIES)


def scenarios(rounds: int = ROUNDS) -> list[Scenario]:
    """The standard scenarios: the write-up's, its acceptance-fraction version, a piecewise-
    stationary one, and a cost-aware one where the cheaper draft is the faster."""
    base = BanditConfig()
    return [
        Scenario("stationary", "Bernoulli arms 0.3, 0.7, 0.5 (the write-up's simulation)",
                 Environment(MEANS), base, ALL),
        Scenario("acceptance", "acceptance fraction, G = 4 token trials per pull",
                 Environment(MEANS, reward="acceptance", gamma=4), base, ALL),
        Scenario("piecewise", "Bernoulli arms, means rotated by one arm every 2,000 rounds",
                 Environment(MEANS, switch_at=switch_every(2000, rounds)), base, ALL),
        Scenario("piecewise-free-one", "piecewise, with arm 0 (an n-gram draft) also scored when not pulled",
                 Environment(MEANS, switch_at=switch_every(2000, rounds), free=(0,)), base, ALL),
        Scenario("piecewise-free-all", "piecewise, every arm scored every round (full information)",
                 Environment(MEANS, switch_at=switch_every(2000, rounds), free=(0, 1, 2)), base, ALL),
        Scenario("throughput",
                 "acceptance G = 4, per-token 0.8, 0.6, 0.5 at step costs 1.0, 0.5, 0.7: tokens/s",
                 Environment((0.8, 0.6, 0.5), reward="acceptance", gamma=4, costs=(1.0, 0.5, 0.7),
                             objective="throughput"),
                 replace(base, objective="throughput", likelihood="token"),
                 ("ucb1", "thompson", "discounted-thompson", "cd-thompson", "fixed")),
    ]


def run_bench(out: Path, rounds: int, seeds: int, seed: int, command: str, plot: bool) -> list[Path]:
    """Run every scenario; write bandit_<name>.json (and .png); return the written paths."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for sc in scenarios(rounds):
        results = run_policies(sc.policies, sc.env, sc.config, rounds, seeds, seed)
        doc = report(results, sc.env, sc.config, rounds, seeds, seed, command)
        doc.update(scenario=sc.name, description=sc.description,
                   equivalent=sc.sim_command(rounds, seeds), machine=machine())
        path = out / f"bandit_{sc.name}.json"
        path.write_text(json.dumps(doc, indent=2) + "\n")
        written.append(path)
        if plot:
            written.append(plot_curves(results, sc, out / f"bandit_{sc.name}.png"))
        print(f"{sc.name}: " + ", ".join(
            f"{n} {r.regret.mean():.1f}" for n, r in results.items()), file=sys.stderr)
    return written


def plot_curves(results: dict[str, SimResult], sc: Scenario, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, r in results.items():
        t = np.arange(1, r.curve_mean.size + 1)
        ax.plot(t, r.curve_mean, label=f"{name} ({r.regret.mean():.1f})")
        ax.fill_between(t, r.curve_mean - r.curve_std, r.curve_mean + r.curve_std, alpha=0.15)
    for s in sc.env.switch_at:
        ax.axvline(s, color="grey", lw=0.5, ls=":")
    top = max(r.curve_mean[-1] for n, r in results.items() if n != "fixed")
    ax.set_ylim(0, 1.3 * top)
    ax.set_xlabel("round")
    unit = "tokens/s" if sc.env.objective == "throughput" else "reward"
    ax.set_ylabel(f"cumulative pseudo-regret ({unit})")
    ax.set_title(f"{sc.name}: {sc.description}", fontsize=9)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
