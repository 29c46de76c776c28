"""Protocols: a YAML file that fixes every choice of a fair comparison.

`load_protocol(path) -> Protocol` validates the file against the schema
(`bench.spec.schema`) and the registry, fills in defaults and hashes
the result (`hashing`); `Protocol.spec` holds it as typed sections
(`bench.spec`); `bench.plan` expands it into cells.
"""

from bench.devices import device_problem
from bench.protocol.load import load_protocol, parse_protocol
from bench.protocol.types import NO_MINER, Protocol, ProtocolError

__all__ = ["NO_MINER", "Protocol", "ProtocolError", "device_problem", "load_protocol", "parse_protocol"]
