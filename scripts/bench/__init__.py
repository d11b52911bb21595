"""Every benchmark and measurement, one command: `python -m scripts.bench.hops <question>`
(__main__.py lists them). README.md says which file answers which question and which files
are libraries for the others."""
