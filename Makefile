# The two commands a newcomer runs: `make demo` and `make test`. Both create .venv, build the
# extension once (release profile, shared with the Rust tests) and leave `oxlake` importable.
VENV       := .venv
PY         := $(VENV)/bin/python
PYTHON     ?= python3
export CARGO_TARGET_DIR ?= $(CURDIR)/target
export PYSPARK_PYTHON := $(CURDIR)/$(VENV)/bin/python

.PHONY: demo test develop wheel wheel-test rust-test py-test spark35-test stress-long fuzz lint bench bench-mor bench-spark clean

$(VENV)/.ready: pyproject.toml
	@echo "== creating $(VENV) (Python $$($(PYTHON) -c 'import platform; print(platform.python_version())'))"
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "maturin>=1.8,<2"
	touch $@

develop: $(VENV)/.ready
	@echo "== building the extension (release profile, target dir $(CARGO_TARGET_DIR)) and installing it with"
	@echo "   the test dependencies into $(VENV): the first build compiles DataFusion and takes about"
	@echo "   20 minutes on 2 cores (cargo's progress below); later builds take seconds to a few minutes"
	cd $(CURDIR) && VIRTUAL_ENV=$(CURDIR)/$(VENV) $(VENV)/bin/maturin develop --release --extras test

demo: develop
	$(PY) -m oxlake.demo

# Tests reading Apache Hudi's corpus are skipped, each with the reason, where it is absent
# (OXLAKE_SHARED, else ../shared: CONTRIBUTING.md); -rs lists the reasons.
rust-test:
	cargo test --release -p oxlake

py-test: develop
	$(PY) -m pytest -q -rfEs --durations=25 tests

test: develop rust-test py-test

# The Spark tests again on Spark 3.5 (pandas 2), in a venv of their own beside the main one.
SPARK35 := .venv-spark35
$(SPARK35)/.ready:
	$(PYTHON) -m venv $(SPARK35)
	$(SPARK35)/bin/pip install -q "pyspark>=3.5,<3.6" "pandas>=2.2,<3" pyarrow pytest hypothesis "hudi==0.5.0" fastavro
	touch $@

spark35-test: develop $(SPARK35)/.ready
	PYTHONPATH=$(CURDIR)/python PYSPARK_PYTHON=$(CURDIR)/$(SPARK35)/bin/python \
		$(SPARK35)/bin/python -m pytest -q -p no:cacheprovider tests/test_spark.py tests/test_streaming.py

# Apache Hudi's own Spark engine against oxlake (docs/JAVA_HUDI.md): the Spark 3.5 bundles pinned by
# version and sha256 in tests/java/bundles.lock, fetched with mvn into a cache outside the clone
# ($OXLAKE_JAVA_CACHE, default ~/.cache/oxlake-java), then the round-trip suite in the Spark 3.5
# venv, one pytest process per Hudi version (a JVM holds one bundle); JAVA_HUDI_VERSIONS=1.0.2 picks.
.PHONY: java-deps java-test
JAVA_HUDI_VERSIONS ?= $(shell $(PYTHON) tests/java/bundles.py versions)
java-deps:
	$(PYTHON) tests/java/bundles.py fetch $(JAVA_HUDI_VERSIONS)

java-test: develop $(SPARK35)/.ready java-deps
	@failed=""; for v in $(JAVA_HUDI_VERSIONS); do \
		echo "== Java Hudi $$v (hudi-spark3.5-bundle_2.12, Spark $$($(SPARK35)/bin/python -c 'import pyspark; print(pyspark.__version__)'))"; \
		OXLAKE_HUDI_VERSION=$$v PYTHONPATH=$(CURDIR)/python PYSPARK_PYTHON=$(CURDIR)/$(SPARK35)/bin/python \
			$(SPARK35)/bin/python -m pytest -q -rfEsx -p no:cacheprovider --durations=5 tests/java \
			|| failed="$$failed $$v"; \
	done; \
	if [ -n "$$failed" ]; then echo "== the Java suite failed for Hudi$$failed" >&2; exit 1; fi

# One abi3 wheel (CPython 3.11+, the lowest manylinux tag its symbols allow, checked by maturin's
# auditwheel) and the sdist, into dist/; wheel-test installs the wheel in a new venv outside the
# tree and runs the smoke suite there (tests/smoke/run).
wheel: $(VENV)/.ready
	@echo "== the wheel and the sdist into dist/ (the first build compiles DataFusion: 20+ minutes)"
	rm -rf dist
	$(VENV)/bin/maturin sdist --out dist
	$(VENV)/bin/maturin build --release --strip --auditwheel check --out dist
	@ls -l dist

wheel-test: wheel
	tests/smoke/run

# The stress suite at the sizes of the issue (tests/stress/README.md): long, outside the default run.
stress-long: develop
	OXLAKE_STRESS=long $(PY) -m pytest -q -s tests/stress

# Fuzzes the log-file reader and the timeline parsers (nightly, cargo-fuzz) for FUZZ_SECONDS each.
FUZZ_SECONDS ?= 30
fuzz:
	rust/fuzz/run $(FUZZ_SECONDS)

lint: develop
	$(PY) rust/tools/module_graph.py
	cargo fmt --all -- --check
	cargo clippy --release --all-targets -p oxlake -p oxlake-python -- -D warnings
	$(VENV)/bin/ruff check python tests benches rust/tools
	$(VENV)/bin/ruff format --check python tests benches rust/tools
	$(VENV)/bin/mypy python/oxlake

bench: develop
	cargo bench -p oxlake-benches --bench core -- --warm-up-time 1 --measurement-time 4
	VIRTUAL_ENV=$(CURDIR)/$(VENV) $(VENV)/bin/maturin develop --release --extras test,bench -q
	$(PY) benches/compare.py

bench-mor: develop
	VIRTUAL_ENV=$(CURDIR)/$(VENV) $(VENV)/bin/maturin develop --release --extras test,bench -q
	$(PY) benches/mor.py

bench-spark: develop
	$(PY) benches/spark.py

clean:
	rm -rf $(VENV) target
