"""Command-line flags generated from config dataclasses: ``het train``'s from
:class:`~het.train.config.TrainConfig`, ``het serve``'s from :class:`~het.config.ShardConfig`,
:class:`~het.config.TableConfig` and :class:`~het.config.OptimizerConfig` (:mod:`het.serve`).

A field ``cache_frac`` is ``--cache-frac``; a field of a nested table, ``synthetic.cap``, is
``--synthetic-cap`` (TOML: ``[synthetic] cap``); a bool ``prefetch`` is ``--prefetch`` /
``--no-prefetch``. Every flag's help is its field's, with the default (per model where it
differs) and the choices of a closed setting (an enum of :mod:`het.choices`). Only the flags
given override the TOML file: one override path for ``het train`` and every benchmark that
runs a job.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing

from het.choices import Choice
from het.config import parse_bytes
from het.staleness import parse_staleness
from het.train.config import RENAMED, TrainConfig, say_renamed
from het.train.defaults import MODEL_DEFAULTS
from het.train.fields import check_widths


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
        help = _help(key, f) if key not in defaults else f"{f.metadata.get('help', '')} (default: {defaults[key]})"
        add_flag(group, flag_name(key), key, f, hint, help, none_ok=_accepts_none(hint, f),
                 renamed=tuple(flag_name(old) for old, new in RENAMED.items()
                               if new == key and flag_name(old) != flag_name(key)))  # --cache-frac: both


def add_flag(parser, name: str, dest: str, f: dataclasses.Field, hint, help: str, none_ok: bool = False,
             aliases: tuple[str, ...] = (), renamed: tuple[str, ...] = ()) -> None:
    """Add the flag ``name`` (with the field's ``aliases`` and ``aliases``) of setting ``f``, whose
    type is ``hint``, to ``parser``; its value goes to ``dest`` when given, nowhere otherwise (so
    a flag not given leaves the config's own default). ``none_ok``: ``none`` is a value.
    ``renamed``: the setting's old flags, which still work, saying once how it is spelled."""
    names = (name, *(a for a in (*f.metadata.get("aliases", ()), *aliases) if a != name))
    kwargs = {"dest": dest, "default": argparse.SUPPRESS, "help": help}
    if hint is bool:
        kwargs["action"] = argparse.BooleanOptionalAction
    else:
        kwargs["type"] = _parser(hint, f, none_ok)
        choices = choices_of(hint, f)
        plain = "SIZE" if f.metadata.get("kind") == "size" else dest.rpartition(".")[2].upper()
        kwargs["metavar"] = "{" + ",".join(choices) + "}" if choices else plain
    parser.add_argument(*names, **kwargs)
    if renamed:
        parser.add_argument(*renamed, **kwargs | {"help": argparse.SUPPRESS, "action": _renamed(kwargs.get("action"))})


def _renamed(base):
    """An argparse action that stores its value as ``base`` does (None: as given), saying first
    how the setting the old flag names is spelled."""
    class Renamed(base or argparse.Action):
        def __call__(self, parser, namespace, values, option_string=None):
            old = option_string.replace("--no-", "--", 1) if option_string.startswith("--no-") else option_string
            say_renamed(old.lstrip("-").replace("-", "_"), self.dest)
            if base is None:
                setattr(namespace, self.dest, values)
            else:
                super().__call__(parser, namespace, values, option_string)

    return Renamed


def choices_of(hint, f: dataclasses.Field) -> tuple[str, ...]:
    """The values a setting may take, when it is a closed choice: the field's own narrower
    ``choices``, else its enum's; ``()`` for an open one."""
    if f.metadata.get("choices"):
        return tuple(str(c) for c in f.metadata["choices"])
    inner = _inner(hint)
    return inner.values() if isinstance(inner, type) and issubclass(inner, Choice) else ()


def default_help(f: dataclasses.Field) -> str:
    """A field's help with its default, when it has one (tuples as a flag spells them)."""
    text = f.metadata.get("help", "")
    default = f.default if f.default is not dataclasses.MISSING else None
    if default is None:
        return text
    if isinstance(default, tuple):
        default = ",".join(map(str, default))
    return f"{text} (default: {default})"


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
    return text if key == "dense_optimizer" else default_help(f)


def _inner(hint):
    """``X`` of ``X | None``; the hint itself otherwise."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if args and typing.get_origin(hint) is not tuple else hint


def _parser(hint, f, none_ok: bool):
    """The argparse ``type`` of a setting: text -> the field's type; errors name what came."""
    kind, inner, choices = f.metadata.get("kind"), _inner(hint), choices_of(hint, f)
    if kind == "staleness":
        convert = parse_staleness
    elif kind == "width":
        def convert(text):
            return text if text == "auto" else int(text)
    elif kind == "widths":
        def convert(text):
            return check_widths(text, f.name)
    elif kind == "size" and inner is int:  # bytes; a str setting keeps the text, checked by its config
        convert = parse_bytes
    elif typing.get_origin(hint) is tuple:
        item = typing.get_args(hint)[0]

        def convert(text):
            return tuple(item(x) for x in text.split(","))
    elif choices:
        convert = str
    else:
        convert = inner

    def parse(text: str):
        if none_ok and inner is not str and text.lower() == "none":
            return None
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {_expected(hint, f, none_ok)}, got {text!r}") from None
        if choices and value not in choices:
            raise argparse.ArgumentTypeError(f"expected one of {', '.join(choices)}, got {text!r}")
        return value

    return parse


def _accepts_none(hint, f) -> bool:
    """Whether ``none`` is a value of the flag: None means something of its own (no cap), not
    "the model's default" (a flag not given)."""
    return type(None) in typing.get_args(hint) and f.name not in MODEL_DEFAULTS["wdl"]


def _expected(hint, f, none_ok: bool) -> str:
    if f.metadata.get("kind") == "staleness":
        return "an integer >= 0 or 'inf'"
    if f.metadata.get("kind") == "width":
        return "an integer >= 1 or 'auto'"
    if f.metadata.get("kind") == "widths":
        return "field widths as name=width,name=width"
    if f.metadata.get("kind") == "size" and _inner(hint) is int:
        return "a size such as 2GiB, 256MiB or 4096 (bytes)" + (" or none" if none_ok else "")
    if typing.get_origin(hint) is tuple:
        item = typing.get_args(hint)[0]
        return f"comma-separated {'integers, e.g. 10,5' if item is int else 'numbers, e.g. 0.9,0.999'}"
    return {int: "an integer", float: "a number"}.get(_inner(hint), "a value") + (" or none" if none_ok else "")
