# The two commands that matter on a fresh machine: `make demo` and `make test`.
# Every step installs what it needs (Debian packages, kernels, guest root, venv) and is cached.
KERNEL ?= 6.12
KERNELS ?= 6.1 6.12 7.3 6.12-lockdown
PYTEST := .venv/bin/pytest

.PHONY: all demo test unit e2e bench mutation lint venv vm image bpf release clean
all: test

venv:
	scripts/venv.sh

# The CO-RE objects the agent loads (kubenpu/kernel/objects/kubenpu-{aggregate,events}.bpf.o), built once
# with Debian's clang from bpf/kubenpu.bpf.c; the node needs no headers and no LLVM.
bpf:
	scripts/bpf.sh

# The main job on a machine without accelerators: a QEMU guest with a virtual GPU, the agent,
# a sample pod, and the kubenpu_ series it exports.
demo: venv bpf
	tests/vm/run.sh $(KERNEL) /src/tests/vm/demo.sh out/demo

# Lint, unit tests against real receivers and tools, then the real-kernel e2e on every kernel.
# Two workers: a boot's QEMU (TCG, one thread) keeps one core busy, so two boots, or a boot and
# the unit tests, run side by side; --dist loadscope keeps a module (its boots) on one worker.
test: venv bpf lint
	KUBENPU_E2E_KERNELS="$(KERNELS)" $(PYTEST) -q -ra -n 2 --dist loadscope --durations=25

unit: venv bpf
	$(PYTEST) -q -ra -m "not vm"

e2e: venv bpf
	KUBENPU_E2E_KERNELS="$(KERNEL)" $(PYTEST) -q -ra tests/test_e2e_vm.py

# Speed figures for both probe modes, measured side by side in one boot (prints a table).
bench: venv bpf
	bench/run.sh $(KERNEL) out/bench

# Mutation testing (a developer tool, not part of `make test`): mutmut on each module of
# MODULES (default: scripts/mutation.py's list) with only its test files; prints killed / total
# and the survivors per module. docs/mutation.md has the scores and the equivalent survivors.
mutation: venv bpf
	.venv/bin/python scripts/mutation.py $(MODULES)

lint: venv
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .

# build.sh takes kernel names; a "-lockdown" entry is one of them booted with a kernel argument.
vm:
	tests/vm/build.sh $(sort $(KERNELS:-lockdown=))

# The agent's image from the Dockerfile (buildah, no daemon, base made locally) as an OCI archive
# under the cache; prints its size. Cached: unchanged inputs build nothing.
image:
	scripts/image.sh

# The versioned artifacts under out/release/<version>/: the wheel with both CO-RE objects, the
# chart (helm package) and the image (OCI archive), with SHA256SUMS. docs/upgrade.md publishes them.
release: venv bpf
	scripts/release.sh

clean:
	rm -rf out .venv .pytest_cache .ruff_cache .hypothesis mutants kubenpu/kernel/objects
