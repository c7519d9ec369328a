"""The Kueue AdmissionCheck controller: kopf handlers over a decision loop that calls the core.

`main` registers the handlers; `controller` runs one decision tick (read, decide, write);
`view` rebuilds the cluster view and the placement ledger from the API; `writer` writes only our
own admission-check entries (server-side apply to /status) and Events; `annotations` and `policy`
are the pydantic borders for what users write.
"""
