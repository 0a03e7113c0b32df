"""Where the TorchRL, TensorDict and PyTorch names the pages use are documented.

``hooks.py`` turns each inline ``<code>NAME</code>`` of a page (not in a code block, not
already a link) whose text is a key of :data:`DOCS` into a link to that address, and
``check_site.py`` fails when one is left unlinked. A name not listed here stays plain code;
add it here when a page starts to use it.
"""

from __future__ import annotations

TORCHRL = "https://docs.pytorch.org/rl/stable/reference/generated/"
TENSORDICT = "https://docs.pytorch.org/tensordict/stable/reference/generated/"
TORCH = "https://docs.pytorch.org/docs/stable/"

_TORCHRL = {
    "SACLoss": "torchrl.objectives.SACLoss",
    "CQLLoss": "torchrl.objectives.CQLLoss",
    "IQLLoss": "torchrl.objectives.IQLLoss",
    "TD3BCLoss": "torchrl.objectives.TD3BCLoss",
    "LossModule": "torchrl.objectives.LossModule",
    "SoftUpdate": "torchrl.objectives.SoftUpdate",
    "ValueEstimatorBase": "torchrl.objectives.value.ValueEstimatorBase",
    "ValueOperator": "torchrl.modules.tensordict_module.ValueOperator",
    "ProbabilisticActor": "torchrl.modules.tensordict_module.ProbabilisticActor",
    "ReplayBuffer": "torchrl.data.ReplayBuffer",
    "TensorStorage": "torchrl.data.replay_buffers.TensorStorage",
    "RandomSampler": "torchrl.data.replay_buffers.RandomSampler",
    "SerialEnv": "torchrl.envs.SerialEnv",
    "ParallelEnv": "torchrl.envs.ParallelEnv",
    "TransformedEnv": "torchrl.envs.TransformedEnv",
    "EnvBase": "torchrl.envs.EnvBase",
    "GymEnv": "torchrl.envs.GymEnv",
    "GymWrapper": "torchrl.envs.GymWrapper",
    "Trainer": "torchrl.trainers.Trainer",
    "TrainerHookBase": "torchrl.trainers.TrainerHookBase",
    "ReplayBufferTrainer": "torchrl.trainers.ReplayBufferTrainer",
}
_TENSORDICT = {
    "TensorDict": "tensordict.TensorDict",
    "TensorDictModule": "tensordict.nn.TensorDictModule",
    "TensorDictSequential": "tensordict.nn.TensorDictSequential",
}
_TORCH = {
    "torch.vmap": "generated/torch.vmap.html",
    "torch.compile": "generated/torch.compile.html",
    "torch.autocast": "amp.html#torch.autocast",
    "torch.Generator": "generated/torch.Generator.html",
    "torch.save": "generated/torch.save.html",
    "torch.load": "generated/torch.load.html",
    "torch.export": "export.html",
    "torch.cuda.CUDAGraph": "generated/torch.cuda.CUDAGraph.html",
    "torch.amp.GradScaler": "amp.html#gradient-scaling",
    "torch.baddbmm": "generated/torch.baddbmm.html",
    "torch.autograd.grad": "generated/torch.autograd.grad.html",
}

DOCS: dict[str, str] = {
    **{name: f"{TORCHRL}{target}.html" for name, target in _TORCHRL.items()},
    **{
        f"torchrl.objectives.{n}": f"{TORCHRL}torchrl.objectives.{n}.html"
        for n in ("SACLoss", "CQLLoss", "IQLLoss", "TD3BCLoss")
    },  # fmt: skip
    **{name: f"{TENSORDICT}{target}.html" for name, target in _TENSORDICT.items()},
    **{name: f"{TORCH}{target}" for name, target in _TORCH.items()},
}
"""Inline code text -> its documentation page."""
