"""The JupyterHub scope of the scheduler's admins, shared by the service (which checks a caller's
token for it) and the hub's spawner (which grants it to an admin's server token); here so that
the hub needs nothing of the service."""

ADMIN_SCOPE = "custom:gpusched:admin"
