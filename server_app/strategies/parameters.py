"""The keyword parameters of fedsynth's strategies: their defaults and meanings, defined once.

Every strategy class (server_app/strategies/, and the public names of `fedsynth.strategies`) is built from
typed keyword parameters only, as Flower's own strategies are. A parameter has the name of the run-config
key it mirrors (`sam_rho` <-> `sam-rho`), so fedsynth's app builds a strategy from a run config by reading
each of the class's parameters under its own name (server_app/registry.py `build_strategy`), and its default
is the run config's (`DEFAULTS`): a public class and `fedsynth run` start from the same numbers.

`documented` appends a class's "Parameters" section, generated from its signature and `PARAMETER_DOCS`, to
its docstring, so `help(FedSynSAM)` lists every parameter with its type, default and meaning.
"""

from __future__ import annotations

import inspect

from common.run.config import RunConfig

DEFAULTS = RunConfig()  # the run config's defaults (docs/configuration.md): every strategy parameter's default

# What each keyword parameter means, defined once; `documented` writes the entries of a class's own
# parameters, with the class's defaults, into its docstring (Flower's `name : type (default: value)` layout).
PARAMETER_DOCS: dict[str, str] = {
    # the round: sampling, checks, bounded influence
    "fraction_train": "Fraction of the nodes sampled for training each round (at least one).",
    "fraction_evaluate": "Fraction of the nodes sent an evaluate message after each round. A round whose train replies\n"
                         "all carried `local-test-accuracy` (the received model's evaluation, as fedsynth's clients do)\n"
                         "sends none, and the carried numbers become the round's evaluate metrics.",
    "min_nodes": "Fewest good train replies a round needs; with fewer the model stays unchanged.",
    "max_failed_rounds": "Rounds in a row below `min_nodes` after which `start()` raises `TooManyFailedRounds`.",
    "seed": "Seed of the node sampling and of the server's own random draws (the same seed, the same run).",
    "lr_schedule": "If given, each round's train config carries \"lr\" = lr_schedule(server_round); else `start()`'s\n"
                   "`train_config` decides.",
    "nodes": "A node table (node ids with partition ids and example counts, as fedsynth's handshake learns it);\n"
             "None numbers the grid's nodes in node-id order, and every round adds the nodes that joined since.",
    "weighted_by_key": "The reply metric that weighs each reply in the averages, as in Flower's strategies.",
    "node_settings": "Your own settings for the nodes, added to every train message's config (as FedProx sends\n"
                     "\"proximal-mu\"); fedsynth's app sends a rule's run-config keys here (\"proximal-mu\", \"moon-mu\", ...).",
    "parameter_names": "The names of the model's trainable arrays (`[n for n, _ in net.named_parameters()]`): what the\n"
                       "server step, the codec and control variates cover. None: judged from the arrays (floating arrays\n"
                       "not named like normalisation statistics).",
    "min_available_nodes": "Each round waits until the grid has at least this many nodes, as Flower's strategies do.",
    # aggregation
    "server_lr": "The server step: w <- w + server_lr * mean(w_i - w).",
    "aggregation": "\"weighted\" (by `weighted_by_key`), \"uniform\", or the robust \"median\", \"trimmed-mean\", \"krum\".",
    "trim_fraction": "\"trimmed-mean\": the fraction of the highest and of the lowest values dropped per coordinate.",
    "byzantine_nodes": "\"krum\": f, the number of faulty nodes Krum tolerates.",
    "max_weight_share": "No node's share of a weighted mean above this (bounded influence; 1.0 leaves the counts).",
    "max_update_norm": "Bound on a node's update norm (0: none); `update_norm_action` says what happens to longer ones.",
    "max_update_norm_ratio": "Clip each update to this multiple of the round's lower-median update norm (0: off); "
                             "with the default, one node's scaled update cannot move the model far (docs/reliability.md).",
    "update_norm_action": "\"clip\" scales an over-long update (or extra record) to the bound, \"refuse\" drops the reply.",
    "max_record_norm": "Bound on the norm of a node's extra record (control-variate delta, correction; 0: none).",
    # the uplink codec: sent in the train config, and the server decodes with it
    "compression": "The uplink codec the nodes use (\"none\", \"qsgd\", \"topk\"), sent as \"compression\"; the server\n"
                   "decodes the replies with it. Buffers travel uncompressed.",
    "bits": "qsgd: bits per coordinate on the wire, sent as \"bits\".",
    "levels": "qsgd: the number of levels s, overriding `bits` (0: from `bits`), sent as \"levels\".",
    "qsgd_scope": "qsgd: one norm per \"tensor\", per \"model\" or per \"bucket\" of `qsgd_bucket` coordinates (\"qsgd-scope\").",
    "qsgd_bucket": "qsgd-scope \"bucket\": coordinates per bucket, sent as \"qsgd-bucket\".",
    "topk_ratio": "topk: the fraction of coordinates a node sends, sent as \"topk-ratio\".",
    "error_feedback": "Whether the nodes keep the compression error and add it to the next update (\"error-feedback\").",
    # the nodes' rules: sent in every train message's config
    "sam_rho": "SAM's radius rho of the nodes' perturbation, sent as \"sam-rho\".",
    "mofedsam_alpha": "MoFedSAM: weight of the local step against the global momentum, sent as \"mofedsam-alpha\".",
    "dyn_alpha": "FedDyn's alpha (the server's correction and the nodes' penalty), sent as \"dyn-alpha\".",
    "cog_start_round": "The first round in which the nodes generate and distil (0: the paper's schedule), sent as\n"
                       "\"cog-start-round\".",
    "synsam_beta": "Weight of the local gradient in the nodes' ascent direction, sent as \"synsam-beta\".",
    "synsam_mix": "How the nodes mix the local and the synthetic gradient (\"paper\", ...), sent as \"synsam-mix\".",
    "matching_loss": "The distillation's trajectory-matching loss: \"normalized\" (SPEC 4.3) or \"paper\" (eq. 9).",
    "synthetic_source": "Where D_syn comes from: \"distilled\" (the method) or \"real-oracle\" (a diagnostic that reads\n"
                        "the training split on the server; not the method).",
    "task": "The model the server builds itself and the data's shape (common.run.task.ServerTask).",
    "server_momentum": "Momentum of the server's update.",
    # the server's own model: distillation, server training, sampling
    "model": "The model the server builds: a preset name (docs/configuration.md) or \"package.module:factory\".",
    "dataset": "The data whose shape the server's model takes (a dataset name, or \"hf:...\").",
    "data_dir": "Where `dataset` lies, when its shape is read from the files (\"\": the default folder).",
    "image_channels": "Image channels of the data (0: from `dataset`).",
    "image_size": "Image side of the data (0: from `dataset`).",
    "num_classes": "Number of classes of the data (0: from `dataset`).",
    "device": "Where the server's own computation runs (\"auto\", \"cpu\", \"cuda\", ...).",
    "trajectory_rounds": "R, the aggregations recorded before the distillation.",
    "synthetic_ipc": "Synthetic images per class.",
    "distill_iterations": "Iterations of the trajectory-matching distillation.",
    "distill_optimizer": "Optimizer of the synthetic images (\"auto\": Adam for grey images, else SGD).",
    "distill_inner_steps": "Steps of the student per distillation iteration (0: 3 for grey images, else 5).",
    "distill_lr": "Learning rate of the synthetic images (0: from the optimizer).",
    "distill_alpha_init": "Initial value of the learnt student learning rate.",
    "distill_alpha_lr": "Learning rate of the learnt student learning rate.",
    "dynafed_lr": "Learning rate of the server's training on the synthetic set.",
    "dynafed_epochs": "Epochs of the server's training on the synthetic set each round (0: none).",
    "batch_size": "Batch size of the server's own training.",
    # diffusion (FedDDPM, FedDDPM+)
    "diffusion_timesteps": "T of the diffusion (0: the U-Net preset's).",
    "aux_sampler": "The sampler of the auxiliary set (\"ddpm\" ancestral, as the paper, or \"ddim\").",
    "sampler": "The sampler of QuickTest's images (\"ddpm\" or \"ddim\").",
    "ddim_steps": "Steps of the DDIM sampler.",
    "local_optimizer": "Optimizer of the server's corrections (\"auto\": Adam for the diffusion task).",
    "warmup_epochs": "Epochs of each node's warm-up, sent in the warm-up message.",
    "warmup_steps": "Steps of each node's warm-up, overriding `warmup_epochs` (0: epochs).",
    "warmup_timeout": "Seconds the server waits for the warm-up replies.",
    "aux_fraction": "Auxiliary images per node, as a fraction of its example count.",
    "correction_epochs": "Server epochs on the auxiliary set after each aggregation.",
    "correction_lr": "Learning rate of those epochs.",
    "quicktest_every": "Rounds between QuickTests.",
    "quicktest_size": "Images QuickTest samples.",
    "quicktest_gamma": "QuickTest's smoothing of its score.",
    "quicktest_threshold": "QuickTest's threshold: a smoothed change below it stops the rounds.",
    "quicktest_reference": "What QuickTest compares with: \"auxiliary\" (the auxiliary set) or \"clients\" (statistics\n"
                           "the nodes send).",
    "fid_features": "The features QuickTest's FID uses (\"classifier\", \"random\", ...).",
    "cache_dir": "Where the \"classifier\" features' classifier, trained once on `dataset`, is cached (\"\": the default).",
    "oneshot_epochs": "Epochs of the one-shot correction.",
    "oneshot_lr": "Learning rate of the one-shot correction (0: `train_config`'s \"lr\").",
    # decentralized
    "topology": "The peer topology: \"ring\", \"random\" (k-regular, redrawn each round from (seed, round)), \"full\", ...",
    "peers": "k of the random topologies.",
    "mixing": "Weights of the mixing matrix W (\"metropolis\", \"uniform\").",
    "relay_mixing": "Send each node the weighted sum of its neighbours' models instead of each model.",
    "sam": "False: OledFL-SGD; True: OledFL-SAM (the nodes read \"sam-rho\" from the config).",
    "ole_beta": "Ole's coefficient beta, sent to the nodes as \"ole-beta\".",
}


def parameter_section(cls: type) -> str:
    """The "Parameters" section of `cls`'s docstring: each keyword parameter with its type, default and meaning."""
    lines = ["Parameters", "----------"]
    for parameter in inspect.signature(cls).parameters.values():
        default = parameter.default
        shown = getattr(default, "__name__", None) or repr(default)
        lines.append(f"{parameter.name} : {parameter.annotation} (default: {shown})")
        lines.extend("    " + line.strip() for line in PARAMETER_DOCS[parameter.name].splitlines())
    return "\n".join(lines)


def documented(cls: type) -> type:
    """Append the class's parameter section to its docstring, so that `help(cls)` lists every parameter."""
    section = "\n".join("    " + line if line else "" for line in parameter_section(cls).splitlines())
    cls.__doc__ = (cls.__doc__ or "").rstrip() + "\n\n" + section + "\n"
    return cls
