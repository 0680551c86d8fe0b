# rlcycle recipes; each is a thin call to scripts/dev.sh so `just` is optional.

# create .venv and install rlcycle with its dev extras
setup:
    bash scripts/dev.sh setup

# run the tests (starts the Docker engine and builds the sandbox image if needed);
# `just test --fast`: only the tests that need no Docker, vLLM, Ray or agent frameworks, and installs none
test *ARGS:
    bash scripts/dev.sh test {{ARGS}}

# ruff over the code, tests and scripts
lint:
    bash scripts/dev.sh lint

# run every scripts/bench_*.py; only the options they share pass: `just bench --runs 3 --json`
bench *ARGS:
    bash scripts/dev.sh bench {{ARGS}}

# the pipeline on the bundled sample data
demo:
    bash scripts/dev.sh demo
