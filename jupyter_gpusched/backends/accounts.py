"""Which OS account a hub user's jobs and notebook servers run as, and which never.

A hub user's work runs as the Unix account of the same name (when the service or the hub runs as
root; see ``service/launcher.py`` and ``spawner.py``). A hub admin can create a hub user of any
name, so the name alone must never decide that work runs with a system account's rights: a hub
user ``root``, ``daemon`` or ``postgres`` would otherwise run jobs as that account. The policy
here refuses an account whose name is in :attr:`AccountPolicy.denied_users` or whose uid is
below :attr:`AccountPolicy.min_uid` (Debian and most distributions give people uids from 1000,
system accounts below), and an account that does not exist.

The service and the hub each read it from their own config (``c.AccountPolicy.min_uid = ...``):
set the same values in both. Here too is what every launcher needs once it has an account:
:func:`run_as_ids` (Popen's arguments that run a child as it), :func:`cwd_problem_for` and
:func:`notebook_problem_for` (can it enter a directory, read a notebook: tried with its own
rights, not root's) and, for an account that cannot run this environment's interpreter,
:data:`SYSTEM_PYTHONS` with :func:`environment_pythonpath`.
"""

from __future__ import annotations

import os
import pwd
import site
import subprocess

from traitlets import Integer, List, Unicode
from traitlets.config import Configurable

#: Interpreters tried when an account cannot run this environment's own (a virtual environment
#: made from a Python under /root, which is 0700): the job launcher and the server command.
SYSTEM_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3")
#: The variable that names, in every batch job's environment, the Python the launcher chose for
#: that job's account (with this package; the environment it needs is set too). The notebook
#: client and ``%%gpujob`` run ``"$GPUSCHED_PYTHON"`` rather than the kernel's own
#: ``sys.executable``, so the one rule of the launcher decides, whoever submits.
JOB_PYTHON_ENV = "GPUSCHED_PYTHON"
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def environment_pythonpath() -> str:
    """``PYTHONPATH`` that gives another interpreter of the same version this environment: the
    checkout first (an editable install's .pth files are not read from PYTHONPATH), then this
    environment's site-packages."""
    return os.pathsep.join([PACKAGE_ROOT, *site.getsitepackages()])


class AccountRefused(Exception):
    """``message`` says, for the user and the admin, why work may not run as this account."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class AccountPolicy(Configurable):
    min_uid = Integer(
        1000,
        help="""The smallest uid a job or notebook server may run as. Accounts below it are
        system accounts (root is 0, daemons and databases have small uids on every
        distribution): a hub user named like one is refused, not run with its rights.""",
    ).tag(config=True)

    denied_users = List(
        Unicode(),
        default_value=["root"],
        help="""Account names no job or notebook server ever runs as, whatever their uid.""",
    ).tag(config=True)

    def check_name(self, name: str) -> None:
        """:class:`AccountRefused` when ``name`` is denied whatever account work runs as (the
        deny list alone: also where work runs as the service's own account)."""
        if name in self.denied_users:
            raise AccountRefused(
                f"work may not run as the account {name!r}: it is in the scheduler's list of "
                "denied accounts (AccountPolicy.denied_users)"
            )

    def account(self, name: str) -> pwd.struct_passwd:
        """The account named ``name``, or :class:`AccountRefused` saying why not."""
        self.check_name(name)
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            raise AccountRefused(f"user {name!r} does not exist on this host") from None
        if entry.pw_uid < self.min_uid:
            raise AccountRefused(
                f"work may not run as the account {name!r} (uid {entry.pw_uid}): it is a system "
                f"account, below AccountPolicy.min_uid ({self.min_uid})"
            )
        return entry


def submitting_account(
    user: str, run_as_submitting_user: bool, policy: AccountPolicy
) -> pwd.struct_passwd | None:
    """The account a job of ``user`` runs as: theirs when the service is root (and the setting
    allows), else None (the service's own). :class:`AccountRefused` where ``policy`` refuses
    it (an unknown user, a system account: never root); the deny list also applies when jobs
    run as the service's account, so that its names are refused alike everywhere."""
    if os.geteuid() != 0 or not run_as_submitting_user:
        policy.check_name(user)
        return None
    return policy.account(user)


def run_as_ids(account: pwd.struct_passwd | None) -> dict:
    """Popen's arguments that run a child as ``account`` (its uid, gid and groups)."""
    if account is None:
        return {}
    groups = os.getgrouplist(account.pw_name, account.pw_gid)
    return {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": groups}


def cwd_problem_for(account: pwd.struct_passwd | None, cwd: str) -> str | None:
    """Why ``account`` (None: this process's) cannot enter ``cwd``, or None. Tried with the
    account's own rights, in a shell run as the account, never judged by root: root may enter
    any directory. The message does not say whether the directory exists: only that this user
    cannot enter it."""
    who = account.pw_name if account is not None else "the service's user"
    cannot = f"the working directory {cwd[:200]!r} does not exist or {who} may not enter it"
    if account is None:
        return None if os.path.isdir(cwd) and os.access(cwd, os.X_OK) else cannot
    return _tried_as(account, 'cd -- "$1"', [cwd], f"the working directory {cwd[:200]!r}", cannot)


def notebook_problem_for(account: pwd.struct_passwd | None, cwd: str, notebook: str) -> str | None:
    """Why ``account`` (None: this process's) cannot read the notebook ``notebook`` (relative:
    to ``cwd``, which it may enter), or None; as :func:`cwd_problem_for`, tried with the
    account's own rights, and without saying whether the file exists."""
    who = account.pw_name if account is not None else "the service's user"
    where = notebook if notebook.startswith("/") else f"{notebook} in {cwd}"
    cannot = f"the notebook {where[:300]!r} is not a file {who} may read"
    if account is None:
        path = os.path.join(cwd, notebook)
        return None if os.path.isfile(path) and os.access(path, os.R_OK) else cannot
    script = 'cd -- "$1" && test -f "$2" && test -r "$2"'
    return _tried_as(account, script, [cwd, notebook], f"the notebook {notebook[:200]!r}", cannot)


def _tried_as(account: pwd.struct_passwd, script: str, args: list, what: str, cannot: str):
    """Run the sh ``script`` (with ``args`` as $1 ...) as ``account``: None if it succeeds,
    else ``cannot``, or why ``what`` could not be checked."""
    try:
        done = subprocess.run(
            ["/bin/sh", "-c", script, "sh", *args],
            cwd="/",
            env={"PATH": os.defpath},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=10,
            **run_as_ids(account),
        )
    except subprocess.TimeoutExpired:
        return f"{what} could not be checked (no answer in 10 s)"
    except OSError as exc:
        return f"{what} could not be checked: {exc.strerror}"
    return None if done.returncode == 0 else cannot
