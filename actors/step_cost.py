"""How long a step takes on this machine, learned from the engine's own steps. Pure: no torch, no trio.

Owns: a least-squares fit, over the last `WINDOW` steps with prompt tokens and the last
`WINDOW` without (seeded by the runner's timed start-up steps), of

    seconds ≈ base + per_decode_row * decode_rows + per_prefill_token * prefill_tokens
              + prompt_step * (1 if prefill_tokens else 0)

and the rule the scheduler core asks of it (`prefill_allowance`): how many prompt tokens may
ride in a step beside `decode_rows` streaming requests so that the step takes at most `stretch`
times what those decodes take alone (`spare_seconds`: that time; `allowances` shares it with a
vision encoder's slice while an image waits to be encoded). And when that rule gives way
(`is_burst`): a burst of prompts waiting to start.

Why a time budget and not a token count: a stream's gap between two chunks is one step, and what
a prompt token costs differs by machine, model, dtype and quantization, so it is measured here,
from the steps already run, and follows the machine as it changes (the window forgets old
steps). Until the fit has seen `MIN_STEPS` steps of both kinds, or when it comes out
nonsensical, it answers None and the scheduler keeps its fixed token budget.
"""

from __future__ import annotations

from collections import deque

WINDOW = 32  # steps of each kind the fit remembers (with prompt tokens, without): it follows the machine
MIN_STEPS = 3  # steps of each kind before the fit is trusted
OUTLIER_FACTOR = 3.0  # a step more than this far off the fit, either way, is not learnt from...
OUTLIER_RUN = 8  # ...unless this many come in a row: then the fit starts over
# Features are scaled to about 1 so the 3x3 system is well conditioned.
_ROW_SCALE = 32.0
_TOKEN_SCALE = 256.0
# A tie-breaker, not a belief: where the steps seen do not tell the costs apart (all of them at
# 32 rows and ~64 prompt tokens, say), the fit leans on a weak prior of no fixed cost and a
# decode row costing what a prompt token does. Heavier priors (1e-3 and up) biased the fixed
# cost towards 0 and halved the allowance in the c=32 simulation (tests/unit/test_step_budget.py).
_PRIOR_WEIGHT = 1e-5
BURST_RATIO = 4  # prompts waiting to start per stream, at least, for a burst


def is_burst(startable: int, streams: int) -> bool:
    """Several prompts wait to start (`startable`: waiting, within max_num_seqs), at least
    BURST_RATIO per stream: one step starts them all, as if nobody streamed
    (SchedulerConfig.burst_tokens). Started a prompt a step by the time budget instead, a burst
    of 31 beside one stream took ~45 steps at c=32 here; they then finished one a step as they
    had started, and every later step of the closed loop ran ~19 decode rows where the batch
    holds 32: 0.63-0.72 of the bare step's tokens/s against 0.85 with the burst in one step.
    The cost: one long gap for the few streams beside the burst, and the burst's first tokens
    come when all of it is in (docs/performance.md, "A burst of arrivals in one step")."""
    return startable > 1 and startable >= BURST_RATIO * streams


class PromptTokens:
    """The prompt tokens one step still has to hand out, and the prompt chunks it may still
    carry (`chunks`, None: any). A single token (a decode) is never held back."""

    def __init__(self, left: int, chunks: int | None = None) -> None:
        self.left = left
        self.chunks = chunks

    def take(self, wanted: int) -> int:
        if wanted <= 1:
            return wanted
        if self.chunks == 0:
            return 0
        granted = min(wanted, self.left)
        self.left -= granted
        if granted and self.chunks is not None:
            self.chunks -= 1
        return granted


# A fixed 512-token budget lets one step carry a 512-token prefill chunk, which takes ~0.5 s on a
# 2-core CPU against ~0.1 s for a decode step of 32 rows, so one gap in many is 5-6x the usual
# one; on a GPU the same 512 tokens cost next to nothing. Hence a budget in time, measured here.
# Sarathi-Serve derives its token budget from a time-between-tokens target the same way.
class StepCostModel:
    def __init__(self, seed: tuple[tuple[int, int, float], ...] = (), window: int = WINDOW) -> None:
        # Two windows, so a long run of decode-only steps (one stream) does not push out every
        # step that showed what a prompt token costs, and the other way round.
        self._with_prompt: deque[tuple[float, float, float]] = deque(maxlen=window)  # (rows, tokens, s), scaled
        self._decode_only: deque[tuple[float, float, float]] = deque(maxlen=window)
        self._coef: tuple[float, float, float, float] | None = None  # base, per row, per token, per prompt step (seconds)
        self._stale = True
        self._outliers = 0  # steps in a row far off the fit
        for rows, tokens, seconds in seed:  # the runner's timed start-up steps
            self.observe(rows, tokens, seconds)

    def observe(self, decode_rows: int, prefill_tokens: int, seconds: float) -> None:
        """Record one step: `decode_rows` requests fed one token, plus `prefill_tokens` prompt tokens."""
        if seconds <= 0 or decode_rows + prefill_tokens == 0:
            return
        if self._is_outlier(decode_rows, prefill_tokens, seconds):
            return
        window = self._with_prompt if prefill_tokens else self._decode_only
        window.append((decode_rows / _ROW_SCALE, prefill_tokens / _TOKEN_SCALE, seconds))
        self._stale = True  # refit when next asked

    def _is_outlier(self, decode_rows: int, prefill_tokens: int, seconds: float) -> bool:
        """A step far off the fit (another process took the cores for a while, a GC pause) says
        nothing about step sizes, and one 3 s step would skew the fit for a whole window. Off
        the fit OUTLIER_RUN times running, though, the machine itself changed: learn again."""
        expected = self.predict(decode_rows, prefill_tokens)
        if expected is None or expected <= 0 or expected / OUTLIER_FACTOR <= seconds <= expected * OUTLIER_FACTOR:
            self._outliers = 0
            return False
        self._outliers += 1
        if self._outliers < OUTLIER_RUN:
            return True
        self._with_prompt.clear()
        self._decode_only.clear()
        self._outliers = 0
        return False

    def predict(self, decode_rows: int, prefill_tokens: int) -> float | None:
        """Seconds a step of this size is expected to take; None while the fit is not trusted."""
        coef = self._fit()
        if coef is None:
            return None
        base, per_row, per_token, prompt_step = coef
        return base + per_row * decode_rows + per_token * prefill_tokens + (prompt_step if prefill_tokens else 0.0)

    def predict_verify(self, decode_rows: int, draft_tokens: int) -> float | None:
        """Seconds a step of `decode_rows` decode rows is expected to take when one of them also
        verifies `draft_tokens` drafted tokens. Alone, a verify step is no prompt chunk: on a
        CPU the compiled few-token graph runs it (runners/native/decode_graph.py), on CUDA a row
        per token of the step's graph, so its tokens cost as decode rows do, without a prompt
        step's fixed cost (`prompt_step`, 31 ms against a 10.5 ms one-row decode step on the Xeon
        of ops/results/sweep-c1-c4-c16-c32-default-spec-auto-llama-server-tfserve-2026-11-27-xeon-amx.json,
        where counting it left `auto` never drafting at one stream). Beside other rows the step
        runs as one with a prompt chunk (the mixed graph) and pays it."""
        if decode_rows <= 1:
            return self.predict(1 + draft_tokens, 0)
        return self.predict(decode_rows, draft_tokens)

    def coefficients_ms(self) -> dict[str, float] | None:
        """The fit as the step log prints it (milliseconds; None while it is not trusted)."""
        coef = self._fit()
        if coef is None:
            return None
        return dict(zip(("base", "per_row", "per_token", "prompt_step"), (round(c * 1e3, 3) for c in coef)))

    # The runner reports a vision encoder's seconds apart from the forward's, so the steps the
    # fit learns from are the forwards alone.
    def allowances(self, held: int, stretch: float | None, budget: int, floor: int, encoding: bool) -> tuple[int, float | None]:
        """A step's prompt tokens (of `budget`, at least `floor`), and the seconds of a vision
        encoder's work it grants (None: no limit), with `held` requests streaming (0: none,
        nobody waits between chunks, so a prompt gets the whole budget and an encoder runs
        whole). The step's spare time goes to prompts; while an image waits to be encoded
        (`encoding`), half of it to its encoder (which runs a block at the least: a block of a
        small tower can take all of that half) and half to prompts, so a prompt's chunks go on
        beside the encoder's. An image admitted in a step that did not expect it gets the
        spare time too."""
        if stretch is None or not held:
            return budget, None
        # Sized by all requests held, not only those decoding: a burst of prompts may take the
        # step to what all of them decoding will take, so it clears.
        spare = self.spare_seconds(held, stretch)
        coef = self._fit()
        if spare is None or coef is None:
            return budget, spare  # prompt tokens cost next to nothing here
        prompt_s = spare / 2 if encoding else spare
        return min(budget, max(_prompt_tokens(prompt_s, coef), floor)), spare - prompt_s if encoding else spare

    def prefill_allowance(self, decode_rows: int, stretch: float) -> int | None:
        """Prompt tokens a step with `decode_rows` decodes may carry so it takes at most
        `stretch` x the decodes alone. None while the fit is not trusted."""
        spare = self.spare_seconds(decode_rows, stretch)
        coef = self._fit()
        return None if spare is None or coef is None else _prompt_tokens(spare, coef)

    # Asks only that the decodes' own time be positive (not the whole fit): prompt tokens that
    # cost next to nothing leave it standing.
    def spare_seconds(self, decode_rows: int, stretch: float) -> float | None:
        """The seconds a step with `decode_rows` decodes may spend on other work (prompt tokens,
        a vision encoder's slice) so it takes at most `stretch` x the decodes alone. None while
        the fit is not trusted."""
        coef = self._solved()  # a prompt token's cost may be next to nothing here: the decodes' is what counts
        if coef is None:
            return None
        base, per_row, _, _ = coef
        decode_alone = base + per_row * decode_rows
        return (stretch - 1.0) * decode_alone if decode_alone > 0 else None

    def _fit(self) -> tuple[float, float, float, float] | None:
        coef = self._solved()
        return coef if coef and coef[2] > 0 else None

    def _solved(self) -> tuple[float, float, float, float] | None:
        if self._stale:
            self._coef, self._stale = self._solve(), False
        return self._coef

    def _solve(self) -> tuple[float, float, float, float] | None:
        if len(self._with_prompt) < MIN_STEPS or len(self._decode_only) + sum(1 for r, _, _ in self._with_prompt if r) < MIN_STEPS:
            return None
        steps = [*self._with_prompt, *self._decode_only]
        per_token = sum(s for _, _, s in steps) / sum(r * _ROW_SCALE + t * _TOKEN_SCALE for r, t, _ in steps)
        ata, aty = _normal_equations(steps, (0.0, per_token * _ROW_SCALE, per_token * _TOKEN_SCALE, 0.0))
        # A prompt step's fixed cost is told from the base cost by decode-only steps (the start-up
        # calibration runs two).
        solved = _solve_linear(ata, aty) if len(self._decode_only) >= 2 else None
        # Kept only where it is more than a one-row decode step costs: a smaller one (a CPU's
        # Python work to build a prompt chunk) moves the allowance by less than the stretch's
        # own slack, and a per-token cost carries it as the CPU figures were measured with.
        if solved is None or solved[3] < solved[0] + solved[1] / _ROW_SCALE:
            solved = _solve_linear([row[:3] for row in ata[:3]], aty[:3])  # the fit without it
        if solved is None:
            return None
        base, per_row, per_token, prompt_step = (*solved, 0.0)[:4]
        return base, per_row / _ROW_SCALE, per_token / _TOKEN_SCALE, prompt_step


# `prompt_step` is what a step pays for carrying any prompt tokens at all. On a CPU it is about
# nothing (the fit drops it when it comes out under a one-row decode step's cost). On a GPU it
# was most of the step: a decode-only step replayed a CUDA graph (3.7 ms for the embedded model's
# shape on an H100) while a step with a prompt chunk ran eager, launch-bound (23-28 ms whatever
# the chunk: `ops/results/gpu-check-first-run-2026-11-26-h100.json`). Fitted as a per-token
# cost, that fixed cost made prompt tokens look ~40x dearer than they are, the allowance came out
# a block or two, and every prompt went in several eager steps: the server ran 0.12-0.18 of the
# bare CUDA-graph step at c >= 8. So a step that must pay `prompt_step` carries prompt tokens
# worth at least that much time, and a prompt goes in one step. (Steps with prompt chunks now
# replay as CUDA graphs too, native/cuda_graphs.py; the cost stays for those too large for a
# bucket, and for any model path whose decode steps are graphs and prompts not.)
def _prompt_tokens(seconds: float, coef: tuple[float, float, float, float]) -> int:
    """Prompt tokens worth `seconds` of a step's time, after the step's fixed cost of carrying
    any. Where that cost is more than `seconds` (a GPU's eager step beside a CUDA-graph decode),
    no chunk keeps the step within the stretch: the step then carries tokens worth at least its
    fixed cost, so the stall buys a whole prompt rather than a block of one. The same floor
    holds from half of `seconds` up: there what is left after the fixed cost would be a sliver
    that pays the whole fixed cost again each step (a compiled CPU step beside a prompt chunk
    pays ~20-30 ms over a 55-85 ms decode step; chunks sized without the floor read no
    different at c=32, docs/performance.md "One prompt chunk a step")."""
    _, _, per_token, prompt_step = coef
    return int(max(seconds - prompt_step, prompt_step) / per_token)


def _normal_equations(steps: list[tuple[float, float, float]], prior: tuple[float, ...]) -> tuple[list[list[float]], list[float]]:
    """(A^T A + w I, A^T y + w prior) over the rows (1, rows, tokens, any tokens); the fit
    without the last feature is their leading 3x3 block. Built once a fit: the scheduler refits
    on the event loop before every step it plans."""
    weight = _PRIOR_WEIGHT * len(steps)
    ata = [[weight if i == j else 0.0 for j in range(4)] for i in range(4)]
    aty = [weight * p for p in prior]
    for rows, tokens, seconds in steps:
        x = (1.0, rows, tokens, 1.0 if tokens else 0.0)
        for i in range(4):
            aty[i] += x[i] * seconds
            row = ata[i]
            for j in range(4):
                row[j] += x[i] * x[j]
    return ata, aty


def _solve_linear(a: list[list[float]], b: list[float]) -> tuple[float, ...] | None:
    """Gaussian elimination with partial pivoting for a small system; None when it is singular."""
    n = len(b)
    m = [[*row, rhs] for row, rhs in zip(a, b)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-12:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(col + 1, n):
            f = m[r][col] / m[col][col]
            for c in range(col, n + 1):
                m[r][c] -= f * m[col][c]
    out = [0.0] * n
    for r in reversed(range(n)):
        out[r] = (m[r][n] - sum(m[r][c] * out[c] for c in range(r + 1, n))) / m[r][r]
    return tuple(out)
