# make demo: install what is missing, mount a bundled sample model, look around, unmount.
# make test: the same install plus the test dependencies, then the linter, the type checker
# (mypy) and the whole suite.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
BUILD  := build

.PHONY: all system-deps test-system-deps venv test-venv clients-venv llama-wheel llama-gguf-hash convert-oracle demo test bench bench-compare fuzz clean check-debian13
all: test

# Debian's FUSE: fuse3 brings libfuse3 (what tensorfs binds: libfuse3.so.3, or .so.4 from 3.17
# on, as in Debian 13) and fusermount; libfuse2 is what fusepy loads (the tests' slow FUSE
# source, bench/passthrough.py).
# ldconfig by its path: a user's PATH often lacks /sbin, and "ldconfig: not found" must not
# send a machine that has everything back to apt-get.
LDCONFIG := $(firstword $(wildcard /sbin/ldconfig /usr/sbin/ldconfig) ldconfig)
system-deps:
	@if $(LDCONFIG) -p | grep -Eq 'libfuse3\.so\.[34] ' && $(LDCONFIG) -p | grep -q 'libfuse\.so\.2 ' \
	    && command -v fusermount >/dev/null && command -v getfattr >/dev/null; then :; else \
	  if [ "$$(id -u)" != 0 ]; then echo "need root to install fuse3 and libfuse2 (apt-get)" >&2; exit 1; fi; \
	  echo "installing fuse3, libfuse2 and attr (getfattr, for the xattr tests) ..."; \
	  apt-get update -qq && \
	  { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fuse3 libfuse2 attr \
	    || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fuse3 libfuse2t64 attr; }; \
	fi
	@[ -e /dev/fuse ] || { echo "/dev/fuse is missing: this machine cannot mount FUSE filesystems" >&2; exit 1; }

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install -q -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed requirements-test.txt
	$(BIN)/python -m pip install -q -r requirements-test.txt -e '.[test,remote,plot]'
	touch $@

# moto's S3 server for the remote tests, in its own virtualenv: beside s3fs, pip may settle
# botocore's pins by falling back to ancient s3fs releases.
MOTO := $(BUILD)/moto-venv
$(MOTO)/bin/moto_server:
	$(PYTHON) -m venv $(MOTO)
	$(MOTO)/bin/python -m pip install -q 'moto[server]==5.2.5'

# A C compiler and libfuse3's headers: tests/fuse/test_struct_layout.py compiles the structs the
# binding declares, and tests/fuse/test_libfuse_matrix.py builds upstream libfuse releases (with
# meson and ninja from requirements-test.txt) to run the mount tests against each.
test-system-deps:
	@command -v cc >/dev/null && command -v pkg-config >/dev/null && pkg-config --exists fuse3 || { \
	  if [ "$$(id -u)" != 0 ]; then echo "need root to install gcc, pkg-config and libfuse3-dev (apt-get)" >&2; exit 1; fi; \
	  echo "installing gcc, pkg-config and libfuse3-dev (for the binding's layout and libfuse tests) ..."; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc libc6-dev pkg-config libfuse3-dev; }
	@# vim and perl: the edit tests rewrite metadata files with them (tests/editing/test_edits_tools.py)
	@{ command -v vim >/dev/null || command -v vim.tiny >/dev/null; } && command -v perl >/dev/null || { \
	  if [ "$$(id -u)" != 0 ]; then echo "need root to install vim-tiny and perl (apt-get)" >&2; exit 1; fi; \
	  echo "installing vim-tiny and perl (for the edit tests) ..."; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq vim-tiny perl; }
	@# nginx: the remote tests run their own (tests/support/servers.py); its system service is never started
	@command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || { \
	  if [ "$$(id -u)" != 0 ]; then echo "need root to install nginx (apt-get)" >&2; exit 1; fi; \
	  echo "installing nginx (for the remote tests; the service is not started) ..."; \
	  p=/usr/sbin/policy-rc.d; made=; [ -e $$p ] || { printf '#!/bin/sh\nexit 101\n' >$$p; chmod +x $$p; made=1; }; \
	  apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx; rc=$$?; \
	  [ -z "$$made" ] || rm -f $$p; exit $$rc; }

venv: system-deps $(VENV)/.installed
test-venv: system-deps test-system-deps $(VENV)/.installed-test $(MOTO)/bin/moto_server

# The real clients of tests/clients/: llama.cpp (llama-cpp-python), transformers on CPU torch.
# PyPI has only llama-cpp-python's source: its wheel is built once (minutes on 2 cores) into a
# cache outside the clone, keyed by the version, the machine and the build flags, so a fresh
# clone, a `make clean` and CI on the same machine reuse it.  The flags make a small portable
# CPU-only build: no BLAS, CUDA, OpenMP, -march=native, multimodal library or programs.
LLAMA_CPP_PYTHON := $(shell sed -n 's/^llama-cpp-python==//p' requirements-clients.txt)
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_BLAS=OFF -DGGML_CUDA=OFF -DGGML_OPENMP=OFF \
  -DLLAVA_BUILD=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF
CLIENTS_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/tensorfs-build
LLAMA_WHEELS := $(CLIENTS_CACHE)/llama-cpp-python-$(LLAMA_CPP_PYTHON)-$(shell uname -m)-$(shell echo '$(LLAMA_CMAKE_ARGS)' | sha1sum | cut -c1-8)

# --no-cache-dir: pip's own wheel cache keys a build by the source only, not CMAKE_ARGS.
# Built in a directory of its own and renamed: two makes at once do not mix their files.
$(LLAMA_WHEELS)/.built: | $(BIN)/python
	@command -v c++ >/dev/null || { \
	  if [ "$$(id -u)" != 0 ]; then echo "need root to install g++ (apt-get)" >&2; exit 1; fi; \
	  echo "installing g++ (to build llama.cpp) ..."; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq g++; }
	@echo "building llama-cpp-python $(LLAMA_CPP_PYTHON) into $(LLAMA_WHEELS) (once: minutes) ..."
	@tmp=$(LLAMA_WHEELS).tmp$$$$ && rm -rf $$tmp && mkdir -p $$tmp && \
	  CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) \
	  $(BIN)/python -m pip wheel -q --no-cache-dir --no-deps --no-binary llama-cpp-python \
	    -w $$tmp llama-cpp-python==$(LLAMA_CPP_PYTHON) && touch $$tmp/.built && \
	  { mv -T $$tmp $(LLAMA_WHEELS) 2>/dev/null || rm -rf $$tmp; } || { rm -rf $$tmp; exit 1; }
	@test -e $@

llama-wheel: $(BIN)/python $(LLAMA_WHEELS)/.built

# torch==2.13.0 is pinned: pip takes this machine's CPU build from its find-links; a range
# would let it resolve a CUDA build of several GB.
$(VENV)/.installed-clients: $(VENV)/.installed-test requirements-clients.txt $(LLAMA_WHEELS)/.built
	$(BIN)/python -m pip install -q -r requirements-clients.txt \
	  --find-links $(LLAMA_WHEELS) --only-binary llama-cpp-python
	touch $@

clients-venv: test-venv $(VENV)/.installed-clients

demo: venv
	@bash examples/demo.sh $(BIN) $(BUILD)

test: test-venv clients-venv llama-gguf-hash convert-oracle
	$(BIN)/ruff check tensorfs tests bench tools examples
	$(BIN)/mypy
	TENSORFS_LLAMA_GGUF_HASH=$(LLAMA_GGUF_HASH) TENSORFS_CONVERT_ORACLE=$(CONVERT_ORACLE) \
	  $(BIN)/python -m pytest -q tests

# llama.cpp's llama-gguf-hash, the oracle of tests/facts/test_facts_hash.py: built with cmake from
# the llama-cpp-python sdist (its vendored llama.cpp), that one target only (~2 min on 2
# cores), statically linked and kept outside the clone (beside the clients' wheel, the same
# llama-cpp-python release) so that a machine builds it once.
LLAMA_GGUF_HASH := $(CLIENTS_CACHE)/llama-cpp-python-$(LLAMA_CPP_PYTHON)/llama-gguf-hash
llama-gguf-hash: $(LLAMA_GGUF_HASH)
$(LLAMA_GGUF_HASH): | $(BIN)/python
	@command -v cmake >/dev/null && command -v c++ >/dev/null || { \
	  if [ "$$(id -u)" != 0 ]; then echo "need root to install cmake and g++ (apt-get)" >&2; exit 1; fi; \
	  echo "installing cmake and g++ (to build llama-gguf-hash, the hash tests' oracle) ..."; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq cmake g++; }
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	src=$$tmp/llama_cpp_python-$(LLAMA_CPP_PYTHON) && \
	$(BIN)/python -m pip download -q --no-binary :all: --no-deps \
	  llama-cpp-python==$(LLAMA_CPP_PYTHON) -d $$tmp && \
	tar -xzf $$src.tar.gz -C $$tmp && \
	cmake -S $$src/vendor/llama.cpp -B $$tmp/build -DCMAKE_BUILD_TYPE=Release \
	  -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF -DGGML_OPENMP=OFF -DLLAMA_CURL=OFF \
	  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF \
	  -DLLAMA_BUILD_EXAMPLES=ON >$$tmp/cmake.log 2>&1 || { cat $$tmp/cmake.log >&2; exit 1; }; \
	cmake --build $$tmp/build --target llama-gguf-hash -j$$(nproc) >$$tmp/build.log 2>&1 \
	  || { tail -50 $$tmp/build.log >&2; exit 1; }; \
	mkdir -p $(dir $@) && cp $$tmp/build/bin/llama-gguf-hash $@.part && mv $@.part $@

# The oracle of the HF-as-GGUF tests (tests/hfgguf/): llama.cpp's convert_hf_to_gguf.py as
# vendored in the same llama-cpp-python sdist (its conversion/ package, its gguf-py and its
# vocab GGUFs under models/), with the virtualenv its requirements name (transformers 4.57.6,
# sentencepiece, protobuf; torch at the CPU build this machine's pip takes).  Kept outside the
# clone beside llama-gguf-hash, built once per machine.  $(CONVERT_ORACLE)/bin/convert runs it.
CONVERT_ORACLE := $(CLIENTS_CACHE)/llama-cpp-python-$(LLAMA_CPP_PYTHON)/convert
convert-oracle: $(CONVERT_ORACLE)/.built
$(CONVERT_ORACLE)/.built: | $(BIN)/python
	@echo "setting up llama.cpp's convert_hf_to_gguf.py ($(LLAMA_CPP_PYTHON)) in $(CONVERT_ORACLE) (once) ..."
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	src=$$tmp/llama_cpp_python-$(LLAMA_CPP_PYTHON)/vendor/llama.cpp && out=$(CONVERT_ORACLE).tmp$$$$ && \
	$(BIN)/python -m pip download -q --no-binary :all: --no-deps \
	  llama-cpp-python==$(LLAMA_CPP_PYTHON) -d $$tmp && \
	tar -xzf $$tmp/llama_cpp_python-$(LLAMA_CPP_PYTHON).tar.gz -C $$tmp && \
	rm -rf $$out && mkdir -p $$out/src $$out/bin && \
	cp -r $$src/convert_hf_to_gguf.py $$src/conversion $$src/gguf-py $$src/models $$out/src/ && \
	$(PYTHON) -m venv $$out/venv && \
	$$out/venv/bin/python -m pip install -q torch==2.13.0 transformers==4.57.6 'numpy~=2.2.6' \
	  'sentencepiece>=0.1.98,<0.3.0' 'protobuf>=4.21.0,<5.0.0' safetensors jinja2 && \
	$$out/venv/bin/python -m pip install -q --no-deps $$out/src/gguf-py && \
	printf '#!/bin/sh\nexec "$$(dirname "$$0")/../venv/bin/python" "$$(dirname "$$0")/../src/convert_hf_to_gguf.py" "$$@"\n' >$$out/bin/convert && \
	chmod +x $$out/bin/convert && touch $$out/.built && \
	{ rm -rf $(CONVERT_ORACLE) && mkdir -p $(dir $(CONVERT_ORACLE)) && mv -T $$out $(CONVERT_ORACLE); } || { rm -rf $$out; exit 1; }
	@test -e $@

# Every row of bench/rows/, by its one entry point (bench/run.py --list names them).  What the
# rows need: libfuse3-dev and pkg-config (row 7's floor, the smallest C daemon, bench/floor/),
# matplotlib (the plot), curl (the remote rows' reference) and Debian's rclone (the peers row);
# nginx and moto come with test-venv.
bench: test-venv clients-venv convert-oracle
	@command -v pkg-config >/dev/null && pkg-config --exists fuse3 || \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libfuse3-dev pkg-config
	$(BIN)/python -m pip install -q matplotlib
	@command -v curl >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq curl
	@command -v rclone >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rclone
	TENSORFS_CONVERT_ORACLE=$(CONVERT_ORACLE) $(BIN)/python bench/run.py

# The regression guard: the local read rows of BASE (a git revision) and of the working tree,
# taking turns in one run; rows 10% or more worse are flagged and fail the command.  A couple
# of minutes; bench/compare.py --help for the sizes and rounds.
BASE ?= HEAD
bench-compare: test-venv
	$(BIN)/python bench/compare.py $(BASE)

# A fresh Debian 13 (trixie, debootstrap minbase plus git, make, python3, python3-venv) in
# build/debian13, a clone of this repository (and ../shared) in it, and the README's two
# commands run there as root in a chroot.  Needs root, debootstrap and the Debian mirror; not
# part of `make test`.  DEBIAN_MIRROR picks the mirror; a second run reuses the tree.
DEBIAN_MIRROR ?= http://deb.debian.org/debian
check-debian13:
	@bash tools/check-debian13.sh $(BUILD)/debian13 $(DEBIAN_MIRROR)

fuzz: test-venv
	$(BIN)/python -m pip install -q atheris
	$(BIN)/python fuzz/fuzz_parsers.py -max_total_time=300

clean:
	-for m in $(BUILD)/mnt*; do [ -d "$$m" ] && fusermount -uz "$$m" 2>/dev/null; done; true
	rm -rf $(BUILD) $(VENV) *.egg-info
