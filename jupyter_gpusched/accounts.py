"""Which OS account a hub user's jobs and notebook servers run as, and which never.

A hub user's work runs as the Unix account of the same name (when the service or the hub runs as
root; see ``service/launcher.py`` and ``spawner.py``). A hub admin can create a hub user of any
name, so the name alone must never decide that work runs with a system account's rights: a hub
user ``root``, ``daemon`` or ``postgres`` would otherwise run jobs as that account. The policy
here refuses an account whose name is in :attr:`AccountPolicy.denied_users` or whose uid is
below :attr:`AccountPolicy.min_uid` (Debian and most distributions give people uids from 1000,
system accounts below), and an account that does not exist.

The service and the hub each read it from their own config (``c.AccountPolicy.min_uid = ...``):
set the same values in both.
"""

from __future__ import annotations

import pwd

from traitlets import Integer, List, Unicode
from traitlets.config import Configurable


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
