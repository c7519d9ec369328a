"""A discrete-event simulator of multi-tenant LLM serving on heterogeneous GPUs, for comparing
speculation policies on the same arrivals. Pure Python and numpy (no plotting, no Kubernetes):
`scenario` reads a SCENARIO.yaml, `engine` runs it under one policy, `policies` holds SovereignSpec
(calling the same core the operator uses), its baselines and the oracle, `metrics` summarises."""
