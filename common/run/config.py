"""The run configuration: every key, its default, its meaning, and its validation.

A run is configured through Flower's run config (`[tool.flwr.app.config]` in
`pyproject.toml`, overridden with `--run-config`). Both the ServerApp and every
ClientApp read the same keys, so both validate them with `parse_run_config`
before doing any work. Each field below is one run-config key (the field name
with `_` written as `-`); its metadata holds the text of the table in docs/configuration.md
(generated: `python -m common.run.config --markdown > docs/configuration.md`).

Validation errors are `ConfigError`s whose message names the key, the bad value
and the accepted values, so a user can fix the run from the message alone.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from common.data.datasets import DATASETS, dataset_info
from common.errors import ConfigError
from common.data.hf_datasets import is_hf
from common.models.diffusion import DIFFUSION_ALGORITHMS, FID_EXTRACTORS, OPTIMIZERS, SAMPLERS, UNET_PRESETS
from common.algorithms.fedcog import COG_ABLATIONS, COG_BASES, KD_WEIGHTINGS
from common.algorithms.gossip import DECENTRALIZED_ALGORITHMS, parse_targets
from common.models.classifiers import MODELS, check_model_fits, is_user_model, user_factory
from common.data.site_data import node_shape_info
from common.algorithms.topology import MIXINGS, TOPOLOGIES

PARTITIONS = ("iid", "dirichlet", "shard", "pathological", "pairs", "node")
NODE_PARTITION = "node"  # every node trains on its own data (common/data/site_data.py)
OWN_DATASET = "own"  # partition = node with no named dataset: the shape keys give the shape facts
AGGREGATIONS = ("weighted", "uniform", "median", "trimmed-mean", "krum")
# The distillation's trajectory-matching loss (server_app/distillation.py `matching_loss`).
MATCHING_LOSSES = ("normalized", "paper")
# Where D_syn comes from (server_app/strategies/fedsynsam.py): the method, or a diagnostic oracle of real images.
REAL_ORACLE = "real-oracle"
SYNTHETIC_SOURCES = ("distilled", REAL_ORACLE)


def _key(default: Any, meaning: str, source: str = "") -> Any:
    return field(default=default, metadata={"meaning": meaning, "source": source})


@dataclass(frozen=True)
class RunConfig:
    """Validated run configuration shared by the ServerApp and the ClientApps."""

    algorithm: str = _key("fedavg", "Algorithm to run (see the algorithm table).")
    num_server_rounds: int = _key(20, "Number of federated rounds.")
    dataset: str = _key(
        "fashion-mnist", "Dataset: mnist, fashion-mnist, cifar10, cifar100, or `hf:<repo>` (a Hugging Face "
        "dataset through flwr-datasets, see docs/data.md); with partition = node also own (the sites' own images: "
        "image-channels, image-size and class-names or num-classes give their shape, docs/own-data.md).", "SPEC 3.1"
    )
    data_dir: str = _key(
        "",
        "Directory used as torchvision root (and where `hf:<repo>` is looked for, as `<data-dir>/<repo>`); empty: "
        "~/.cache/fedsynth/data, and for Fashion-MNIST the Debian package files are found automatically.",
        "SPEC 3.1",
    )
    cache_dir: str = _key(
        "", "Where client partitions are cached; empty: ~/.cache/fedsynth/partitions."
    )
    hf_image_column: str = _key("", "`hf:<repo>` datasets: the image column; empty: found from the features.")
    hf_label_column: str = _key("", "`hf:<repo>` datasets: the label column; empty: found from the features.")
    model: str = _key("auto", "Model: cnn, cnn-gn (cnn with GroupNorm), mlp (784-200-10), mlp2 (784-200-200-10, "
                      "McMahan's 2NN), convnet, resnet18; a U-Net (unet-small, "
                      "unet-paper-mnist, unet-paper-cifar) makes the run a diffusion task; auto: the algorithm's paper "
                      "model (unet-paper-mnist for fedddpm and fedddpm+, cnn otherwise); or a user's own, "
                      "package.module:factory (called with num_classes, channels, image_size; docs/own-data.md).",
                      "SPEC 3.3")
    gn_groups: int = _key(
        2, "GroupNorm groups of resnet18 (a divisor of 64): 2, the project's default, or 32, the DisPFL code that "
        "OledFL builds on.", "OledFL code lineage (DisPFL): 32"
    )
    partition: str = _key(
        "dirichlet", "Split over clients: iid, dirichlet, shard, pathological, pairs (disjoint groups of "
        "classes-per-client classes, each group's samples split evenly over N / groups clients), or node (no "
        "split: every node trains on its own data, named by its node config `dataset-path`, docs/own-data.md).",
        "SPEC 3.2; pairs: FedCOG NIID-2; node: SPEC 3.1",
    )
    dataset_path: str = _key(
        "", "partition = node: a node's data when its node config has no `dataset-path`; `{partition-id}` is "
        "replaced by the node's partition id (simulation: one folder per node, e.g. /data/sites/{partition-id}).",
        "SPEC 3.1",
    )
    class_names: str = _key(
        "", "partition = node: the federation's classes, comma-separated, in label-id order; imagefolder class "
        "folders and string labels map to ids through them. Empty: labels are ids 0..C-1.", "SPEC 3.1",
    )
    num_classes: int = _key(
        0, "partition = node: the number of classes C; 0: from class-names, else the named dataset's. hf:<repo> "
        "datasets: with image-channels and image-size, the shape facts without opening the dataset.", "SPEC 3.1"
    )
    image_channels: int = _key(
        0, "partition = node: channels of the images the model sees (1 grey, 3 colour; images are converted); 0: "
        "the named dataset's. hf:<repo> datasets: see num-classes.", "SPEC 3.1",
    )
    central_test_path: str = _key(
        "", "A test set by path for central evaluation (any format of docs/own-data.md; a test split alone is "
        "enough); empty: the named dataset's official test split, or with partition = node none (the clients' "
        "local-test accuracy is then the run's accuracy).", "SPEC 3.1",
    )
    alpha: float = _key(0.3, "Dirichlet concentration (smaller is more skewed).", "SPEC 3.2")
    classes_per_client: int = _key(
        2, "Classes per client for the pathological and pairs splits.", "FedCOG NIID-2, OledFL"
    )
    local_test_fraction: float = _key(
        0.2, "Fraction of each client's partition held out as its local test split."
    )
    seed: int = _key(0, "Seed for partitions, model init, sampling and local training.")
    fraction_train: float = _key(
        1.0, "Fraction p of clients sampled per round (n = max(floor(N*p), 1)).", "SPEC 4"
    )
    min_nodes: int = _key(1, "A round counts only if at least this many nodes answered.")
    max_missing_nodes: int = _key(
        0, "How many of the num-partitions nodes may fail the start-of-run handshake (or not connect within "
        "node-wait-timeout) and the run still start without them; 0: every node must answer, else the run fails "
        "(exit 1) naming each lost node and why."
    )
    max_failed_rounds: int = _key(
        3, "Stop the run after this many consecutive rounds below min-nodes."
    )
    round_timeout: float = _key(600.0, "Seconds to wait for replies in a round.")
    reply_poll_interval: float = _key(
        0.05, "Seconds between the server's checks for replies (Flower's own: 3 s deployed, 0.1 s in simulation)."
    )
    node_wait_timeout: float = _key(
        120.0, "Seconds to wait at start for all partitions' nodes to connect."
    )
    local_epochs: int = _key(1, "Local epochs per round (when local-steps is 0).")
    local_steps: int = _key(0, "Local SGD steps per round K; 0 means use local-epochs.")
    batch_size: int = _key(32, "Local mini-batch size.")
    lr: float = _key(0.05, "Local learning rate eta.")
    lr_decay: float = _key(1.0, "Per-round decay: lr * lr-decay^(round-1).", "OledFL: 0.998")
    momentum: float = _key(0.0, "Local SGD momentum (buffer reset every round).")
    weight_decay: float = _key(0.0, "Local SGD weight decay.")
    clip_grad_norm: float = _key(
        0.0, "Local training: clip each step's gradient to this global L2 norm (as torch.nn.utils.clip_grad_norm_, "
        "before weight decay); 0: off.", "OledFL/DisPFL code: 10",
    )
    aggregation: str = _key(
        "weighted", "Server combination of the updates: weighted (by sample count) or uniform mean; robust: median "
        "(coordinate-wise), trimmed-mean (trim-fraction cut each side), krum (byzantine-nodes); centralized only.",
        "FedDDPM: uniform; Flower's FedMedian, FedTrimmedAvg, Krum",
    )
    trim_fraction: float = _key(0.2, "aggregation = trimmed-mean: fraction beta of the updates cut at each end, "
                                "per coordinate; in [0, 0.5).", "FedTrimmedAvg")
    byzantine_nodes: int = _key(1, "aggregation = krum: number f of malicious nodes Krum tolerates.", "Krum")
    max_update_norm: float = _key(
        0.0, "Bound on the L2 norm of each client update w_i - w (all arrays; decentralized: each node's step from "
        "its last model, before it is relayed); 0: none. See update-norm-action."
    )
    max_update_norm_ratio: float = _key(
        1.5, "Bound on each client update's L2 norm relative to the round: at most this multiple of the lower median "
        "of the round's update norms; a longer update is scaled down to it (clipped, never dropped). With 1.5, one "
        "node of three sending its update x 10^6 (and claiming 10^12 examples) leaves the final accuracy within 2 "
        "points of the honest run; at 2 it did not (tests/test_safe_defaults.py). Applied after max-update-norm, to "
        "every centralized algorithm; its cost on honest runs is in docs/reliability.md. 0: off (the papers' plain "
        "mean)."
    )
    update_norm_action: str = _key(
        "clip", "A client update above max-update-norm: clip (scaled to the bound) or refuse (dropped as a failure)."
    )
    max_weight_share: float = _key(
        0.4, "Cap on any one client's share of a weighted mean (the model's sample-count weights, the test-count "
        "weighted local accuracy and train loss, FedDDPM's auxiliary set sizes); the excess goes to the others in "
        "proportion. The cap applies at every n > 1 clients as max(max-weight-share, 1/n): with 2 clients (or any n "
        "<= 1 / max-weight-share) the mean is uniform. 0.4: one node of three claiming 10^12 examples weighs 0.4 "
        "(the others 0.3 each), and honest Dirichlet splits of the studies stay below it (largest share 0.29 at 10 "
        "clients, alpha >= 0.01, or 100 clients, fraction-train >= 0.15; docs/reliability.md), so it changes nothing "
        "there. A share in (0, 1]; 1: off."
    )
    max_record_norm: float = _key(
        0.0, "Bound on the L2 norm of each algorithm-specific array record of a reply (SCAFFOLD's and fedgamma's "
        "control-variate delta, FedLESAM-D's dynamic correction, FedSMOO's perturbation dual); 0: none. Acted on as "
        "update-norm-action says."
    )
    server_lr: float = _key(1.0, "Server step eta_g on the mean update.")
    server_momentum: float = _key(0.9, "FedAvgM server momentum.", "FedCOG: 0.1")
    proximal_mu: float = _key(0.01, "FedProx proximal weight mu.", "FedProx")
    moon_mu: float = _key(1.0, "MOON contrastive weight mu.", "MOON; FedCOG used 0.01")
    moon_tau: float = _key(0.5, "MOON temperature tau.", "MOON")
    moon_projection_dim: int = _key(256, "MOON projection-head output size.", "MOON")
    sam_rho: float = _key(0.05, "SAM perturbation radius rho.", "FedSAM")
    mofedsam_alpha: float = _key(0.1, "MoFedSAM weight of the local SAM gradient.", "MoFedSAM")
    device: str = _key("auto", "auto (CUDA when available), cpu, cuda or cuda:N.")
    eval_every: int = _key(1, "Centralized evaluation every this many rounds (0: only at the end).")
    central_eval: bool = _key(True, "Evaluate the global model on the official test split (or central-test-path); "
                              "diffusion task: FID against the real training split, with partition = node against "
                              "the nodes' pooled feature sums.")
    results_dir: str = _key(
        "results", "Root of the results folders; relative paths are under $FEDSYNTH_HOME or cwd."
    )
    run_name: str = _key("", "Name of the results folder; empty: algorithm-dataset-partition-time.")
    save_model: bool = _key(True, "Write the final global model (safetensors).")
    tensorboard: bool = _key(
        False, "Also write each round's metrics (and diffusion sample grids) as TensorBoard event files in the "
        "run's folder (needs the tensorboard package: pip install fedsynth[tensorboard])."
    )

    # --- reliability: checkpoints and resume ---
    checkpoint_every: int = _key(
        1, "Write the server checkpoint every this many rounds (and after the last); 0: never. "
        "1: a crash loses at most one round (a checkpoint costs < 1 % of a round, docs/deployment.md)."
    )
    resume: bool = _key(
        False, "Continue the run named by run-name (in results-dir) from its latest checkpoint; the config must "
        "match the checkpoint's (docs/reliability.md).",
    )
    overwrite: bool = _key(
        False, "Discard what the run-name folder holds and start over; with resume = true: resume when a checkpoint "
        "exists, else start over.",
    )
    accept_unverified_checkpoint: bool = _key(
        False, "Resume (or fork) a checkpoint that has no checksum (format 1, or its checksum removed), whose contents "
        "therefore cannot be verified; without it such a checkpoint is refused.",
    )

    # --- FedSynSAM (issue 3): uplink compression, SAM family, trajectory distillation ---
    compression: str = _key(
        "none", "Uplink codec for each client's update w_i - w: none, qsgd, topk (any centralized algorithm).",
        "SPEC 3.5",
    )
    bits: int = _key(4, "qsgd: bits per coordinate on the wire (1 sign bit + bits-1 level bits).", "FedSynSAM: 4, 8")
    levels: int = _key(0, "qsgd: number of levels s, overriding bits (0: s = 2^(bits-1) - 1); the FedSynSAM paper's "
                       "b-bit form is 2^b + 1 (17: 6 bits per coordinate; 257: 10 bits).", "SPEC 3.5; FedSynSAM eq. 3")
    qsgd_scope: str = _key("tensor", "qsgd: one norm per tensor, per model (the whole update, FedSynSAM eq. 3) "
                           "or per bucket of qsgd-bucket coordinates of the whole update.", "SPEC 3.5")
    qsgd_bucket: int = _key(512, "qsgd-scope = bucket: coordinates per bucket (one float32 norm each).", "SPEC 3.5")
    topk_ratio: float = _key(0.1, "topk: fraction of each tensor's coordinates kept (largest magnitudes).",
                             "FedSynSAM: 0.1, 0.25")
    error_feedback: bool = _key(
        False, "Compress the update plus last round's compression error (kept in node state).", "SPEC 3.5"
    )
    trajectory_rounds: int = _key(
        30, "R: fedsynsam/dynafed keep the global models w^0..w^R and distil the synthetic set after round R.",
        "FedSynSAM: 30",
    )
    synthetic_ipc: int = _key(20, "Synthetic images per class distilled from the trajectory.", "FedSynSAM: 20")
    distill_iterations: int = _key(200, "M: trajectory-matching iterations.", "FedSynSAM: 200")
    distill_inner_steps: int = _key(
        0, "s: steps on the synthetic set per matched segment (0: 3 for grey images, 5 for colour).",
        "FedSynSAM: 3 / 5",
    )
    distill_optimizer: str = _key(
        "auto", "Optimizer of the synthetic images: adam, sgd (momentum 0.5), auto (adam grey, sgd colour).",
        "FedSynSAM",
    )
    distill_lr: float = _key(0.0, "Learning rate of the synthetic images (0: 0.05 with adam, 1000 with sgd).",
                             "FedSynSAM")
    distill_alpha_init: float = _key(0.01, "Initial value of the learnable inner step size alpha.", "FedSynSAM")
    distill_alpha_lr: float = _key(1e-5, "SGD learning rate of alpha.", "FedSynSAM")
    synthetic_source: str = _key(
        "distilled", "fedsynsam/dynafed: where D_syn comes from after round R: distilled (the method: trajectory "
        "matching) or real-oracle (a diagnostic, NOT the method: synthetic-ipc real training images per class drawn "
        "with the run's seed; the server reads the training split, which a federated server does not hold).",
        "diagnostic",
    )
    synsam_beta: float = _key(
        0.9, "FedSynSAM: weight of the local gradient in the ascent direction (1 - beta: synthetic).", "FedSynSAM"
    )
    synsam_mix: str = _key(
        "paper", "FedSynSAM ascent mix: paper (beta grad_local + (1 - beta) grad_syn) or normalized (an ablation, "
        "not the paper's: each gradient scaled to unit norm before mixing).", "FedSynSAM eq. 14; ablation",
    )
    matching_loss: str = _key(
        "normalized", "fedsynsam/dynafed distillation loss: normalized (||w_hat - w^{r+s}||^2 / ||w^r - w^{r+s}||^2, "
        "SPEC 4.3's choice, as in trajectory matching) or paper (FedSynSAM eq. 9's unnormalised ||w_hat - w^{r+s}||^2, "
        "faithful to the paper). distill-loss-start/-end are logged in the chosen loss.", "FedSynSAM eq. 9; SPEC 4.3"
    )
    dynafed_lr: float = _key(1e-4, "DynaFed: Adam learning rate of the server's training on the synthetic set.",
                             "SPEC 4.1")
    dynafed_epochs: int = _key(5, "DynaFed: epochs on the synthetic set after every aggregation.", "SPEC 4.1")
    dyn_alpha: float = _key(
        0.1, "fedlesam-d / fedsmoo: weight alpha of the FedDyn-style dynamic regulariser.", "FedDyn; FedSMOO"
    )
    perturbation_diagnostic: bool = _key(
        False, "Simulation only: log each round the cosine of the FedSAM/FedLESAM/FedSynSAM ascent directions "
        "with the true gradient on the sampled clients' data.", "FedSynSAM Fig. 2",
    )

    # --- Decentralized FL (issue 6): dpsgd, dfedavg, dfedavgm, dfedsam, oledfl-sgd, oledfl-sam ---
    topology: str = _key(
        "random", "Decentralized topology: random (a fresh k-regular graph each round: every node has exactly k "
        "neighbours), random-draws (each node draws k peers, links both ways: k to ~2k neighbours), random-pull "
        "(each node draws k peers and averages itself and them, 1/(k+1) each: DisPFL's directed pull graph, "
        "row-stochastic only; needs mixing = uniform), ring, grid (2-D torus), exponential, full.",
        "SPEC 4.5",
    )
    peers: int = _key(10, "Random topologies: neighbours k per node and round (random: n * k even, k < n).",
                      "OledFL: 10")
    mixing: str = _key(
        "metropolis", "Decentralized mixing weights: metropolis (Metropolis-Hastings) or uniform (1/(k+1) on the "
        "node and each neighbour; needs every node to have k neighbours; equal to metropolis on such graphs).",
        "SPEC 4.5; DisPFL code",
    )
    ole_beta: float = _key(0.99, "OledFL: Ole coefficient beta, start from x_i + beta (x_i - z_i^{t-1}); in [0, 1).",
                           "OledFL: 0.99 CIFAR-10, 0.8 CIFAR-100")
    relay_mixing: bool = _key(
        False, "Decentralized: the relay sends each node the weighted sum of its neighbours' models (one model) "
        "instead of every neighbour's model; same numbers, less traffic.", "SPEC 4.5",
    )
    dfedavgm_momentum: float = _key(0.9, "DFedAvgM: local SGD momentum (buffer reset every round).",
                                    "DFedAvgM: 0.9")
    target_accuracies: str = _key(
        "0.7,0.75,0.8", "Comma-separated accuracies of the average model; the summary reports the first round "
        "reaching each (decentralized runs).", "OledFL Table III",
    )

    # --- FedCOG (issue 4): complementary generation + KD, a client-side plug-in ---
    cog: bool = _key(
        False, "Turn FedCOG on over the configured base algorithm (fedavg, fedavgm, fedprox, scaffold, moon); "
        "the same as algorithm = \"X+cog\" (\"fedcog\" = \"fedavg+cog\").", "SPEC 4.2",
    )
    cog_start_round: int = _key(
        0, "First FedCOG round; earlier rounds run the base unchanged. 0: the paper's schedule scaled to "
        "num-server-rounds (round 51 of 70, 15 of 20).", "FedCOG: 50 base + 20 FedCOG rounds",
    )
    gen_budget: int = _key(256, "FedCOG: generation budget G, split over the classes a client lacks.", "FedCOG: 256")
    gen_steps: int = _key(100, "FedCOG: Adam steps on the generated inputs.", "FedCOG: 100 (Table 10)")
    gen_lr: float = _key(0.01, "FedCOG: Adam learning rate of the inputs (betas 0.5, 0.9).", "FedCOG code: 0.01")
    lambda_dis: float = _key(0.1, "FedCOG: weight of the disagreement term 1 - JS(global, previous local).",
                             "FedCOG: 0.1")
    kd_weighting: str = _key(
        "balanced", "FedCOG: balanced (c_real, c_kd from real vs missing sample counts) or fixed "
        "(c_real = 1, c_kd = lambda-kd).", "FedCOG A.2.2 and code",
    )
    lambda_kd: float = _key(0.01, "FedCOG: KD weight with kd-weighting = fixed.", "FedCOG: 0.01")
    cog_ablation: str = _key(
        "none", "FedCOG Table 5: none (full), noise (Gaussian inputs, not optimised), global-only "
        "(no disagreement term), hard-label (CE on the global model's argmax instead of KD).", "FedCOG Table 5",
    )
    cog_grid_partition: int = _key(
        0, "FedCOG: the node with this partition id writes fedcog-generated.png (its generated inputs per "
        "class) to its results folder each FedCOG round; -1: none. Needs run-name.", "FedCOG Fig. 5",
    )

    # --- FedDDPM (issue 5): the diffusion task (a unet-* model), FedDDPM / FedDDPM+, FID ---
    image_size: int = _key(
        0, "Diffusion task, and partition = node: side of the square images, resized with antialiasing on load; "
        "0: the dataset's own.", "SPEC 3.1"
    )
    diffusion_timesteps: int = _key(
        0, "Diffusion task: T, the number of DDPM steps (linear beta 1e-4 to 0.02); 0: the U-Net preset's "
        "(500 for unet-small and unet-paper-mnist, 1000 for unet-paper-cifar).", "FedDDPM: 500 MNIST, 1000 CIFAR",
    )
    local_optimizer: str = _key(
        "auto", "Optimizer of local training and of FedDDPM's server epochs: sgd, adam, or auto (adam for the "
        "diffusion task, sgd otherwise); a new one every round.", "FedDDPM: Adam",
    )
    sampler: str = _key(
        "ddpm", "Diffusion task: sampler of the evaluation's images (FID, KID, grids, QuickTest): ddpm "
        "(ancestral, T steps) or ddim (eta 0, ddim-steps steps, for quick checks; results name the sampler).",
        "SPEC 4.4",
    )
    aux_sampler: str = _key(
        "ddpm", "FedDDPM(+): sampler of the auxiliary set: ddpm (ancestral, the paper's) or ddim (ddim-steps steps).",
        "FedDDPM Alg. 1",
    )
    ddim_steps: int = _key(50, "Diffusion task: steps of the ddim sampler.", "DDIM")
    fid_every: int = _key(
        10, "Diffusion task: FID and a sample grid every this many rounds and after the last; 0: only after the "
        "last.", "SPEC 3.6",
    )
    fid_samples: int = _key(1000, "Diffusion task: generated images per round's FID and KID (against the real "
                            "training split).", "SPEC 3.6")
    final_fid_samples: int = _key(
        5000, "Diffusion task: generated images of the final model's final-fid, final-kid and class histogram "
        "(mode coverage); 0: none.",
    )
    fid_features: str = _key(
        "auto", "FID feature extractor: classifier (small CNN trained on the server's copy of the training split, "
        "cached on disk, offline), random (the same CNN untrained, from a fixed seed: needs no data; its FIDs "
        "compare only with its own) or inception (Inception-v3, local weights only, on every host with partition = "
        "node); auto: random with partition = node (the server holds no images), else classifier.", "SPEC 3.6",
    )
    warmup_epochs: int = _key(
        200, "FedDDPM(+): epochs each node trains its own DDPM before round 1 (uploaded once).",
        "FedDDPM: 200 MNIST, 400 CIFAR-10, 600 CIFAR-100",
    )
    warmup_steps: int = _key(0, "FedDDPM(+): warmup length in local steps instead of epochs; 0: use warmup-epochs.",
                             "CPU presets")
    warmup_timeout: float = _key(7200.0, "FedDDPM(+): seconds to wait for the nodes' warm models.")
    aux_fraction: float = _key(
        0.1, "FedDDPM(+): the server samples aux-fraction * m_i images from node i's warm model (kept on the "
        "server only).", "FedDDPM: 0.1",
    )
    correction_epochs: int = _key(
        1, "FedDDPM: server epochs E on the auxiliary set after every aggregation.", "FedDDPM: 1 MNIST, 5 CIFAR"
    )
    correction_lr: float = _key(5e-5, "FedDDPM: learning rate eta of the server's epochs on the auxiliary set after "
                                "every aggregation (FedDDPM+'s one-shot uses oneshot-lr).",
                                "FedDDPM: 5e-5")
    oneshot_epochs: int = _key(20, "FedDDPM+: epochs of the one-shot correction on the auxiliary set.",
                               "FedDDPM+: 20 MNIST, 30 CIFAR")
    oneshot_lr: float = _key(
        0.0, "FedDDPM+: learning rate of the one-shot correction; 0: the clients' lr (zeta).", "FedDDPM Alg. 2"
    )
    quicktest_every: int = _key(
        10, "FedDDPM+: QuickTest at t = 0, every, 2*every, ... (t = round - 1: rounds 1, 11, 21 with 10); 0: never "
        "(correct after the last).", "FedDDPM+ Alg. 3: t mod 10 = 0",
    )
    quicktest_size: int = _key(500, "FedDDPM+: samples scored by each QuickTest (FID against the auxiliary set).",
                               "FedDDPM+: 500")
    quicktest_gamma: float = _key(0.4, "FedDDPM+: EMA weight gamma of the newest QuickTest score.", "FedDDPM+: 0.4")
    quicktest_threshold: float = _key(
        0.2, "FedDDPM+: stop when abs(EMA - score) <= threshold (in FID units of fid-features).", "FedDDPM+: 0.2"
    )
    quicktest_reference: str = _key(
        "auxiliary", "FedDDPM+: QuickTest's reference statistics, none from real data at the server: auxiliary "
        "(the auxiliary set's features) or clients (the nodes' pooled feature sums, asked for once).", "SPEC 4.4",
    )

    def __post_init__(self) -> None:
        if self.model == "auto":  # the algorithm's paper model when the user names none
            object.__setattr__(self, "model", default_model(self.algorithm))
        if self.fid_features == "auto":  # no server data with partition = node: an extractor that needs none
            object.__setattr__(self, "fid_features", "random" if self.partition == NODE_PARTITION else "classifier")

    def as_dict(self) -> dict[str, Any]:
        """The config as run-config keys (dashes), as written to config.json."""
        return {key_name(f.name): getattr(self, f.name) for f in dataclasses.fields(self)}

    def oneshot_rate(self) -> float:
        """FedDDPM+'s one-shot rate: `oneshot-lr`, or the clients' `lr` (Algorithm 2 trains it at zeta)."""
        return self.oneshot_lr or self.lr

    def local_lr(self, server_round: int) -> float:
        """Learning rate of a round, `lr * lr-decay^(round-1)`."""
        return self.lr * self.lr_decay ** (server_round - 1)


def cog_enabled(cfg: RunConfig) -> bool:
    """Whether this run uses FedCOG: `fedcog`, an `X+cog` name, or `cog = true`."""
    return cfg.cog or cfg.algorithm == "fedcog" or cfg.algorithm.endswith("+cog")


def default_model(algorithm: str) -> str:
    """`model = "auto"`: FedDDPM's MNIST U-Net for the diffusion algorithms, the simple CNN otherwise."""
    return "unet-paper-mnist" if algorithm in ("fedddpm", "fedddpm+") else "cnn"


def key_name(field_name: str) -> str:
    """The run-config key of a dataclass field (`num_server_rounds` -> `num-server-rounds`)."""
    return field_name.replace("_", "-")


def config_fields() -> list[dataclasses.Field]:
    """All run-config fields, in declaration order."""
    return list(dataclasses.fields(RunConfig))


def _coerce(key: str, value: Any, default: Any) -> Any:
    """Coerce a TOML/CLI value to the type of the key's default, or raise ConfigError."""
    expected = type(default)
    if expected is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise ConfigError(f"run config key '{key}': expected true or false, got {value!r}")
    if expected is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise ConfigError(f"run config key '{key}': expected an integer, got {value!r}")
        return value
    if expected is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"run config key '{key}': expected a number, got {value!r}")
        if not math.isfinite(value):
            raise ConfigError(f"run config key '{key}': expected a finite number, got {value!r}")
        return float(value)
    if not isinstance(value, str):
        raise ConfigError(f"run config key '{key}': expected a string, got {value!r}")
    return value


def _require(condition: bool, key: str, value: Any, accepted: str) -> None:
    if not condition:
        raise ConfigError(f"run config key '{key}' = {value!r} is invalid; accepted: {accepted}")


def _check_choice(key: str, value: str, choices: Iterable[str]) -> None:
    choices = tuple(choices)
    _require(value in choices, key, value, "one of " + ", ".join(choices))


def _check_values(cfg: RunConfig, known_algorithms: Iterable[str]) -> None:
    """Range and consistency checks; each names the key and the accepted values."""
    for f in config_fields():  # a NUL in a name or path fails deep in the OS ("embedded null byte")
        value = getattr(cfg, f.name)
        _require(not (isinstance(value, str) and "\x00" in value), key_name(f.name), value, "text without a NUL byte")
    _require(cfg.seed >= 0, "seed", cfg.seed, "an integer >= 0 (numpy's generators take no negative seed)")
    _check_choice("algorithm", cfg.algorithm, sorted(known_algorithms))
    hf = is_hf(cfg.dataset)
    node = cfg.partition == NODE_PARTITION
    _require(cfg.dataset in DATASETS or (hf and len(cfg.dataset) > 3) or (node and cfg.dataset == OWN_DATASET),
             "dataset", cfg.dataset, "one of " + ", ".join(DATASETS) + " or hf:<repo>"
             + (f" ({OWN_DATASET} only with partition = node)" if cfg.dataset == OWN_DATASET else ""))
    if is_user_model(cfg.model):  # package.module:factory (SPEC 3.3)
        try:
            user_factory(cfg.model)
        except ValueError as err:
            raise ConfigError(f"run config key 'model': {err}") from None
        _require(cfg.algorithm.split("+", 1)[0] != "moon", "model", cfg.model,
                 f"a built-in classifier with moon (MOON needs the model's `features` and `head`: "
                 f"{', '.join(MODELS)})")
    else:
        _check_choice("model", cfg.model, ("auto",) + MODELS + tuple(UNET_PRESETS) + ("package.module:factory",))
    _require(cfg.gn_groups >= 1 and 64 % cfg.gn_groups == 0, "gn-groups", cfg.gn_groups,
             "a divisor of 64 (1, 2, 4, 8, 16, 32 or 64)")
    _check_choice("partition", cfg.partition, PARTITIONS)
    _check_choice("aggregation", cfg.aggregation, AGGREGATIONS)
    _require(cfg.num_server_rounds >= 1, "num-server-rounds", cfg.num_server_rounds, "an integer >= 1")
    _require(cfg.alpha > 0, "alpha", cfg.alpha, "a number > 0")
    if not node:
        _require(cfg.image_channels == 0 or hf, "image-channels", cfg.image_channels,
                 "0 unless partition = node or the dataset is hf:<repo>")
        _require(cfg.num_classes == 0 or hf, "num-classes", cfg.num_classes,
                 "0 unless partition = node or the dataset is hf:<repo>")
    if node:
        _check_node_values(cfg)
    elif hf:  # an hf: dataset's classes are known once it is opened: the partitioner checks then
        _require(cfg.classes_per_client >= 1, "classes-per-client", cfg.classes_per_client, "an integer >= 1")
    else:
        num_classes = dataset_info(cfg.dataset).num_classes
        _require(
            1 <= cfg.classes_per_client <= num_classes,
            "classes-per-client",
            cfg.classes_per_client,
            f"an integer in 1..{num_classes} (dataset '{cfg.dataset}' has {num_classes} classes)",
        )
        _require(cfg.partition != "pairs" or num_classes % cfg.classes_per_client == 0, "classes-per-client",
                 cfg.classes_per_client, f"with partition 'pairs' a divisor of the {num_classes} classes of "
                 f"'{cfg.dataset}'")
    _require(0 <= cfg.local_test_fraction < 1, "local-test-fraction", cfg.local_test_fraction, "a number in [0, 1)")
    _require(0 < cfg.fraction_train <= 1, "fraction-train", cfg.fraction_train, "a number in (0, 1]")
    _require(cfg.min_nodes >= 1, "min-nodes", cfg.min_nodes, "an integer >= 1")
    _require(cfg.max_missing_nodes >= 0, "max-missing-nodes", cfg.max_missing_nodes, "an integer >= 0")
    _require(cfg.max_failed_rounds >= 1, "max-failed-rounds", cfg.max_failed_rounds, "an integer >= 1")
    _require(cfg.round_timeout > 0, "round-timeout", cfg.round_timeout, "seconds > 0")
    _require(0 < cfg.reply_poll_interval <= 10, "reply-poll-interval", cfg.reply_poll_interval, "seconds in (0, 10]")
    _require(cfg.node_wait_timeout > 0, "node-wait-timeout", cfg.node_wait_timeout, "seconds > 0")
    _require(cfg.local_epochs >= 1, "local-epochs", cfg.local_epochs, "an integer >= 1")
    _require(cfg.local_steps >= 0, "local-steps", cfg.local_steps, "an integer >= 0 (0: use local-epochs)")
    _require(cfg.batch_size >= 1, "batch-size", cfg.batch_size, "an integer >= 1")
    _require(cfg.lr > 0, "lr", cfg.lr, "a number > 0")
    _require(0 < cfg.lr_decay <= 1, "lr-decay", cfg.lr_decay, "a number in (0, 1]")
    _require(0 <= cfg.momentum < 1, "momentum", cfg.momentum, "a number in [0, 1)")
    _require(cfg.weight_decay >= 0, "weight-decay", cfg.weight_decay, "a number >= 0")
    _require(cfg.clip_grad_norm >= 0 and math.isfinite(cfg.clip_grad_norm), "clip-grad-norm", cfg.clip_grad_norm,
             "a number >= 0 (0: no clipping)")
    _require(0 <= cfg.trim_fraction < 0.5, "trim-fraction", cfg.trim_fraction, "a number in [0, 0.5)")
    _require(cfg.byzantine_nodes >= 0, "byzantine-nodes", cfg.byzantine_nodes, "an integer >= 0")
    _require(cfg.max_update_norm >= 0, "max-update-norm", cfg.max_update_norm, "a number >= 0 (0: no bound)")
    _require(cfg.max_update_norm_ratio == 0 or cfg.max_update_norm_ratio >= 1, "max-update-norm-ratio",
             cfg.max_update_norm_ratio, "0 (off) or a number >= 1 (a multiple of the round's median update norm)")
    _check_choice("update-norm-action", cfg.update_norm_action, ("clip", "refuse"))
    _require(0 < cfg.max_weight_share <= 1, "max-weight-share", cfg.max_weight_share,
             "a share in (0, 1] (1: no cap)")
    _require(cfg.max_record_norm >= 0, "max-record-norm", cfg.max_record_norm, "a number >= 0 (0: no bound)")
    _require(cfg.aggregation in ("weighted", "uniform") or cfg.algorithm not in DECENTRALIZED_ALGORITHMS,
             "aggregation", cfg.aggregation, "weighted or uniform with a decentralized algorithm (no server mean)")
    _require(cfg.server_lr > 0, "server-lr", cfg.server_lr, "a number > 0")
    _require(0 <= cfg.server_momentum < 1, "server-momentum", cfg.server_momentum, "a number in [0, 1)")
    _require(cfg.proximal_mu >= 0, "proximal-mu", cfg.proximal_mu, "a number >= 0")
    _require(cfg.moon_mu >= 0, "moon-mu", cfg.moon_mu, "a number >= 0")
    _require(cfg.moon_tau > 0, "moon-tau", cfg.moon_tau, "a number > 0")
    _require(cfg.moon_projection_dim >= 1, "moon-projection-dim", cfg.moon_projection_dim, "an integer >= 1")
    _require(cfg.sam_rho >= 0, "sam-rho", cfg.sam_rho, "a number >= 0")
    _require(0 <= cfg.mofedsam_alpha <= 1, "mofedsam-alpha", cfg.mofedsam_alpha, "a number in [0, 1]")
    _require(cfg.eval_every >= 0, "eval-every", cfg.eval_every, "an integer >= 0")
    device_ok = cfg.device in ("auto", "cpu", "cuda") or (
        cfg.device.startswith("cuda:") and cfg.device[5:].isdigit()
    )
    _require(device_ok, "device", cfg.device, "auto, cpu, cuda or cuda:N")
    _require(
        "/" not in cfg.run_name and cfg.run_name not in (".", ".."),
        "run-name",
        cfg.run_name,
        "a folder name without '/'",
    )
    _require(cfg.checkpoint_every >= 0, "checkpoint-every", cfg.checkpoint_every, "an integer >= 0 (0: never)")
    _require(not cfg.resume or bool(cfg.run_name), "run-name", cfg.run_name,
             "the name of the run to continue when resume = true")
    # FedSynSAM (issue 3)
    _check_choice("compression", cfg.compression, ("none", "qsgd", "topk"))
    _require(2 <= cfg.bits <= 9, "bits", cfg.bits, "an integer in 2..9 (1 sign bit + 1..8 level bits)")
    _require(0 <= cfg.levels <= 65535, "levels", cfg.levels, "an integer in 0..65535 (0: from bits)")
    _check_choice("qsgd-scope", cfg.qsgd_scope, ("tensor", "model", "bucket"))
    _require(cfg.qsgd_bucket >= 1, "qsgd-bucket", cfg.qsgd_bucket, "an integer >= 1")
    _require(0 < cfg.topk_ratio <= 1, "topk-ratio", cfg.topk_ratio, "a number in (0, 1]")
    _require(cfg.trajectory_rounds >= 1, "trajectory-rounds", cfg.trajectory_rounds, "an integer >= 1")
    _require(cfg.synthetic_ipc >= 1, "synthetic-ipc", cfg.synthetic_ipc, "an integer >= 1")
    _require(cfg.distill_iterations >= 0, "distill-iterations", cfg.distill_iterations, "an integer >= 0")
    _require(cfg.distill_inner_steps >= 0, "distill-inner-steps", cfg.distill_inner_steps,
             "an integer >= 0 (0: by dataset)")
    _check_choice("distill-optimizer", cfg.distill_optimizer, ("auto", "adam", "sgd"))
    _require(cfg.distill_lr >= 0, "distill-lr", cfg.distill_lr, "a number >= 0 (0: by optimizer)")
    _require(cfg.distill_alpha_init > 0, "distill-alpha-init", cfg.distill_alpha_init, "a number > 0")
    _require(cfg.distill_alpha_lr >= 0, "distill-alpha-lr", cfg.distill_alpha_lr, "a number >= 0")
    _require(0 <= cfg.synsam_beta <= 1, "synsam-beta", cfg.synsam_beta, "a number in [0, 1]")
    _check_choice("synsam-mix", cfg.synsam_mix, ("paper", "normalized"))
    _check_choice("matching-loss", cfg.matching_loss, MATCHING_LOSSES)
    _check_choice("synthetic-source", cfg.synthetic_source, SYNTHETIC_SOURCES)
    _require(cfg.synthetic_source != REAL_ORACLE or cfg.partition != NODE_PARTITION, "synthetic-source",
             cfg.synthetic_source, "distilled with partition = node (real-oracle reads the training split on the "
             "server, and the sites' data is not there)")
    _require(cfg.dynafed_lr > 0, "dynafed-lr", cfg.dynafed_lr, "a number > 0")
    _require(cfg.dynafed_epochs >= 0, "dynafed-epochs", cfg.dynafed_epochs, "an integer >= 0")
    _require(cfg.dyn_alpha > 0, "dyn-alpha", cfg.dyn_alpha, "a number > 0")
    # Decentralized FL (issue 6)
    _check_choice("topology", cfg.topology, TOPOLOGIES)
    _require(cfg.peers >= 1, "peers", cfg.peers, "an integer >= 1")
    _check_choice("mixing", cfg.mixing, MIXINGS)
    _require(0 <= cfg.ole_beta < 1, "ole-beta", cfg.ole_beta, "a number in [0, 1) (OledFL diverges for beta >= 1)")
    _require(0 <= cfg.dfedavgm_momentum < 1, "dfedavgm-momentum", cfg.dfedavgm_momentum, "a number in [0, 1)")
    try:
        parse_targets(cfg.target_accuracies)
    except ValueError as err:
        raise ConfigError(f"run config key 'target-accuracies' = {cfg.target_accuracies!r} is invalid ({err}); "
                          "accepted: comma-separated accuracies in (0, 1], e.g. \"0.7,0.8\"") from None
    _require(cfg.algorithm not in DECENTRALIZED_ALGORITHMS or cfg.compression == "none", "compression",
             cfg.compression, "none with a decentralized algorithm (nodes exchange full models)")
    # FedCOG (issue 4)
    _require(not cfg.cog or cfg.algorithm.split("+", 1)[0] in COG_BASES + ("fedcog",), "cog", cfg.cog,
             f"true only with a base algorithm FedCOG plugs into: {', '.join(COG_BASES)}")
    _require(cfg.cog_start_round >= 0, "cog-start-round", cfg.cog_start_round, "an integer >= 0 (0: paper's schedule)")
    _require(cfg.gen_budget >= 1, "gen-budget", cfg.gen_budget, "an integer >= 1")
    _require(cfg.gen_steps >= 0, "gen-steps", cfg.gen_steps, "an integer >= 0 (0: Gaussian-noise inputs)")
    _require(cfg.gen_lr > 0, "gen-lr", cfg.gen_lr, "a number > 0")
    _require(cfg.lambda_dis >= 0, "lambda-dis", cfg.lambda_dis, "a number >= 0")
    _check_choice("kd-weighting", cfg.kd_weighting, KD_WEIGHTINGS)
    _require(cfg.lambda_kd >= 0, "lambda-kd", cfg.lambda_kd, "a number >= 0")
    _check_choice("cog-ablation", cfg.cog_ablation, COG_ABLATIONS)
    _require(cfg.cog_grid_partition >= -1, "cog-grid-partition", cfg.cog_grid_partition,
             "a partition id, or -1 for no grid")
    _check_diffusion_values(cfg)
    if (hf and not node) or is_user_model(cfg.model):  # a user's model is checked when it is built
        return
    try:
        check_model_fits(cfg.model, node_shape_info(cfg) if node else dataset_info(cfg.dataset))
    except ValueError as err:
        raise ConfigError(f"run config key 'model' = {cfg.model!r} does not fit dataset "
                          f"{cfg.dataset!r}: {err}") from None


def _check_node_values(cfg: RunConfig) -> None:
    """partition = node: the shape keys that replace a dataset, and what needs a dataset on the server."""
    _require(not is_hf(cfg.dataset), "dataset", cfg.dataset,
             f"{OWN_DATASET} or a named dataset with partition = node (a node's hf data is its dataset-path: a "
             "save_to_disk or parquet folder)")
    _require(cfg.num_classes >= 0, "num-classes", cfg.num_classes, "an integer >= 0 (0: from class-names)")
    _require(cfg.image_channels in (0, 1, 3), "image-channels", cfg.image_channels, "0, 1 (grey) or 3 (colour)")
    try:
        node_shape_info(cfg)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    if cfg.model in UNET_PRESETS:  # FID's reference is the sites' pooled feature sums (server_app/fid_reference.py)
        _require(cfg.fid_features != "classifier", "fid-features", cfg.fid_features,
                 "random (or inception, with its weights on every host) with a U-Net and partition = node: the "
                 "classifier is trained on real images on the server, which holds none")
    _require(not cfg.perturbation_diagnostic, "perturbation-diagnostic", cfg.perturbation_diagnostic,
             "false with partition = node (it reads every client's data on the server)")


def _check_diffusion_values(cfg: RunConfig) -> None:
    """FedDDPM (issue 5): the diffusion task's keys, and which algorithms and models go together."""
    _require(cfg.image_size >= 0, "image-size", cfg.image_size, "an integer >= 0 (0: the dataset's own)")
    _require(cfg.diffusion_timesteps == 0 or cfg.diffusion_timesteps >= 2, "diffusion-timesteps",
             cfg.diffusion_timesteps, "0 (the U-Net preset's) or an integer >= 2")
    _check_choice("local-optimizer", cfg.local_optimizer, OPTIMIZERS)
    _check_choice("sampler", cfg.sampler, SAMPLERS)
    _check_choice("aux-sampler", cfg.aux_sampler, SAMPLERS)
    _require(cfg.ddim_steps >= 1, "ddim-steps", cfg.ddim_steps, "an integer >= 1")
    _require(cfg.fid_every >= 0, "fid-every", cfg.fid_every, "an integer >= 0 (0: only after the last round)")
    _require(cfg.fid_samples >= 2, "fid-samples", cfg.fid_samples, "an integer >= 2")
    _require(cfg.final_fid_samples == 0 or cfg.final_fid_samples >= 2, "final-fid-samples", cfg.final_fid_samples,
             "0 (none) or an integer >= 2")
    _check_choice("fid-features", cfg.fid_features, FID_EXTRACTORS)
    _require(cfg.warmup_epochs >= 1, "warmup-epochs", cfg.warmup_epochs, "an integer >= 1")
    _require(cfg.warmup_steps >= 0, "warmup-steps", cfg.warmup_steps, "an integer >= 0 (0: use warmup-epochs)")
    _require(cfg.warmup_timeout > 0, "warmup-timeout", cfg.warmup_timeout, "seconds > 0")
    _require(cfg.aux_fraction > 0, "aux-fraction", cfg.aux_fraction, "a number > 0")
    _require(cfg.correction_epochs >= 0, "correction-epochs", cfg.correction_epochs, "an integer >= 0")
    _require(cfg.correction_lr > 0, "correction-lr", cfg.correction_lr, "a number > 0")
    _require(cfg.oneshot_epochs >= 0, "oneshot-epochs", cfg.oneshot_epochs, "an integer >= 0")
    _require(cfg.oneshot_lr >= 0, "oneshot-lr", cfg.oneshot_lr, "a number >= 0 (0: the clients' lr)")
    _require(cfg.quicktest_every >= 0, "quicktest-every", cfg.quicktest_every, "an integer >= 0 (0: never)")
    _require(cfg.quicktest_size >= 2, "quicktest-size", cfg.quicktest_size, "an integer >= 2")
    _require(0 < cfg.quicktest_gamma <= 1, "quicktest-gamma", cfg.quicktest_gamma, "a number in (0, 1]")
    _require(cfg.quicktest_threshold >= 0, "quicktest-threshold", cfg.quicktest_threshold, "a number >= 0")
    _check_choice("quicktest-reference", cfg.quicktest_reference, ("auxiliary", "clients"))
    if cfg.model not in UNET_PRESETS:
        _require(cfg.algorithm not in ("fedddpm", "fedddpm+"), "model", cfg.model,
                 f"a U-Net ({', '.join(UNET_PRESETS)}) with algorithm '{cfg.algorithm}' (the diffusion task)")
        _require(cfg.image_size == 0 or cfg.partition == NODE_PARTITION or is_hf(cfg.dataset), "image-size",
                 cfg.image_size, "0 unless the model is a U-Net (diffusion task), partition = node or an hf: dataset")
        return
    _require(cfg.algorithm in DIFFUSION_ALGORITHMS, "algorithm", cfg.algorithm,
             f"with a U-Net model (diffusion task) one of {', '.join(DIFFUSION_ALGORITHMS)}")
    _require(not cfg.cog, "cog", cfg.cog, "false with a U-Net model (FedCOG needs a classifier)")
    if is_hf(cfg.dataset) and cfg.partition != NODE_PARTITION:
        return
    preset = UNET_PRESETS[cfg.model]
    own = node_shape_info(cfg) if cfg.partition == NODE_PARTITION else dataset_info(cfg.dataset)
    side = cfg.image_size or own.height
    _require(side % preset.downsampling == 0, "image-size", cfg.image_size,
             f"a side divisible by {preset.downsampling} for model '{cfg.model}' (the dataset's own side is "
             f"{own.height}; e.g. image-size = {max(preset.downsampling, side // preset.downsampling * preset.downsampling)})")
    timesteps = cfg.diffusion_timesteps or preset.timesteps
    _require("ddim" not in (cfg.sampler, cfg.aux_sampler) or cfg.ddim_steps <= timesteps, "ddim-steps", cfg.ddim_steps,
             f"at most T = {timesteps} (diffusion-timesteps)")


def parse_run_config(raw: Mapping[str, Any], known_algorithms: Iterable[str]) -> RunConfig:
    """Build and validate a RunConfig from Flower's run config.

    Keys absent from `raw` take their defaults; unknown keys are an error (Flower
    rejects them in `flwr run`, and the in-process CLI must behave the same).
    """
    fields_by_key = {key_name(f.name): f for f in config_fields()}
    unknown = sorted(set(raw) - set(fields_by_key))
    if unknown:
        import difflib

        hints = []
        for key in unknown:
            close = difflib.get_close_matches(key, list(fields_by_key), n=3, cutoff=0.6)
            hints.append(f"'{key}' (did you mean {' or '.join(repr(c) for c in close)}?)" if close else f"'{key}'")
        raise ConfigError(
            f"unknown run config key(s): {', '.join(hints)}; the known keys are listed in the README's run-config "
            "table (known keys: " + ", ".join(fields_by_key) + ")"
        )
    values = {
        f.name: _coerce(key, raw[key], f.default)
        for key, f in fields_by_key.items()
        if key in raw
    }
    cfg = RunConfig(**values)
    _check_values(cfg, known_algorithms)
    return cfg


def parse_overrides(text: str) -> dict[str, Any]:
    """Parse `--run-config "a=1 b='x'"` the way Flower does: space-separated key=value, values in TOML.

    As in `flwr run` (flwr.common.config.parse_config_args), a quoted value stays a
    string (`run-name='2024'` is the string "2024") and may hold spaces; a bare
    word that is not TOML is taken as a string.
    """
    import re
    import tomllib

    pattern = re.compile(r"(\S+?)=('[^']*'|\"[^\"]*\"|\S+)")
    overrides: dict[str, Any] = {}
    rest = pattern.sub(" ", text).split()
    if rest:
        raise ConfigError(f"run config override {rest[0]!r} is not of the form key=value")
    for key, value in pattern.findall(text):
        try:
            overrides[key] = tomllib.loads(f"v = {value}")["v"]
        except tomllib.TOMLDecodeError:
            overrides[key] = value  # a bare word is a string, as in Flower's CLI
    return overrides


def config_table_markdown() -> str:
    """The run-config table, generated from the fields above."""
    rows = ["| key | default | meaning | source |", "| --- | --- | --- | --- |"]
    for f in config_fields():
        default = f.default
        shown = f'"{default}"' if isinstance(default, str) else str(default).lower() if isinstance(default, bool) else default
        meaning, source = (str(f.metadata[k]).replace("|", "\\|") for k in ("meaning", "source"))
        rows.append(f"| `{key_name(f.name)}` | `{shown}` | {meaning} | {source} |")
    return "\n".join(rows)


CONFIGURATION_PAGE_INTRO = """\
# Run configuration

<!-- Generated from common/run/config.py: do not edit by hand. Regenerate with
     python -m common.run.config --markdown > docs/configuration.md
     (tests/test_docs.py fails when this page and common/run/config.py disagree.) -->

Every key below lives in `[tool.flwr.app.config]` in `pyproject.toml` and can be overridden with
`--run-config "key=value key2='text'"` (`fedsynth run`, `fedsynth compare`, `flwr run .`) or in a study
file ([studies.md](studies.md)). Server and clients validate the config before any work: an unknown key or
algorithm lists the known ones, and a bad value stops the run with one message naming the key and the
accepted values. On a SuperNode, the node config keys `partition-id`, `num-partitions` (required, except
with `partition = "node"`), `dataset-path`, `name`, `data-dir`, `cache-dir` and `device` (optional,
overriding the run config on that node) are set with `flower-supernode --node-config`
([deployment.md](deployment.md), [own-data.md](own-data.md)). The *source* column names where a
default comes from (a paper, or SPEC.md).
"""


def configuration_page() -> str:
    """docs/configuration.md: the introduction and the generated table."""
    return f"{CONFIGURATION_PAGE_INTRO}\n{config_table_markdown()}\n"


if __name__ == "__main__":
    import sys

    # python -m common.run.config --markdown > docs/configuration.md   (no flag: the table alone)
    sys.stdout.write(configuration_page() if "--markdown" in sys.argv[1:] else config_table_markdown() + "\n")
