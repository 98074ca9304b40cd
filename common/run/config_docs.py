"""docs/configuration.md, generated from the run config's parts: one table of keys per part.

Every key's row (default, meaning, source) comes from its field in the part that declares it
(common/run/config.py's `PARTS`), so the page cannot drift from the code: tests/test_docs.py
compares the page with `configuration_page()`. Regenerate with
`python -m common.run.config_docs --markdown > docs/configuration.md`.
"""

from __future__ import annotations

import dataclasses
import sys

from collections.abc import Mapping

from common.algorithm_table import PaperRule
from common.algorithms.plugins import plugin_algorithm, rule_keys
from common.keys import key_name, own_fields
from common.run.config import PARTS, config_fields
from common.run.own_settings import SEPARATOR, own_keys, settings_group, strategy_of


def part_table_markdown(part: type, prefix: str = "", fields: list[dataclasses.Field] | None = None) -> str:
    """One part's own keys (`own_fields`: not those of a group it extends; or `fields`) as a markdown table: key
    (after `prefix`: a plugin's "<name>."), default, meaning, source."""
    rows = ["| key | default | meaning | source |", "| --- | --- | --- | --- |"]
    for f in own_fields(part) if fields is None else fields:
        default = f.default
        shown = f'"{default}"' if isinstance(default, str) else str(default).lower() if isinstance(default, bool) else default
        meaning, source = (str(f.metadata[k]).replace("|", "\\|") for k in ("meaning", "source"))
        rows.append(f"| `{prefix}{key_name(f.name)}` | `{shown}` | {meaning} | {source} |")
    return "\n".join(rows)


def config_table_markdown() -> str:
    """Every part's table under a heading, its docstring's first line, in the parts' reading order."""
    sections = []
    for part in PARTS:
        heading = (part.__doc__ or part.__name__).strip().splitlines()[0].rstrip(".")
        sections.append(f"## {heading}\n\n{part_table_markdown(part)}")
    return "\n\n".join(sections)


CONFIGURATION_PAGE_INTRO = """\
# Run configuration

<!-- Generated from the run config's parts (common/run/config.py's PARTS): do not edit by hand. Regenerate with
     python -m common.run.config_docs --markdown > docs/configuration.md
     (tests/test_docs.py fails when this page and the code disagree.) -->

Every key below lives in `[tool.flwr.app.config]` in `pyproject.toml` and can be overridden with
`--run-config "key=value key2='text'"` (`fedsynth run`, `fedsynth compare`, `flwr run .`) or in a study
file ([studies.md](studies.md)). Server and clients validate the config before any work: an unknown key or
algorithm lists the known ones, and a bad value stops the run with one message naming the key and the
accepted values. On a SuperNode, the node config keys `partition-id`, `num-partitions` (required, except
with `partition = "node"`), `dataset-path`, `name`, `data-dir`, `cache-dir` and `device` (optional,
overriding the run config on that node) are set with `flower-supernode --node-config`
([deployment.md](deployment.md), [own-data.md](own-data.md)). The *source* column names where a
default comes from (a paper, or SPEC.md). The keys are grouped by the part of the code that reads them.
"""


def configuration_page() -> str:
    """docs/configuration.md: the introduction and the generated tables."""
    return f"{CONFIGURATION_PAGE_INTRO}\n{config_table_markdown()}\n"


def own_settings_markdown(path: str) -> str:
    """The run-config keys of the plugin `path` ("package.module:Name"): its settings group's table under its name
    (common/run/own_settings.py), or a line saying it declares none."""
    group = settings_group(path)
    if group is None:
        return f"{path} declares no settings of its own\n"
    heading = (group.__doc__ or group.__name__).strip().splitlines()[0].rstrip(".")
    prefix = next(iter(own_keys(strategy_of(path)))).partition(SEPARATOR)[0] + SEPARATOR
    return f"## {heading} ({path})\n\n{part_table_markdown(group, prefix, dataclasses.fields(group))}\n"


# docs/algorithms.md's paper-rule table (fedsynth/algorithm_docs.py `paper_rules_table`), whose rows a plugin's
# rule is shown as too (`paper_rule_markdown`)
PAPER_RULE_HEADER = ("| algorithm | mean | server step | own hyper-parameters (default) | source | the paper's regime |\n"
                     "| --- | --- | --- | --- | --- | --- |")


def _value_text(value: object) -> str:
    return f'"{value}"' if isinstance(value, str) else f"{value:g}" if isinstance(value, float) else str(value)


def paper_rule_row(name: str, rule: PaperRule, mean: str, defaults: Mapping[str, object], server_step: str = "") -> str:
    """One row of the paper-rule table: the algorithm `name`, its `mean` ("-" for none), its rule's server step
    (`server_step` when given), its hyper-parameters `defaults` ({key: declared default}), source and regime."""
    keys = ", ".join(f"`{key}` = {_value_text(value)}" for key, value in defaults.items()) or "-"
    cells = [f"`{name}`", mean, server_step or rule.server_step, keys, rule.source, rule.regime or "the shared defaults"]
    return "| " + " | ".join(" ".join(cell.split()).replace("|", "\\|") for cell in cells) + " |"


def paper_rule_markdown(path: str) -> str:
    """The paper rule the plugin `path` declares (`Algorithm.rule`, checked when the run config is parsed) as a
    built-in's row of docs/algorithms.md shows it: its mean, server step, hyper-parameters with their declared
    defaults (its rule's shared keys, the keys its client reads, its own settings' keys), source and regime; or a
    line saying it declares none."""
    algorithm = plugin_algorithm(path)
    rule = algorithm.rule
    if rule is None:
        return f"{path} declares no paper rule\n"
    declared = {key_name(f.name): f.default for f in config_fields()}
    defaults: dict[str, object] = {key: declared[key] for key in dict.fromkeys(tuple(rule.keys) + rule_keys(algorithm))
                                   if key in declared}
    defaults.update({key: f.default for key, f in own_keys(strategy_of(path)).items()})
    mean = "-" if algorithm.decentralized else f"{algorithm.mean} ({rule.mean_source})"
    return f"## Its paper's rule ({path})\n\n{PAPER_RULE_HEADER}\n{paper_rule_row(path, rule, mean, defaults)}\n"


if __name__ == "__main__":
    # python -m common.run.config_docs --markdown > docs/configuration.md   (no flag: the tables alone)
    # python -m common.run.config_docs --algorithm package.module:Name       (a plugin's own keys and paper rule)
    if "--algorithm" in sys.argv[1:-1]:
        path = sys.argv[sys.argv.index("--algorithm") + 1]
        sys.stdout.write(own_settings_markdown(path) + "\n" + paper_rule_markdown(path))
    else:
        sys.stdout.write(configuration_page() if "--markdown" in sys.argv[1:] else config_table_markdown() + "\n")
