"""The dataset layer's error type and the commands its messages point users to."""

from __future__ import annotations

from cbop_torchrl.runtime import program_command

GENERATE_COMMAND = "cbop-collect env={family} kind={kind}"
"""The generator command that writes a D4RL look-alike ``<family>-<kind>-gen.hdf5``
(``python scripts/collect.py ...`` in a checkout).

Kept in one place so every error message names the same, current command.
"""


class DatasetError(ValueError):
    """A dataset source cannot be loaded; the message says what is wrong and what would work.

    CLIs catch it, print the message and exit non-zero instead of showing a traceback.
    """


def generate_command(family: str = "hopper", kind: str = "medium-replay") -> str:
    """The generator command for one family and D4RL kind, as the user's shell runs it
    (:func:`cbop_torchrl.runtime.program_command`), e.g. for error messages."""
    command = GENERATE_COMMAND.format(family=family, kind=kind)
    return command.replace("cbop-collect", program_command("cbop-collect"), 1)
