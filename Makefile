# One entry point per task; each target calls the script that the README and .ci/run use.
.PHONY: setup demo test lint bench schemas

setup:
	bash scripts/setup.sh

demo:
	bash scripts/demo.sh

test:
	bash scripts/test.sh

lint:
	bash scripts/lint.sh

bench:
	bash scripts/bench.sh

schemas:
	bash scripts/schemas.sh
