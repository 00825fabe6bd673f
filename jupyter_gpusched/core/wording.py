"""Words for numbers in the messages users read (reasons, refusals): "1 GPU", "2 GPUs"; and
an estimated start: "about 25 min (at 14:05 UTC)".

The web page words estimates in the browser: ``service/web/static/draw.js`` (``waitText``,
``estimateText``) follows :func:`wait_text` and :func:`estimate_text` rule for rule, and
``tests/test_page_browser.py`` checks the two agree on the same cases: change both together."""

from __future__ import annotations

from datetime import datetime, timezone


def gpus_text(count: float) -> str:
    """``count`` GPUs in words: ``1 GPU``, ``0 GPUs``, ``2 GPUs``, ``0.5 GPUs``."""
    return f"{count:g} GPU" + ("" if count == 1 else "s")


def estimate_text(
    start_now: bool, eta: float | None, reason: str | None, now: float, clock: bool = True
) -> str:
    """``POST api/estimate``'s answer in words, as the notebook, the spawn form and the CLI
    print it: ``starts now``; ``about 25 min (at 14:05 UTC): <reason>`` (``clock``: with the
    time; the date too when it is not ``now``'s day); ``waits: <reason>`` when there is no
    estimate."""
    if start_now:
        return "starts now"
    if eta is None:
        return f"waits: {reason}" if reason else "waits"
    text = "about " + wait_text(eta - now)
    if clock:
        moment = datetime.fromtimestamp(eta, timezone.utc)
        same_day = moment.date() == datetime.fromtimestamp(now, timezone.utc).date()
        text += f" (at {moment.strftime('%H:%M' if same_day else '%Y-%m-%d %H:%M')} UTC)"
    return f"{text}: {reason}" if reason else text


def wait_text(seconds: float) -> str:
    """A wait in words, as precise as a user plans with: ``1 min`` at least, ``25 min``,
    ``2 h 10 min`` (to 10 min from 2 h), ``3 days`` (from 2 days)."""
    minutes = max(1, round(seconds / 60))
    if minutes < 60:
        return f"{minutes} min"
    if minutes < 120:
        return f"1 h {minutes - 60} min" if minutes > 60 else "1 h"
    if minutes < 48 * 60:
        hours, rest = divmod(round(minutes / 10) * 10, 60)
        return f"{hours} h {rest} min" if rest else f"{hours} h"
    return f"{round(minutes / (24 * 60))} days"
