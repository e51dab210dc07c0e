"""Measuring through drift: the reference series and the log-ratio every window is told as.

On this VM one configuration's p99 moves 2-4x between consecutive windows and the defaults drift
by tens of percent within an hour (vm-bench.md §7, §14), so a trial is never compared with a number
measured minutes earlier. During the search the engine interleaves *reference* windows (the
baseline configuration) with trial windows, ``R R T T R T T R ...``, and a window measured at index
``t`` is told to the optimiser as

    y(t) = log J(t) - level(t),   level(t) = sum_j w_j r_j / sum_j w_j,  w_j = exp(-|t - t_j| / h)

the log-ratio to the baseline level *at that moment*, a kernel average of the reference windows
``r_j = log J`` around ``t`` (both sides once the next reference is measured; the told values are
revised then). The bandwidth ``h`` (in windows) is chosen by leave-one-out prediction of the
references themselves (absolute error over h in {1, 2, 4, 8, 16, 32, all}; the widest h within
10 % of the best error wins, so a narrow bandwidth must clearly earn its noise): when the
host drifts, the nearest references predict best and h is small (the trial is compared with its
neighbours); when it does not, every reference helps and h is large (a precise baseline instead
of a noisy neighbour). With fewer than four references all of them are averaged. A reference
window itself is told at the baseline configuration as its log-ratio to the level predicted from
the *other* references, so the model knows the baseline is 0 and how noisy it is.

Noise: the window-to-window standard deviation of log J is estimated from the successive
differences of the reference series and of the repeated windows of trial configurations (robust:
1.4826 x median |r[j+1] - r[j]| / sqrt 2: slow drift and single outlier windows barely move it),
shrunk towards a prior of 0.15 while there are few of them. The standard error of a trial's mean
log-ratio over n windows is ``sd * sqrt(1 + sum w^2 / (sum w)^2) / sqrt(n)`` (window noise plus the level's own noise).

A workload shift shows as a jump of the reference level: when the last two references sit more than
``max(3 x SE, log 1.3)`` away from the references before them (on the same side), ``shift()`` reports the index where
the new regime starts (windows before it describe another workload).

Pure, no I/O: built from (window index, log J) pairs, so a resumed session rebuilds it from the study.
"""

from __future__ import annotations

import bisect
import math
import statistics
from dataclasses import dataclass, field

PRIOR_SD = 0.15
PRIOR_WEIGHT = 2.0
BANDWIDTHS = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, math.inf)


def _kernel_mean(points: list[tuple[int, float]], at: int, h: float) -> tuple[float, float]:
    """(weighted mean, sum w^2 / (sum w)^2) of ``points`` around ``at`` with bandwidth ``h``."""
    ws = [1.0] * len(points) if math.isinf(h) else [math.exp(-abs(at - i) / h) for i, _ in points]
    tot = sum(ws)
    if tot <= 1e-300:  # every reference is far away: the nearest one
        _i, v = min(points, key=lambda p: abs(at - p[0]))
        return v, 1.0
    return sum(w * v for w, (_, v) in zip(ws, points)) / tot, sum(w * w for w in ws) / (tot * tot)


@dataclass
class ReferenceSeries:
    indices: list[int] = field(default_factory=list)
    logs: list[float] = field(default_factory=list)
    since: int = 0                       # first index of the current regime (after a shift)
    #: |log J| differences between back-to-back windows of one trial configuration (its repeats):
    #: more evidence of the window noise than the references alone give
    repeat_diffs: list[tuple[int, float]] = field(default_factory=list)
    _bw_key: tuple[int, int, int] = (-1, -1, -1)
    _bw: float = math.inf

    def add(self, index: int, log_j: float) -> None:
        if not math.isfinite(log_j):
            raise ValueError(f"non-finite reference value {log_j!r}")
        i = bisect.bisect(self.indices, index)
        self.indices.insert(i, index)
        self.logs.insert(i, log_j)

    def _active(self) -> list[tuple[int, float]]:
        return [(i, v) for i, v in zip(self.indices, self.logs) if i >= self.since]

    def __len__(self) -> int:
        return len(self._active())

    # ---------------------------------------------------------------- level at a window
    def bandwidth(self) -> float:
        """Kernel bandwidth in windows (math.inf = plain mean), by leave-one-out on the references."""
        act = self._active()
        if len(act) < 4:
            return math.inf
        key = (len(act), act[-1][0], self.since)
        if self._bw_key == key:
            return self._bw
        errs: dict[float, float] = {}
        for h in BANDWIDTHS:
            err = 0.0
            for k, (t, v) in enumerate(act):
                others = [(i, r) for j, (i, r) in enumerate(act) if j != k]
                err += abs(v - _kernel_mean(others, t, h)[0])
            errs[h] = err
        # the widest bandwidth that predicts about as well as the best one (within 10 %): a narrow
        # one must clearly earn its extra noise
        lo = min(errs.values())
        best = max(h for h, e in errs.items() if e <= lo * 1.10 + 1e-12)
        self._bw_key, self._bw = key, best
        return best

    def _level_w(self, index: int, exclude_self: bool = False) -> tuple[float, float] | None:
        act = self._active()
        if exclude_self:
            act = [(i, v) for i, v in act if i != index]
        if not act:
            return None
        return _kernel_mean(act, index, self.bandwidth())

    def level(self, index: int) -> float | None:
        lw = self._level_w(index)
        return None if lw is None else lw[0]

    def neighbours(self, index: int) -> list[float]:
        act = self._active()
        before = [v for i, v in act if i < index]
        after = [v for i, v in act if i > index]
        return ([before[-1]] if before else []) + ([after[0]] if after else [])

    def mean_level(self) -> float | None:
        act = self._active()
        return sum(v for _, v in act) / len(act) if act else None

    def y(self, index: int, log_j: float) -> float | None:
        """Log-ratio of a window at ``index`` to the baseline level then (None: no reference yet)."""
        lv = self.level(index)
        return None if lv is None else log_j - lv

    def reference_ys(self) -> list[tuple[int, float]]:
        """Each reference window as a log-ratio to the level the other references predict for it
        (the baseline's scatter around 0)."""
        out: list[tuple[int, float]] = []
        for i, v in self._active():
            lw = self._level_w(i, exclude_self=True)
            if lw is not None:
                out.append((i, v - lw[0]))
        return out

    # ---------------------------------------------------------------- noise
    def add_repeat(self, index: int, log_a: float, log_b: float) -> None:
        """Two windows of the same trial configuration measured a few windows apart."""
        self.repeat_diffs.append((index, abs(log_b - log_a)))

    def noise_sd(self) -> float:
        act = self._active()
        diffs = [abs(act[k + 1][1] - act[k][1]) for k in range(len(act) - 1)]
        diffs += [d for i, d in self.repeat_diffs if i >= self.since]
        if not diffs:
            return PRIOR_SD
        robust = 1.4826 * statistics.median(diffs) / math.sqrt(2.0)
        n = float(len(diffs))
        return math.sqrt((PRIOR_WEIGHT * PRIOR_SD ** 2 + n * robust ** 2) / (PRIOR_WEIGHT + n))

    def window_se(self, index: int) -> float:
        """Standard error of one window's y at ``index`` (its own noise and its level's)."""
        lw = self._level_w(index)
        level_share = lw[1] if lw is not None else 1.0
        return self.noise_sd() * math.sqrt(1.0 + level_share)

    def interval(self) -> int:
        """How many trial windows may pass before the next reference: as often as the drift
        demands. Few references yet: every 3; the leave-one-out bandwidth says the level wanders
        within a few windows: every 2; it barely moves (bandwidth 16 windows or more): every 6."""
        if len(self) < 5:
            return 3
        h = self.bandwidth()
        if h <= 4:
            return 2
        if h <= 8:
            return 4
        return 6

    # ---------------------------------------------------------------- workload shift
    def shift(self) -> int | None:
        """Index where a new regime starts, when the last two references jumped away from the rest."""
        act = self._active()
        if len(act) < 5:
            return None
        old = [v for _, v in act[:-2]]
        new = [v for _, v in act[-2:]]
        sd = self.noise_sd()
        se = sd * math.sqrt(1.0 / len(old) + 1.0 / len(new))
        gap = abs(sum(new) / 2 - sum(old) / len(old))
        same_side = (new[0] - sum(old) / len(old)) * (new[1] - sum(old) / len(old)) > 0
        if same_side and gap > max(3.0 * se, math.log(1.3)):
            return act[-2][0]
        return None

    def suspect(self) -> bool:
        """The last reference alone sits far from the ones before it (a shift, or one outlier
        window): worth a second reference at once to tell which, instead of waiting a whole interval."""
        act = self._active()
        if len(act) < 4:
            return False
        old = [v for _, v in act[:-1]]
        m = sum(old) / len(old)
        sd = self.noise_sd()
        return abs(act[-1][1] - m) > max(3.0 * sd * math.sqrt(1.0 + 1.0 / len(old)), math.log(1.3))

    def start_regime(self, index: int) -> None:
        self.since = index
