"""The tool-call hint of a drawn agent trace, drawn apart from the session's true continuation.

Why (issue 45): a generator knows which replies its sessions continue after. Marking exactly
those as tool calls makes the hint an oracle: "tool call" would mean "the session comes back"
with certainty, and a policy reading it would be told the future. In a real agent a serving
system learns that a reply is a tool call when the reply is decoded, and some of those calls
never return; some continuations also follow a reply that carried no tool call. So the
generators keep the drawn continuation (the next message is a tool output) as the truth, and
draw the hint from it with two published rates:

- A session's last reply is a tool call that never returned (the harness cut the loop: a
  command timeout, the context or cost limit, an error, a format failure) with probability
  `CUT_SESSION_SHARE`. Source: SWE-agent's exit statuses on SWE-Bench Pro, 4 models x 730
  tasks = 2,920 trajectories, nilenso's analysis (table "0. Resolution and Submission"),
  https://nilenso.github.io/swe-bench-pro-cost-token-time-analysis/reference.html
  : 2,214 ended cleanly by the model's own `submit`; 530 were auto-submitted after an error
  condition the harness recorded (command timeout, context overflow, cost limit, format error)
  and 176 never submitted, so 706 / 2,920 = 24.2 % of sessions ended on a call the harness
  abandoned. (Benchmark runs, not production traffic: the closest public count we found.)
- A session that continues had one of its replies interrupted by the user (cut while it was
  decoded, so no tool call is known; the user's next message continues the session) with
  probability `INTERRUPTED_SESSION_SHARE`. Source: Anthropic, "Measuring AI agent autonomy in
  practice" (18 Feb 2026), https://www.anthropic.com/research/measuring-agent-autonomy :
  users interrupt Claude Code in about 5 % of turns (new users) rising to about 9 %
  (experienced, 750+ sessions); we take the new users' 5 %, the lower figure (a Claude Code turn
  is one agent run on one user prompt, a drawn session here).

Every other reply's hint is the truth. Draws are per row from the generator's own stream, in
row order, so the same seed gives the same bits and a longer trace extends a shorter one.
"""

from __future__ import annotations

import numpy as np

__all__ = ["CUT_SESSION_SHARE", "INTERRUPTED_SESSION_SHARE", "draw_tool_hints"]

#: Share of agent sessions whose last call was a tool call the harness abandoned (706 / 2,920:
#: SWE-agent on SWE-Bench Pro, nilenso's analysis; module docstring).
CUT_SESSION_SHARE = 706 / 2920
#: Share of continuing sessions with one reply interrupted by the user (Anthropic, Claude Code,
#: new users: about 5 % of turns; module docstring).
INTERRUPTED_SESSION_SHARE = 0.05


def _per_reply_interrupt(continues: np.ndarray, session: np.ndarray) -> np.ndarray:
    """Per continuing reply, the chance of an interrupt that gives its session one in
    `INTERRUPTED_SESSION_SHARE` on average: 1 - (1 - share)^(1/k), k = the session's
    continuing replies (rows grouped by session)."""
    _, inverse = np.unique(session, return_inverse=True)
    k = np.bincount(inverse, weights=continues.astype(np.float64))[inverse]
    return np.where(continues, 1.0 - (1.0 - INTERRUPTED_SESSION_SHARE) ** (1.0 / np.maximum(k, 1)),
                    0.0)  # fmt: skip


def draw_tool_hints(
    continues: np.ndarray, session: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """Whether each reply is hinted as a tool call, given whether its session truly continues.

    `continues[i]`: the reply is followed by a tool output in its session (the drawn truth);
    `session[i]`: its session, rows grouped by session. One uniform per row from `rng`.
    """
    continues = np.asarray(continues, bool)
    u = rng.random(continues.size)
    interrupted = u < _per_reply_interrupt(continues, np.asarray(session))
    cut = ~continues & (u < CUT_SESSION_SHARE)
    return (continues & ~interrupted) | cut
