"""Analysis over the core's model, for people rather than for decisions: the regime sweep
(`regimes`, `sovereignspec regimes`), one configuration's terms (`predict`), their tables
(`regime_report`) and figures (`plots`). Nothing here is on the operator's path."""
