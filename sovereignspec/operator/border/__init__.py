"""The operator's border: the API's objects as typed views, parsed once, and what users write."""
