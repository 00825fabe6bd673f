"""The cluster from Slurm: ``nodes: slurm`` in the cluster file, and Slurm's node states, live.

A cluster file may leave its nodes to Slurm::

    nodes: slurm
    slurm:                      # all optional
      partition: gpu            # only this partition's nodes (default: every node with GPUs)
      gpu_model: H100           # for GPUs whose GRES has no type (default: the type, or "gpu")
      gpu_memory_gb: 80         # these, nvlink and pcie_switches apply to every node
      nvlink: all
      pcie_switches: 1
      slurm_conf: /etc/slurm/slurm.conf   # default: $SLURM_CONF, or Slurm's own default
      bin_dir: /usr/bin         # where scontrol is (default: $PATH)

:func:`cluster_document` reads ``scontrol show node --oneliner`` and turns every node with GPUs
into an entry of the cluster file: ``name``; ``gpus`` and ``gpu_model`` from its GRES
(``gpu:h100:4(S:0-1)``: 4 GPUs of model h100; a node with several GPU types gets the one it has
most of); ``labels`` from its features (``ib`` -> ``{ib: "true"}``, ``zone=a`` -> ``{zone: a}``);
``cpus`` (CPUTot), ``memory_gb`` (RealMemory); ``state`` from Slurm's state (see
:func:`engine_state`); and ``leaf`` from the tree topology (``scontrol show topology``, else
``topology.conf`` beside ``slurm.conf``): a node's leaf is the switch that lists it, the leaf's
spine the switch that lists the leaf (a deeper tree is cut there). Nodes without GPUs are left
out (the engine places GPU jobs only). The result goes to ``Cluster.from_dict`` like any
cluster file, so errors still name the file.

Slurm's node states follow into the engine while the service runs: :class:`SlurmNodeSync`
compares Slurm's states (``SlurmLauncher.node_states``) with the engine's and drains or downs
nodes through ``LiveScheduler.set_node`` (actor ``slurm``, so the audit log says who), and puts
back in service the nodes *it* took out when Slurm does. An admin's own drain (through the
service's API) is never undone by it. Call :meth:`SlurmNodeSync.sync` at every poll, before
``LiveScheduler.poll`` (see the class).

Slurm's text (``--oneliner`` lines, host lists, GRES, node states) is read by :mod:`.parse`.
"""

from __future__ import annotations

import logging
import os
import subprocess
import time

from ...core.errors import ConfigError
from .parse import engine_state, expand_nodes, parse_gres, parse_oneliner

log = logging.getLogger("jupyter_gpusched.slurm")

#: The keys of the ``slurm:`` section of a cluster file with ``nodes: slurm``.
OPTIONS = {
    "partition",
    "gpu_model",
    "gpu_memory_gb",
    "nvlink",
    "pcie_switches",
    "slurm_conf",
    "bin_dir",
}
_RANK = {"up": 0, "drain": 1, "down": 2}


# -- running Slurm's commands ----------------------------------------------------------------
def slurm_env(slurm_conf: str = "") -> dict[str, str]:
    """The environment for Slurm's commands: ours, with ``SLURM_CONF`` when given."""
    env = dict(os.environ)
    if slurm_conf:
        env["SLURM_CONF"] = slurm_conf
    return env


def run_scontrol(args: list[str], *, slurm_conf: str = "", bin_dir: str = "", timeout=30.0):
    """``scontrol ARGS``'s output; ConfigError with Slurm's message when it fails."""
    program = os.path.join(bin_dir, "scontrol") if bin_dir else "scontrol"
    try:
        done = subprocess.run(
            [program, *args],
            capture_output=True,
            text=True,
            env=slurm_env(slurm_conf),
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(f"cannot run scontrol {' '.join(args)}: {exc}", field="nodes") from None
    if done.returncode != 0:
        why = (done.stderr or done.stdout).strip() or f"exit status {done.returncode}"
        raise ConfigError(f"scontrol {' '.join(args)} failed: {why}", field="nodes")
    return done.stdout


def read_nodes(*, partition: str = "", slurm_conf: str = "", bin_dir: str = "") -> list[dict]:
    """Every node Slurm knows (of ``partition``), as ``scontrol show node --oneliner`` fields."""
    text = run_scontrol(["show", "node", "--oneliner"], slurm_conf=slurm_conf, bin_dir=bin_dir)
    nodes = [parse_oneliner(line) for line in text.splitlines() if line.startswith("NodeName=")]
    if partition:
        nodes = [n for n in nodes if partition in n.get("Partitions", "").split(",")]
    return nodes


def read_topology(*, slurm_conf: str = "", bin_dir: str = "") -> tuple[dict, dict]:
    """``(leaf of each node, spine of each leaf)`` from the tree topology, or two empty dicts
    when Slurm has none. Read from ``scontrol show topology``, else from ``topology.conf`` in
    the directory of ``slurm.conf``."""
    try:
        text = run_scontrol(["show", "topology"], slurm_conf=slurm_conf, bin_dir=bin_dir)
    except ConfigError:
        text = ""
    switches = [parse_oneliner(line) for line in text.splitlines()]
    switches = [s for s in switches if "SwitchName" in s]
    if not switches:
        conf = slurm_conf or os.environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf"
        path = os.path.join(os.path.dirname(conf), "topology.conf")
        try:
            with open(path) as file:
                lines = [line.split("#", 1)[0] for line in file]
        except OSError:
            lines = []
        switches = [parse_oneliner(line) for line in lines]
        switches = [s for s in switches if "SwitchName" in s]
    leaf_of: dict[str, str] = {}
    spine_of: dict[str, str] = {}
    for switch in switches:
        name = switch["SwitchName"]
        for node in expand_nodes(switch.get("Nodes", "")):
            leaf_of.setdefault(node, name)
        for child in expand_nodes(switch.get("Switches", "")):
            spine_of.setdefault(child, name)
    leaves = set(leaf_of.values())
    return leaf_of, {leaf: spine for leaf, spine in spine_of.items() if leaf in leaves}


def _labels(features: str) -> dict[str, str]:
    labels = {}
    for feature in features.split(","):
        feature = feature.strip()
        if not feature or feature == "(null)":
            continue
        key, sep, value = feature.partition("=")
        labels[key] = value if sep else "true"
    return labels


def _number(text: str | None) -> float | None:
    try:
        value = float(text) if text is not None else None
    except ValueError:
        return None
    return value if value and value > 0 else None


def cluster_document(data: dict, source: str = "cluster file") -> dict:
    """The cluster file ``data`` (a mapping with ``nodes: slurm``) with its nodes (and switches)
    read from Slurm: a document for ``Cluster.from_dict``."""
    options = data.get("slurm") or {}
    if not isinstance(options, dict):
        raise ConfigError("'slurm' must be a mapping of options", source=source, field="slurm")
    unknown = set(options) - OPTIONS
    if unknown:
        raise ConfigError(
            f"unknown option {sorted(unknown)[0]!r} under 'slurm' (known: "
            f"{', '.join(sorted(OPTIONS))})",
            source=source,
            field="slurm",
        )
    where = {"slurm_conf": str(options.get("slurm_conf") or "")}
    where["bin_dir"] = str(options.get("bin_dir") or "")
    try:
        raw = read_nodes(partition=str(options.get("partition") or ""), **where)
        leaf_of, spine_of = read_topology(**where)
    except ConfigError as exc:
        raise ConfigError(f"nodes: slurm: {exc.message}", source=source, field="nodes") from None
    nodes = []
    for fields in raw:
        name = fields["NodeName"]
        gres = parse_gres(fields.get("Gres", ""))
        gpus = sum(gres.values())
        if gpus < 1:
            continue
        kind = gres.most_common(1)[0][0]
        entry: dict = {
            "name": name,
            "gpus": gpus,
            "gpu_model": kind or str(options.get("gpu_model") or "gpu"),
        }
        if "gpu_model" in options and not kind:
            entry["gpu_model"] = str(options["gpu_model"])
        for key in ("gpu_memory_gb", "nvlink", "pcie_switches"):
            if key in options:
                entry[key] = options[key]
        labels = _labels(fields.get("AvailableFeatures", fields.get("Features", "")))
        if labels:
            entry["labels"] = labels
        cpus = _number(fields.get("CPUTot"))
        if cpus:
            entry["cpus"] = cpus
        memory = _number(fields.get("RealMemory"))
        if memory and memory > 1:
            entry["memory_gb"] = memory / 1024
        entry["state"] = engine_state(fields.get("State", "")) or "up"
        if name in leaf_of:
            entry["leaf"] = leaf_of[name]
        nodes.append(entry)
    if not nodes:
        partition = options.get("partition")
        scope = f"partition {partition}" if partition else "Slurm"
        raise ConfigError(
            f"nodes: slurm: no node of {scope} has GPUs (GRES gpu)", source=source, field="nodes"
        )
    document = {"nodes": nodes}
    if spine_of:
        switches: dict[str, list[str]] = {}
        for entry in nodes:
            leaf = entry.get("leaf", "leaf")
            spine = spine_of.get(leaf, "spine")
            if leaf not in switches.setdefault(spine, []):
                switches[spine].append(leaf)
        document["switches"] = switches
    extra = set(data) - {"nodes", "slurm", "switches"}
    for key in extra:  # let Cluster.from_dict name it
        document[key] = data[key]
    return document


def load_cluster(path):
    """``files.load_cluster`` that also reads ``nodes: slurm`` (see the module docstring)."""
    from ...core import Cluster
    from ...yaml_lines import read_yaml

    data = read_yaml(path)
    if isinstance(data, dict) and data.get("nodes") == "slurm":
        data = cluster_document(data, source=str(path))
    return Cluster.from_dict(data, source=str(path))


# -- keeping the engine's node states in step with Slurm's -----------------------------------
class SlurmNodeSync:
    """Drain and down, in the engine, the nodes Slurm drains and downs; resume them when Slurm
    does. Made with the service's :class:`~jupyter_gpusched.service.live.LiveScheduler`
    (whose launcher is a ``SlurmLauncher``); the service calls :meth:`sync` at every poll,
    *before* ``live.poll()``::

        sync = SlurmNodeSync(live, interval=10)
        def tick():
            sync.sync()
            live.poll()

    Slurm's states are read every ``interval`` seconds, and at once when the launcher saw a
    job end with NODE_FAIL (so that the engine downs the node and requeues the job, rather
    than taking the failure for the job's own).

    Which nodes Slurm took out is kept in the database (setting ``slurm_nodes``), so that
    after a restart they are still put back when Slurm resumes them. A node an admin drained
    through the service's API stays drained whatever Slurm says; a node in a more severe state
    in the engine than in Slurm (downed by an admin, drained by Slurm) keeps it.
    """

    SETTING = "slurm_nodes"

    def __init__(self, live, interval: float = 10.0, clock=time.monotonic, launcher=None):
        self.live = live
        self.launcher = launcher or live.launcher  # one that reports_node_states
        self.interval = interval
        self.clock = clock
        self._last = -float("inf")
        # node -> the state Slurm imposed on it (persisted)
        self.imposed: dict[str, str] = dict(live.store.get_setting(self.SETTING, {}) or {})

    def due(self) -> bool:
        return self.clock() - self._last >= self.interval or self.launcher.node_refresh_wanted

    def sync(self, force: bool = False) -> list[tuple[str, str]]:
        """Apply Slurm's node states; return the changes made, ``[(node, state), ...]``."""
        if not (force or self.due()):
            return []
        self._last = self.clock()
        try:
            states = self.launcher.node_states()
        except Exception as exc:  # slurmctld unreachable: change nothing
            log.warning("cannot read Slurm's node states: %s", exc)
            return []
        changes = []
        admin = self.live.store.get_setting("nodes", {}) or {}
        for name, (slurm_state, reason) in states.items():
            if slurm_state is None or name not in self.live.cluster.by_name:
                continue
            ours = self.live.node_state(name)
            mine = self.imposed.get(name)
            if slurm_state == "up":
                if mine is not None and ours == mine:
                    changes.append((name, "resume"))
                    self._set(name, "resume", None)
                elif mine is not None:  # an admin changed it since: theirs now
                    self._forget(name)
                continue
            if ours == slurm_state:
                if mine is None and name not in admin:
                    self._remember(name, slurm_state)  # e.g. from the cluster file
                continue
            if _RANK[slurm_state] > _RANK[ours] or (mine is not None and ours == mine):
                log.info(
                    "Slurm has node %s %s (%s): %s in the engine",
                    name,
                    slurm_state,
                    reason or "no reason given",
                    slurm_state,
                )
                changes.append((name, slurm_state))
                self._set(name, slurm_state, slurm_state)
        return changes

    def _set(self, name: str, action: str, imposed: str | None) -> None:
        self.live.set_node(name, action, "slurm")
        if imposed is None:
            self._forget(name)
        else:
            self._remember(name, imposed)

    def _remember(self, name: str, state: str) -> None:
        self.imposed[name] = state
        self.live.store.set_setting(self.SETTING, dict(self.imposed), by="slurm")

    def _forget(self, name: str) -> None:
        self.imposed.pop(name, None)
        self.live.store.set_setting(self.SETTING, dict(self.imposed), by="slurm")
