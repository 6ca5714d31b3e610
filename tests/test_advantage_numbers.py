"""Advantages against a float64 reference over random batches (ties, all-equal groups, values like 1/3, None rows,
reward magnitudes 1e-6 to 1e6), the equal-rewards cases that used to blow up, and the run state of a run resumed in
the middle of a generation buffer against the uninterrupted run's."""

import json
import math
import zlib

import numpy as np
import pytest
from test_advantages import _record, _trainer
from test_speedups import tiny_model_dir  # noqa: F401 - the fixture, shared

G = 4
REL_TOL = 1e-6  # the documented tolerance: rewards within a millionth of the batch's largest |reward| are equal
EPS = 1e-4  # TRL's std epsilon


def reference(rewards, group_size, baseline, scale, ema=None):
    """The advantages as documented (grpokit/advantages.py), in float64 numpy, written from the definitions."""
    r = np.asarray(rewards, dtype=np.float64)
    valid_all = r[~np.isnan(r)]
    tol = REL_TOL * (np.abs(valid_all).max() if valid_all.size else 0.0)
    batch_std = np.std(valid_all, ddof=1) if valid_all.size > 1 else math.nan
    batch_flat = valid_all.size < 2 or valid_all.max() - valid_all.min() <= tol
    out = np.zeros_like(r)
    for g in range(len(r) // group_size):
        group = r[g * group_size:(g + 1) * group_size]
        ok = ~np.isnan(group)
        v = group[ok]
        flat = v.size < 2 or v.max() - v.min() <= tol
        if baseline == "group_mean":
            base = np.full(group_size, v.mean() if v.size else math.nan)
        elif baseline == "group_median":
            base = np.full(group_size, np.median(v) if v.size else math.nan)
        elif baseline == "leave_one_out":
            base = np.array([(v.sum() - x) / (v.size - 1) if v.size > 1 else x for x in group])
        else:
            base = np.full(group_size, ema[g])
        adv = group - base
        if scale == "group":
            adv = adv / ((np.std(v, ddof=1) if v.size > 1 else math.nan) + EPS)
        elif scale == "batch":
            adv = adv / (batch_std + EPS)
        if flat and (baseline != "exponential_moving_average" or scale == "group"):
            adv[:] = 0.0
        if baseline == "exponential_moving_average" and scale == "batch" and batch_flat:
            adv[:] = 0.0
        adv[~ok] = 0.0
        out[g * group_size:(g + 1) * group_size] = np.nan_to_num(adv, nan=0.0)
    return out


def random_batch(rng, magnitude, groups=12):
    """A float32 batch mixing spread groups, ties, all-equal groups, 1/3 reached by different sums, and None rows."""
    third = [np.float32(1 / 3), np.float32(1) - np.float32(2 / 3), np.float32(0.1) + np.float32(0.2) - np.float32(0.3)
             + np.float32(1 / 3), np.float32(2 / 6)]
    rows = []
    for _ in range(groups):
        kind = rng.integers(6)
        if kind == 0:
            group = rng.normal(size=G)
        elif kind == 1:
            group = rng.choice([0.0, 0.5, 1.0], size=G)  # ties
        elif kind == 2:
            group = np.full(G, rng.normal())  # all equal
        elif kind == 3:
            group = np.array(rng.choice(third, size=G), dtype=np.float64)  # equal, up to float32 rounding
        elif kind == 4:
            group = rng.normal(size=G)
            group[rng.integers(G)] = math.nan  # a completion no reward could score
        else:
            group = np.array([0.2, 0.2, 0.2, 0.7]) if rng.random() < 0.5 else np.array([0.2] * G)
        rows.append(np.asarray(group, dtype=np.float64) * magnitude)
    return np.concatenate(rows).astype(np.float32)


@pytest.mark.parametrize("magnitude", [1e-6, 1e-3, 1.0, 1e3, 1e6])
@pytest.mark.parametrize("baseline", ["group_mean", "group_median", "leave_one_out", "exponential_moving_average"])
@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_advantages_match_a_float64_reference_on_random_batches(magnitude, baseline, scale):
    import torch

    from grpokit.advantages import advantages

    rng = np.random.default_rng(zlib.crc32(f"{magnitude}{baseline}{scale}".encode()))
    for _ in range(3):
        batch = random_batch(rng, magnitude)
        ema = (rng.normal(size=len(batch) // G) * magnitude).astype(np.float32)
        ours = advantages(torch.from_numpy(batch), G, baseline, scale, torch.from_numpy(ema)).numpy()
        expected = reference(batch, G, baseline, scale, ema.astype(np.float64))
        atol = 1e-6 * (magnitude if scale == "none" else 1.0)
        np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=atol)
        assert np.isfinite(ours).all()


def test_equal_rewards_never_become_signal():
    import torch

    from grpokit.advantages import advantages, flat_batch, zero_spread_groups

    # 1/3 reached by two float32 sums (a third, and one minus two thirds), at magnitude 1e3: one ulp apart
    one = torch.tensor(1.0)
    third = torch.stack([one / 3, one - one * 2 / 3, one / 3, one - one * 2 / 3]) * 1e3
    assert third.unique().numel() > 1  # the rounding this is about
    for baseline in ("group_mean", "group_median", "leave_one_out"):
        assert (advantages(third, G, baseline, "group") == 0).all()
    assert zero_spread_groups(third, G).all()  # dynamic sampling drops it
    # a real spread at a small magnitude is a spread: kept, and scored
    small = torch.tensor([0.0, 1e-9, 2e-9, 3e-9])
    assert not zero_spread_groups(small, G).any() and advantages(small, G, scale_rewards="none").abs().max() > 0
    # EMA + 'batch' on a step where every completion failed: 0, not (0 - 0.6) / 1e-4
    failed = torch.zeros(8)
    ema = torch.tensor([0.6, 0.2])
    assert flat_batch(failed)
    assert (advantages(failed, G, "exponential_moving_average", "batch", ema) == 0).all()
    # ... while 'none' keeps the history's signal: r - b
    torch.testing.assert_close(advantages(failed, G, "exponential_moving_average", "none", ema),
                               torch.tensor([-0.6] * 4 + [-0.2] * 4))


def test_the_normaliser_does_not_divide_by_rounding():
    import torch

    from grpokit.advantages import Welford

    welford = Welford()
    one = torch.tensor(1.0)
    values = torch.stack([one / 3, one - one * 2 / 3] * 4) * 1e3
    welford.update(values)
    assert 0 < welford.std < 1e-3  # float rounding, not a spread
    out = welford.normalise(values)
    assert out.abs().max() < 1e-3  # only the mean subtracted: no 1e4-fold values


class PromptReward:
    """A reward of the prompt alone: regenerated completions score what the first ones did."""

    __name__ = "by_prompt"

    def __call__(self, prompts, completions, **kwargs):
        return [float(len(p[-1]["content"]) % 5) for p in prompts]


def test_a_run_resumed_mid_buffer_ends_with_the_uninterrupted_run_state(tiny_model_dir, tmp_path):  # noqa: F811
    """steps_per_generation 2: checkpoint-1 falls inside a generation buffer. The resumed run regenerates that batch
    and must count it once: its EMA baselines and normaliser end where the uninterrupted run's do, and TRL's
    generation schedule (a new batch every 2 steps) is the uninterrupted run's."""
    from grpokit.advantages import STATE_FILE, run_state

    options = {"baseline_type": "exponential_moving_average", "reward_normalization": True}
    settings = dict(steps=3, per_device_train_batch_size=4, steps_per_generation=2, save_strategy="steps",
                    save_steps=1)

    def generation_steps(trainer):
        steps, method = [], trainer._generate_and_score_completions

        def recorded(inputs):
            steps.append(trainer.state.global_step)
            return method(inputs)

        trainer._generate_and_score_completions = recorded
        return steps

    full = _trainer(tiny_model_dir, tmp_path / "full", PromptReward(), options, **settings)
    full_steps = generation_steps(full)
    full.train()
    assert full_steps == [0, 2]
    # inside the buffer: the state before the buffer's batch; at its end: the state after it
    assert json.loads((tmp_path / "full" / "checkpoint-1" / STATE_FILE).read_text())["normaliser"]["count"] == 0
    assert json.loads((tmp_path / "full" / "checkpoint-2" / STATE_FILE).read_text())["normaliser"]["count"] == 8

    resumed = _trainer(tiny_model_dir, tmp_path / "resumed", PromptReward(), options, **settings)
    resumed_steps = generation_steps(resumed)
    losses = _record(resumed, "_compute_loss")
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-1"))
    assert resumed_steps == [1, 2]  # the interrupted buffer once, then on the uninterrupted run's schedule
    assert len(losses) == 2  # steps 2 and 3 trained
    final, again = run_state(full).to_json(), run_state(resumed).to_json()
    assert final["normaliser"]["count"] == 16
    assert again["normaliser"] == pytest.approx(final["normaliser"])
    assert again["ema_baselines"] == pytest.approx(final["ema_baselines"])
