#!/usr/bin/env bash
# The Debian packages the tests start for real: PostgreSQL (the store's second database),
# Node.js's npm for configurable-http-proxy, Chromium for the browser tests, and Prometheus
# (scraping node agents in tests/test_node_agent.py and tests/test_reaper_sources.py: the tests
# start their own, the package's service is stopped). Installs only what is missing; needs root
# (as in CI) to install, and says what to install by hand otherwise.
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

if [[ " ${missing[*]} " == *" prometheus "* ]]; then
    # the package may start its own server on :9090 (systemd, or its init script where there is
    # no systemd and no policy-rc.d forbids it); the tests start their own, so stop it
    if command -v systemctl >/dev/null; then
        systemctl disable --now prometheus >/dev/null 2>&1 || true
    fi
    if [[ -x /etc/init.d/prometheus ]]; then
        /etc/init.d/prometheus stop >/dev/null 2>&1 || true
    fi
fi
