"""Local development harness: the real control plane on loopback, simulated GPU nodes, a real
Prometheus. Used by the tests and by `make demo`; never by the operator itself."""
