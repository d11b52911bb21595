"""Running the services: on this machine (run_local), as processes for the tests and the
benchmarks (services), checking a deployment (smoke_test), and podman for the container tests.
Standard library only here: smoke_test runs wherever python3 does."""
