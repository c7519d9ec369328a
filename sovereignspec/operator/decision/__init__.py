"""The operator's decision: from the objects one tick read to the writes it makes. Pure: no client,
no clock (it is passed in), no I/O."""
