"""The bands in which the service records a notebook server's GPU utilization over time.

The service keeps no sample-by-sample series (a server sampled every 10 s for a month is a quarter
of a million rows): it records *runs* of consecutive samples whose utilization stayed in one band
(``service/utilization_record.py``), each with its highest sample, and the idle-timeout what-if
(``sim/reaper_whatif.py``) replays those runs. The bands are fine where idle thresholds are set:
a what-if whose ``idle_threshold`` is one of :data:`BAND_EDGES` sees every run exactly as busy or
idle as the samples in it were; with another threshold a run counts as busy when its highest
sample is at or above it.
"""

from __future__ import annotations

from bisect import bisect_right

# Fine below 20%, where idle thresholds are set; one band above, so that a busy GPU whose
# utilization swings (40%, 60%, 45% ...) is one run per busy stretch, not a row per sample.
BAND_EDGES = (1.0, 2.0, 5.0, 10.0, 20.0)  # percent


def band(utilization: float) -> int:
    """The band of ``utilization`` (percent): 0 for [0, 1), 1 for [1, 2), ... 5 for [20, 100]."""
    return bisect_right(BAND_EDGES, utilization)
