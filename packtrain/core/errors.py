"""The error every core module raises when a file or name breaks the contract between the halves.

Its own module so that the lowest core modules (schema.py, inputs.py) can raise it without
importing contract.py, which reads files through them. The CLI prints it as ``error: ...``.
"""


class ContractError(Exception):
    """A build directory, shard, manifest or name does not satisfy the contract."""
