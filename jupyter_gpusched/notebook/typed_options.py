"""Options a person types, on the command line (``jupyter gpusched submit``) and in the
``%%gpujob`` magic, read the same way by both (argparse ``type=`` functions).

A duration typed there carries its unit: ``--walltime 120`` means 120 *minutes* to a Slurm
user (``sbatch --time=120``) and 120 seconds to the API, so a bare number is refused with the
ways to write it. The API and the Python client keep taking numbers as seconds.
"""

from __future__ import annotations

import argparse
import re

_BARE_NUMBER = re.compile(r"\s*[0-9]+(\.[0-9]*)?\s*")


def duration_with_unit(text: str) -> str:
    """``text`` as it is, unless it is a number without a unit (argparse's type error)."""
    if _BARE_NUMBER.fullmatch(text):
        number = text.strip()
        raise argparse.ArgumentTypeError(
            f"{number!r} has no unit: write {number}m for minutes (what Slurm's --time={number} "
            f"means), {number}s for seconds, or a duration such as 2h or 1d"
        )
    return text
