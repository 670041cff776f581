"""The root of every error a user sees as one line, and the error of the contract between the halves.

:class:`PacktrainError` is what the CLI catches (packtrain/cli/commands.py ``run``): every error whose
message names the file or field and the fix derives from it, in core/, pipeline/ and trainer/, and
is printed as ``error: <message>`` with exit code 2, never a traceback. An error that is not one (a
bug) keeps its traceback.

Its own module so that the lowest core modules (schema.py, inputs.py) can raise :class:`ContractError`
without importing contract.py, which reads files through them.
"""


class PacktrainError(Exception):
    """A refusal or stop a user can act on; the message says what is wrong and how to fix it."""


class ContractError(PacktrainError):
    """A build directory, shard, manifest or name does not satisfy the contract."""
