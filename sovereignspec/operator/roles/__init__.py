"""What the operator runs: the worker and dispatcher roles, the AdmissionChecks' reconciler, the
watches, the sovereignty record, the kopf handlers and start-up."""
