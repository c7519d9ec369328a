"""The pure core of SovereignSpec: the cost model, the optimiser, the sovereignty filter and placement.

Everything in this package is a function over plain data (dataclasses, numpy arrays). It never
imports kopf, the Kubernetes client, an HTTP library or the clock, so that every decision the
operator takes can be replayed from its inputs, tested without a cluster and benchmarked alone.
`tests/unit/test_layering.py` enforces this.
"""
