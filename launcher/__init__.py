"""Starting Conduit's processes: the stack `make run-stack` runs (stack.py: engines, shims, replicas),
the Shepherd gateway in front of engines (smg_gateway.py). The tests and the benchmarks start theirs
through it too; it is not client code, so it lives apart from `clients/`."""
