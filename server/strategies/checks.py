"""What an aggregation rule made of one client's update: the per-client record.

A robust rule may shrink an update (a norm bound), weigh it less, or leave it out (Krum).
Each :class:`UpdateCheck` says which and why, so the engine can record the reason with the
client's participation (``geofl runs show``). A rule that decides when the update arrives
(clipping) fills it in at once; one that must see every update first (Krum, trimmed mean)
fills it in when the round's aggregate is taken, and the engine records it again then.

The record is deliberately rule-neutral (a norm, a scale, used or not) so that other
per-client steps, such as the clipping of differential privacy, can report through it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["UpdateCheck"]


@dataclass
class UpdateCheck:
    """One update as a rule judged it (mutable: deferred rules decide at aggregation).

    Attributes
    ----------
    rule
        The rule's registry name (``clip``, ``krum``, ...).
    norm
        L2 norm of the update as received (NaN until a rule measured it): of its float
        tensors for the clipping rules, of every coordinate for the spilled rules.
    scale
        Factor its float tensors entered the aggregate with: 1 unchanged, < 1 shrunk, 0
        when it was left out.
    used
        Whether the update entered the aggregate at all.
    reason
        Why it was changed, for the participation record; None when it was used as sent.
    """

    rule: str
    norm: float = float("nan")
    scale: float = 1.0
    used: bool = True
    reason: str | None = None

    def shrink(self, scale: float, reason: str) -> None:
        """The update was used, its float tensors multiplied by ``scale``."""
        self.scale, self.reason = scale, reason

    def leave_out(self, reason: str) -> None:
        """The update was not used in the aggregate."""
        self.scale, self.used, self.reason = 0.0, False, reason
