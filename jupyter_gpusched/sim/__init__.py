"""Trace replay: the engine of :mod:`jupyter_gpusched.core` run in simulated time."""
