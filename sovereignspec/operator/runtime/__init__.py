"""The operator's machinery: informers, the status writer, leader election, metrics, telemetry."""
