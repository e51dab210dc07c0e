"""Search space encoding and the optimisers (skopt, random, grid)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from polltuned.optimiser import make_optimiser
from polltuned.optimiser.skopt_backend import SkoptOptimiser
from polltuned.optimiser.space import Space
from polltuned.policy.loader import load_policy
from polltuned.policy.schema import Policy
from polltuned.worlds.env import default_config


@pytest.fixture
def pol() -> Policy:
    return load_policy("sim-default")


def test_zero_is_off_is_an_explicit_switch(pol: Policy) -> None:
    sp = Space.from_policy(pol)
    d = sp.dim("net.core.busy_read")
    assert d.kind == "switch" and d.width == 2 and d.log
    base = default_config(pol)
    u_off = sp.encode(base)
    assert u_off[d.offset] == 0 and u_off[d.offset + 1] == 0
    u_on = sp.encode({**base, "net.core.busy_read": 50})
    assert u_on[d.offset] == 1
    assert sp.decode(u_on)["net.core.busy_read"] == 50


def test_log_scale_puts_small_values_far_apart(pol: Policy) -> None:
    d = Space.from_policy(pol).dim("net.core.busy_read")
    assert d.to_unit(10) - d.to_unit(1) > d.to_unit(200) - d.to_unit(100)


def test_conditional_knob_is_pinned_when_its_dependency_is_off(pol: Policy) -> None:
    sp = Space.from_policy(pol)
    base = default_config(pol)
    c = sp.canonical({**base, "sim0:napi_defer_hard_irqs": 10, "sim0:gro_flush_timeout": 0})
    assert c["sim0:napi_defer_hard_irqs"] == 0
    c2 = sp.canonical({**base, "sim0:napi_defer_hard_irqs": 10, "sim0:gro_flush_timeout": 20000})
    assert c2["sim0:napi_defer_hard_irqs"] == 10
    # the pinned knob does not make two configurations different trials
    assert sp.key_of({**base, "sim0:napi_defer_hard_irqs": 7}) == sp.key_of(base)


def test_small_integer_range_is_categorical(pol: Policy) -> None:
    d = Space.from_policy(pol).dim("kernel.timer_migration")
    assert d.kind == "cat" and d.choices == (0, 1)


def test_seeds_are_tried_one_knob_at_a_time(pol: Policy) -> None:
    sp = Space.from_policy(pol)
    base = default_config(pol)
    seeds = sp.seed_configs(base)
    changed = [{k for k in c if c[k] != base[k]} for c in seeds]
    assert {"net.core.busy_read"} in changed and {"net.core.busy_poll"} in changed
    # the deferral seed brings its dependency (gro_flush_timeout 20000 ns) along
    assert {"sim0:napi_defer_hard_irqs", "sim0:gro_flush_timeout"} in changed
    assert all(len(c) <= 2 for c in changed)


def test_the_seeds_together_are_one_more_trial_after_the_one_knob_seeds(pol: Policy) -> None:
    sp = Space.from_policy(pol)
    base = default_config(pol)
    joint = sp.joint_seed(base)
    assert joint is not None
    want = {k: pol.knobs[k].seeds[0] for k in pol.knobs if pol.knobs[k].seeds}
    assert len(want) >= 2 and all(joint[k] == v for k, v in want.items())
    assert all(joint[k] == base[k] for k in base if k not in want)
    assert sp.key_of(joint) not in {sp.key_of(c) for c in sp.seed_configs(base)}
    opt = SkoptOptimiser(sp, base, seed=0, initial_points=6, safety_limit=math.log(1.5))
    keys = [sp.key_of(opt.ask()) for _ in range(12)]
    one_knob = {sp.key_of(c) for c in sp.seed_configs(base)}
    assert sp.key_of(joint) in keys
    assert max(i for i, k in enumerate(keys) if k in one_knob) < keys.index(sp.key_of(joint))
    # one seeded knob: nothing more than its own seed; no seeds: nothing at all
    one = {k: v if k == "net.core.busy_read" else v.model_copy(update={"seeds": []}) for k, v in pol.knobs.items()}
    assert Space.from_policy(pol.model_copy(update={"knobs": one})).joint_seed(base) is None
    none = {k: v.model_copy(update={"seeds": []}) for k, v in pol.knobs.items()}
    assert Space.from_policy(pol.model_copy(update={"knobs": none})).joint_seed(base) is None
    # a conditional knob seeded with its dependency is already one one-knob seed: not a second trial
    pair = {k: v if "napi_defer_hard_irqs" in k or "gro_flush_timeout" in k else v.model_copy(update={"seeds": []})
            for k, v in pol.knobs.items()}
    sp_pair = Space.from_policy(pol.model_copy(update={"knobs": pair}))
    assert len(sp_pair.seed_configs(base)) == 2 and sp_pair.joint_seed(base) is None


def test_skopt_starts_with_a_space_filling_design_the_seeds_at_most_half(pol: Policy) -> None:
    base = default_config(pol)
    sp = Space.from_policy(pol)
    opt = SkoptOptimiser(sp, base, seed=0, initial_points=8, safety_limit=math.log(1.5))
    first = [opt.ask() for _ in range(8)]
    keys = [sp.key_of(c) for c in first]
    seeds = [sp.key_of(c) for c in sp.seed_configs(base)]
    seeded = [k for k in keys if k in seeds]
    assert 1 <= len(seeded) <= 4 and sp.key_of(base) not in keys   # extra candidates, half at most
    # without seeds the whole start is space-filling: the switch tried off and on, values spread over
    # the log range, every category
    knobs = {k: v.model_copy(update={"seeds": []}) for k, v in pol.knobs.items()}
    sp2 = Space.from_policy(pol.model_copy(update={"knobs": knobs}))
    opt2 = SkoptOptimiser(sp2, base, seed=0, initial_points=8, safety_limit=math.log(1.5))
    free = [opt2.ask() for _ in range(8)]
    assert not {sp2.key_of(c) for c in free} & set(seeds)
    br = [int(c["net.core.busy_read"]) for c in free]
    assert 2 <= sum(v == 0 for v in br) <= 6
    on = [v for v in br if v > 0]
    assert max(on) / min(on) >= 10
    assert {c["kernel.timer_migration"] for c in free} == {0, 1}


def test_random_and_grid_do_not_repeat(pol: Policy) -> None:
    sp = Space.from_policy(pol)
    base = default_config(pol)
    for name in ("random", "grid"):
        opt = make_optimiser(name, sp, base, seed=3)
        seen = set()
        for _ in range(25):
            c = opt.ask()
            k = sp.key_of(c)
            assert k not in seen, name
            seen.add(k)
            opt.tell(c, 0.0)


def test_failed_configuration_is_not_a_told_number(pol: Policy) -> None:
    sp = Space.from_policy(pol)
    opt = make_optimiser("random", sp, default_config(pol), seed=0)
    c = opt.ask()
    opt.tell_failed(c)
    assert opt.best() is None  # nothing was told
    with pytest.raises(ValueError):
        opt.tell(c, float("nan"))


def _fill(opt: SkoptOptimiser, sp: Space, n: int, rng: np.random.Generator) -> None:
    base = default_config_from(sp)
    for c in sp.sample_uniform(rng, n):
        full = {**base, **c}
        y = 0.3 * (full["net.core.busy_read"] == 0) + float(rng.normal(0, 0.05))
        opt.tell(full, y)


def default_config_from(sp: Space) -> dict[str, int | float | str]:
    return {d.key: d.off_value if d.kind != "cat" else d.choices[-1] for d in sp.dims}


def test_recommendation_prefers_repeated_evidence_over_one_lucky_window(pol: Policy) -> None:
    sp = Space.from_policy(pol)
    base = default_config(pol)
    opt = SkoptOptimiser(sp, base, seed=0)
    opt.set_noise(0.1)  # what the reference windows measured
    rng = np.random.default_rng(0)
    good = {**base, "net.core.busy_read": 50}
    lucky = {**base, "net.core.gro_normal_batch": 40, "kernel.timer_migration": 0}
    for c in sp.sample_uniform(rng, 12):
        opt.tell(c, 0.1 + float(rng.normal(0, 0.1)))
    for _ in range(4):
        opt.tell(good, -0.30 + float(rng.normal(0, 0.02)))
    opt.tell(lucky, -0.34)  # 0.04 better in one window, with window noise 0.1
    rec = opt.best()
    assert rec is not None and rec.config["net.core.busy_read"] == 50


def test_harm_is_remembered_and_the_model_bound_keeps_proposals_off_the_cliff(pol: Policy) -> None:
    sp = Space.from_policy(pol)
    base = default_config(pol)
    limit = math.log(1.5)
    opt = SkoptOptimiser(sp, base, seed=1, initial_points=1, safety_limit=limit)
    opt._design.clear()
    rng = np.random.default_rng(2)
    for _ in range(4):
        opt.tell(base, float(rng.normal(0, 0.03)))
    for v in (30, 50, 70):
        opt.tell({**base, "net.core.busy_read": v}, -0.5 + float(rng.normal(0, 0.03)))
    cliff = {**base, "net.core.busy_read": 180}
    opt.tell(cliff, limit + 1.0)   # broke the guard
    opt.tell({**base, "net.core.busy_read": 160}, limit + 0.9)
    d = sp.dim("net.core.busy_read")
    near_cliff = 0
    for _ in range(12):
        c = opt.ask()
        assert sp.key_of(c) != sp.key_of(cliff)
        if int(c["net.core.busy_read"]) >= 150:
            near_cliff += 1
        br = float(c["net.core.busy_read"])
        opt.tell(c, -0.5 if 20 <= br <= 100 else (limit + 1.0 if br >= 150 else 0.0))
    assert near_cliff <= 1
    rec = opt.best()
    assert rec is not None and 20 <= int(rec.config["net.core.busy_read"]) <= 100
    assert d.to_unit(float(rec.config["net.core.busy_read"])) < d.to_unit(150)


def test_categorical_knob_one_hot_and_sampled() -> None:
    from polltuned.policy.loader import policy_from_dict

    p = policy_from_dict({
        "name": "cat", "nic": "eth0", "probe": {"kind": "sim", "scenario": "nothing_helps"},
        "knobs": {"{nic}:irq_affinity": {"type": "categorical", "values": ["spread", "local", "remote"],
                                         "seeds": ["local"]},
                  "net.core.busy_read": {"min": 0, "max": 200, "zero_is_off": True, "scale": "log"}},
    }).resolve_nic()
    sp = Space.from_policy(p)
    d = sp.dim("eth0:irq_affinity")
    assert d.kind == "cat" and d.width == 3
    u = sp.encode({"eth0:irq_affinity": "remote", "net.core.busy_read": 0})
    assert list(u[d.offset:d.offset + 3]) == [0.0, 0.0, 1.0]
    seen = {c["eth0:irq_affinity"] for c in sp.sample_uniform(np.random.default_rng(0), 40)}
    assert seen == {"spread", "local", "remote"}
    base = {"eth0:irq_affinity": "spread", "net.core.busy_read": 0}
    assert {"eth0:irq_affinity": "local", "net.core.busy_read": 0} in sp.seed_configs(base)
