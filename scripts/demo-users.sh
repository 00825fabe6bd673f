#!/usr/bin/env bash
# Creates the Unix accounts of the demo hub's users (hub_config/jupyterhub_config.py): alice,
# bob, carol and admin, each with a home directory. The scheduler, run by the hub as root, runs
# every job as the Unix user who submitted it, so these accounts must exist on this host.
# Idempotent: existing accounts are left as they are. Needs root.
#   scripts/demo-users.sh [USER...]     (default: alice bob carol admin)
set -euo pipefail
users=("$@")
[[ ${#users[@]} -gt 0 ]] || users=(alice bob carol admin)
missing=()
for user in "${users[@]}"; do
    id -u "$user" >/dev/null 2>&1 || missing+=("$user")
done
if [[ ${#missing[@]} -eq 0 ]]; then
    exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
    echo "demo-users.sh: the demo needs the Unix users ${missing[*]}; create them as root:" >&2
    echo "    sudo $0 ${missing[*]}" >&2
    echo "(or: sudo useradd --create-home --shell /bin/bash USER, for each)" >&2
    exit 1
fi
for user in "${missing[@]}"; do
    group=()
    # A group of that name already there (e.g. 'admin' on some systems): make it the user's own.
    getent group "$user" >/dev/null && group=(--gid "$user") || group=(--user-group)
    useradd --create-home --shell /bin/bash "${group[@]}" "$user"
    echo "demo-users.sh: created user $user (home $(getent passwd "$user" | cut -d: -f6))"
done
