# The two commands that do all set-up on a fresh machine: `make demo` and `make test`.
# Python packages go into .venv, configurable-http-proxy into node_modules; the only things
# installed outside the project are Debian packages (scripts/install-system.sh: PostgreSQL and
# npm, when missing; needs root, as in CI) and, for `make demo`, the demo Unix users.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
STAMPS := .make-stamps
NODE_STAMP := $(STAMPS)/node_modules
LAB_STAMP  := $(STAMPS)/labextension
LAB_SOURCES := $(wildcard labextension/src/*.ts labextension/style/*) \
	labextension/package.json labextension/package-lock.json labextension/tsconfig.json
TRACES ?= ../shared/traces

# The demo hub (hub_config/jupyterhub_config.py reads the same variables; hub_config/README.md
# lists them all). Two demos on one host: give each its own ports and state directory; each then
# has its own simulated GPUs (GPUSCHED_SIM_GPU_DIR, beside its state directory).
export GPUSCHED_HUB_PORT ?= 8000
export GPUSCHED_HUB_API_PORT ?= 8081
export GPUSCHED_PROXY_API_PORT ?= 8001
export GPUSCHED_SERVICE_PORT ?= 8765
export GPUSCHED_DEMO_PASSWORD ?= gpusched-demo
export GPUSCHED_STATE_DIR ?= $(CURDIR)/hub-state
export GPUSCHED_SIM_GPU_DIR ?= $(GPUSCHED_STATE_DIR)-sim-gpus
HUB_URL := http://127.0.0.1:$(GPUSCHED_HUB_PORT)

define DEMO_HELP

== JupyterHub with the GPU scheduler: $(HUB_URL)
Log in at $(HUB_URL)/hub/login as alice, bob, carol or admin (a hub admin and the scheduler's
admin), password '$(GPUSCHED_DEMO_PASSWORD)'. The scheduler's API is under
$(HUB_URL)/services/gpusched/api/, described at $(HUB_URL)/services/gpusched/api/openapi.json. A token: $(HUB_URL)/hub/token in a browser, or, in a shell:

H=$(HUB_URL); P=$(GPUSCHED_DEMO_PASSWORD)
TOKEN=$$(curl -s -X POST $$H/hub/api/users/alice/tokens \
  -d '{"auth": {"username": "alice", "password": "'$$P'"}}' |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["token"])')
JOB=$$(curl -s -H "Authorization: token $$TOKEN" $$H/services/gpusched/api/jobs \
  -d '{"command": "echo GPUs: $$CUDA_VISIBLE_DEVICES; id -un", "gpus": 2}' |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["id"])')
curl -s -H "Authorization: token $$TOKEN" $$H/services/gpusched/api/jobs/$$JOB
curl -s -H "Authorization: token $$TOKEN" $$H/services/gpusched/api/jobs/$$JOB/log
curl -s -H "Authorization: token $$TOKEN" $$H/services/gpusched/api/queue

Ctrl-C stops what the demo started: the scheduler cancels pending and batch jobs and has the
hub stop every notebook server ("the demo stopped", one line each, within 20 s), then the hub,
the proxy and the scheduler exit. GPUSCHED_DEMO_STOP_ALL=0 make demo keeps servers and jobs
running across a restart instead, as a production hub does (cleanup_servers = False).
State: $(GPUSCHED_STATE_DIR); simulated GPUs' loads: $(GPUSCHED_SIM_GPU_DIR). As root, each
user's server runs as their Unix account.

endef
export DEMO_HELP

.PHONY: demo replay-demo test lint pytest bench install system node_modules labextension clean

install: $(STAMP)

# SKIP_JUPYTER_BUILDER: the build hook (pyproject.toml) would build the Lab extension here too;
# the labextension target below builds it instead (after `system` gives npm), once, and links it.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	SKIP_JUPYTER_BUILDER=1 $(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

## make system: the Debian packages the tests start for real (PostgreSQL, npm), if missing.
system:
	@scripts/install-system.sh

## make node_modules: configurable-http-proxy (JupyterHub's proxy), pinned in package.json.
node_modules: $(NODE_STAMP)

$(NODE_STAMP): package.json package-lock.json | system
	npm ci --no-audit --no-fund
	@mkdir -p $(STAMPS)
	touch $(NODE_STAMP)

## make labextension: the JupyterLab extension (labextension/, TypeScript) built with
## @jupyter/builder into jupyter_gpusched/labextension, which the wheel ships as
## share/jupyter/labextensions/jupyter-gpusched; linked there in .venv for this checkout.
## `python -m build` and `pip install .` run the same npm build through the build hook.
labextension: $(LAB_STAMP)

$(LAB_STAMP): $(LAB_SOURCES) | $(STAMP) system
	cd labextension && npm ci --no-audit --no-fund && npm run clean && npm run build
	@mkdir -p $(VENV)/share/jupyter/labextensions
	rm -rf $(VENV)/share/jupyter/labextensions/jupyter-gpusched  # a copy pip install -e made
	ln -s $(CURDIR)/jupyter_gpusched/labextension \
		$(VENV)/share/jupyter/labextensions/jupyter-gpusched
	@mkdir -p $(STAMPS)
	touch $(LAB_STAMP)

## make demo: JupyterHub on 127.0.0.1:8000 with the scheduler as a managed service (foreground;
## Ctrl-C stops the hub, the proxy and the service). State is kept in hub-state/, the simulated
## GPUs' loads in hub-state-sim-gpus/. Variables: the exports above, and GPUSCHED_CLUSTER_FILE,
## GPUSCHED_QUEUE_FILE, GPUSCHED_POLICY_FILE, GPUSCHED_GPU_BACKEND, GPUSCHED_JOB_PYTHON.
demo: $(STAMP) $(NODE_STAMP) $(LAB_STAMP) | system
	@scripts/demo-users.sh || echo "make demo: continuing without them: not root, so the" \
		"service runs every job as $$(id -un)"
	@printf '%s\n' "$$DEMO_HELP"
	GPUSCHED_CLUSTER_FILE=$${GPUSCHED_CLUSTER_FILE:-$(CURDIR)/hub_config/demo-cluster.yaml} \
	GPUSCHED_QUEUE_FILE=$${GPUSCHED_QUEUE_FILE:-$(CURDIR)/hub_config/demo-queues.yaml} \
	GPUSCHED_GPU_BACKEND=$${GPUSCHED_GPU_BACKEND:-simulated} \
	GPUSCHED_DEMO_STOP_ALL=$${GPUSCHED_DEMO_STOP_ALL:-1} \
	$(BIN)/jupyterhub -f hub_config/jupyterhub_config.py

## make replay-demo: replay the example trace through each policy and print the comparison table.
replay-demo: $(STAMP)
	$(BIN)/jupyter-gpusched replay examples/trace.csv \
		--cluster examples/cluster.yaml --queues examples/queues.yaml \
		--config examples/policy.yaml \
		--policy gpusched --policy fifo --out demo-out

## make test: lint (ruff, the import rules), then the whole test suite ("no tests collected" fails: pytest exits 5).
## The hub tests (tests/test_hub.py) need node_modules and, as root, create the demo users.
test: lint pytest

lint: $(STAMP)
	$(BIN)/ruff check jupyter_gpusched tests benchmarks
	$(BIN)/ruff format --check jupyter_gpusched tests benchmarks
	$(BIN)/lint-imports  # the import rules of the layout (pyproject.toml, [tool.importlinter])

pytest: $(STAMP) $(NODE_STAMP) $(LAB_STAMP) | system
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_engine.py

## make docs: rewrite the generated parts of docs/ (the reason table of docs/engine.md).
.PHONY: docs
docs: $(STAMP)
	$(BIN)/python -c 'import pathlib; from jupyter_gpusched.core.reasons import with_table; \
		p = pathlib.Path("docs/engine.md"); p.write_text(with_table(p.read_text()))'

clean:
	rm -rf $(VENV) $(STAMPS) node_modules labextension/node_modules labextension/lib \
		jupyter_gpusched/labextension test-output demo-out hub-state hub-state-sim-gpus .pytest_cache .ruff_cache .hypothesis
