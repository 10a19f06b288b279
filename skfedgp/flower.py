"""Training over Flower's Message API: a transport, a ServerApp and a ClientApp.

The structured training loop (:func:`skfedgp.federated.run_structured_training`)
talks to its clients only through a *transport*: ``transport.call(method,
args, ids=None)`` runs the client method ``method`` on the called clients and
returns ``{client_id: result}``. :class:`FlowerTransport` is a transport whose
``call`` sends one Flower ``Message`` per client, carrying the method name and
the serialised arguments, and turns the replies back into the message
dataclasses of :mod:`skfedgp.federated`. :func:`make_client_app` builds the
``ClientApp`` that answers them from the node's own data, and
:func:`make_server_app` the ``ServerApp`` that runs the same training, with
the same defaults, as :class:`~skfedgp.FederatedHierarchicalGPRegressor`.

Serialisation (:func:`encode` / :func:`decode`) is field by field: arrays go
into a Flower ``ArrayRecord`` (NumPy's own format, no pickle), numbers,
strings and ``None`` markers into a ``ConfigRecord``; nested dataclasses
(``ModelConfig``, ``Packer``, ``ClientUpdateValue.hyperparameters``) are
flattened under dotted names. Only the types listed in :data:`CODEC_TYPES`
are decoded: a message never executes code on the receiver.

Static configuration (the :class:`~skfedgp.federated.ModelConfig` and the
global :class:`~skfedgp._hierarchy.Packer`) is sent to a client once and kept
on the client; so is any array or message a client already holds (the global
vector of the previous exchange, the posterior it received, its own pilot):
the transport sends a reference instead. What is left, the model payload, is
what ``communication_`` counts (:attr:`FlowerTransport.payload_log_`).

Requires the optional dependency ``flwr`` (``pip install "skfedgp[flower]"``).

References
----------
D. J. Beutel, T. Topal, A. Mathur, X. Qiu, J. Fernandez-Marques, Y. Gao,
L. Sani, K. H. Li, T. Parcollet, P. P. B. de Gusmao, N. D. Lane, "Flower: A
Friendly Federated Learning Research Framework", arXiv:2007.14390, 2020.
"""

from __future__ import annotations

import dataclasses
import numbers

import numpy as np

from . import federated as _fed
from ._hierarchy import Packer

__all__ = [
    "CODEC_TYPES",
    "encode",
    "decode",
    "payload_nbytes",
    "FlowerTransport",
    "make_client_app",
    "make_server_app",
]


def _require_flwr():
    try:
        import flwr  # noqa: F401
    except ImportError as exc:  # pragma: no cover - exercised without flwr only
        raise ImportError(
            "skfedgp.flower needs the optional dependency flwr; install it with "
            "pip install \"skfedgp[flower]\"") from exc


# --------------------------------------------------------------------------
# codec
# --------------------------------------------------------------------------

#: Dataclasses the codec writes and reads, by class name.
CODEC_TYPES = {
    cls.__name__: cls
    for cls in (
        _fed.ClientSummary, _fed.InitBroadcast, _fed.GlobalBroadcast, _fed.ClientUpdate,
        _fed.ClientStatistics, _fed.ModelConfig, _fed.PilotSummary,
        _fed.StructuredStatistics, _fed.PosteriorBroadcast, _fed.GlobalGradient,
        _fed.LocalHyperparameters, _fed.ClientUpdateValue, _fed._PopulationPilot,
    )
}

_TYPE = "#type"
_NONE = "#none"
_TUPLE = "#tuple"
_LIST = "#list"
_LEN = "#len"


def _flatten(value, key, arrays, config):
    """Write ``value`` under ``key`` into ``arrays`` (name -> ndarray) and ``config``."""
    if value is None:
        config[key + _NONE] = True
    elif isinstance(value, Packer):
        config[key + _TYPE] = "Packer"
        config[key + ".names"] = [str(n) for n, _, _ in value.spec]
        config[key + ".kinds"] = [str(k) for _, _, k in value.spec]
        config[key + ".ndims"] = [len(s) for _, s, _ in value.spec]
        config[key + ".dims"] = [int(x) for _, s, _ in value.spec for x in s]
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        name = type(value).__name__
        if name not in CODEC_TYPES:
            raise TypeError(f"skfedgp.flower cannot serialise a {name}")
        config[key + _TYPE] = name
        for f in dataclasses.fields(value):
            _flatten(getattr(value, f.name), f"{key}.{f.name}", arrays, config)
    elif isinstance(value, np.ndarray):
        arrays[key] = np.ascontiguousarray(value)
    elif isinstance(value, (bool, np.bool_)):
        config[key] = bool(value)
    elif isinstance(value, numbers.Integral):
        config[key] = int(value)
    elif isinstance(value, numbers.Real):
        config[key] = float(value)
    elif isinstance(value, (str, bytes)):
        config[key] = value
    elif isinstance(value, (tuple, list)):
        config[key + (_TUPLE if isinstance(value, tuple) else _LIST)] = len(value)
        for i, v in enumerate(value):
            _flatten(v, f"{key}[{i}]", arrays, config)
    else:
        raise TypeError(
            f"skfedgp.flower cannot serialise {key!r} of type {type(value).__name__}")


def _unflatten(key, arrays, config):
    """Inverse of :func:`_flatten`."""
    if config.get(key + _NONE, False):
        return None
    if key in arrays:
        return arrays[key]
    if key in config:
        return config[key]
    if key + _TYPE in config:
        name = config[key + _TYPE]
        if name == "Packer":
            dims = list(config[key + ".dims"])
            spec, off = [], 0
            for n, k, nd in zip(config[key + ".names"], config[key + ".kinds"],
                                config[key + ".ndims"]):
                spec.append((n, tuple(int(x) for x in dims[off:off + nd]), k))
                off += nd
            return Packer(spec)
        if name not in CODEC_TYPES:
            raise ValueError(f"skfedgp.flower: unknown message type {name!r} in a record")
        cls = CODEC_TYPES[name]
        return cls(**{f.name: _unflatten(f"{key}.{f.name}", arrays, config)
                      for f in dataclasses.fields(cls)})
    for marker, kind in ((_TUPLE, tuple), (_LIST, list)):
        if key + marker in config:
            return kind(_unflatten(f"{key}[{i}]", arrays, config)
                        for i in range(int(config[key + marker])))
    raise ValueError(f"skfedgp.flower: field {key!r} is missing from the record")


def _count(value):
    """Payload bytes of a value as ``communication_`` counts them.

    Arrays count their ``nbytes``; numbers (int, float) 8 bytes; message
    dataclasses use :func:`skfedgp.federated.message_nbytes` (the same sum);
    strings, booleans, ``None`` and packers count nothing.
    """
    if value is None or isinstance(value, (str, bytes, bool, np.bool_, Packer)):
        return 0
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    if isinstance(value, numbers.Real):
        return 8
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return int(sum(_count(getattr(value, f.name)) for f in dataclasses.fields(value)))
    if isinstance(value, (tuple, list)):
        return int(sum(_count(v) for v in value))
    raise TypeError(f"cannot count the bytes of a {type(value).__name__}")


def payload_nbytes(value):
    """Model payload of a value in bytes (8 per float64 number).

    Parameters
    ----------
    value : message dataclass, ndarray, number, tuple/list of those, or None

    Returns
    -------
    int
        Equal to :func:`skfedgp.federated.message_nbytes` for a message.
    """
    return _count(value)


def encode(value, name="v"):
    """Serialise a value into a Flower ``RecordDict`` (field by field).

    Parameters
    ----------
    value : message dataclass, ModelConfig, Packer, ndarray, number, str, None,
        or a tuple/list of those
    name : str, default="v"
        Prefix of the records: ``name + ".arrays"`` (``ArrayRecord``) and
        ``name + ".config"`` (``ConfigRecord``).

    Returns
    -------
    flwr.app.RecordDict

    Raises
    ------
    TypeError
        For a type the codec does not know.
    """
    _require_flwr()
    from flwr.app import RecordDict

    rd = RecordDict()
    _encode_into(rd, value, name)
    return rd


def _encode_into(rd, value, name):
    from flwr.app import Array, ArrayRecord, ConfigRecord

    arrays, config = {}, {}
    _flatten(value, "v", arrays, config)
    rd[name + ".arrays"] = ArrayRecord({k: Array(v) for k, v in arrays.items()})
    rd[name + ".config"] = ConfigRecord(config)


def decode(records, name="v"):
    """Read back a value written by :func:`encode`.

    Parameters
    ----------
    records : flwr.app.RecordDict
    name : str, default="v"

    Returns
    -------
    object
        The value; arrays come back with their dtype and shape, numbers as
        Python ``int``/``float`` (bit-exact).

    Raises
    ------
    ValueError
        If a field is missing or names an unknown type.
    """
    arrays = {k: a.numpy() for k, a in records[name + ".arrays"].items()}
    config = dict(records[name + ".config"])
    return _unflatten("v", arrays, config)
