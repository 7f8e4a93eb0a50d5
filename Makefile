# Two commands do everything on a fresh machine:
#   make synth   venv + fleetcast CLI + pinned CDK CLI, then synthesize the default config offline
#   make test    the same plus test tools and the reference backend (CPU torch), then every test and gate
SHELL := /bin/bash
VENV  ?= .venv
PY    := $(VENV)/bin/python
CONFIG ?= config/fleet.yaml
# jsii silences its end-of-life banner only when this names the running Node major version.
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := $(shell node --version 2>/dev/null | sed -E "s/^v([0-9]+).*/\1/")
export CDK_DISABLE_CLI_TELEMETRY := true
# Synthesis never needs AWS: no credentials, no metadata service, no lookups.
OFFLINE := env -u AWS_ACCESS_KEY_ID -u AWS_SECRET_ACCESS_KEY -u AWS_SESSION_TOKEN -u AWS_PROFILE \
           AWS_EC2_METADATA_DISABLED=true

.PHONY: synth test demo deploy teardown docs bench-gateway bench-accuracy bench-decode bench-scaling plan-seed probe-wheels clean

$(VENV)/.synth-deps: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[bench,plan]'
	touch $@

$(VENV)/.test-deps: $(VENV)/.synth-deps pyproject.toml
	$(PY) -m pip install -q -e '.[dev,reference,bench,plan]'
	touch $@

node_modules/.package-lock.json: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error

synth: $(VENV)/.synth-deps node_modules/.package-lock.json
	rm -rf cdk.out
	$(OFFLINE) npx cdk synth --no-lookups --no-notices --quiet -c config=$(CONFIG)
	$(VENV)/bin/fleetcast synth summary --config $(CONFIG) --out cdk.out

test: $(VENV)/.test-deps node_modules/.package-lock.json
	$(OFFLINE) $(PY) -m pytest -q -p no:cacheprovider

demo: $(VENV)/.test-deps
	$(PY) -m runtime.demo

# Single-account deploy in the order AWS requires (needs credentials; `fleetcast deploy --help`).
deploy: $(VENV)/.synth-deps node_modules/.package-lock.json
	$(VENV)/bin/fleetcast deploy --config $(CONFIG)

teardown: $(VENV)/.synth-deps node_modules/.package-lock.json
	$(VENV)/bin/fleetcast teardown --config $(CONFIG)

docs: $(VENV)/.synth-deps
	$(VENV)/bin/fleetcast config docs > docs/config.md

# Benchmarks print figures; none of them is a test.
bench-gateway: $(VENV)/.test-deps
	$(PY) -m scripts.bench_gateway $(BENCH_ARGS)

bench-accuracy: $(VENV)/.test-deps
	$(PY) scripts/bench_accuracy.py --aiperf $(or $(AIPERF),none)

bench-decode: $(VENV)/.test-deps
	$(PY) scripts/bench_decode.py $(or $(BENCH_ARGS),--device cpu --size tiny)

# A diurnal day with bursts through a simulated Auto Scaling group: load target alone vs + SLO protection.
bench-scaling: $(VENV)/.synth-deps
	$(PY) -m scripts.bench_scaling $(BENCH_ARGS)

# Wheels the consumer-side bench probe carries (needs PyPI); bench-mode synth asks for them.
probe-wheels: $(VENV)/.synth-deps
	$(VENV)/bin/fleetcast bench probe-wheels --out build/probe-wheels

# The seed scenario planned from arrivals, then that sizing checked by simulation (exit 3 if they disagree).
plan-seed: $(VENV)/.synth-deps
	$(VENV)/bin/fleetcast plan --results examples/plan/seed/results --traffic examples/plan/seed/traffic-seoul-arrivals.yaml \
	  --config $(CONFIG) --report build/plan-seed
	$(VENV)/bin/fleetcast plan simulate --results examples/plan/seed/results \
	  --traffic examples/plan/seed/traffic-seoul-arrivals.yaml --config $(CONFIG)

clean:
	rm -rf cdk.out .pytest_cache
