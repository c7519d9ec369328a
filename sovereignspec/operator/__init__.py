"""The Kueue AdmissionCheck controller, in four rooms, each importing only the rooms below it:

- `roles`: what runs. The worker role (`controller`: one decision tick, read, decide, write), the
  dispatcher role (`dispatcher`), the AdmissionChecks' reconciler (`checks`), the watches, the
  sovereignty record (`audit`, `record`, `bucket`), the kopf handlers (`main`) and start-up
  (`process`);
- `decision`: what is decided, pure (no client, no clock, no I/O): what waits (`requests`), what is
  placed (`ledger`), the view a tick decides on (`view`), the writes (`plan`), what the engines
  teach (`learning`), scoring and sovereignty violations;
- `runtime`: the machinery under the roles: informers, the status writer (server-side apply of our
  own check entries), leader election, metrics and their authenticated endpoint, telemetry sources;
- `border`: the API's objects as typed views parsed once (`objects`, `workloads`, `nodes`, `world`,
  `cuts`), the serving kinds (`kinds`) and the pydantic borders for what users write
  (`annotations`, `policy`).

`decision` and `runtime` do not import each other. docs/architecture.md draws it.
"""
