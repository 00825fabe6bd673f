"""What runs in the JupyterHub process: the spawners (:mod:`.spawner`, :mod:`.slurm_spawner`,
their queue client :mod:`.spawner_queue`), their GPU profiles (:mod:`.profiles`), the single-user
command line (:mod:`.singleuser_command`) and the hub's pages (:mod:`.stop_notice`,
``templates/``). Needs the ``[hub]`` extra (jupyterhub)."""
