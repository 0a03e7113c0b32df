"""The paper's settings table and how a ``null`` in a table-fed field is resolved.

A ``null`` in a table-fed field (``estimator.psi``, ``agent.num_qvalue_nets``, ...) means
"the paper's value for this dataset": :func:`paper_settings` supplies it from
:data:`PAPER_PSI` and :data:`PAPER_SHARED` (on a generated look-alike set listed in
:data:`GENERATED_PSI`, psi is the paper's offline choice for that set instead; the bundled
demo is hopper-medium-replay-gen's file and resolves as that set does), and
:func:`fill_nulls` writes it into a config's values. ``preset=paper`` leaves every
table-fed field null; the CPU and debug presets set the compute sizes themselves and leave
only ``estimator.psi`` (a property of the dataset, not of the budget) to the table. Any
value given on the command line is not null, so explicit overrides always win.
"""

from __future__ import annotations

from typing import Any

from cbop_torchrl.registry import Task, kind_in_name

PAPER_PSI: dict[str, dict[str, float]] = {
    "halfcheetah": {
        "random": 3.0,
        "medium": 0.5,
        "medium-replay": 0.5,
        "medium-expert": 3.0,
        "expert": 5.0,
        "full-replay": 2.0,
    },
    "hopper": {
        "random": 5.0,
        "medium": 3.0,
        "medium-replay": 2.0,
        "medium-expert": 3.0,
        "expert": 3.0,
        "full-replay": 3.0,
    },
    "walker2d": {
        "random": 5.0,
        "medium": 3.0,
        "medium-replay": 2.0,
        "medium-expert": 3.0,
        "expert": 3.0,
        "full-replay": 2.0,
    },
}
"""The paper's LCB coefficient psi per family and D4RL dataset kind (DESIGN.md section 1)."""

GENERATED_PSI: dict[str, float] = {
    "hopper-medium-replay-gen": 5.0,
    "walker2d-medium-replay-gen": 3.0,
    "halfcheetah-medium-replay-gen": 3.0,
}
"""psi for ``estimator.psi: null`` on the generated look-alike sets (``scripts/collect.py``,
by the set's name) where the paper's own way of choosing it differs from its D4RL table: the
offline choice by FQE over the paper's grid {0.5, 2, 3, 5} (appendix C), made at the CPU
preset's sizes (``python benchmarks/psi_grid.py --select``; the choice, its candidates and
their scores are ``benchmarks/results/<set>/psi_selection.json``; docs/results.md). Sets not
listed keep the D4RL table's psi for their family and kind. walker2d's and halfcheetah's
choices are made on seed 0 of their grids (seeds 1-2 are being made); on halfcheetah FQE's
order is the reverse of the online one (Spearman's rho -0.80), and its choice stands as the
paper's protocol makes it. The choices made at the preset's earlier 15-epoch dynamics model
are ``benchmarks/results/<set>/psi_selection-dyn15.json``."""

SAME_FILE_AS: dict[str, str] = {"hopper-demo-medium-replay-gen": "hopper-medium-replay-gen"}
"""Generated files that are another set's file under another name, so psi resolves as for
that set: the bundled demo is hopper-medium-replay-gen's repository copy (the same generator
settings, data_key 695feec0a915, and the same bytes; ``benchmarks/set_files.py``)."""


def generated_psi(dataset_name: str) -> float | None:
    """The offline choice of psi for a generated set (:data:`GENERATED_PSI`, through
    :data:`SAME_FILE_AS`), or None where the D4RL table's psi applies."""
    return GENERATED_PSI.get(SAME_FILE_AS.get(dataset_name, dataset_name))


PAPER_QVALUE_NETS = {"hopper": 50}
"""Q-ensemble size M where it differs from :data:`PAPER_DEFAULT_QVALUE_NETS`."""
PAPER_DEFAULT_QVALUE_NETS = 20

PAPER_SHARED: dict[str, Any] = {
    "estimator.horizon": 10,
    "dynamics.num_members": 30,
    "dynamics.num_elites": 20,
    "train.epochs": 1000,
    "train.steps_per_epoch": 1000,
    "train.batch_size": 256,
    "agent.actor_lr": 3e-4,
    "agent.critic_lr": 3e-4,
    "agent.alpha_lr": 3e-4,
}
"""Paper settings that do not depend on the dataset (appendix B/D)."""


AUTHORS_COMMIT = "3fb693e"
"""The commit of jihwan-jeong/CBOP that :data:`AUTHORS_SETTINGS` cites (its first code commit)."""

AUTHORS_SETTINGS: dict[str, tuple[Any, str]] = {
    "bc.converge": (True, "rlkit/trainers/behavior_clone.py:174-247; "
                    "rlkit/examples/conf/algorithm/pretrain.yaml:18 (use_best_parameters)"),
    "bc.lr": (1e-3, "rlkit/examples/conf/overrides/pretrain_hopper.yaml:65 (bc_prior)"),
    "bc.batch_size": (1024, "README.md:104 (overrides.bc_prior.batch_size=1024)"),
    "bc.max_epochs": (100, "README.md:104 (algorithm.algorithm_cfg.num_total_epochs=100)"),
    "bc.patience": (5, "rlkit/examples/conf/algorithm/pretrain.yaml:17"),
    "bc.holdout": (1000, "rlkit/trainers/behavior_clone.py:64,148 (min(20%, max_num_test))"),
    "bc.improvement": (0.01, "rlkit/trainers/behavior_clone.py:91"),
    "fqe.converge": (True, "rlkit/trainers/pol_eval.py:137-260"),
    "fqe.rounds": (5, "README.md:104 (overrides.policy_eval.num_value_learning_repeat=5)"),
    "fqe.lr": (1e-3, "rlkit/examples/conf/overrides/pretrain_hopper.yaml:35 (policy_eval)"),
    "fqe.batch_size": (1024, "README.md:104 (overrides.policy_eval.batch_size=1024)"),
    "fqe.max_epochs": (100, "README.md:104 (algorithm.algorithm_cfg.num_total_epochs=100)"),
    "fqe.patience": (5, "rlkit/examples/conf/algorithm/pretrain.yaml:17"),
    "fqe.holdout": (1000, "rlkit/trainers/pol_eval.py:65,160 (min(20%, max_logging))"),
    "fqe.improvement": (0.01, "rlkit/core/rl_algorithms/offline/offline_pretrain_algorithm.py:33"),
    "fqe.drop_terminal": (True, "rlkit/data_management/replay_buffers/"
                          "simple_replay_buffer.py:271-295 (idx_to_include = ~term)"),
    "agent.q_init": ("authors", "rlkit/examples/algorithms/pretrain.py:144-155 and "
                     "rlkit/examples/algorithms/actor_critic/mvepo.py:130-147 (fan-in, "
                     "biases 0.1); rlkit/torch/models/ensemble.py:511,533-534 (last layer +-3e-3)"),
    "dynamics.separate_reward": (True, "rlkit/examples/conf/overrides/pretrain_hopper.yaml:50"),
    "dynamics.activation": ("relu", "rlkit/examples/conf/overrides/pretrain_hopper.yaml:47"),
    "dynamics.weight_decay": ((0.0,) * 5, "rlkit/examples/conf/overrides/"
                              "pretrain_hopper.yaml:48 (use_decay: false)"),
    "dynamics.bootstrap_per_epoch": (True, "rlkit/trainers/mbrl/mbrl.py:186"),
    "dynamics.batch_size": (1024, "README.md:99 (overrides.dynamics.batch_size=1024)"),
    "dynamics.holdout_ratio": (0.2, "rlkit/examples/conf/algorithm/pretrain.yaml:23"),
    "dynamics.max_holdout": (10_000, "rlkit/examples/conf/algorithm/pretrain.yaml:24; "
                             "rlkit/trainers/mbrl/mbrl.py:315"),
    "dynamics.shared_logvar_bounds": (True, "rlkit/torch/models/probabilistic_ensemble.py:52-55"),
    "dynamics.lr": (1e-3, "rlkit/examples/conf/overrides/pretrain_hopper.yaml:52"),
    "dynamics.patience": (5, "rlkit/examples/conf/algorithm/pretrain.yaml:17"),
    "estimator.unbiased_variance": (True, "rlkit/trainers/mvepo/mvepo.py:442 "
                                    "(torch.var_mean over M x K, n - 1)"),
}  # fmt: skip
"""``preset=paper``'s values where the paper is silent and the authors' code decides: dotted
key -> (value, the file and line of jihwan-jeong/CBOP at :data:`AUTHORS_COMMIT` it comes from).
The line numbers of ``pretrain_hopper.yaml`` are the same in ``pretrain_halfcheetah.yaml`` and
``pretrain_walker2d.yaml``. BC's loss, the actions' negative log-likelihood
(``rlkit/policies/gaussian_policy.py:93-95``), is this project's only BC loss, so it has no key.
The preset sets each value (``configs/preset/paper.yaml``); the CPU and debug presets keep
today's choices (each key's default)."""


def infer_dataset_kind(name: str) -> str | None:
    """The D4RL kind named in a dataset name (``hopper-medium-replay-gen`` -> ``medium-replay``).

    Read by :func:`cbop_torchrl.registry.kind_in_name` (any separators, case and script);
    longer kinds are tried first, so ``medium-expert`` is not read as ``medium``.
    Returns None when no kind appears in the name.
    """
    return kind_in_name(name)


def paper_settings(family: Task | str | None, kind: str | None) -> dict[str, Any]:
    """The paper's settings for one dataset, as dotted keys (``"estimator.psi"``: 2.0).

    ``estimator.psi`` is present only when ``kind`` is one of the D4RL kinds.
    """
    family_name = family.name if isinstance(family, Task) else family
    settings = dict(PAPER_SHARED)
    settings["agent.num_qvalue_nets"] = PAPER_QVALUE_NETS.get(
        family_name, PAPER_DEFAULT_QVALUE_NETS
    )
    if kind is not None and kind in PAPER_PSI.get(family_name, {}):
        settings["estimator.psi"] = PAPER_PSI[family_name][kind]
    return settings


def fill_nulls(
    values: dict[str, Any], family: Task | str | None, dataset_name: str
) -> tuple[list[str], list[str]]:
    """Fills the null table-fed fields of ``values`` (a config's sections as plain dicts, in
    place) with the paper's settings for the dataset ``dataset_name`` of ``family``.

    Returns:
        The dotted keys filled, and the problems: a null ``estimator.psi`` where the paper
        has no psi for the dataset.
    """
    filled: list[str] = []
    problems: list[str] = []
    kind = infer_dataset_kind(dataset_name)
    table = paper_settings(family, kind)
    if (offline_psi := generated_psi(dataset_name)) is not None:
        table["estimator.psi"] = offline_psi
    for dotted in [*table, "estimator.psi"]:
        section, _, key = dotted.partition(".")
        if values[section].get(key) is not None:
            continue
        if dotted in table:
            values[section][key] = table[dotted]
            filled.append(dotted)
        else:
            family_name = getattr(family, "name", family) or "not a known one"
            problems.append(
                f"estimator.psi is null, which means 'the paper's psi for this dataset', "
                f"but the paper has no psi for {dataset_name!r} (family {family_name}, "
                f"kind {kind or 'unknown'}); pass estimator.psi=<value>, e.g. "
                "estimator.psi=2.0"
            )
    return filled, problems
