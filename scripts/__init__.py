"""phi3-chat's command-line scripts and the library code they share, grouped by job (README.md):
models/ makes model folders, bench/ measures, run/ starts and checks the services; gen_docs and
vendor_static keep the repo. Installed editable by `make venv` as part of the phi3-chat-dev
package, so `from scripts.run import services` works from anywhere, and every command runs as
`python -m scripts.<group>.<name>` from the checkout."""
