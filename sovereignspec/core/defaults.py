"""One home for the decision's defaults. The operator's SpeculationPolicy, the chart's values (held
to these by a test), the CLI, the regime analysis, the simulator and the Placer read them here."""

from __future__ import annotations

GAMMA_MAX = 8  # the longest draft considered
GAMMA_LIMIT = 32  # the longest any configuration may ask for
SELF_BENEFIT_MARGIN = 0.02  # S_real must reach 1 + this: covers the model's error
HEADROOM_UNCERTAINTY = 0.05  # a reading is judged this much worse than reported
# A running decision whose engine's TPOT is this far from the prediction (relative) is reported: the
# bound the model is held to for a neighbour's TPOT on the real engine (issue 45's acceptance).
PREDICTION_ERROR_BOUND = 0.25
# The neighbours' SLO bound is judged this much tighter (the model's error on how far a step grows,
# and a request's TPOT spreading around its steps'): see core.placement.PlacerSettings.
NEIGHBOUR_SLO_MARGIN = 0.2
