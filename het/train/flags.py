"""``het train``'s flags, generated from :class:`~het.train.config.TrainConfig`'s fields.

A field ``cache_frac`` is ``--cache-frac``; a field of a nested table, ``synthetic.cap``, is
``--synthetic-cap`` (TOML: ``[synthetic] cap``); a bool ``prefetch`` is ``--prefetch`` /
``--no-prefetch``. Every flag's help is its field's, with the default (per model where it
differs) and the choices of a closed setting. Only the flags given override the TOML file:
one override path for ``het train`` and every benchmark that runs a job.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing

from het.staleness import parse_staleness
from het.train.config import MODEL_DEFAULTS, TrainConfig


def config_fields(cls=TrainConfig, prefix: str = ""):
    """``(dotted key, field, type)`` of every leaf setting, nested tables' included."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            yield from config_fields(hint, f"{prefix}{f.name}.")
        else:
            yield prefix + f.name, f, hint


def flag_name(key: str) -> str:
    """``"synthetic.cap"`` -> ``"--synthetic-cap"``.

    Example:
        >>> flag_name("cache_frac"), flag_name("graph.fanouts")
        ('--cache-frac', '--graph-fanouts')
    """
    return "--" + key.replace(".", "-").replace("_", "-")


def add_config_flags(parser: argparse.ArgumentParser, exclude: tuple[str, ...] = (), defaults: dict | None = None,
                     fixed: dict | None = None) -> None:
    """Add ``--config`` and one flag per setting of TrainConfig, but those in ``exclude`` and in
    ``fixed``. A command that runs jobs of its own kind gives ``defaults`` (beneath the TOML
    file, shown in the help) and ``fixed`` settings (above the flags);
    :func:`config_from_args` applies them."""
    defaults, fixed = dict(defaults or {}), dict(fixed or {})
    parser.add_argument("--config", metavar="TOML", help="the job's TOML file (the flags given override it)")
    keys = [key for key, _, _ in config_fields() if key not in exclude and key not in fixed]
    parser.set_defaults(config_layers=(defaults, fixed, tuple(keys)))
    group = parser.add_argument_group("job settings (TOML keys; a [table] key is --TABLE-KEY)")
    for key, f, hint in config_fields():
        if key not in keys:
            continue
        names = (flag_name(key), *f.metadata.get("aliases", ()))
        help = _help(key, f) if key not in defaults else f"{f.metadata.get('help', '')} (default: {defaults[key]})"
        kwargs = {"dest": key, "default": argparse.SUPPRESS, "help": help}
        if hint is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs["type"] = _parser(hint, f)
            choices = f.metadata.get("choices")
            kwargs["metavar"] = "{" + ",".join(choices) + "}" if choices else key.rpartition(".")[2].upper()
        group.add_argument(*names, **kwargs)


def overrides(args: argparse.Namespace) -> dict:
    """The settings given as flags: ``{dotted key: value}`` (a command's own flag of the same
    name as a setting, ``het bench scale --workers 1,2``, is not one)."""
    keys = getattr(args, "config_layers", ({}, {}, ()))[2]
    return {k: v for k, v in vars(args).items() if k in keys}


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The job of parsed flags: the command's defaults < the TOML file of ``--config`` < the
    flags given < the command's fixed settings (see :func:`add_config_flags`)."""
    defaults, fixed, _ = getattr(args, "config_layers", ({}, {}, ()))
    return TrainConfig.load(getattr(args, "config", None), {**overrides(args), **fixed}, defaults)


def _help(key: str, f) -> str:
    text = f.metadata.get("help", "")
    if f.default is None and key in MODEL_DEFAULTS["wdl"]:
        base = MODEL_DEFAULTS["wdl"][key]
        others = "; ".join(f"{m} {d[key]}" for m, d in MODEL_DEFAULTS.items() if d[key] != base)
        return f"{text} (default: {base}{'; ' + others if others else ''})"
    default = f.default if f.default is not dataclasses.MISSING else None
    if key == "dense_optimizer" or default is None:
        return text
    if isinstance(default, tuple):
        default = ",".join(map(str, default))
    return f"{text} (default: {default})"


def _parser(hint, f):
    """The argparse ``type`` of a setting: text -> the field's type; errors name what came."""
    if f.metadata.get("kind") == "staleness":
        convert = parse_staleness
    elif typing.get_origin(hint) is tuple:
        def convert(text):
            return tuple(int(x) for x in text.split(","))
    else:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        inner = args[0] if args else hint
        optional = _accepts_none(hint, f)

        def convert(text):
            if optional and inner is not str and text.lower() == "none":
                return None
            return inner(text)

    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {_expected(hint, f)}, got {text!r}") from None
        choices = f.metadata.get("choices")
        if choices and value not in choices:
            raise argparse.ArgumentTypeError(f"expected one of {', '.join(choices)}, got {text!r}")
        return value

    return parse


def _accepts_none(hint, f) -> bool:
    """Whether ``none`` is a value of the flag: None means something of its own (no cap), not
    "the model's default" (a flag not given)."""
    return type(None) in typing.get_args(hint) and f.name not in MODEL_DEFAULTS["wdl"]


def _expected(hint, f) -> str:
    if f.metadata.get("kind") == "staleness":
        return "an integer >= 0 or 'inf'"
    if typing.get_origin(hint) is tuple:
        return "comma-separated integers, e.g. 10,5"
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    inner = args[0] if args else hint
    return {int: "an integer", float: "a number"}.get(inner, "a value") + (" or none" if _accepts_none(hint, f) else "")
