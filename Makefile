# SovereignSpec developer entry points. `make run` runs the main job; `make test` runs everything CI runs.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
OUT ?= out

.PHONY: venv lint format typecheck test unit run demo regimes calibration-figure calibrate-profiles simulate bench bench-engine bench-operator bench-failover bench-flood bench-mix bench-sim sim-native clean binaries engine-e2e cluster-up cluster-down pod-e2e image multicluster-up multicluster-down demo-multicluster bench-multicluster mutants

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

venv: $(VENV)/.installed

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

format: venv
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

typecheck: venv
	$(BIN)/mypy sovereignspec localdev benchmarks

unit: venv
	VENV=$(VENV) hack/pytest.sh -m "not cluster and not pod_e2e and not engine"

# The whole suite: lint, types (strict on the pure core), the layering check and every test,
# including those against the real control plane (built first: pytest's timeouts are per test),
# then the operator as users run it, on a real node (pod-e2e: its own control plane and ports).
test: lint typecheck binaries
	VENV=$(VENV) hack/pytest.sh -m "not pod_e2e and not engine"
	$(MAKE) engine-e2e
	$(MAKE) pod-e2e

# A real vLLM (its CPU build from PyPI, in a virtualenv of its own cached beside the Go binaries)
# serving tiny checkpoints built at test time, started by `sovereignspec launch` from the operator's
# own decisions; Prometheus scrapes it with the shipped relabelling. See docs/engine-e2e.md.
engine-e2e: venv
	hack/engine-env.sh >/dev/null
	hack/build-binaries.sh prometheus
	VENV=$(VENV) hack/pytest.sh tests/engine -m engine -s

# Speculative decoding's realized speed-up measured on a real vLLM (its CPU build) at batch 1-32,
# for an exact draft, a perturbed one and ngram, beside the model learned from the plain runs alone
# (docs/engine-bench.md). Tens of minutes on 2 cores; ARGS="--levels 1,8 --repeats 2" for less.
bench-engine: venv
	hack/engine-env.sh >/dev/null
	$(BIN)/python -m benchmarks.engine_bench --out $(OUT)/bench-engine $(ARGS)

# etcd, kube-apiserver, kubectl and the Kueue manager from pinned Go modules, and Debian's
# Prometheus; cached under ~/.cache/sovereignspec, so only the first run builds.
binaries:
	hack/build-binaries.sh all

# The local control plane on loopback; prints where everything runs and the kubeconfig path.
cluster-up: venv binaries
	hack/cluster-up.sh

cluster-down:
	hack/cluster-down.sh

# MultiKueue on loopback: a manager whose dispatcher is SovereignSpec and two workers (eu, kr), each
# etcd + kube-apiserver + Kueue, configured, with simulated GPU nodes, telemetry and the operators.
multicluster-up: venv binaries
	$(BIN)/python -m localdev.multicluster up

multicluster-down: venv
	$(BIN)/python -m localdev.multicluster down

# Tenants of both jurisdictions submit Jobs to the manager: where each was dispatched, and why.
demo-multicluster: venv binaries
	$(BIN)/python -m localdev.multicluster demo

# Dispatch latency, SovereignSpec's dispatcher against Kueue's AllAtOnce, on the same 200 Jobs.
bench-multicluster: venv binaries
	$(BIN)/python -m benchmarks.multicluster $(ARGS)

# The main job: SovereignSpec admitting a mix of tenants' serving Jobs on the local control plane.
demo: venv binaries
	$(BIN)/python -m localdev.demo

run: demo

# The regime analysis of the source on the shipped profiles (table + plot).
regimes: venv
	mkdir -p $(OUT)
	$(BIN)/sovereignspec regimes --alphas 0.6,0.8 --plot $(OUT)/regimes.png

# The calibrated model against the published data it is fitted to and tested against.
calibration-figure: venv
	$(BIN)/python -c "from sovereignspec.analysis.plots import plot_calibration; from sovereignspec.profiles import load_profiles; plot_calibration(load_profiles(), 'docs/figures/calibration.png')"

bench: venv
	$(BIN)/python -m benchmarks $(ARGS)

# Refit the shipped H100 and A100 profiles from the shipped measurements (tests hold the files to this).
M := profiles/measurements
calibrate-profiles: venv
	$(BIN)/sovereignspec calibrate $(M)/h100-sxm_llama-3.1-8b_tp1.csv \
		--held-out $(M)/h100-sxm_vidur_linear_fit.csv --held-out $(M)/h100-sxm_vidur_linear_held_out.csv \
		--gpu H100-SXM --model llama-3.1-8b --out profiles/gpus/h100-sxm.yaml
	$(BIN)/sovereignspec calibrate $(M)/a100-80g-sxm_magicdec_tp8.csv \
		--held-out $(M)/a100-80g-sxm_vidur_linear_fit.csv --held-out $(M)/a100-80g-sxm_vidur_linear_held_out.csv \
		--gpu A100-80G-SXM --model llama-3.1-8b --tp 8 --step-overhead-ms 2.2817 \
		--out profiles/gpus/a100-80g-sxm.yaml
	$(BIN)/python hack/scale_profiles.py

# Mutation testing of the decision path: every mutant of a fixed list of operators in the core
# (optimiser, speed-up, roofline, placement and what it was split into, the scalar path, the
# sovereignty filter) and the operator's plan, against the unit tests that guard them; killed,
# survived, timed out and errors counted apart, the score over killed and survived only; survivors
# are listed (each killed by a test or explained in docs/mutants.md). 1,263 mutants: hours on 2 cores
# (ARGS="FILE ..." or --only PATH:LINE for a part).
mutants: venv
	$(BIN)/python hack/mutants.py $(ARGS)

# The simulator's hot modules compiled by mypyc into build/sim-native/ (loaded only while they
# match their sources; same results, 1.5-2.5x as fast).
SIM_NATIVE_SOURCES := $(foreach m,state routing arrivals tenancy loop truth worlds,sovereignspec/sim/$(m).py)
build/sim-native/sources.json: $(SIM_NATIVE_SOURCES) hack/build_sim_native.py $(VENV)/.installed
	mkdir -p build
	@# Without a C compiler (or on a build error) the interpreted simulator runs, with the same results.
	$(BIN)/python hack/build_sim_native.py build/sim-native > build/sim-native.log 2>&1 \
	  && tail -1 build/sim-native.log \
	  || { tail -20 build/sim-native.log; echo "sim-native: mypyc could not build it (above); the interpreted simulator runs"; }

sim-native: build/sim-native/sources.json

# One simulated hour of a 64-GPU cluster at the mixed scenario's load: compiled, and interpreted.
bench-sim: venv sim-native
	$(BIN)/python -m benchmarks.simulate

# Every shipped scenario under every policy, with figures in out/sim/.
simulate: venv sim-native
	for s in idle mixed saturated sovereign-split heterogeneous shared-engine; do $(BIN)/sovereignspec simulate $$s --learning --plot $(OUT)/sim || exit 1; done

# The leader lost mid-burst under load: two replicas (the chart's lease), 5,000 one-GPU workloads,
# the leader SIGKILLed, then paused: time to the standby's first decision, lost, repeated,
# over-committed (docs/failover.md). ARGS="--workloads 1000" for less.
bench-failover: venv binaries
	$(BIN)/python -m benchmarks.failover $(ARGS)

# Admission latency (500 Jobs, SovereignSpec vs a trivial check) and operator memory, on the local
# control plane with 2,000 simulated GPUs.
bench-operator: venv binaries
	$(BIN)/python -m benchmarks.operator $(ARGS)

# One tenant's flood of large annotations (2,000 Jobs x 250 KiB) beside others' admission: the
# operator's peak RSS and the others' latency, without and with it.
bench-flood: venv binaries
	$(BIN)/python -m benchmarks.flood $(ARGS)

# Exclusive tenants and multi-node groups in one jurisdiction, on the operator's own decision path
# (no API server): each tenant's wait with groups pinned by label and per pod set, side by side.
bench-mix: venv
	$(BIN)/python -m benchmarks.tenant_mix $(ARGS)

clean:
	rm -rf $(VENV) $(OUT) .mypy_cache .ruff_cache .pytest_cache .hypothesis build/sim-native build/sim-native.log

# SovereignSpec as users run it: the image built offline from the unchanged Dockerfile, a real node
# (containerd, kubelet, scheduler, controller-manager from pinned sources, Debian's runc), `helm
# install`, the examples applied with kubectl (tests/pod_e2e/). Everything runs in a network namespace
# of its own holding the pod network (CNI bridge + host-local, built from their Go module): the
# machine's interfaces are left alone. Root, this machine kind; see docs/pod-e2e.md.
pod-e2e: venv binaries
	hack/engine-env.sh >/dev/null
	hack/pod-e2e/netns.sh env VENV=$(VENV) hack/pytest.sh tests/pod_e2e -m pod_e2e -s

# The operator image as an OCI archive (out/), built offline with buildah: push it with
# `skopeo copy oci-archive:out/sovereignspec-image.tar docker://REGISTRY/sovereignspec:TAG`.
image: venv
	hack/pod-e2e/packages.sh
	PYTHON=$(BIN)/python OPERATOR_IMAGE=ghcr.io/sovereignspec/sovereignspec:$$(sed -n 's/^appVersion: *"\(.*\)"/\1/p' charts/sovereignspec/Chart.yaml) \
	  hack/pod-e2e/images.sh operator
	mkdir -p $(OUT)
	hack/pod-e2e/images.sh archive ghcr.io/sovereignspec/sovereignspec:$$(sed -n 's/^appVersion: *"\(.*\)"/\1/p' charts/sovereignspec/Chart.yaml) $(OUT)/sovereignspec-image.tar oci
	@echo "wrote $(OUT)/sovereignspec-image.tar"
