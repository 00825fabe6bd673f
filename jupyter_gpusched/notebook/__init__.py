"""What runs in a notebook server and its kernels: the server extension (:mod:`.serverext`), the
service client (:mod:`.client`), the ``%%gpujob`` magics (:mod:`.magics`), the queue widget
(:mod:`.widgets`) and the payloads they submit (:mod:`.payloads`). Imports neither the service
nor the hub. Needs the ``[notebook]`` extra."""
