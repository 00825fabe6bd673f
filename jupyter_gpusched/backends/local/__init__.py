"""Jobs on this host: :mod:`.launcher` (the service's ``LocalLauncher``) starts each job under
:mod:`.runner` (``python -m jupyter_gpusched.backends.local.runner``)."""
