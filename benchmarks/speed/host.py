"""What the host's CPU is: its model and the flags that decide the bf16 figures."""

from __future__ import annotations

from pathlib import Path

import torch

#: CPU flags that decide the bf16 figures: AMX tiles run bf16 matmuls at several times the
#: fp32 rate; avx512_bf16 alone at about twice; without either bf16 is emulated.
CPU_FLAGS = ("amx_bf16", "amx_tile", "avx512_bf16", "avx512f")


def host_cpu_info(cpuinfo: Path = Path("/proc/cpuinfo")) -> dict:
    """``cpu_model`` and ``cpu_has_<flag>`` for :data:`CPU_FLAGS`, from ``cpuinfo`` (Linux).

    Keys are absent where the file is missing or has no such line (other systems),
    so figures from different hosts can be told apart without guessing.
    ``torch_cpu_capability`` is the instruction set torch's CPU kernels dispatch to.
    """
    info: dict = {"torch_cpu_capability": torch.backends.cpu.get_cpu_capability()}
    try:
        text = cpuinfo.read_text()
    except OSError:
        return info
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() not in fields:  # the first processor's lines
            fields[key.strip()] = value.strip()
    if "model name" in fields:
        info["cpu_model"] = fields["model name"]
    if "flags" in fields:
        flags = set(fields["flags"].split())
        info.update({f"cpu_has_{flag}": flag in flags for flag in CPU_FLAGS})
    return info
