"""Telemetry readers: GPU activity from Prometheus or dcgm-exporter (or NVML on a node), acceptance
rates and time per output token from the engines' metrics (each engine's module names its own).
They produce a `Snapshot`; the operator turns it into headroom readings for the core, never the
other way round."""
