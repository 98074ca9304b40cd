"""Names of the records that travel between the ServerApp and the ClientApps.

Both sides import these names, so a record is spelled in one place.
"""

MODEL = "arrays"            # the model (global on the way down, local on the way up)
METRICS = "metrics"
CONFIG = "config"
SCAFFOLD_CONTROL = "scaffold-c"              # server control variate c (down)
SCAFFOLD_CONTROL_DELTA = "scaffold-delta-c"  # c_i+ - c_i (up)
PREVIOUS_UPDATE = "previous-update"          # w^t - w^{t-1} (down; MoFedSAM, FedLESAM)
HANDSHAKE = "handshake"                      # query name of the start-of-run handshake
NODE_STATE_PREFIX = "node-state:"             # records the node writes into its Context.state (after a resume)
STATE_SCAFFOLD_CONTROL = "scaffold-c-i"       # key of SCAFFOLD's c_i in a node's Context.state
STATE_MOON_PREVIOUS_MODEL = "moon-previous-model"     # key of the model MOON's node ended its last round with
STATE_COG_PREVIOUS_MODEL = "fedcog-previous-model"    # the same for FedCOG's disagreement term
# FedSynSAM (issue 3)
COMPRESSED_UPDATE = "compressed-update"      # Q(w_i - w), packed codec payload, instead of MODEL (up)
SYNTHETIC_DATA = "synthetic-data"            # D_syn = {x, y} distilled on the server (down, once per node)
DYNAMIC_CORRECTION = "dynamic-correction"    # FedLESAM-D: the node's g_i+ - g_i (up)
STATE_DYN_GRADIENT = "feddyn-gradient"       # key of FedLESAM-D's / FedSMOO's g_i in a node's Context.state
GLOBAL_PERTURBATION = "global-perturbation"  # FedSMOO's global perturbation s (down)
PERTURBATION_DUAL = "perturbation-dual"      # FedSMOO's mu_i - e_i, the node's perturbation correction (up)
# Decentralized FL (issue 6)
GOSSIP = "gossip"                            # mixing weights of a decentralized round: self, neighbours (down)
GOSSIP_MODEL_PREFIX = "gossip-model-"        # + partition id: a neighbour's last model z_j (down)
GOSSIP_MIXED = "gossip-mixed"                # relay-mixing: sum_{j != i} W_ij z_j, one record (down)
STATE_OWN_MODEL = "decentralized-own-model"  # key of z_i^{t-1}, the node's last local model, in its Context.state
STATE_OWN_ROUND = "decentralized-own-round"  # key of the round that produced it
# FedCOG (issue 4)
CLIENT_STAT_PREFIX = "stat-"                 # reply metrics the server averages per round (e.g. generation time)
# FedDDPM (issue 5); the auxiliary set itself never travels
DIFFUSION_PHASE = "phase"                    # config key of a train message: "warmup" for FedDDPM's warmup (down)
WARMUP_PHASE = "warmup"                      # its value: train the node's own DDPM for the warm-up, upload once
FID_STATS = "fid_stats"                      # query: a node's feature sums of its images (FID without server images)
FID_EXTRACTOR = "fid-extractor"              # the classifier or random extractor's weights (down, with FID_STATS)
FID_SUMS = "fid-sums"                        # sum f and sum f f^T of the node's image features (up; n in metrics)
