"""FedCOG's name lists: its ablations and its KD weightings (the bases it plugs into are the table's `cog_base` rows).

They live apart from FedCOG's math (common/algorithms/fedcog.py, which needs torch) so that the run
config's checks (common/algorithms/cog_settings.py, common/run/config.py) read them without loading
torch: `import fedsynth.strategies` does not load it (tests/test_light_import.py).
"""

from __future__ import annotations

# Table 5's ablations: none = full FedCOG (4); noise = Gaussian inputs, not optimised (1);
# global-only = generation without the disagreement term (2); hard-label = CE on the
# global model's argmax instead of KD (3).
COG_ABLATIONS = ("none", "noise", "global-only", "hard-label")
KD_WEIGHTINGS = ("balanced", "fixed")
