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
(``ModelConfig``, ``Packer``, ``ClientUpdateValue.hyperparameters``) and
dicts with string keys (``LocalHyperparameters.coregionalisation`` of
multi-output targets) are flattened under dotted and numbered names. Only
the types listed in :data:`CODEC_TYPES` are decoded: a message never
executes code on the receiver.

Static configuration (the :class:`~skfedgp.federated.ModelConfig` and the
global :class:`~skfedgp._hierarchy.Packer`) is sent to a client once and kept
on the client; so is any array or message a client already holds (the global
vector it was sent with the last ``statistics`` request, the posterior it
received, its own pilot): the transport sends a reference instead. What is
left, the model payload (:attr:`FlowerTransport.payload_log_`,
:func:`payload_per_round`), equals ``communication_`` in every round: the
set-up (round 0; when no set-up call is retried, since a retry may be sent
as a reference), every training round and the final exchange.

:func:`secure_statistics_sum` sums the clients' statistics of one
evaluation of the ELBO through Flower's SecAgg+ (``SecAggPlusWorkflow`` on
the server, ``secaggplus_mod`` on a ClientApp made with
``make_client_app(..., secure_aggregation=True)``): in that round the server
unmasks only the sum, exact to the quantisation bound :func:`secagg_error_bound`
(docs/flower.md, "Secure aggregation"). The training itself still uses the
plain exchanges, and such a node still answers them (``train.statistics``
included), so this hides nothing from a server that asks for them.

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
import os

import numpy as np

from . import federated as _fed
from ._hierarchy import Packer
from .optim import Adam

__all__ = [
    "CODEC_TYPES",
    "encode",
    "decode",
    "payload_nbytes",
    "payload_per_round",
    "FlowerTransport",
    "fit_over_transport",
    "make_client_app",
    "make_server_app",
    "flatten_statistics",
    "unflatten_statistics",
    "secagg_quantization_range",
    "secagg_error_bound",
    "combine_error_bounds",
    "secure_statistics_sum",
    "SECURE_WEIGHT",
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
        _fed.ClientState, _fed.DesignResidual, _fed.InputScaleReport, _fed.PoolEvidence,
        _fed.LocalKernelSummary, _fed.DepartureSummary,
    )
}
_ADAM_FIELDS = ("learning_rate", "beta1", "beta2", "eps", "t", "m", "v")

_TYPE = "#type"
_NONE = "#none"
_TUPLE = "#tuple"
_LIST = "#list"
_DICT = "#dict"
_LEN = "#len"


def _flatten(value, key, arrays, config):
    """Write ``value`` under ``key`` into ``arrays`` (name -> ndarray) and ``config``."""
    if value is None:
        config[key + _NONE] = True
    elif isinstance(value, Adam):
        config[key + _TYPE] = "Adam"
        for name in _ADAM_FIELDS:
            _flatten(getattr(value, name), f"{key}.{name}", arrays, config)
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
    elif isinstance(value, dict):
        bad = [k for k in value if not isinstance(k, str)]
        if bad:
            raise TypeError(
                f"skfedgp.flower cannot serialise {key!r}: dict keys must be str, got {bad[0]!r}")
        config[key + _DICT] = list(value)
        for i, v in enumerate(value.values()):
            _flatten(v, f"{key}{{{i}}}", arrays, config)
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
        if name == "Adam":
            adam = Adam()
            for f in _ADAM_FIELDS:
                setattr(adam, f, _unflatten(f"{key}.{f}", arrays, config))
            return adam
        if name not in CODEC_TYPES:
            raise ValueError(f"skfedgp.flower: unknown message type {name!r} in a record")
        cls = CODEC_TYPES[name]
        values = {}
        for f in dataclasses.fields(cls):
            sub = f"{key}.{f.name}"
            if not _present(sub, arrays, config) and (
                    f.default is not dataclasses.MISSING
                    or f.default_factory is not dataclasses.MISSING):
                continue  # an optional field a node of an earlier version does not send
            values[f.name] = _unflatten(sub, arrays, config)
        return cls(**values)
    if key + _DICT in config:
        return {str(k): _unflatten(f"{key}{{{i}}}", arrays, config)
                for i, k in enumerate(config[key + _DICT])}
    for marker, kind in ((_TUPLE, tuple), (_LIST, list)):
        if key + marker in config:
            return kind(_unflatten(f"{key}[{i}]", arrays, config)
                        for i in range(int(config[key + marker])))
    raise ValueError(f"skfedgp.flower: field {key!r} is missing from the record")


def _present(key, arrays, config):
    """Whether a record holds a value (of any kind) under ``key``."""
    return key in arrays or key in config or any(
        key + m in config for m in (_NONE, _TYPE, _DICT, _TUPLE, _LIST))


def _count(value):
    """Payload bytes of a value as ``communication_`` counts them.

    Arrays count their ``nbytes``; numbers (int, float) 8 bytes; message
    dataclasses use :func:`skfedgp.federated.message_nbytes` (the same sum);
    strings, booleans, ``None`` and packers count nothing.
    """
    if value is None or isinstance(value, (str, bytes, bool, np.bool_, Packer, Adam)):
        return 0
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    if isinstance(value, numbers.Real):
        return 8
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return int(sum(_count(getattr(value, f.name)) for f in dataclasses.fields(value)))
    if isinstance(value, (tuple, list)):
        return int(sum(_count(v) for v in value))
    if isinstance(value, dict):
        return int(sum(_count(v) for v in value.values()))
    raise TypeError(f"cannot count the bytes of a {type(value).__name__}")


def payload_nbytes(value):
    """Model payload of a value in bytes (8 per float64 number).

    Parameters
    ----------
    value : message dataclass, ndarray, number, tuple/list/dict of those, or None

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
        or a tuple/list or str-keyed dict of those
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


# --------------------------------------------------------------------------
# references: what a client already holds is not sent again
# --------------------------------------------------------------------------

#: Argument types that are configuration, not model payload
#: (``communication_`` does not count them); sent once, then referenced.
STATIC_TYPES = ("ModelConfig", "Packer")
#: Methods whose array argument (the global vector) is always sent: the
#: broadcast that opens an evaluation of the ELBO, as ``communication_``
#: counts it.
BROADCAST_METHODS = ("statistics",)


def _kind(value):
    """Type name under which both ends keep the last value of this kind (or None)."""
    if isinstance(value, np.ndarray):
        return "ndarray"
    if isinstance(value, Packer) or (dataclasses.is_dataclass(value)
                                     and not isinstance(value, type)):
        return type(value).__name__
    return None


def _same(a, b):
    """Whether ``b`` is ``a`` or bit-identical to it (arrays)."""
    if a is b:
        return True
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    return False


def _find_held(held, value, method):
    """Slot of ``held`` holding ``value`` (an argument the client already has), or None."""
    kind = _kind(value)
    if kind is None or (kind == "ndarray" and method in BROADCAST_METHODS):
        return None
    for slot in (f"arg:{kind}", f"reply:{kind}"):
        if slot in held and _same(held[slot], value):
            return slot
    return None


# --------------------------------------------------------------------------
# client side
# --------------------------------------------------------------------------

#: Message types are ``"train.<method>"``.
MESSAGE_CATEGORY = "train"
#: Client methods a :class:`FlowerTransport` may call (those of
#: :class:`~skfedgp.federated.StructuredClient` the training loop uses),
#: plus ``"hello"`` (client id, numbers of features and of outputs, the
#: first exchange).
METHODS = ("hello", "summary", "prepare", "pilot", "pool_evidence", "input_scale_check",
           "initialise", "design_residual",
           "statistics", "global_gradient", "local_phase", "finish", "close", "get_state",
           "set_state", "local_prior_summary", "set_local_prior")
_STATE_KEY = "skfedgp"

#: Per-process registry: ``(run_id, node_id) -> _Node``. A SuperNode in
#: subprocess isolation starts a fresh process per message, so the node's
#: state is also kept in ``context.state`` (on the node, never sent) and the
#: registry is only a cache.
_REGISTRY = {}


class _Node:
    """What a ClientApp keeps for its node between messages."""

    def __init__(self, client_id, target):
        self.client_id = client_id
        self.target = target  # StructuredClient wrapping the node's Client
        self.held = {}        # slot -> last value received or sent
        self.version = 0


def _check_local_data(client_id, X, y):
    """Validate what ``load_data`` returned on a node.

    ``X`` must be finite. A 1-D ``y`` (or one column) must be finite; a
    ``y`` of shape ``(n, Q)``, ``Q > 1``, is validated as
    :meth:`~skfedgp.FederatedHierarchicalGPRegressor.fit` validates
    multi-output targets (:func:`skfedgp.regressor.check_multioutput_targets`:
    NaN marks a missing output, inf and rows with every output missing are
    errors).

    Returns
    -------
    client_id : str or int
    X : ndarray of shape (n, d)
    y : ndarray of shape (n,) or (n, Q)

    Raises
    ------
    TypeError
        For a client id that is not a str or an int.
    ValueError
        For bad data, naming the client.
    """
    from sklearn.utils import check_array

    from .regressor import MIN_SAMPLES_PER_CLIENT, check_multioutput_targets

    if client_id is None or not isinstance(client_id, (str, numbers.Integral)) \
            or isinstance(client_id, bool):
        raise TypeError(
            f"load_data must return a client id that is a str or an int, got {client_id!r}")
    try:
        X = check_array(X, dtype=np.float64, input_name="X")
        if np.ndim(y) == 2 and np.shape(y)[1] > 1:
            y = check_multioutput_targets(y, X.shape[0])
        else:
            y = check_array(y, dtype=np.float64, ensure_2d=False, input_name="y")
    except ValueError as exc:
        raise ValueError(f"client {client_id!r}: {exc}") from None
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.ndim not in (1, 2) or y.shape[0] != X.shape[0]:
        raise ValueError(
            f"client {client_id!r}: y must have shape ({X.shape[0]},) or "
            f"({X.shape[0]}, n_outputs), got {y.shape}")
    if X.shape[0] < MIN_SAMPLES_PER_CLIENT:
        raise ValueError(
            f"client {client_id!r} has {X.shape[0]} sample(s); at least "
            f"{MIN_SAMPLES_PER_CLIENT} are needed")
    cid = int(client_id) if isinstance(client_id, numbers.Integral) else str(client_id)
    return cid, X, y


def _node_for(context, load_data):
    """The node's :class:`_Node`: from the registry, from ``context.state``, or new."""
    import pickle

    key = (getattr(context, "run_id", None), context.node_id)
    saved = context.state[_STATE_KEY] if _STATE_KEY in context.state else None
    node = _REGISTRY.get(key)
    if node is not None and saved is not None and node.version == int(saved["version"]):
        return node
    if saved is not None:  # a fresh process (subprocess isolation, another actor)
        node = pickle.loads(saved["node"])  # written by this node itself, never sent
    else:
        cid, X, y = _check_local_data(*load_data(context))
        # as structured_client(client, config) chooses: y of shape (n, Q) is
        # the multi-output (ILMM) model, which the server learns from "hello"
        cls = _fed.ILMMStructuredClient if y.ndim == 2 else _fed.StructuredClient
        node = _Node(cid, cls(_fed.Client(cid, X, y)))
    _REGISTRY[key] = node
    return node


def _save_node(node, context):
    """Keep the node's state in ``context.state`` (stays on the node)."""
    import pickle

    from flwr.app import ConfigRecord

    node.version += 1
    context.state[_STATE_KEY] = ConfigRecord(
        {"version": node.version, "node": pickle.dumps(node, protocol=pickle.HIGHEST_PROTOCOL)})


def _data_shape(client):
    """``(n_features, n_outputs)`` of a node's client (the ``hello`` reply);
    ``n_outputs`` is 1 for 1-D targets."""
    raw = getattr(client, "_client", None)
    X, y = (raw._X, raw._y) if raw is not None else (client._Xs, client._y)
    return int(X.shape[1]), int(y.shape[1]) if y.ndim == 2 else 1


def _handle(message, context, load_data, on_finish):
    """ClientApp handler: decode, call the client method, reply.

    A client method that raises is answered with a failure record
    (``ctl["failed"]``, ``ctl["numerical"]``), which the transport turns
    into a :class:`~skfedgp.federated.ClientFailure`.
    """
    from flwr.app import ConfigRecord, Message, RecordDict

    method = message.metadata.message_type.split(".", 1)[-1]
    reply = RecordDict()
    try:
        node = _node_for(context, load_data)
    except Exception as exc:  # noqa: BLE001 -- the node's data could not be loaded
        reply["ctl"] = ConfigRecord({"failed": f"loading the node's data failed: {exc!r}",
                                     "numerical": False})
        return Message(reply, reply_to=message)
    ctl = message.content["ctl"]
    out = {"client_id": node.client_id}
    try:
        if method not in METHODS:
            raise ValueError(f"unknown skfedgp client method {method!r}")
        args = []
        for i in range(int(ctl["nargs"])):
            ref = f"ref.{i}"
            if ref in ctl:
                if ctl[ref] not in node.held:
                    raise RuntimeError(
                        f"client {node.client_id!r} was sent a reference to {ctl[ref]!r}, "
                        "which it does not hold (state lost)")
                args.append(node.held[ctl[ref]])
            else:
                value = decode(message.content, f"a{i}")
                kind = _kind(value)
                if kind:
                    node.held[f"arg:{kind}"] = value
                args.append(value)
        if method == "hello":
            result = _data_shape(node.target)
        else:
            result = getattr(node.target, method)(*args)
        kind = _kind(result)
        if kind:
            node.held[f"reply:{kind}"] = result
        if method == "finish" and on_finish is not None:
            on_finish(node.client_id, node.target, context)
        _encode_into(reply, result, "r")
    except Exception as exc:  # noqa: BLE001 -- reported to the server as a ClientFailure
        out.update(failed=repr(exc),
                   numerical=isinstance(exc, (np.linalg.LinAlgError, FloatingPointError)))
    _save_node(node, context)
    if method == "close":  # training is over: keep the node's state in context.state only
        _REGISTRY.pop((getattr(context, "run_id", None), context.node_id), None)
    reply["ctl"] = ConfigRecord(out)
    return Message(reply, reply_to=message)


def make_client_app(load_data, *, on_finish=None, mods=None, secure_aggregation=False):
    """A Flower ``ClientApp`` that answers a :class:`FlowerTransport`.

    Parameters
    ----------
    load_data : callable
        ``load_data(context) -> (client_id, X, y)``: the node's own data, read
        on the node (e.g. from a path in ``context.node_config``); ``client_id``
        a str or int unique among the nodes, ``X`` of shape ``(n_i, d)``
        (finite), ``y`` in original units, of shape ``(n_i,)`` (finite) or
        ``(n_i, Q)`` for ``Q > 1`` outputs: the multi-output (ILMM) model,
        where a NaN entry is a missing output, validated as
        :meth:`~skfedgp.FederatedHierarchicalGPRegressor.fit` validates it
        (no inf, no row with every output missing). Every node must hold
        the same ``Q``; the node reports it in the ``hello`` exchange.
        Called once per node.
    on_finish : callable, optional
        ``on_finish(client_id, client, context)`` after the final exchange,
        with the node's :class:`~skfedgp.federated.StructuredClient`
        (:class:`~skfedgp.federated.ILMMStructuredClient` for ``Q > 1``; its
        fitted local vector ``client.theta``, ``client.local_values()`` and
        posterior moments ``client.posterior``): the place to save the
        client's personal model on the node.
    mods : list, optional
        Flower mods applied to every handler.
    secure_aggregation : bool, default=False
        Also register the plain ``train`` handler, wrapped in Flower's
        ``secaggplus_mod``, that answers :func:`secure_statistics_sum`: the
        node's statistics at the global vector of the request, flattened
        (:func:`flatten_statistics`) into a legacy ``FitRes``. The node must
        have been set up by a :class:`FlowerTransport` (it uses the
        configuration and global packer it holds).

    Returns
    -------
    flwr.clientapp.ClientApp
        Handlers ``train.<method>`` for every method in :data:`METHODS`
        (and ``train`` with ``secure_aggregation=True``).

    Raises
    ------
    TypeError
        If ``load_data`` is not callable.

    Notes
    -----
    The node's client object is kept in a per-process registry and, because
    a SuperNode starts a fresh process per message (its default
    ``--isolation subprocess``), pickled into the node's own
    ``context.state``, which the SuperNode keeps on the client machine (it
    holds the raw data and is never sent). Incoming records are read by
    :func:`decode` only (no pickle).
    """
    _require_flwr()
    from flwr.clientapp import ClientApp

    if not callable(load_data):
        raise TypeError("load_data must be a callable load_data(context) -> (client_id, X, y)")
    app = ClientApp()

    def handler(message, context):
        return _handle(message, context, load_data, on_finish)

    for m in METHODS:
        getattr(app, MESSAGE_CATEGORY)(m, mods=mods)(handler)
    if secure_aggregation:
        from flwr.client.mod import secaggplus_mod

        def secure_handler(message, context):
            return _secure_handle(message, context, load_data)

        # secaggplus_mod innermost: it masks what the handler returns
        app.train(mods=list(mods or []) + [secaggplus_mod])(secure_handler)
    return app


def _secure_handle(message, context, load_data):
    """Plain ``train`` handler behind ``secaggplus_mod`` (:func:`secure_statistics_sum`).

    Reads the legacy ``FitIns`` (the global vector, the round, the agreed
    clipping range and weight), computes the node's
    :class:`~skfedgp.federated.StructuredStatistics` with the configuration
    and global packer the node holds from its :class:`FlowerTransport`
    exchanges, and answers with a legacy ``FitRes`` whose only parameter
    array is :func:`flatten_statistics` of them; ``secaggplus_mod`` masks it
    and removes the plain array before the reply leaves the node.

    Raises
    ------
    RuntimeError
        If the node has not been set up by a :class:`FlowerTransport`.
    ValueError
        If an entry of the flattened statistics is not finite or lies
        outside the agreed clipping range (SecAgg+ would clip it silently).
        Flower sends the exception's message to the server in the clear, so
        it names the clipping range but no value of the statistics.
    """
    from flwr.app import Message
    from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
    from flwr.compat.common import recorddict_compat as compat

    fitins = compat.recorddict_to_fitins(message.content, keep_input=True)
    node = _node_for(context, load_data)
    gpack = node.held.get("arg:Packer")
    config = node.held.get("arg:ModelConfig")
    if gpack is None or config is None:
        raise RuntimeError(
            f"client {node.client_id!r} holds no model configuration: a secure sum of "
            "statistics needs a node set up by a FlowerTransport")
    theta_g = parameters_to_ndarrays(fitins.parameters)[0]
    # the node's cached forward state belongs to the training exchange in
    # progress (its global_gradient uses it): keep it
    kept = getattr(node.target, "_state", None)
    try:
        stats = node.target.statistics(theta_g, gpack, config,
                                       int(fitins.config[_SECURE_ROUND]))
    finally:
        node.target._state = kept
    _save_node(node, context)
    vector = flatten_statistics(stats)
    clip = float(fitins.config[_SECURE_CLIP])
    largest = float(np.max(np.abs(vector))) if vector.size else 0.0
    if not np.isfinite(largest) or largest > clip:
        # the reason of a ClientApp exception is sent to the server in the
        # clear: it must not carry the statistics (not even their largest entry)
        raise ValueError(
            f"client {node.client_id!r}: its statistics are not finite or lie outside "
            f"the agreed clipping range {clip:.6g}; SecAgg+ would clip them silently")
    res = FitRes(Status(Code.OK, ""), ndarrays_to_parameters([vector]),
                 int(fitins.config[_SECURE_WEIGHT]), {})
    return Message(compat.fitres_to_recorddict(res, keep_input=True), reply_to=message)


# --------------------------------------------------------------------------
# server side: the transport
# --------------------------------------------------------------------------


def _arg_payload(value):
    """Model payload of one argument: configuration (:data:`STATIC_TYPES`) and
    bare ints (round numbers, seeds, sizes) are control, not payload."""
    if isinstance(value, numbers.Integral) or _kind(value) in STATIC_TYPES:
        return 0
    return _count(value)


class FlowerTransport:
    """Transport of the federated training over a Flower ``Grid``.

    Implements the transport interface of
    :func:`skfedgp.federated.run_structured_training` (``client_ids``,
    ``call``, context manager): ``call(method, args, ids)`` sends one
    ``Message`` of type ``"train.<method>"`` per called client and waits for
    the replies (``grid.send_and_receive``).

    Parameters
    ----------
    grid : flwr.serverapp.Grid
        The grid given to the ServerApp's ``main``.
    min_nodes : int, default=1
        :meth:`connect` waits until at least this many nodes are connected.
    timeout : float or None, default=None
        Seconds to wait for the replies of one call (None: no limit). A
        client that does not reply in time is a
        :class:`~skfedgp.federated.ClientFailure`.
    connect_timeout : float, default=300.0
        Seconds :meth:`connect` waits for ``min_nodes`` nodes.
    fault_hook : callable or None, default=None
        ``fault_hook(client_id, method, round) -> None``, called on the server
        before each client call (``"close"`` excepted), as in
        :class:`~skfedgp.federated.JoblibTransport`: if it raises, the
        message is not sent and the client's result is a
        :class:`~skfedgp.federated.ClientFailure` (fault injection).

    Attributes
    ----------
    client_ids : list
        Client ids of the connected nodes, sorted as
        :class:`~skfedgp.FederatedHierarchicalGPRegressor` sorts its labels
        (after :meth:`connect`).
    node_ids_ : dict
        Client id to Flower node id.
    n_features_ : int
        Number of input features (the same on every node).
    n_outputs_ : int
        Number of outputs (target columns; 1 for 1-D targets), the same on
        every node; more than 1 trains the multi-output (ILMM) model.
    payload_log_ : list of dict
        One entry per call: ``method``, ``round``, ``bytes_down``,
        ``bytes_up`` (model payload: arrays' ``nbytes`` and 8 bytes per
        number of the message dataclasses, as ``communication_`` counts),
        ``n_messages`` (requests and replies).
    wire_log_ : list of dict
        The same calls measured on the serialised Flower records
        (``bytes_down``, ``bytes_up``): NumPy headers, keys, references and
        control fields included.
    """

    def __init__(self, grid, *, min_nodes=1, timeout=None, connect_timeout=300.0,
                 fault_hook=None):
        _require_flwr()
        if not isinstance(min_nodes, numbers.Integral) or min_nodes < 1:
            raise ValueError(f"min_nodes must be an integer >= 1, got {min_nodes!r}")
        if timeout is not None and not timeout > 0:
            raise ValueError(f"timeout must be None or a positive number, got {timeout!r}")
        self.grid = grid
        self.min_nodes = int(min_nodes)
        self.timeout = timeout
        self.connect_timeout = float(connect_timeout)
        self.fault_hook = fault_hook
        self.payload_log_ = []
        self.wire_log_ = []
        self.client_ids = []
        self.node_ids_ = {}
        self._held = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    # -- set-up ----------------------------------------------------------------
    def connect(self):
        """Wait for the nodes and learn their client ids (one ``hello`` each).

        Each node answers with its client id, its number of features and
        its number of outputs (target columns, 1 for 1-D targets).

        Returns
        -------
        self

        Raises
        ------
        TimeoutError
            If fewer than ``min_nodes`` nodes connect within ``connect_timeout``.
        RuntimeError
            If a node fails to load its data.
        ValueError
            If two nodes report the same client id, different numbers of
            features or different numbers of outputs.
        """
        import time

        from ._validation import unique_labels

        t0 = time.monotonic()
        nodes = sorted(self.grid.get_node_ids())
        while len(nodes) < self.min_nodes:
            if time.monotonic() - t0 > self.connect_timeout:
                raise TimeoutError(
                    f"only {len(nodes)} of min_nodes={self.min_nodes} Flower nodes connected "
                    f"within {self.connect_timeout:g} s")
            time.sleep(0.1)
            nodes = sorted(self.grid.get_node_ids())
        replies = self._exchange("hello", {n: () for n in nodes}, {}, 0)
        cids, dims, outputs = {}, {}, {}
        for node, (cid, value, err) in replies.items():
            if err is not None:
                raise RuntimeError(f"Flower node {node} failed at set-up: {err[0]}")
            if cid in cids:
                raise ValueError(
                    f"Flower nodes {cids[cid]} and {node} both report client id {cid!r}")
            cids[cid] = node
            # a node of an earlier skfedgp version answers with n_features only
            # (it supports one target column)
            dims[cid], outputs[cid] = (value, 1) if np.ndim(value) == 0 else value
        if len(set(dims.values())) != 1:
            raise ValueError(f"the nodes' data have different numbers of features: {dims}")
        if len(set(outputs.values())) != 1:
            raise ValueError(
                "the nodes' data have different numbers of outputs (target columns; 1 for "
                f"1-D targets): {outputs}; every node must hold the same Q columns")
        self.n_features_ = int(next(iter(dims.values())))
        self.n_outputs_ = int(next(iter(outputs.values())))
        self.client_ids, _ = unique_labels(list(cids))
        self.node_ids_ = {c: cids[c] for c in self.client_ids}
        self._held = {c: {} for c in self.client_ids}
        self.payload_log_, self.wire_log_ = [], []
        return self

    # -- one call ----------------------------------------------------------------
    def call(self, method, args=(), ids=None, *, round_=0):
        """Run ``method`` on the clients ``ids`` (default: all) over Flower.

        Parameters
        ----------
        method : str
            One of :data:`METHODS` (not ``"hello"``).
        args : tuple or dict
            Arguments common to all called clients, or ``{client_id: tuple}``.
        ids : list, optional
        round_ : int, default=0
            Round of the call (for the logs and :class:`ClientFailure`).

        Returns
        -------
        dict
            ``{client_id: result}`` in the order of ``ids``; a client whose
            method raised, whose reply is a Flower error or is missing after
            ``timeout`` maps to a :class:`~skfedgp.federated.ClientFailure`.
        """
        if method not in METHODS or method == "hello":
            raise ValueError(f"unknown client method {method!r}; expected one of {METHODS[1:]}")
        ids = list(self.client_ids) if ids is None else list(ids)
        unknown = [c for c in ids if c not in self.node_ids_]
        if unknown:
            raise ValueError(f"unknown client id(s) {unknown}")
        out = {}
        if self.fault_hook is not None and method != "close":
            for cid in ids:
                try:
                    self.fault_hook(cid, method, round_)
                except Exception as exc:  # noqa: BLE001 -- an injected failure
                    out[cid] = _fed.ClientFailure(cid, method, round_, repr(exc))
        send = [c for c in ids if c not in out]
        per = {self.node_ids_[c]: tuple(args[c] if isinstance(args, dict) else args)
               for c in send}
        held = {self.node_ids_[c]: self._held[c] for c in send}
        replies = self._exchange(method, per, held, round_) if send else {}
        for cid in send:
            _, value, err = replies[self.node_ids_[cid]]
            if err is None:
                out[cid] = value
                continue
            error, numerical, reached = err
            if not reached:
                self._held[cid] = {}  # its state is unknown: resend everything next time
            out[cid] = _fed.ClientFailure(cid, method, round_, error, numerical)
        return {cid: out[cid] for cid in ids}

    def _exchange(self, method, per_node, held, round_):
        """One message per node; returns ``{node: (client_id, value, error)}``.

        ``error`` is None or ``(text, numerical, reached)``, ``reached``
        telling whether the client handled the message.
        """
        from flwr.app import ConfigRecord, Message, RecordDict

        messages, down, wire_down = [], 0, 0
        for node, args in per_node.items():
            h = held.get(node, {})
            content = RecordDict()
            ctl = {"nargs": len(args)}
            for i, value in enumerate(args):
                slot = _find_held(h, value, method)
                if slot is not None:
                    ctl[f"ref.{i}"] = slot
                    continue
                _encode_into(content, value, f"a{i}")
                down += _arg_payload(value)
                kind = _kind(value)
                if kind:
                    h[f"arg:{kind}"] = value
            content["ctl"] = ConfigRecord(ctl)
            wire_down += _wire_nbytes(content)
            messages.append(Message(content, dst_node_id=int(node),
                                    message_type=f"{MESSAGE_CATEGORY}.{method}"))
        replies = self.grid.send_and_receive(messages, timeout=self.timeout)
        out, up, wire_up = {}, 0, 0
        for rep in replies:
            node = rep.metadata.src_node_id
            if node not in per_node:
                continue
            if rep.has_error():
                out[node] = (None, None, (
                    f"Flower error from node {node} in {method!r}: "
                    f"[{rep.error.code}] {rep.error.reason}", False, False))
                continue
            ctl = rep.content["ctl"]
            cid = ctl.get("client_id")
            wire_up += _wire_nbytes(rep.content)
            if "failed" in ctl:
                # reached: the client's own code ran (its state is known)
                out[node] = (cid, None, (ctl["failed"], bool(ctl["numerical"]), cid is not None))
                continue
            value = decode(rep.content, "r")
            kind = _kind(value)
            if kind and node in held:
                held[node][f"reply:{kind}"] = value
            if method != "hello":
                up += _count(value)
            out[node] = (cid, value, None)
        for node in per_node:
            if node not in out:
                out[node] = (None, None, (
                    f"TimeoutError('no reply from Flower node {node} to {method!r} within "
                    f"{self.timeout} s')", False, False))
        if method != "hello":
            self.payload_log_.append({"method": method, "round": int(round_),
                                      "bytes_down": int(down), "bytes_up": int(up),
                                      "n_messages": 2 * len(per_node)})
            self.wire_log_.append({"method": method, "round": int(round_),
                                   "bytes_down": int(wire_down), "bytes_up": int(wire_up)})
        return out


#: Set-up exchanges: their bytes are round 0 of ``communication_``.
SETUP_METHODS = ("summary", "prepare", "pilot", "pool_evidence", "input_scale_check",
                 "initialise", "design_residual")


def payload_per_round(log):
    """Sum a :attr:`FlowerTransport.payload_log_` by round, as ``communication_`` does.

    The set-up exchanges (:data:`SETUP_METHODS` called in round 0) are round 0; the first
    evaluation of the ELBO (calls of round 0 after the set-up) counts in
    round 1, as the training loop books it.

    Parameters
    ----------
    log : list of dict

    Returns
    -------
    list of dict
        ``round``, ``bytes_up``, ``bytes_down`` in round order.
    """
    per = {}
    for e in log:
        r = (0 if e["method"] in SETUP_METHODS and int(e["round"]) == 0
             else max(int(e["round"]), 1))
        up, down = per.get(r, (0, 0))
        per[r] = (up + e["bytes_up"], down + e["bytes_down"])
    return [{"round": r, "bytes_up": up, "bytes_down": down}
            for r, (up, down) in sorted(per.items())]


def _wire_nbytes(records):
    """Serialised size of a RecordDict's values: each array's ``.npy`` bytes
    (header included), 8 per number, the length of strings and bytes, plus
    the keys."""
    total = 0
    for rec in records.values():
        for k, v in rec.items():
            total += len(k)
            data = getattr(v, "data", None)
            if isinstance(data, bytes):
                total += len(data)
            elif isinstance(v, (str, bytes)):
                total += len(v)
            elif isinstance(v, list):
                total += sum(len(x) if isinstance(x, (str, bytes)) else 8 for x in v)
            else:
                total += 8
    return total


# --------------------------------------------------------------------------
# server side: the ServerApp
# --------------------------------------------------------------------------


def _check_server_params(estimator_params):
    """Validate the estimator parameters now (not when the run starts)."""
    from .regressor import FederatedHierarchicalGPRegressor

    est = FederatedHierarchicalGPRegressor(**estimator_params)
    config, n_rounds = est._check_params()
    if config.variational_family != "structured":
        raise ValueError(
            "skfedgp.flower trains the structured family only (variational_family="
            f"'structured', the estimator's default), got {config.variational_family!r}")
    _fed.check_participation(est.client_fraction, est.min_clients, est.max_retries)
    if est.warm_start:
        raise ValueError("warm_start=True has nothing to continue from in a ServerApp; pass "
                         "resume_from (a TrainingState or the path of a saved one)")
    if est.checkpoint is not None and not (callable(est.checkpoint)
                                           or isinstance(est.checkpoint, (str, os.PathLike))):
        raise ValueError(f"checkpoint must be a path or a callable, got {est.checkpoint!r}")
    if est.fault_hook is not None and not callable(est.fault_hook):
        raise ValueError(f"fault_hook must be callable, got {est.fault_hook!r}")
    return est, config, n_rounds


def fit_over_transport(transport, est, config, n_rounds):
    """Run the estimator's structured training through a connected transport.

    Seeds are drawn exactly as :meth:`FederatedHierarchicalGPRegressor.fit`
    draws them (one per client in sorted client-id order, then the
    server's), so the same ``random_state`` gives the same model.

    Parameters
    ----------
    transport : FlowerTransport
        After :meth:`FlowerTransport.connect` (any object with the transport
        interface, ``n_features_`` and sorted ``client_ids`` will do; an
        ``n_outputs_`` above 1, the nodes' number of target columns, trains
        the multi-output model with ``config.n_outputs`` set as ``fit``
        sets it).
    est : FederatedHierarchicalGPRegressor
        Unfitted; its parameters are used.
    config : ModelConfig
    n_rounds : int

    Returns
    -------
    dict
        The fitted global state; see :func:`make_server_app`.

    Raises
    ------
    ValueError
        With multi-output targets and parameters ``fit`` refuses for them
        (``variance`` or ``local_variance`` given); as in ``fit``, before
        any node is asked anything, for a ``resume_from`` state trained with
        other model settings, a ``checkpoint`` path that names a folder or
        lies in a missing one, or ``min_clients`` above the number of nodes
        (:func:`skfedgp.federated.check_run_setup`).
    """
    from sklearn.utils import check_random_state

    n_outputs = int(getattr(transport, "n_outputs_", 1))
    if n_outputs > 1:
        config = est._multioutput_config(config, n_outputs)
    ids = list(transport.client_ids)
    rng = check_random_state(est.random_state)
    seeds = rng.randint(0, 2**31 - 1, size=len(ids) + 1)
    server = _fed.Server(config, transport.n_features_, int(seeds[-1]))
    client_seeds = [int(s) for s in seeds[:-1]]
    participation_seed = int(rng.randint(0, 2**31 - 1))
    state = est.resume_from
    if isinstance(state, (str, os.PathLike)):
        state = _fed.TrainingState.load(state)
    # as in fit: the resumed state's settings, the checkpoint path, min_clients
    _fed.check_run_setup(config, state, est.checkpoint, est.min_clients, len(ids))
    callback = est.checkpoint
    if isinstance(callback, (str, os.PathLike)):
        path = callback

        def callback(r, st):
            st.save(path)
    _, res = _fed.run_structured_training(
        None, server, config, n_rounds=n_rounds, seeds=client_seeds, verbose=est.verbose,
        transport=transport, client_fraction=est.client_fraction,
        min_clients=est.min_clients, max_retries=est.max_retries,
        random_state=participation_seed, state=state, callback=callback)
    # as in fit: a client whose local phase failed whenever it was asked
    from .regressor import trace_summary, warn_loose_bound, warn_untrained_clients

    first = 0 if state is None else len(state.history)
    warn_untrained_clients([c for c in ids if c not in res.get("excluded_clients", [])],
                           res.get("failed_clients", []), first,
                           res.get("local_phase_done", ()))
    trace = trace_summary(res.get("trace_terms", ()))
    if res["converged"]:
        warn_loose_bound(trace, server.n_inducing_)
    post = res["posterior"]
    return {
        "client_ids": ids,
        "theta_global": res["theta_global"],
        "global_values": res["global_pack"].unpack(res["theta_global"]),
        "global_pack": res["global_pack"],
        "global_posterior": {"mean": post.mean, "covariance": post.covariance},
        "elbo_history": res["elbo_history"],
        "objective_history": res["objective_history"],
        "communication": res["communication"],
        "n_iter": res["n_iter"],
        "converged": res["converged"],
        "n_evaluations": res["n_evaluations"],
        "population": res["population"],
        "failed_clients": res.get("failed_clients", []),
        "excluded_clients": res.get("excluded_clients", []),
        "y_offset": server.y_offset,
        "y_scale": server.y_scale,
        "x_offset": server.x_offset,
        "x_scale": server.x_scale,
        "n_inducing": server.n_inducing_,
        "trace_term": None if trace is None else trace["total"],
        "n_outputs": config.n_outputs or 1,
        "config": config,
        "payload_log": list(transport.payload_log_),
        "wire_log": list(transport.wire_log_),
    }


def make_server_app(*, min_nodes=1, timeout=None, connect_timeout=300.0, output_path=None,
                    **estimator_params):
    """A Flower ``ServerApp`` that trains the estimator's model over the grid.

    Parameters
    ----------
    min_nodes : int, default=1
        Wait for at least this many SuperNodes (clients) before training;
        every node connected at that moment takes part.
    timeout : float or None, default=None
        Seconds to wait for the replies of one exchange (None: no limit).
    connect_timeout : float, default=300.0
        Seconds to wait for ``min_nodes`` nodes.
    output_path : str or path-like, optional
        Where the ServerApp saves the fitted global state (``joblib.dump``
        of the dict below). A run config entry ``output-path``
        (``flwr run --run-config "output-path='fit.joblib'"``) takes
        precedence. In a deployment the ServerApp runs in its own process:
        this file is how the result leaves it.
    **estimator_params
        Parameters of :class:`~skfedgp.FederatedHierarchicalGPRegressor`
        (same names, same defaults), validated here. ``client_fraction``,
        ``min_clients``, ``max_retries``, ``fault_hook`` (called on the
        server before each message), ``checkpoint`` (a path or a callable,
        the server's :class:`~skfedgp.federated.TrainingState` after every
        round, without client parts: each client keeps its own) and
        ``resume_from`` act as in ``fit``; ``n_jobs`` is ignored;
        ``warm_start=True`` is refused (a ServerApp has no fitted state).

    Returns
    -------
    flwr.serverapp.ServerApp
        After a run, ``app.result_`` (same process, e.g. Flower's
        simulation) holds a dict with ``client_ids``, ``theta_global``,
        ``global_values`` (constrained global block: inputs in the scaled
        unit-box coordinates, variances in standardised units),
        ``global_pack``, ``global_posterior`` (``mean``, ``covariance`` of
        ``q(v_g)``), ``elbo_history``, ``objective_history``,
        ``communication`` (as the estimator's ``communication_``), ``n_iter``,
        ``converged``, ``n_evaluations``, ``failed_clients``,
        ``excluded_clients`` (as ``failed_clients_`` and
        ``excluded_clients_``), ``population``, ``y_offset``,
        ``y_scale`` (per output with multi-output targets), ``x_offset``,
        ``x_scale``, ``n_inducing``, ``trace_term`` (as the estimator's
        ``trace_term_``; a :class:`~skfedgp.SparseApproximationWarning` as
        in ``fit``), ``n_outputs`` (1 for 1-D targets), ``config``,
        ``payload_log`` and ``wire_log`` (per exchange,
        :class:`FlowerTransport`). The clients' local blocks and posterior
        moments stay on the clients (``make_client_app(on_finish=...)``).

    Raises
    ------
    ValueError
        For bad estimator parameters or ``variational_family="mean_field"``.
    """
    _require_flwr()
    from flwr.serverapp import ServerApp

    est, config, n_rounds = _check_server_params(estimator_params)
    app = ServerApp()
    app.result_ = None

    @app.main()
    def main(grid, context):
        transport = FlowerTransport(grid, min_nodes=min_nodes, timeout=timeout,
                                    connect_timeout=connect_timeout,
                                    fault_hook=est.fault_hook).connect()
        result = fit_over_transport(transport, est, config, n_rounds)
        app.result_ = result
        path = (context.run_config or {}).get("output-path", output_path)
        if path:
            import joblib

            joblib.dump(result, path)

    return app


# --------------------------------------------------------------------------
# secure aggregation (SecAgg+) of one evaluation's statistics
# --------------------------------------------------------------------------

# keys of the legacy FitIns config of a secure-sum request
_SECURE_ROUND = "skfedgp.round"
_SECURE_WEIGHT = "skfedgp.num-examples"
_SECURE_CLIP = "skfedgp.clipping-range"
#: ``max_weight`` of the SecAgg+ workflow and ``num_examples`` of every
#: client: each client's weight ``num_examples / max_weight`` is 1, so the
#: workflow returns the plain mean ``sum_i x_i / n`` (times n: the sum).
SECURE_WEIGHT = 1


def flatten_statistics(stats):
    """One client's statistics as the vector a secure sum adds.

    Parameters
    ----------
    stats : StructuredStatistics
        ``precision`` ``S_i`` of shape (M, M), ``shift`` ``b_i`` of shape
        (M,), ``constant`` ``e_i`` and ``log_prior`` (floats).

    Returns
    -------
    ndarray of shape (M (M + 1) / 2 + M + 2,)
        ``[upper triangle of (S_i + S_i^T) / 2 row by row, b_i, e_i,
        log_prior_i]``. ``S_i`` is symmetric: sending one triangle halves
        its part and keeps the sum exactly symmetric.

    Notes
    -----
    ``(S_i, b_i, e_i)`` is the client's message of the structured posterior
    (docs/maths.md, section 9; the server needs only their sums,
    :func:`skfedgp._structured.combine`).
    """
    S = np.asarray(stats.precision, dtype=np.float64)
    M = S.shape[0]
    upper = (0.5 * (S + S.T))[np.triu_indices(M)]
    return np.concatenate([upper, np.asarray(stats.shift, dtype=np.float64).ravel(),
                           [float(stats.constant), float(stats.log_prior)]])


def unflatten_statistics(vector, round_=0):
    """Statistics from a (sum of) :func:`flatten_statistics` vector(s).

    Parameters
    ----------
    vector : array-like of shape (M (M + 1) / 2 + M + 2,)
        ``M`` is read from the length.
    round_ : int, default=0
        Round number stored in the returned message.

    Returns
    -------
    StructuredStatistics
        ``precision`` of shape (M, M) (symmetric), ``shift`` of shape (M,),
        ``constant`` and ``log_prior``. For a sum of flattened vectors, the
        summed statistics: ``combine([s.precision], [s.shift],
        [s.constant], M)`` is ``q(v_g)`` and the ELBO of the sum.

    Raises
    ------
    ValueError
        If the length is not ``M (M + 3) / 2 + 2`` for an integer ``M >= 0``.
    """
    v = np.asarray(vector, dtype=np.float64).ravel()
    L = v.size - 2
    M = int(round((np.sqrt(9.0 + 8.0 * max(L, 0)) - 3.0) / 2.0))
    if L < 0 or M * (M + 3) // 2 != L:
        raise ValueError(
            f"a flattened statistics vector has length M (M + 3) / 2 + 2, got {v.size}")
    k = M * (M + 1) // 2
    S = np.zeros((M, M))
    S[np.triu_indices(M)] = v[:k]
    S = S + np.triu(S, 1).T
    return _fed.StructuredStatistics(int(round_), S, v[k:k + M].copy(), float(v[k + M]),
                                     float(v[k + M + 1]))


def secagg_quantization_range(n_clients, modulus_range=2**32):
    """Largest power of two ``T`` for which a SecAgg+ sum of ``n_clients`` cannot wrap.

    Flower's SecAgg+ maps each entry to an integer in ``[0, T]`` and adds
    them modulo ``modulus_range``: the sum is exact only if
    ``n_clients * T < modulus_range`` (the clients' weight factors, ``T``
    each with :data:`SECURE_WEIGHT`, obey the same limit). ``T`` is also
    kept at most ``2**30`` (Flower's quantiser returns int32).

    Parameters
    ----------
    n_clients : int
        At least 2.
    modulus_range : int, default=2**32
        A power of two (the workflow's ``modulus_range``).

    Returns
    -------
    int

    Raises
    ------
    ValueError
        For ``n_clients < 2`` or a modulus too small for ``n_clients``.
    """
    n, mod = int(n_clients), int(modulus_range)
    if n < 2:
        raise ValueError(f"SecAgg+ needs at least 2 clients, got {n_clients}")
    cap = (mod - 1) // n
    if cap < 2:
        raise ValueError(f"modulus_range={modulus_range} is too small for {n} clients")
    return min(1 << (cap.bit_length() - 1), 1 << 30)


def secagg_error_bound(n_clients, clipping_range, quantization_range):
    """Largest error of one entry of a SecAgg+ sum (Flower 1.42's quantisation).

    Each client's entry ``x`` (weight 1, :data:`SECURE_WEIGHT`) is clipped
    to ``[-c, c]`` (``c = clipping_range``) and stochastically rounded on a
    grid of step ``2 c / T`` (``T = quantization_range``): an error below
    one step per client. With every entry of every client inside
    ``[-c, c]`` (nothing clipped) and no wrap-around
    (``n T < modulus_range``, :func:`secagg_quantization_range`), an entry
    of the dequantised sum of ``n`` clients is within
    ``n * 2 c / T`` of the exact sum, plus a floating-point slack of
    ``8 n c`` machine epsilons (dequantisation subtracts ``n c``).

    Parameters
    ----------
    n_clients : int
        Number of clients in the sum.
    clipping_range : float
        ``c``: every entry of every client lies in ``[-c, c]`` (units of
        the entries, e.g. standardised-target units for ``S_i`` and ``b_i``,
        nats for ``e_i``).
    quantization_range : int
        ``T``, the number of quantisation steps over ``[-c, c]``.

    Returns
    -------
    float
        The bound (same units as the entries).

    References
    ----------
    SecAgg+: Bell, Bonawitz, Gascon, Lepoint and Raykova, "Secure single-server
    aggregation with (poly)logarithmic overhead", ACM CCS 2020; the
    quantisation is that of Flower 1.42's ``secaggplus_mod``.
    """
    n, c = int(n_clients), float(clipping_range)
    return n * 2.0 * c / int(quantization_range) + 8.0 * n * c * np.finfo(np.float64).eps


def combine_error_bounds(mean, covariance, eps):
    """Bounds on how far ``q(v_g)`` and the ELBO move when every entry of
    the summed statistics moves by at most ``eps``.

    With ``A = I + sum_i S_i``, ``mu = A^{-1} sum_i b_i`` and
    ``ELBO = -(sum_i e_i + log det A - b^T mu) / 2`` (:func:`skfedgp._structured.combine`),
    let symmetric ``dA`` and ``db``, ``de`` satisfy ``|dA_jk|, |db_j|, |de| <= eps``.
    With ``r_j = sum_k |A^{-1}_jk|``, ``s = sum_jk |A^{-1}_jk|``,
    ``rho = eps s`` (required ``< 1``) and ``m = ||mu||_1``, the exact
    (not first-order) changes obey

    * ``|dmu_j| <= eps r_j (1 + m) / (1 - rho)``;
    * ``|d(A^{-1})_jl| <= eps r_j r_l / (1 - rho)``;
    * ``|dELBO| <= (eps (1 + 2 m + m^2) - log(1 - rho)
      + eps^2 (1 + m)^2 s / (1 - rho)) / 2``.

    Proof sketch: ``X = A^{-1} dA`` has ``|X_jk| <= eps r_j``, so the
    Neumann series of ``(A + dA)^{-1}`` converges entrywise with row sums
    at most ``r_j / (1 - rho)``; ``dmu = (A + dA)^{-1} (db - dA mu)``,
    ``d(A^{-1}) = -A^{-1} dA (A + dA)^{-1}``, ``|tr X^k| <= rho^k`` bounds
    ``log det(I + X)`` by ``-log(1 - rho)``, and
    ``d(b^T A^{-1} b) = 2 mu^T db - mu^T dA mu + w^T (A + dA)^{-1} w`` with
    ``w = db - dA mu``. To first order in ``eps`` these are the familiar
    ``eps r_j (1 + m)``, ``eps r_j r_l`` and
    ``eps (1 + s + 2 m + m^2) / 2``. The relation between the exact and the
    perturbed statistics is symmetric, so the bounds hold with either
    posterior as ``mean`` and ``covariance`` (a server that only has the
    securely summed one can use it). The summed log hyperprior moves by at
    most ``eps``. Floating-point error of :func:`~skfedgp._structured.combine`
    itself is not included.

    Parameters
    ----------
    mean : ndarray of shape (M,)
        ``mu`` (``ServerPosterior.mu``).
    covariance : ndarray of shape (M, M)
        ``A^{-1}`` (``ServerPosterior.A_inv``).
    eps : float
        Bound on every entry's error (:func:`secagg_error_bound`).

    Returns
    -------
    dict
        ``mean`` (ndarray of shape (M,)), ``covariance`` (ndarray of shape
        (M, M)), ``elbo`` (float): the entrywise bounds; ``rho`` (float).

    Raises
    ------
    ValueError
        If ``eps`` is negative or not finite, or ``rho >= 1`` (the
        perturbation may be too large for ``A + dA`` to stay invertible:
        no bound).
    """
    eps = float(eps)
    if not (np.isfinite(eps) and eps >= 0):
        raise ValueError(f"eps must be non-negative and finite, got {eps!r}")
    mu = np.asarray(mean, dtype=np.float64)
    Ai = np.abs(np.asarray(covariance, dtype=np.float64))
    r = Ai.sum(axis=1)
    s = float(Ai.sum())
    m1 = float(np.abs(mu).sum())
    rho = eps * s
    if not rho < 1.0:
        raise ValueError(
            f"eps * sum |A^-1| = {rho:.3g} >= 1: the perturbation is too large for a bound")
    inv = 1.0 / (1.0 - rho)
    return {"mean": eps * r * (1.0 + m1) * inv,
            "covariance": eps * np.outer(r, r) * inv,
            "elbo": 0.5 * (eps * (1.0 + m1) ** 2 - np.log1p(-rho)
                           + eps * eps * (1.0 + m1) ** 2 * s * inv),
            "rho": rho}


def _secure_sum_strategy(proxies, fit_config):
    """A legacy ``Strategy`` for one SecAgg+ round: asks ``proxies`` with
    ``fit_config`` and records what ``aggregate_fit`` is handed."""
    from flwr.common import FitIns, parameters_to_ndarrays
    from flwr.server.strategy import Strategy

    class _SecureSum(Strategy):
        def __init__(self):
            self.seen = None  # [(node_id, num_examples, vector)] handed to aggregate_fit
            self.failures = None

        def initialize_parameters(self, client_manager):
            return None

        def configure_fit(self, server_round, parameters, client_manager):
            return [(p, FitIns(parameters, dict(fit_config))) for p in proxies]

        def aggregate_fit(self, server_round, results, failures):
            self.seen = [(proxy.node_id, int(res.num_examples),
                          parameters_to_ndarrays(res.parameters)) for proxy, res in results]
            self.failures = list(failures)
            return (results[0][1].parameters if results else None), {}

        def configure_evaluate(self, server_round, parameters, client_manager):
            return []

        def aggregate_evaluate(self, server_round, results, failures):
            return None, {}

        def evaluate(self, server_round, parameters):
            return None

    return _SecureSum()


def secure_statistics_sum(grid, node_ids, theta_global, round_=0, *, clipping_range,
                          quantization_range=None, modulus_range=2**32,
                          reconstruction_threshold=None, timeout=None):
    """Sum of the nodes' statistics at one global vector, through Flower's SecAgg+.

    The first exchange of an evaluation of the collapsed ELBO, secured: each
    node (a :func:`make_client_app` with ``secure_aggregation=True``, set up
    by a :class:`FlowerTransport`) computes its
    :class:`~skfedgp.federated.StructuredStatistics` at ``theta_global``
    and hands :func:`flatten_statistics` of them to Flower's
    ``secaggplus_mod`` as the parameters of a legacy ``FitRes`` with
    ``num_examples =`` :data:`SECURE_WEIGHT`; the server runs Flower's
    ``SecAggPlusWorkflow`` (set-up, key sharing, masked-vector collection,
    unmasking) in a ``LegacyContext`` whose strategy asks exactly
    ``node_ids``. The server receives only masked integer vectors; the
    workflow unmasks their sum, dequantises it and divides it by the summed
    weights (``n``); the strategy's ``aggregate_fit`` is handed that one
    aggregate in place of every client's parameters; this function
    multiplies it by ``n``.

    Parameters
    ----------
    grid : flwr.serverapp.Grid
        The ServerApp's grid (the one a :class:`FlowerTransport` uses).
    node_ids : sequence of int
        Flower node ids of the clients to sum over (at least 2;
        :attr:`FlowerTransport.node_ids_` maps client ids to them).
    theta_global : ndarray of shape (P,)
        The global vector (sent to the clients in the clear, as in the
        plain ``statistics`` broadcast).
    round_ : int, default=0
        Round number (of the messages and of the returned statistics).
    clipping_range : float
        ``c``: every entry of every client's flattened statistics must lie
        in ``[-c, c]``. It is a public parameter the clients agree on
        beforehand (it must not depend on this evaluation's private
        values); a node whose statistics exceed it refuses to answer (a
        failure, see Raises) instead of being clipped silently.
    quantization_range : int, optional
        ``T``. Default: :func:`secagg_quantization_range` of ``len(node_ids)``.
    modulus_range : int, default=2**32
        A power of two above ``len(node_ids) * T``.
    reconstruction_threshold : int, optional
        Shares needed to rebuild a node's secrets. Default
        ``len(node_ids) // 2 + 1`` (every node shares with every other:
        ``num_shares=1.0``).
    timeout : float, optional
        Seconds to wait for each stage's replies (None: no limit).

    Returns
    -------
    dict
        ``statistics`` (:class:`~skfedgp.federated.StructuredStatistics`,
        the securely aggregated sum: ``precision`` of shape (M, M),
        ``shift`` of shape (M,), ``constant``, ``log_prior``),
        ``n_clients``, ``node_ids``, ``bound`` (:func:`secagg_error_bound`:
        every entry of the sum is within it of the exact sum),
        ``clipping_range``, ``quantization_range``, ``modulus_range`` and
        ``aggregate_fit_inputs``: the ``(node_id, num_examples, parameters)``
        the strategy's ``aggregate_fit`` was handed, one per client, each
        carrying the same aggregate (the mean), never a client's own vector.

    Raises
    ------
    ValueError
        For fewer than 2 or repeated node ids, a non-positive or non-finite
        ``clipping_range``, or a ``quantization_range`` for which the sum
        could wrap around ``modulus_range``.
    RuntimeError
        If the workflow halted (too few nodes answered a stage), or not every
        node's masked vector is in the sum (a node failed, e.g. statistics
        outside the clipping range, or dropped out: SecAgg+ would then return
        the sum over the others).
    """
    _require_flwr()
    from flwr.app import ConfigRecord, Context, RecordDict
    from flwr.common import ndarrays_to_parameters
    from flwr.compat.common import recorddict_compat as compat
    from flwr.server.client_manager import SimpleClientManager
    from flwr.server.compat.grid_client_proxy import GridClientProxy
    from flwr.server.compat.legacy_context import LegacyContext
    from flwr.server.workflow import SecAggPlusWorkflow
    from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD, Key

    node_ids = [int(n) for n in node_ids]
    n = len(node_ids)
    if n < 2 or len(set(node_ids)) != n:
        raise ValueError(f"a secure sum needs at least 2 distinct node ids, got {node_ids}")
    clip = float(clipping_range)
    if not (np.isfinite(clip) and clip > 0):
        raise ValueError(f"clipping_range must be positive and finite, got {clipping_range!r}")
    T = (secagg_quantization_range(n, modulus_range) if quantization_range is None
         else int(quantization_range))
    if not 2 <= T <= 2**31 - 1 or n * T >= int(modulus_range):
        raise ValueError(
            f"quantization_range={T} with {n} clients: need 2 <= T < 2**31 and "
            f"n * T < modulus_range={modulus_range}, or the sum wraps around")
    threshold = n // 2 + 1 if reconstruction_threshold is None else int(reconstruction_threshold)

    run = getattr(grid, "run", None)
    run_id = int(getattr(run, "run_id", 0) or 0)
    proxies = [GridClientProxy(node_id=nid, grid=grid, run_id=run_id) for nid in node_ids]
    manager = SimpleClientManager()
    for p in proxies:
        manager.register(p)
    strategy = _secure_sum_strategy(
        proxies, {_SECURE_ROUND: int(round_), _SECURE_WEIGHT: SECURE_WEIGHT,
                  _SECURE_CLIP: clip})
    context = LegacyContext(
        Context(run_id=run_id, node_id=0, node_config={}, state=RecordDict(), run_config={}),
        strategy=strategy, client_manager=manager)
    theta = np.ascontiguousarray(np.asarray(theta_global, dtype=np.float64))
    context.state[MAIN_PARAMS_RECORD] = compat.parameters_to_arrayrecord(
        ndarrays_to_parameters([theta]), keep_input=True)
    context.state[MAIN_CONFIGS_RECORD] = ConfigRecord({Key.CURRENT_ROUND: int(round_)})
    workflow = SecAggPlusWorkflow(
        num_shares=1.0, reconstruction_threshold=threshold, max_weight=float(SECURE_WEIGHT),
        clipping_range=clip, quantization_range=T, modulus_range=int(modulus_range),
        timeout=timeout)
    workflow(grid, context)

    seen = strategy.seen
    if seen is None:
        raise RuntimeError("SecAgg+ halted before unmasking (too few nodes answered a stage)")
    got = sorted(nid for nid, _, _ in seen)
    if strategy.failures or got != sorted(node_ids):
        raise RuntimeError(
            f"the secure sum is incomplete: masked vectors from nodes {got} of {sorted(node_ids)}"
            f" (missing {sorted(set(node_ids) - set(got))}; first failure: "
            f"{strategy.failures[:1]})")
    mean = seen[0][2][0]
    if any(len(arrs) != 1 or not np.array_equal(arrs[0], mean) for _, _, arrs in seen):
        raise RuntimeError("aggregate_fit was handed different vectors: not a SecAgg+ aggregate")
    total = n * np.asarray(mean, dtype=np.float64)
    return {
        "statistics": unflatten_statistics(total, round_),
        "n_clients": n,
        "node_ids": node_ids,
        "bound": secagg_error_bound(n, clip, T),
        "clipping_range": clip,
        "quantization_range": T,
        "modulus_range": int(modulus_range),
        "aggregate_fit_inputs": seen,
    }
