"""FedNova (Wang et al., 2020, "Tackling the Objective Inconsistency Problem in Heterogeneous Federated
Optimization") as a fedsynth plugin: `algorithm = "fednova:FEDNOVA"` with this folder's parent on the path.

fedsynth does not ship FedNova; tests/test_algorithm_plugins.py copies this package outside the tree and
runs it in simulation and on a loopback deployment, as a user's package would be run.
"""

from fedsynth.algorithm import Algorithm

FEDNOVA = Algorithm(strategy="fednova.server:FedNova", client="fednova.client:fednova_update")
