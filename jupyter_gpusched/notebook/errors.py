"""The errors of the notebook client: what the service refused (or could not be reached), and a
``function=`` job that raised or ended without a result.

Apart from :mod:`.client` and :mod:`.job` because both raise them, and a Job is made by a Client:
here neither module has to import the other for its errors."""

from __future__ import annotations


class GPUSchedError(Exception):
    """An error from the scheduler service (``status``: the HTTP status, None when the service
    could not be reached) or from using the client; ``field`` names the request field at fault."""

    def __init__(self, message: str, field: str | None = None, status: int | None = None):
        super().__init__(message)
        self.message, self.field, self.status = message, field, status

    def __str__(self) -> str:
        where = f" (field {self.field!r})" if self.field else ""
        return f"{self.message}{where}"


class JobFailedError(GPUSchedError):
    """A ``function=`` job raised, or ended without a result. ``remote_traceback``: the job's
    traceback as text; ``__cause__`` is the job's exception when it could be unpickled."""

    def __init__(self, message: str, remote_traceback: str | None = None):
        super().__init__(message)
        self.remote_traceback = remote_traceback
