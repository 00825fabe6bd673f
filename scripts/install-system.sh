#!/usr/bin/env bash
# The Debian packages the tests start for real: PostgreSQL (the store's second database) and
# Node.js's npm for configurable-http-proxy. Installs only what is missing; needs root (as in
# CI) to install, and says what to install by hand otherwise.
set -euo pipefail
missing=()
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing+=(postgresql)
command -v npm >/dev/null || missing+=(npm)
[[ -x /usr/bin/chromium ]] || missing+=(chromium)  # the JupyterLab browser tests (Playwright)
if [[ ${#missing[@]} -eq 0 ]]; then
    exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
    echo "install-system.sh: please install: ${missing[*]} (apt-get install ${missing[*]})" >&2
    exit 1
fi
echo "install-system.sh: installing ${missing[*]}"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
