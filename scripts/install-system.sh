#!/usr/bin/env bash
# The Debian packages the tests start for real: PostgreSQL (the store's second database),
# Node.js's npm for configurable-http-proxy, and Prometheus (scraping node agents in
# tests/test_node_agent.py; the tests start their own, the package's service is not needed). Installs only what is missing; needs root (as in
# CI) to install, and says what to install by hand otherwise.
set -euo pipefail
missing=()
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing+=(postgresql)
command -v npm >/dev/null || missing+=(npm)
[[ -x /usr/bin/chromium ]] || missing+=(chromium)  # the JupyterLab browser tests (Playwright)
command -v prometheus >/dev/null || [[ -x /usr/bin/prometheus ]] || missing+=(prometheus)
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

if [[ " ${missing[*]} " == *" prometheus "* ]] && command -v systemctl >/dev/null; then
    # the package starts its own server on :9090; the tests start theirs, so stop it
    systemctl disable --now prometheus >/dev/null 2>&1 || true
fi
